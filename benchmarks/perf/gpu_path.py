"""The GPU path measured without a GPU (``benchmarks.perf``, ``python -m benchmarks gpu-path``):
kernels and host syncs per decoded token, graph breaks of the static decode step, the H100 roofline
of a decode step, and the memory planner against a measured CPU edit; with ``--batched``, the
batched engine's kernels per case and the H100 roofline of one case's edit (``benchmarks.
gpu_batched``); with ``--device cuda``, the figures only a GPU measures.

On a GPU each aten op of a decode step that runs a kernel is about one kernel launch, and each read
of a device value on the host (``.item()``, ``bool()``, ``nonzero``) stalls the launch queue; at 7B
widths a launch-bound decode pays for both, not for bandwidth. The counts run the project's own
rollout (``rollout.batched_hybrid_rollout``, dynamic or ``static_decode``;
``batched_hybrid_rollouts`` for the requests of an edit decoded as one batch) on the ``meta`` device
(shapes without data; a value read on the host is counted and answered with 0, which keeps the loop
going) for two rollout lengths and two depths, and scale to the model's depth: ``per_step =
(ops(2k) - ops(k)) / k`` (k: the stop test's period, 1 on the dynamic path), ``per_layer =
per_step(3 layers) - per_step(2 layers)``, the rest is outside the layers; a decoded token's share
is ``per_step / requests``. Counted as kernels: every aten op but views and ``_unsafe_view`` (a
reshape's result, no kernel), with scaled dot-product attention as the one fused kernel a GPU runs
(``planner.fused_attention_on_meta``) where the meta device would decompose it. Graph breaks:
``torch._dynamo.explain`` of the static decode step.

The roofline of a decode step on an H100 (``H100``): the bytes it must read (every weight the step
multiplies by, the adapters in the model's dtype, and the KV cache at the rollout's mean context)
over the memory bandwidth, against its FLOPs (``torch.utils.flop_counter.FlopCounterMode`` over one
step at the backbone's full depth on the meta device) over the bf16 dense peak; the larger is the
floor.

``--graphs`` (with ``--device``): also an edit's time with ``compile_training: graphs``, first and
at steady state. ``--profile`` (with ``--device``): where a rollout token's and an inner step's
time goes on the device (``kernel_profile``: ``torch.profiler``'s kernels, their summed and
overlapping time, the device's idle time, by kernel family)."""

from __future__ import annotations

import collections
import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from hpse_easyedit.cli import OneLineParser

from .machine import sync
from .meta_ops import (
    H100,
    ROLLOUT,
    STUDENT_PROMPT,
    TEACHER_PROMPT,
    OpCounter,
    at_depth,
    kernel_op,
    meta_executor,
    static_step_graph_breaks,
    top_ops,
)

__all__ = [
    "H100",
    "OpCounter",
    "compiled_decode_kernels",
    "decode_counts",
    "gpu_figures",
    "planner_check",
    "roofline",
    "static_step_graph_breaks",
]


def _requests(count: int) -> list[tuple[list[int], list[int]]]:
    """``count`` requests' (student, teacher) prompt ids of the counting runs."""
    return [([7] * 30, [9] * (60 + 10 * i)) for i in range(count)]


def _rollout_counts(
    hparams: Any, layers: int, tokens: int, static: bool, requests: int
) -> OpCounter:
    from hpse_easyedit.planner import fused_attention_on_meta
    from hpse_easyedit.rollout import batched_hybrid_rollout, batched_hybrid_rollouts

    executor = meta_executor(hparams, layers)
    gate = dict(
        tau=hparams.tau,
        kappa=hparams.kappa,
        top_k=hparams.top_k,
        max_new_tokens=tokens,
        stop_ids=[0],
        pad_id=0,
        stop_every=hparams.decode_stop_every,
    )
    with fused_attention_on_meta(), OpCounter() as count:
        if requests > 1:
            batched_hybrid_rollouts(
                executor.model, executor.row_switch, _requests(requests), **gate
            )
        else:
            ((student, teacher),) = _requests(1)
            batched_hybrid_rollout(
                executor.model, executor.row_switch, student, teacher, static_decode=static, **gate
            )
    return count


def decode_counts(hparams: Any, static: bool, requests: int = 1) -> dict:
    """Kernels and host reads per decoded rollout token (a step's student and teacher rows of every
    request in one forward, divided by ``requests``) at the depth of ``hparams``' backbone, from 2-
    and 3-layer counts, and the ops that make them up; see the module docstring. ``requests`` > 1
    decodes that many requests as one batch on the static path."""
    from hpse_easyedit.planner import backbone_config

    if requests > 1 and not static:
        raise ValueError("the requests of an edit decode as one batch on the static path only")
    depth = backbone_config(hparams.model_name).num_hidden_layers
    every = hparams.decode_stop_every if static else 1
    per_step, by_op = {}, {}
    for layers in (2, 3):
        short = _rollout_counts(hparams, layers, every, static, requests)
        long = _rollout_counts(hparams, layers, 2 * every, static, requests)
        per_step[layers] = (
            (long.ops - short.ops) / every,
            (long.host_reads - short.host_reads) / every,
        )
        by_op[layers] = {op: (long.by_op[op] - short.by_op[op]) / every for op in long.by_op}
    per_layer = per_step[3][0] - per_step[2][0]
    outside = per_step[2][0] - 2 * per_layer
    step = outside + depth * per_layer
    ops = {}
    for op in by_op[2].keys() | by_op[3].keys():
        layer_share = by_op[3].get(op, 0) - by_op[2].get(op, 0)
        ops[op] = (by_op[2].get(op, 0) - 2 * layer_share + depth * layer_share) / requests
    return {
        "requests": requests,
        "ops_per_layer": per_layer,
        "ops_outside_layers": outside,
        "layers": depth,
        "ops_per_step": step,
        "ops_per_token": step / requests,
        "host_syncs_per_token": per_step[2][1] / requests,
        "top_ops_per_token": top_ops(ops, 8),
    }


#: a kernel launch in the ``call`` function of inductor's generated code: a fused kernel, an extern
#: kernel (matmuls) or an aten fallback
_LAUNCH = re.compile(
    r"^\s+(?:\w+ = )?(cpp_fused_\w+|triton_\w+\.run|extern_kernels\.\w+|torch\.ops\.aten\.\w+)\(",
    re.MULTILINE,
)


def _compiled_step_kernels(hparams: Any, layers: int, vocab: int) -> int:
    """Kernels one compiled static decode step launches: the step of the backbone cut to ``layers``
    layers (random weights in the file's dtype, the vocabulary shrunk to ``vocab`` ids: the head is
    one matmul at any size) under ``torch.compile(fullgraph=True)`` with inductor on the CPU,
    counted in the code inductor generates."""
    from torch._inductor.utils import run_and_get_code
    from transformers import AutoModelForCausalLM

    from hpse_easyedit.executors import make_executor
    from hpse_easyedit.planner import backbone_config
    from hpse_easyedit.static_decode import StaticDecoder

    config = backbone_config(hparams.model_name, layers)
    config.vocab_size = vocab
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=hparams.torch_dtype).eval()
    executor = make_executor(model, at_depth(hparams, layers))
    decoder = StaticDecoder(executor.model, [[7] * 30, [9] * 60], 0, 8)
    with torch.no_grad(), executor.row_switch(torch.tensor([False, True])):
        tokens = decoder.prefill().argmax(-1).view(2, 1)
        torch._dynamo.reset()
        _, codes = run_and_get_code(torch.compile(decoder.step, fullgraph=True), tokens)
    return sum(
        len(_LAUNCH.findall(code[code.index("def call(") :]))
        for code in codes
        if "def call(" in code
    )


def compiled_decode_kernels(hparams: Any, vocab: int = 512) -> dict:
    """Kernels per decoded token of the compiled static decode step (``static_decode: compile``: on
    a GPU CUDA graphs replay it as one launch, and its kernels are inductor's fusions) at the depth
    of ``hparams``' backbone, from 2- and 3-layer compilations scaled as ``decode_counts`` scales.
    Inductor's CPU code stands in for its CUDA code here: the same graph and fusion rules, another
    code generator (an estimate of the CUDA count, not a count of it)."""
    from hpse_easyedit.planner import backbone_config

    depth = backbone_config(hparams.model_name).num_hidden_layers
    two, three = (_compiled_step_kernels(hparams, layers, vocab) for layers in (2, 3))
    per_layer = three - two
    outside = two - 2 * per_layer
    return {
        "kernels_per_layer": per_layer,
        "kernels_outside_layers": outside,
        "layers": depth,
        "kernels_per_token": outside + depth * per_layer,
        "requests": 1,
    }


def roofline(hparams: Any, requests: int = 1) -> dict:
    """The H100 floor of one decode step of ``requests`` requests (student and teacher rows each) of
    ``hparams``' backbone at full depth, at UnKEBench's lengths: the bytes it reads over the
    bandwidth against its FLOPs over the bf16 peak (see the module docstring), and the rollout
    tokens per second that floor allows."""
    from torch.utils.flop_counter import FlopCounterMode

    from hpse_easyedit.static_decode import StaticDecoder

    executor = meta_executor(hparams, None)
    model = executor.model
    config = model.config.get_text_config(decoder=True)
    dtype_bytes = hparams.torch_dtype.itemsize
    embedding = model.get_input_embeddings().weight
    tied = embedding is model.get_output_embeddings().weight
    weights = sum(p.numel() * dtype_bytes for p in model.parameters() if tied or p is not embedding)
    rows = 2 * requests
    context = TEACHER_PROMPT + ROLLOUT // 2
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_cache = (
        2
        * config.num_hidden_layers
        * config.num_key_value_heads
        * head_dim
        * dtype_bytes
        * context
        * rows
    )
    decoder = StaticDecoder(
        model, [[7] * STUDENT_PROMPT] * requests + [[9] * TEACHER_PROMPT] * requests, 0, ROLLOUT
    )
    teacher_rows = torch.tensor([False] * requests + [True] * requests)
    with torch.no_grad(), executor.row_switch(teacher_rows):
        tokens = decoder.prefill().argmax(-1).view(rows, 1)
        with FlopCounterMode(display=False) as flops:
            decoder.step(tokens)
    step_flops = flops.get_total_flops()
    bandwidth_s = (weights + kv_cache) / (H100["bandwidth_gb_s"] * 1e9)
    compute_s = step_flops / (H100["bf16_tflops"] * 1e12)
    floor_s = max(bandwidth_s, compute_s)
    return {
        **H100,
        "requests": requests,
        "weight_bytes_per_step": weights,
        "kv_cache_bytes_per_step": kv_cache,
        "flops_per_step": step_flops,
        "bandwidth_seconds_per_step": bandwidth_s,
        "compute_seconds_per_step": compute_s,
        "bound": "bandwidth" if bandwidth_s >= compute_s else "compute",
        "gpu_bandwidth_floor_tok_s": requests / floor_s,
    }


def planner_check(model: Any, tok: Any, hparams: Any, passage: str) -> dict:
    """The planner's predicted peak of one cut-down edit (one round, two inner steps) on ``model``
    against the peak that PyTorch's CPU allocator reached for it: every allocation and free of the
    edit recorded by ``torch.profiler(profile_memory=True)``, summed in time order, plus the weights
    the edit started with. The plan gets the edit's real lengths (prompts, passage, rollout), so the
    comparison tests the planner's model of the edit, not the benchmark's typical lengths. ``error``
    = predicted / measured - 1."""
    from torch.profiler import ProfilerActivity, profile

    from hpse_easyedit import hpse_edit, restore_weights
    from hpse_easyedit.captured import training_mode
    from hpse_easyedit.editor import edit_prompts
    from hpse_easyedit.planner import GIB, Workload, plan_edit

    hp = hparams.with_overrides({"rounds": 1, "inner_steps": 2})
    requests = [{"subject": "Selma Varrick", "target_new": passage}]
    prompts = edit_prompts(model, tok, requests, hp)[0]
    weights = {
        t.untyped_storage()._cdata: t.untyped_storage().nbytes()
        for t in [*model.parameters(), *model.buffers()]
    }
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = hpse_edit(model, tok, requests, hp)
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    rollout = len(result.rollouts[0][0])
    model = restore_weights(result.model, result.weights_copy)
    workload = Workload(
        "measured",
        requests=1,
        passage_tokens=len(prompts.passage_ids),
        max_new_tokens=rollout,
        student_prompt_tokens=len(prompts.student_ids),
        teacher_overhead_tokens=len(prompts.teacher_ids) - len(prompts.passage_ids),
    )
    # the step the edit ran (compile_training: auto captures it on a card only)
    captured = training_mode(hp.compile_training, model, hp.gradient_checkpointing)
    plan = plan_edit(
        hp.with_overrides({"model_name": hparams.model_name, "compile_training": captured}),
        workload,
    )
    predicted = max(
        plan["phases"][p]["peak_gib"] for p in ("trainable_state", "rollout", "training")
    )
    measured = (sum(weights.values()) + peak) / GIB
    return {
        "predicted_gib": predicted,
        "measured_gib": measured,
        "error": predicted / measured - 1,
        "rollout_tokens": rollout,
        "allocator_events": len(events),
        "model": model,
    }


def gpu_figures(
    hparams: Any,
    *,
    device: str,
    layers: int | None = None,
    vocab: int | None = None,
    repeats: int = 3,
    profile: bool = False,
    graphs: bool = False,
    partial: Callable[[dict], None] | None = None,
) -> dict:
    """What only a GPU measures, on a random-weight model of ``hparams``' backbone (its published
    config, built straight on ``device`` in the file's dtype; ``layers``/``vocab`` cut it for a dry
    run): rollout tokens per second of one request at UnKEBench's lengths on the dynamic decode, the
    static one and the compiled static one (CUDA graphs on CUDA; the best of ``repeats`` after a
    first run that compiles), the seconds of one single-request edit with the file's rounds and
    inner steps (the edit's own loop, ``training.train_edit``, on the compiled static decode), and
    the peak reserved memory plus the CUDA context (and, in ``edit_peak_gib``, each edit's own
    allocated and reserved peak, without the context); with ``profile``, where the time of a
    rollout token and of an inner step goes (``kernel_profile``); with ``graphs``, also a first and
    a steady-state edit with ``compile_training: graphs`` (the captured step under CUDA graphs,
    ``graphs_first`` and ``graphs_steady``). ``partial`` is called with the
    figures so far after the rollouts and after each edit (a step stopped at its time limit keeps
    them)."""
    from transformers import AutoModelForCausalLM

    from hpse_easyedit import restore_weights
    from hpse_easyedit.editor import HPSEObjective
    from hpse_easyedit.executors import make_executor
    from hpse_easyedit.planner import backbone_config
    from hpse_easyedit.prompts import EditPrompts
    from hpse_easyedit.training import train_edit

    config = backbone_config(hparams.model_name, layers)
    if vocab is not None:
        config.vocab_size = vocab
    target = torch.device(device)
    torch.manual_seed(0)
    with target:
        model = AutoModelForCausalLM.from_config(config, dtype=hparams.torch_dtype).eval()
    hp = at_depth(hparams, config.num_hidden_layers).with_overrides({"max_new_tokens": ROLLOUT})
    if target.type == "cuda":
        torch.cuda.reset_peak_memory_stats(target)
    executor = make_executor(model, hp)
    student, teacher = [7] * STUDENT_PROMPT, [9] * TEACHER_PROMPT
    rollout: dict[str, float] = {}
    failed: dict[str, str] = {}
    for mode in (False, True, "compile"):
        name = {False: "dynamic", True: "static", "compile": "compiled"}[mode]
        try:
            rollout[name] = _rollout_tok_s(executor, hp, student, teacher, mode, repeats)
            print(f"rollout {name}: {rollout[name]:.1f} tok/s", file=sys.stderr, flush=True)
        except Exception as exc:  # a failing mode must not lose the figures of the others
            failed[name] = f"{type(exc).__name__}: {exc}"[:500]
    executor.finish()
    model = executor.model
    hp = hp.with_overrides({"static_decode": "compile" if "compiled" in rollout else True})
    edits: dict[str, float] = {}
    out = {
        "device": str(target),
        "layers": config.num_hidden_layers,
        "vocab": config.vocab_size,
        "rollout_tokens": ROLLOUT,
        "gpu_rollout_tok_s": max(rollout.values(), default=None),
        "rollout_tok_s": rollout,
        "rollout_failed": failed,
        "gpu_edit_seconds": None,
        "edit_seconds": edits,
        "edit_compile_training": hp.compile_training,
        "edit_static_decode": hp.static_decode,
        "rounds": hp.rounds,
        "inner_steps": hp.inner_steps,
    }
    if partial is not None:
        partial(out)
    prompts = [
        EditPrompts(subject="s", student_ids=student, teacher_ids=teacher, passage_ids=[5] * 157)
    ]
    # the file's inner step (compile_training: auto captures it on a card): a first edit that
    # compiles it, then one at steady state; with ``graphs`` the same two under CUDA graphs; then
    # the eager step for comparison
    runs = [("first", hp), ("steady", hp)]
    if graphs:
        under_graphs = hp.with_overrides({"compile_training": "graphs"})
        runs += [("graphs_first", under_graphs), ("graphs_steady", under_graphs)]
    runs.append(("eager_step", hp.with_overrides({"compile_training": False})))
    peaks: dict[str, dict[str, float]] = {}
    overall_reserved = 0
    for name, settings in runs:
        executor = make_executor(model, settings)
        unedited = executor.weights_copy()
        objective = HPSEObjective(executor, prompts, settings, stop_ids=[], pad_id=0)
        sync(target)
        if target.type == "cuda":  # each edit's own peak (the process's is kept beside it)
            overall_reserved = max(overall_reserved, torch.cuda.max_memory_reserved(target))
            torch.cuda.reset_peak_memory_stats(target)
        t0 = time.perf_counter()
        try:
            train_edit(executor, settings, objective, rounds=hp.rounds, inner_steps=hp.inner_steps)
            sync(target)
            edits[name] = time.perf_counter() - t0
        except Exception as exc:  # a failing edit must not lose the figures of the others
            failed[f"edit_{name}"] = f"{type(exc).__name__}: {exc}"[:500]
            continue
        finally:
            model = restore_weights(executor.model, unedited)
        if target.type == "cuda":
            peaks[name] = {
                "allocated_gib": torch.cuda.max_memory_allocated(target) / 2**30,
                "reserved_gib": torch.cuda.max_memory_reserved(target) / 2**30,
            }
            out["edit_peak_gib"] = peaks
        print(
            f"edit {name} ({settings.static_decode=}, {objective.captured=}): {edits[name]:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        out["gpu_edit_seconds"] = edits.get("steady", edits.get("first"))
        if partial is not None:
            partial(out)
    if profile:
        out["profile"] = _profiles(model, hp, prompts, student, teacher)
    if target.type == "cuda":
        free, total = torch.cuda.mem_get_info(target)
        context = total - free - torch.cuda.memory_reserved(target)
        out["gpu_name"] = torch.cuda.get_device_name(target)
        reserved = max(overall_reserved, torch.cuda.max_memory_reserved(target))
        out["gpu_context_gib"] = context / 2**30
        out["gpu_peak_reserved_gib"] = (reserved + context) / 2**30
    return out


def _profiles(model: Any, hp: Any, prompts: list, student: list, teacher: list) -> dict:
    """``kernel_profile`` of one rollout on the edit's decode and of two inner steps on a rollout,
    each after one that warms up, with a fresh executor around ``model``."""
    from hpse_easyedit.editor import HPSEObjective
    from hpse_easyedit.executors import make_executor
    from hpse_easyedit.training import inner_step

    device = next(model.parameters()).device
    executor = make_executor(model, hp)

    def rollout() -> int:
        return len(_rollout(executor, hp, student, teacher, hp.static_decode))

    rollout()  # (re)compiles where the new executor's guards ask for it
    out = {"decode": hp.static_decode, "rollout_token": kernel_profile(rollout, device)}
    objective = HPSEObjective(executor, prompts, hp, stop_ids=[], pad_id=0)
    optimizer = executor.optimizer()
    executor.model.eval()
    objective.start_round(executor.model)
    executor.model.train(hp.lora_dropout > 0)
    inner_step(objective, executor.model, optimizer)

    def steps() -> int:
        for _ in range(2):
            inner_step(objective, executor.model, optimizer)
        return 2

    out["inner_step"] = kernel_profile(steps, device)
    executor.model.eval()
    executor.finish()
    for name, figures in out.items():
        if name != "decode":
            print(
                f"profile {name}: {figures['wall_ms']:.2f} ms wall, {figures['busy_ms']:.2f} ms "
                f"busy, {figures['kernels']:.0f} kernels",
                file=sys.stderr,
                flush=True,
            )
    return out


def _rollout_tok_s(
    executor: Any, hp: Any, student: list, teacher: list, mode: Any, repeats: int
) -> float:
    """Rollout tokens per second of one request decoded with ``static_decode=mode``: the best of
    ``repeats`` timed runs after one that warms up (and compiles)."""
    device = next(executor.model.parameters()).device
    best = float("inf")
    for run in range(repeats + 1):
        sync(device)
        t0 = time.perf_counter()
        ro = _rollout(executor, hp, student, teacher, mode)
        sync(device)
        if run:
            best = min(best, time.perf_counter() - t0)
    return len(ro) / best


def _rollout(executor: Any, hp: Any, student: list, teacher: list, mode: Any) -> Any:
    """One request's ``ROLLOUT``-token hybrid rollout, decoded with ``static_decode=mode``."""
    from hpse_easyedit.rollout import batched_hybrid_rollout

    return batched_hybrid_rollout(
        executor.model,
        executor.row_switch,
        student,
        teacher,
        tau=hp.tau,
        kappa=hp.kappa,
        top_k=hp.top_k,
        max_new_tokens=ROLLOUT,
        stop_ids=[],
        pad_id=0,
        static_decode=mode,
        stop_every=hp.decode_stop_every,
    )


#: kernel families of a profile, by the first pattern a kernel's name matches (CUDA kernel names, or
#: aten op names on CPU)
KERNEL_FAMILIES = tuple(
    (family, re.compile(pattern, re.I))
    for family, pattern in (
        ("matmul", r"gemm|gemv|cutlass|xmma|nvjet|cublas|aten::(mm|bmm|addmm|matmul|linear)\b"),
        ("attention", r"flash|fmha|attention|sdpa"),
        ("fused (triton)", r"^triton"),
        ("reduction, softmax, norm", r"reduce|softmax|norm|sum|mean|max"),
        ("copy, index, fill", r"copy|memcpy|memset|cat|index|gather|scatter|fill|where"),
    )
)


def _family(name: str) -> str:
    return next((family for family, rx in KERNEL_FAMILIES if rx.search(name)), "elementwise, other")


def kernel_profile(run: Callable[[], int], device: torch.device, top: int = 12) -> dict:
    """Where the time of ``run()`` goes, per unit (``run`` returns how many it made: decoded
    tokens, inner steps), from ``torch.profiler``: on CUDA its kernels (those a CUDA graph replays
    too) and their durations; on CPU (a dry run) its aten ops but views, each with its self time.
    ``wall_ms`` is measured under the profiler (its host overhead included); ``busy_ms`` is the
    union of the kernels' intervals (on CPU the sum of self times), so ``wall_ms - busy_ms`` is the
    time the device waits (launches, host work, syncs); ``kernel_ms`` is their summed durations."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync(device)
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        units = run()
        sync(device)
        wall = time.perf_counter() - t0
    by_name: dict[str, list[float]] = collections.defaultdict(list)  # microseconds
    if cuda:
        kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
        busy, end = 0.0, float("-inf")
        for a, b in sorted((e.time_range.start, e.time_range.end) for e in kernels):
            if b > end:  # the union of the intervals
                busy += b - max(a, end)
                end = b
        for e in kernels:
            by_name[e.name].append(e.time_range.elapsed_us())
    else:
        for e in prof.events():
            if e.device_type == DeviceType.CPU and _runs_a_kernel(e.name):
                by_name[e.name].append(e.self_cpu_time_total)
        busy = sum(map(sum, by_name.values()))
    families: dict[str, dict[str, float]] = {}
    for name, times in by_name.items():
        f = families.setdefault(_family(name), {"kernels": 0.0, "ms": 0.0})
        f["kernels"] += len(times) / units
        f["ms"] += sum(times) / 1e3 / units
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {
        "units": units,
        "wall_ms": 1e3 * wall / units,
        "kernels": sum(map(len, by_name.values())) / units,
        "kernel_ms": sum(map(sum, by_name.values())) / 1e3 / units,
        "busy_ms": busy / 1e3 / units,
        "families": dict(sorted(families.items(), key=lambda kv: -kv[1]["ms"])),
        "top": [
            {
                "name": name[:160],
                "calls": len(times) / units,
                "mean_us": sum(times) / len(times),
                "ms": sum(times) / 1e3 / units,
            }
            for name, times in ranked
        ],
    }


def _runs_a_kernel(name: str) -> bool:
    """Is the profiled CPU event ``name`` an aten op that runs a kernel (``kernel_op``)?"""
    if not name.startswith("aten::"):
        return False
    packet = getattr(torch.ops.aten, name.removeprefix("aten::"), None)
    try:
        func = getattr(packet, packet.overloads()[0])
    except (AttributeError, IndexError, RuntimeError):
        return True
    return kernel_op(func)


def _cpu_figures(path: Path, compiled: bool) -> dict:
    from hpse_easyedit import HPSEHyperParams

    hp = HPSEHyperParams.from_hparams(path)
    requests = 3  # MQuAKE-uns edits a case's three passages jointly
    return {
        **({"compiled": compiled_decode_kernels(hp)} if compiled else {}),
        "executor": hp.executor,
        "dynamic": decode_counts(hp, static=False),
        "static": decode_counts(hp, static=True),
        f"static_{requests}_requests": decode_counts(hp, static=True, requests=requests),
        "static_graph_breaks": static_step_graph_breaks(hp),
        "roofline": roofline(hp),
    }


def _batched_figures(path: Path, sizes: list[int]) -> dict:
    """``benchmarks.perf.gpu_batched``'s figures of the file at ``path`` under ``batched``, with its
    ``case_edit_seconds_roofline`` also at the file's top level; a note for a file that does not
    edit with LoRA."""
    from hpse_easyedit import HPSEHyperParams

    from .gpu_batched import batched_figures

    hp = HPSEHyperParams.from_hparams(path)
    if hp.executor != "lora":
        return {"batched": {"skipped": f"executor {hp.executor}: the batched counts are LoRA's"}}
    figures = batched_figures(hp, sorted(set(sizes)))
    return {
        "batched": figures,
        "case_edit_seconds_roofline": figures["case_edit_seconds_roofline"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m benchmarks gpu-path",
        description="The GPU path's figures: on CPU (the default) kernels and host syncs per "
        "decoded token, graph breaks and the H100 roofline of every shipped 7B-9B HPSE file, "
        "counted on the meta device; with --device cuda, rollout "
        "tokens/s, one edit's seconds and reserved memory on that GPU.",
    )
    parser.add_argument(
        "--hparams", nargs="+", help="HPSE files (default: every shipped 7B-9B file)"
    )
    parser.add_argument(
        "--device", default="cpu", help="cpu: counts and roofline (no GPU); cuda[:N]: measure on it"
    )
    parser.add_argument(
        "--layers", type=int, help="with --device: cut the model to this many layers (a dry run)"
    )
    parser.add_argument(
        "--vocab", type=int, help="with --device: shrink the vocabulary (a dry run)"
    )
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="on CPU, also count the kernels of the compiled "
        "static step (inductor; minutes per file)",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="hparams overrides"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="with --device: also profile a rollout token and an inner step (kernels, their time, "
        "the device's idle time; torch.profiler)",
    )
    parser.add_argument(
        "--graphs",
        action="store_true",
        help="with --device: also time a first and a steady-state edit with compile_training: "
        "graphs (the captured inner step under CUDA graphs)",
    )
    parser.add_argument(
        "--batched",
        type=int,
        nargs="+",
        metavar="B",
        help="on CPU, also count the batched engine's kernels per case at these numbers of cases "
        "at once, with the H100 roofline of one case's edit (LoRA files; "
        "benchmarks.perf.gpu_batched)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="with --device: timed rollouts per decode mode, after one that warms up (default 3)",
    )
    parser.add_argument("--out", help="write the JSON here (default: stdout)")
    args = parser.parse_args(argv)
    if args.batched and (args.device != "cpu" or args.layers is not None):
        parser.error("--batched counts on CPU: leave out --device and --layers")
    if args.out and Path(args.out).exists():
        parser.error(f"--out {args.out} exists; choose a new file")
    if args.repeats < 1:
        parser.error("--repeats: at least 1 timed rollout")
    if args.batched and min(args.batched) < 1:
        parser.error("--batched: numbers of cases at once are at least 1")
    from hpse_easyedit import HPSEHyperParams

    root = Path(__file__).resolve().parents[2] / "hparams" / "HPSE"
    paths = (
        [Path(p) for p in args.hparams]
        if args.hparams
        else [p for p in sorted(root.glob("*.yaml")) if not p.stem.startswith("smollm2")]
    )
    report: dict[str, Any] = {"torch": torch.__version__}

    def write(report: dict) -> None:
        text = json.dumps(report, indent=1)
        if args.out:
            Path(args.out).write_text(text + "\n")
        else:
            sys.stdout.write(text + "\n")

    for path in paths:
        if args.device == "cpu" and args.layers is None:
            report[path.stem] = _cpu_figures(path, args.compiled)
            if args.batched:
                report[path.stem].update(_batched_figures(path, args.batched))
        else:
            hp = HPSEHyperParams.from_hparams(path).with_overrides(list(args.set))
            floor = roofline(hp)

            def partial(figures: dict, stem: str = path.stem, floor: dict = floor) -> None:
                if args.out:  # the figures so far, in case the step is stopped
                    write({**report, stem: {**figures, "roofline": floor, "partial": True}})

            report[path.stem] = {
                **gpu_figures(
                    hp,
                    device=args.device,
                    layers=args.layers,
                    vocab=args.vocab,
                    repeats=args.repeats,
                    profile=args.profile,
                    graphs=args.graphs,
                    partial=partial,
                ),
                "roofline": floor,
            }
    write(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
