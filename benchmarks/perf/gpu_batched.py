"""Many edits at once on a GPU, estimated without one (``python -m benchmarks gpu-path --batched 1
16``): kernels per CASE per decoded token and per CASE per inner step of the batched engine
(``hpse_easyedit.batched``) at a 7B backbone's widths, and the H100 roofline of one case's edit at
B cases at once.

The counts run the engine's own code on the ``meta`` device (shapes without data, the file's dtype:
bfloat16 for the 7B files), with ``benchmarks.perf.gpu_path``'s counter (``OpCounter``: every aten
op that runs a kernel; scaled dot-product attention as the one fused kernel a GPU runs): B cases of
one request each around one frozen model (``make_stacked``: B stacked LoRA adapters, the LoRA
files' executor), decoded as the engine's round does (``_round_rollouts``: every case's student row
and its teacher row in one static decode batch, ``static_decode: true``, eager), then one inner
step (``_round_batches`` + ``_inner_step``: every case's KL rows in one forward and backward, then
its NLL rows, all B cases in one pass as ``cases_per_pass: auto`` does on a GPU). As
``benchmarks.perf.gpu_path.decode_counts`` does, each count is taken at 2 and 3 layers and scaled to
the backbone's depth (``per layer = Q(3) - Q(2)``, the rest outside the layers), a decode step as
the difference of two rollout lengths. Adam is the fused CUDA Adam the engine builds on a GPU
(``StackedExecutor.optimizer``), which the meta device cannot run: its kernels are counted from
PyTorch's multi-tensor launch rule (``fused_adam_kernels``). The solo edit (``hpse_edit``: its
executor, ``HPSEObjective``, ``training.inner_step``) is counted the same way, as the reference.
``stacked_decode_graph_breaks``: ``torch._dynamo.explain`` of the batched engine's static decode
step for 2 cases (on CUDA ``static_decode: auto`` compiles it with ``fullgraph=True``).

The roofline of one case's edit at B cases (``case_edit_roofline``), with the file's budget (R
rounds, M inner steps) and the lengths of the H100 edit the host cost is measured on:

    case seconds = R x (host x rollout kernels + rollout floor) / B
                 + R x M x (host x inner-step kernels + inner-step floor) / B

- ``host``: the host time per kernel launched eagerly, measured on an H100 (``calibration``): the
  inner step's wall time in the measured edit less the time the card was busy, over the kernels
  the profiler saw in it. The model assumes each kernel's launch costs that, whatever its size, and
  that host and card do not overlap (an upper bound; with perfect overlap the larger of the two
  would count instead).
- the floors (``H100``: the data sheet's bandwidth and dense bfloat16 peak): a decode step reads
  every weight once for all B cases (the base weights in the model's dtype, the B cases' adapters in
  float32 as the stacked forward reads them, and the KV cache of the 2B rows at the rollout's mean
  context), against its FLOPs; the prefill's FLOPs; an inner step's FLOPs (forward and backward of
  the KL and NLL rows, B times one case's) against its weight reads (each of the two terms reads
  every weight in its forward and again in its backward). FLOPs are ``FlopCounterMode``'s over the
  same runs; it has no formula for the CPU flash attention that stands in for the GPU's, so
  attention's FLOPs (about 1% of an inner step's at these lengths) are left out.
- a variant with the decode under CUDA graphs (``static_decode: auto`` on CUDA: the step replayed
  as one launch): the rollout's host term is then zero and its time its floor.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import torch

from .meta_ops import (
    H100,
    ROLLOUT,
    STUDENT_PROMPT,
    TEACHER_PROMPT,
    OpCounter,
    at_depth,
    meta_model,
    static_step_graph_breaks,
    top_ops,
)

__all__ = [
    "PROFILE_JSON",
    "batched_counts",
    "batched_figures",
    "calibration",
    "case_edit_roofline",
    "fused_adam_kernels",
]

#: the H100 measurement the host cost per kernel and the edit's lengths come from (``benchmarks.
#: gpu_path --device cuda --profile``; its file stem inside)
PROFILE_JSON = Path(__file__).resolve().parents[2] / "docs" / "perf" / "gpu-h100-profile.json"
PROFILE_FILE = "qwen2.5-7b"
#: the passage of that edit (``gpu_path.gpu_figures``)
PASSAGE = 157
#: PyTorch's CUDA multi-tensor launches (``ATen/native/cuda/MultiTensorApply.cuh``): elements per
#: chunk (one block each), blocks per launch, and tensors per launch by the number of lists (4 KB of
#: kernel arguments; a build and driver with 32 KB arguments packs more tensors into a launch, so
#: these counts are upper bounds)
CHUNK, MAX_BLOCKS = 65536, 320
MAX_TENSORS = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30}


def _multi_tensor_launches(numels: Sequence[int], lists: int) -> int:
    """Kernels one multi-tensor op over tensors of ``numels`` elements launches (``lists`` tensor
    lists: a launch ends when its tensor table or its block table is full)."""
    launches, tensors, blocks = 0, 0, 0
    for n in numels:
        tensors += 1
        for _ in range(max(1, math.ceil(n / CHUNK))):
            blocks += 1
            if blocks == MAX_BLOCKS:
                launches, blocks = launches + 1, 0
        if tensors == MAX_TENSORS[lists]:
            launches, tensors, blocks = launches + (blocks > 0), 0, 0
    return launches + (blocks > 0)


def fused_adam_kernels(params: Sequence[torch.Tensor]) -> int:
    """Kernels of one ``torch.optim.Adam(fused=True)`` step on CUDA over ``params`` (one device and
    dtype): the step counters' ``_foreach_add_`` (one list) and ``_fused_adam_`` (parameters,
    gradients and the two moments: four lists)."""
    numels = [p.numel() for p in params]
    return _multi_tensor_launches([1] * len(numels), 1) + _multi_tensor_launches(numels, 4)


class _FusedAdamCount:
    """Stands in for the fused CUDA Adam of an edit (``Executor.optimizer``,
    ``StackedExecutor.optimizer``) on the meta device: clears the gradients as Adam's ``zero_grad``
    does, and a step adds its CUDA kernels to ``counter`` (LoRA: Adam has no post-step work)."""

    def __init__(self, params: Sequence[torch.Tensor], counter: OpCounter) -> None:
        self.params, self.counter = list(params), counter

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        kernels = fused_adam_kernels(self.params)
        self.counter.ops += kernels
        self.counter.by_op["_fused_adam_ (launches)"] += kernels


def _scaled(at2: float, at3: float, depth: int) -> float:
    """A quantity counted at 2 and 3 layers, at ``depth`` layers."""
    return at2 + (depth - 2) * (at3 - at2)


def _prompts(i: int, passage: int) -> Any:
    """Request ``i``'s prompt ids at the measured edit's lengths."""
    from hpse_easyedit.prompts import EditPrompts

    return EditPrompts(
        subject=f"s{i}",
        student_ids=[7] * STUDENT_PROMPT,
        teacher_ids=[9] * TEACHER_PROMPT,
        passage_ids=[5] * passage,
    )


def _rollout_on_card(tokens: int, top_k: int) -> Any:
    """A ``tokens``-token rollout as a round leaves it on the device (meta)."""
    from hpse_easyedit.rollout import Rollout

    meta = torch.device("meta")
    return Rollout(
        torch.zeros(tokens, dtype=torch.long, device=meta),
        torch.zeros(tokens, dtype=torch.bool, device=meta),
        torch.zeros(tokens, top_k, dtype=torch.long, device=meta),
        torch.zeros(tokens, top_k, device=meta),
    )


def _engine(hp: Any, model: Any, cases: int | None, rollout: int, passage: int) -> tuple:
    """The edit's own steps around ``model``: ``draw(tokens)`` (one round's rollouts of that
    length), ``batches()`` (a round's training batches on ``rollout``-token rollouts), ``step(
    batches, counter)`` (one inner step with the fused Adam counted into ``counter``). ``cases``
    None: the solo edit (``hpse_edit``: its executor, ``HPSEObjective``, ``training.inner_step``);
    else the batched engine for that many one-request cases, all in one pass."""
    meta = torch.device("meta")
    if cases is None:
        from hpse_easyedit.editor import HPSEObjective
        from hpse_easyedit.executors import make_executor
        from hpse_easyedit.rollout import draw_rollouts
        from hpse_easyedit.training import inner_step

        executor = make_executor(model, hp)
        prompts = [_prompts(0, passage)]
        objective = HPSEObjective(executor, prompts, hp, stop_ids=[0], pad_id=0)

        def draw(tokens: int) -> None:
            hpt = hp.with_overrides({"max_new_tokens": tokens})
            draw_rollouts(executor, prompts, hpt, stop_ids=[0], pad_id=0)

        def batches() -> Any:
            objective.use_rollouts([_rollout_on_card(rollout, hp.top_k)])

        def step(_: Any, counter: OpCounter) -> None:
            optimizer = _FusedAdamCount(executor.trainable_parameters(), counter)
            inner_step(objective, executor.model, optimizer)

        return draw, batches, step, executor.trainable_parameters()
    from hpse_easyedit.batched import CaseEdit, _Case, _inner_step, _round_batches, _round_rollouts
    from hpse_easyedit.executors.stacked import make_stacked

    stacked = make_stacked(model, hp, cases)
    live = [_Case(i, [_prompts(i, passage)], CaseEdit()) for i in range(cases)]

    def draw(tokens: int) -> None:
        _round_rollouts(stacked, live, hp.with_overrides({"max_new_tokens": tokens}), [0], 0)

    def batches() -> Any:
        for c in live:
            c.rollouts = [_rollout_on_card(rollout, hp.top_k)]
        return _round_batches(live, hp, 0, meta, None)

    def step(passes: Any, counter: OpCounter) -> None:
        _inner_step(stacked, passes, hp, _FusedAdamCount(stacked.trainable_parameters(), counter))

    return draw, batches, step, stacked.trainable_parameters()


def _one_depth(hparams: Any, layers: int, cases: int | None, rollout: int, passage: int) -> dict:
    """The engine's counts (``_engine``) with the backbone cut to ``layers`` layers: a decode
    step's kernels, host reads and FLOPs and the rest of a rollout's (its prefill, which gives the
    first token, less one step), a round's batching, and one inner step's."""
    from torch.utils.flop_counter import FlopCounterMode

    from hpse_easyedit.planner import fused_attention_on_meta

    model = meta_model(hparams, layers)
    hp = at_depth(hparams, layers).with_overrides(
        {"static_decode": True, "fast_decode": False, "lora_dropout": 0.0}
    )
    draw, batches, step, params = _engine(hp, model, cases, rollout, passage)
    every, runs = hp.decode_stop_every, {}
    with fused_attention_on_meta(), OpCounter():  # what only a first rollout makes (LoRA's
        draw(every)  # decode copies of the adapters) must not count as steps
    for tokens in (every, 2 * every):
        with fused_attention_on_meta(), OpCounter() as count:
            with FlopCounterMode(display=False) as flops:
                draw(tokens)
        runs[tokens] = (count.ops, count.host_reads, flops.get_total_flops(), count.by_op)
    (ops1, reads1, flops1, by1), (ops2, reads2, flops2, by2) = runs[every], runs[2 * every]
    out: dict[str, Any] = {
        "decode_step_ops": (ops2 - ops1) / every,
        "decode_step_host_reads": (reads2 - reads1) / every,
        "decode_step_flops": (flops2 - flops1) / every,
        "decode_step_by_op": {op: (by2[op] - by1.get(op, 0)) / every for op in by2},
    }
    out["rollout_fixed_ops"] = ops1 - every * out["decode_step_ops"]
    out["rollout_fixed_flops"] = flops1 - every * out["decode_step_flops"]
    with OpCounter() as count:  # a round's batches: its rollouts read on the host, padded
        prepared = batches()
    out["round_batch_ops"], out["round_batch_host_reads"] = count.ops, count.host_reads
    with fused_attention_on_meta(), OpCounter() as count:
        with FlopCounterMode(display=False) as flops:
            step(prepared, count)
    out["inner_step_ops"], out["inner_step_host_reads"] = count.ops, count.host_reads
    out["inner_step_flops"] = flops.get_total_flops()
    out["inner_step_by_op"] = dict(count.by_op)
    out["trainable_numel"] = sum(p.numel() for p in params)
    return out


def batched_counts(
    hparams: Any, cases: int | None, *, rollout: int = ROLLOUT, passage: int = PASSAGE
) -> dict:
    """Kernels, host reads and FLOPs of the batched engine editing ``cases`` one-request cases at
    once (None: the solo edit of one), at the depth of ``hparams``' backbone (see the module
    docstring): per decode step (all cases' rows), per rollout beyond its steps, per round's
    batching and per inner step, and each per case."""
    from hpse_easyedit.planner import backbone_config

    if hparams.executor != "lora":
        raise ValueError(
            f"the batched roofline counts the LoRA executor; set executor: lora (now "
            f"{hparams.executor!r})"
        )
    depth = backbone_config(hparams.model_name).num_hidden_layers
    two, three = (_one_depth(hparams, layers, cases, rollout, passage) for layers in (2, 3))
    n = cases or 1
    out: dict[str, Any] = {
        "engine": "solo (hpse_edit)" if cases is None else "batched (hpse_edit_cases)",
        "cases": n,
        "layers": depth,
        "executor": hparams.executor,
    }
    for key in (
        "decode_step_ops",
        "decode_step_host_reads",
        "decode_step_flops",
        "rollout_fixed_ops",
        "rollout_fixed_flops",
        "round_batch_ops",
        "round_batch_host_reads",
        "inner_step_ops",
        "inner_step_host_reads",
        "inner_step_flops",
        "trainable_numel",
    ):
        out[key] = _scaled(two[key], three[key], depth)
    out["decode_ops_per_layer"] = three["decode_step_ops"] - two["decode_step_ops"]
    out["inner_step_ops_per_layer"] = three["inner_step_ops"] - two["inner_step_ops"]
    out["kernels_per_case_per_token"] = out["decode_step_ops"] / n
    out["kernels_per_case_per_inner_step"] = out["inner_step_ops"] / n
    for name in ("decode_step", "inner_step"):
        by2, by3 = two[f"{name}_by_op"], three[f"{name}_by_op"]
        per_case = {
            op: _scaled(by2.get(op, 0), by3.get(op, 0), depth) / n for op in by2.keys() | by3
        }
        out[f"{name}_top_ops_per_case"] = top_ops(per_case, 10)
    return out


def calibration(path: Path = PROFILE_JSON, file: str = PROFILE_FILE) -> dict:
    """The host time per eagerly launched kernel, from an H100 edit (``path``, ``benchmarks.
    gpu_path --device cuda --profile``): its inner step's wall time (the edit's seconds less its R
    rollouts at the measured compiled decode rate, over R x M steps) less the card's busy time in a
    profiled inner step, over that step's kernels; that edit's rollout length, and the eager static
    decode's tokens per second on the same card."""
    figures = json.loads(path.read_text())[file]
    steps = figures["rounds"] * figures["inner_steps"]
    rollouts = figures["rounds"] * figures["rollout_tokens"] / figures["gpu_rollout_tok_s"]
    step_s = (figures["gpu_edit_seconds"] - rollouts) / steps
    profile = figures["profile"]["inner_step"]
    busy_s = profile["busy_ms"] / 1e3
    return {
        "source": str(path.relative_to(path.parents[2])),
        "gpu": figures.get("gpu_name"),
        "edit_seconds": figures["gpu_edit_seconds"],
        "rollout_tokens": figures["rollout_tokens"],
        "eager_decode_tok_s": figures["rollout_tok_s"]["static"],
        "inner_step_seconds": step_s,
        "inner_step_busy_seconds": busy_s,
        "inner_step_kernels": profile["kernels"],
        "host_seconds_per_kernel": (step_s - busy_s) / profile["kernels"],
    }


def _decode_bytes(hparams: Any, cases: int, context: float) -> dict:
    """Bytes one decode step of ``cases`` cases reads at full depth: the base weights in the model's
    dtype (the input embedding only gathered unless tied to the head), every case's adapters in
    float32 (LoRA: the stacked forward casts the rows to the adapters' dtype), and the KV cache of
    the 2 x ``cases`` rows at ``context`` tokens."""
    model = meta_model(hparams, None)
    size = hparams.torch_dtype.itemsize
    embedding = model.get_input_embeddings().weight
    tied = embedding is model.get_output_embeddings().weight
    weights = sum(p.numel() * size for p in model.parameters() if tied or p is not embedding)
    text = model.config.get_text_config(decoder=True)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv = 2 * text.num_hidden_layers * text.num_key_value_heads * head_dim * size * context
    return {"weights": weights, "kv_cache": kv * 2 * cases}


def case_edit_roofline(hparams: Any, counts: dict, calib: dict, rollout: int) -> dict:
    """One case's edit seconds on an H100 at ``counts['cases']`` cases at once (see the module
    docstring): the host and floor terms of its rollouts and inner steps, the eager total
    (``seconds``) and the total with the decode under CUDA graphs (``seconds_graphed_decode``)."""
    b, host = counts["cases"], calib["host_seconds_per_kernel"]
    bandwidth, peak = H100["bandwidth_gb_s"] * 1e9, H100["bf16_tflops"] * 1e12
    rounds, steps = hparams.rounds, hparams.rounds * hparams.inner_steps
    read = _decode_bytes(hparams, b, TEACHER_PROMPT + rollout / 2)
    # the solo decode reads the adapters' copies in the model's dtype, the stacked one float32
    solo = counts["engine"].startswith("solo")
    adapters = counts["trainable_numel"] * (hparams.torch_dtype.itemsize if solo else 4)
    decode_bytes = read["weights"] + adapters + read["kv_cache"]
    step_floor = max(decode_bytes / bandwidth, counts["decode_step_flops"] / peak)
    rollout_floor = counts["rollout_fixed_flops"] / peak + rollout * step_floor
    fixed = counts["rollout_fixed_ops"] + counts["round_batch_ops"]
    rollout_kernels = fixed + rollout * counts["decode_step_ops"]
    terms = 2 if hparams.kl_weight > 0 and hparams.nll_weight > 0 else 1
    inner_floor = max(2 * terms * read["weights"] / bandwidth, counts["inner_step_flops"] / peak)
    parts = {
        "rollouts_host": rounds * host * rollout_kernels / b,
        "rollouts_floor": rounds * rollout_floor / b,
        "inner_steps_host": steps * host * counts["inner_step_ops"] / b,
        "inner_steps_floor": steps * inner_floor / b,
    }
    return {
        "cases": b,
        "seconds": sum(parts.values()),
        "seconds_graphed_decode": sum(parts.values()) - parts["rollouts_host"],
        "parts": parts,
        "decode_step_floor_seconds": step_floor,
        "decode_step_bound": "bandwidth" if decode_bytes / bandwidth >= step_floor else "compute",
        "decode_step_bytes": decode_bytes,
        "inner_step_floor_seconds": inner_floor,
        "inner_step_seconds": host * counts["inner_step_ops"] + inner_floor,
        "eager_token_seconds": host * counts["decode_step_ops"] + step_floor,
        "inner_step_bound": (
            "compute" if counts["inner_step_flops"] / peak >= inner_floor else "bandwidth"
        ),
    }


#: the target: one case's edit at the largest B at most this share of its solo edit's time
TARGET_SHARE = 0.2


def batched_figures(hparams: Any, sizes: Sequence[int] = (1, 16)) -> dict:
    """``benchmarks.perf.gpu_path``'s ``batched`` figures for ``hparams`` (a LoRA file) at each
    number of cases at once in ``sizes``, and for the solo edit: the counts, the H100 roofline of
    one case's edit (``case_edit_seconds_roofline``: {B: seconds}, the eager engine;
    ``..._graphed_decode``: the decode under CUDA graphs), each B's share of the solo edit's time
    against ``TARGET_SHARE``, and the solo prediction beside the measured H100 edit it is calibrated
    on."""
    calib = calibration()
    rollout = calib["rollout_tokens"]
    counts = {"solo": batched_counts(hparams, None, rollout=rollout)}
    counts.update({str(b): batched_counts(hparams, b, rollout=rollout) for b in sizes})
    roofline = {k: case_edit_roofline(hparams, c, calib, rollout) for k, c in counts.items()}
    variants = {"eager": "seconds", "graphed_decode": "seconds_graphed_decode"}
    share = {
        k: {v: roofline[k][key] / roofline["solo"][key] for v, key in variants.items()}
        for k in counts
        if k != "solo"
    }
    largest = str(max(sizes))
    return {
        "stacked_decode_graph_breaks": static_step_graph_breaks(hparams, cases=2),
        "card": H100,
        "calibration": calib,
        "budget": {"rounds": hparams.rounds, "inner_steps": hparams.inner_steps},
        "lengths": {
            "student_prompt": STUDENT_PROMPT,
            "teacher_prompt": TEACHER_PROMPT,
            "passage": PASSAGE,
            "rollout": rollout,
            "requests_per_case": 1,
        },
        "dtype": str(hparams.torch_dtype).removeprefix("torch."),
        "device": "meta",
        "decode": "static_decode: true, eager; graphed_decode: its host term dropped",
        "cases_per_pass": "all (a GPU's 'auto')",
        "counts": counts,
        "roofline": roofline,
        "kernels_per_case_per_token": {
            k: c["kernels_per_case_per_token"] for k, c in counts.items()
        },
        "kernels_per_case_per_inner_step": {
            k: c["kernels_per_case_per_inner_step"] for k, c in counts.items()
        },
        "case_edit_seconds_roofline": {k: r["seconds"] for k, r in roofline.items() if k != "solo"},
        "case_edit_seconds_roofline_graphed_decode": {
            k: r["seconds_graphed_decode"] for k, r in roofline.items() if k != "solo"
        },
        "solo_edit_seconds_roofline": {v: roofline["solo"][key] for v, key in variants.items()},
        "case_edit_share_of_solo": share,
        "target": {
            "cases": int(largest),
            "share_at_most": TARGET_SHARE,
            "met": {v: share[largest][v] <= TARGET_SHARE for v in variants},
        },
        "model_check": {  # the solo predictions beside the H100 measurement
            "measured_edit_seconds_graphed_decode": calib["edit_seconds"],
            "predicted_edit_seconds_graphed_decode": roofline["solo"]["seconds_graphed_decode"],
            "measured_inner_step_seconds": calib["inner_step_seconds"],
            "predicted_inner_step_seconds": roofline["solo"]["inner_step_seconds"],
            "measured_eager_decode_tok_s": calib["eager_decode_tok_s"],
            "predicted_eager_decode_tok_s": 1 / roofline["solo"]["eager_token_seconds"],
        },
    }
