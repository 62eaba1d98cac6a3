"""What one HPSE inner step launches, eager and captured (``compile_training``), at a backbone's
real widths: counted on this CPU, extrapolated to the backbone's depth.

The backbone of the hparams file (Qwen2.5-7B for ``hparams/HPSE/qwen2.5-7b.yaml``: its published
config, random weights in the file's dtype, the vocabulary cut to ``--vocab`` ids as the GPU
rehearsal cuts it) is built at 1 and 2 layers. On each, one inner step (the KL term over prompt +
rollout and the NLL term over prompt + passage, forward and backward, then Adam) of a LoRA (or
FT-M) edit at UnKEBench's lengths is counted:

- eager: every aten op that runs a kernel (views excluded), with the counter of the GPU path's op
  counts (``gpu_path.OpCounter``, a ``TorchDispatchMode``), Adam counted as the kernels of a CUDA
  card's fused Adam (``gpu_batched.fused_adam_kernels``; on CPU torch's Adam runs a dozen ops per
  tensor);
- captured: the kernels inductor's generated code calls in the step's graphs (forward and
  backward of the one pass over both terms' stacked rows, ``captured.CapturedJoint``: its fused
  kernels, the matrix products it hands to the library, any aten op it falls back to), read from
  the code (``torch._inductor.utils.run_and_get_code``), plus
  the ops outside the graphs (the loss weights, the gradients' accumulation, Adam and
  ``zero_grad``), counted by the same counter on the step with its graphs replaced by their
  outputs.

A count is linear in the depth (each layer adds the same ops), so the two depths give the count of
every layer and of the rest, and the backbone's depth the step's. The eager step is counted on the
meta device (no arithmetic, as the GPU path's op counts are); the captured one is compiled and run
on this CPU (``first_step_seconds``: that step, compilation included). Prints a table; ``--out``
writes the JSON (docs/perf/captured-step-*.json)::

    OMP_NUM_THREADS=1 python -m benchmarks perf-captured --hparams hparams/HPSE/qwen2.5-7b.yaml \\
        --out docs/perf/captured-step-qwen2.5-7b.json
"""

from __future__ import annotations

import json
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from hpse_easyedit.cli import OneLineParser

from ..markdown import md_table

__all__ = ["count_step", "kernel_calls", "main"]

#: lengths of the counted step (UnKEBench's, as the GPU path's roofline takes them): student prompt,
#: passage, rollout; the counts do not depend on them (``--lengths`` shortens them for a quick run)
LENGTHS = (37, 157, 128)

#: a call in the ``call()`` of inductor's generated wrapper that launches work: a fused kernel
#: (C++ on CPU, Triton on CUDA), a library call (``extern_kernels.mm``) or an aten fallback
_CALL = re.compile(
    r"^\s*(?:\w+\s*=\s*)?(?:buf\w*\s*=\s*)?"
    r"(cpp_fused_\w+|triton_\w+\.run|extern_kernels\.\w+|aten\.\w+(?:\.\w+)?|torch\.ops\.\w+\.\w+(?:\.\w+)?)\("
)


def kernel_calls(code: str) -> dict[str, int]:
    """The calls that launch work in the ``call`` function of one inductor-generated module, by
    kind: ``fused`` (inductor's kernels), ``library`` (``extern_kernels``), ``aten`` (fallbacks)."""
    body = code[code.index("def call(") :] if "def call(" in code else code
    body = body[: body.find("\ndef ", 1)] if "\ndef " in body[1:] else body
    counts = {"fused": 0, "library": 0, "aten": 0}
    for line in body.splitlines():
        m = _CALL.match(line)
        if not m:
            continue
        name = m.group(1)
        if name.startswith(("cpp_fused", "triton_")):
            counts["fused"] += 1
        elif name.startswith("extern_kernels"):
            counts["library"] += 1
        else:
            counts["aten"] += 1
    return counts


def _model(hparams: Any, layers: int, vocab: int, device: str) -> Any:
    from transformers import AutoModelForCausalLM

    from hpse_easyedit.planner import backbone_config

    config = backbone_config(hparams.model_name, layers)
    config.vocab_size = vocab
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=hparams.torch_dtype).eval()


def _objective(model: Any, hp: Any, lengths: Sequence[int] = LENGTHS) -> tuple:
    from hpse_easyedit.editor import HPSEObjective
    from hpse_easyedit.executors import make_executor
    from hpse_easyedit.planner import _placeholder_rollouts
    from hpse_easyedit.prompts import EditPrompts

    student, passage, rollout = lengths
    executor = make_executor(model, hp)
    prompts = [
        EditPrompts(
            subject="s",
            student_ids=[7] * student,
            teacher_ids=[9] * (student + passage),
            passage_ids=[5] * passage,
        )
    ]
    objective = HPSEObjective(executor, prompts, hp, stop_ids=[], pad_id=0)
    objective.use_rollouts(_placeholder_rollouts(prompts, hp, rollout))
    executor.model.train(False)
    return executor, objective, executor.optimizer()


def count_step(
    hparams: Any, layers: int, vocab: int, captured: bool, lengths: Sequence[int] = LENGTHS
) -> dict:
    """Kernels of one inner step (see the module docstring) on the backbone cut to ``layers``."""
    from benchmarks.perf.gpu_batched import _FusedAdamCount
    from benchmarks.perf.meta_ops import OpCounter, at_depth
    from hpse_easyedit.training import inner_step

    hp = at_depth(hparams, layers).with_overrides(
        {"compile_training": captured, "lora_dropout": 0.0}
    )
    # eager: counted on the meta device (no arithmetic), as the GPU path's counts are; captured:
    # compiled and run on the CPU
    device = "cpu" if captured else "meta"
    model = _model(hparams, layers, vocab, device)
    executor, objective, optimizer = _objective(model, hp, lengths)
    out: dict[str, Any] = {"layers": layers, "captured": captured, "device": device}
    params = executor.trainable_parameters()
    if not captured:
        from hpse_easyedit.planner import fused_attention_on_meta

        with fused_attention_on_meta(), OpCounter() as count:
            inner_step(objective, executor.model, _FusedAdamCount(params, count))
        out["kernels"] = count.ops
        out["by_op"] = dict(count.by_op.most_common(12))
        return out
    from torch._inductor.utils import run_and_get_code

    start = time.perf_counter()
    _, codes = run_and_get_code(lambda: inner_step(objective, executor.model, optimizer))
    out["first_step_seconds"] = time.perf_counter() - start  # compilation included
    graphs = [kernel_calls(code) for code in codes]
    out["graphs"] = graphs
    out["outside_graphs"] = _outside_graphs(objective, executor, optimizer)
    out["in_graphs"] = {k: sum(g[k] for g in graphs) for k in ("fused", "library", "aten")}
    out["kernels"] = sum(out["in_graphs"].values()) + out["outside_graphs"]
    return out


def _outside_graphs(objective: Any, executor: Any, optimizer: Any) -> int:
    """The ops of a captured inner step outside its graphs: the same step with each pass's graph
    replaced by an autograd function that hands back the graph's losses and gradients as they are
    (no kernels), counted by ``OpCounter``."""
    from benchmarks.perf.gpu_batched import _FusedAdamCount
    from benchmarks.perf.meta_ops import OpCounter
    from hpse_easyedit.training import inner_step

    params = executor.trainable_parameters()
    recorded: list = []
    for group in objective.step(executor.model):  # each pass's outputs and gradients, once
        loss = sum(w * v for w, v in group.values())
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        terms = {name: (w, v.detach()) for name, (w, v) in group.items()}
        recorded.append((terms, [g if g is None else g.detach() for g in grads]))

    stand = _Standin(recorded, params)
    with OpCounter() as count:
        inner_step(stand, executor.model, _FusedAdamCount(params, count))
    return count.ops - stand.replay_ops


class _Replay(torch.autograd.Function):
    """A pass's recorded losses and gradients handed back as its graph would hand them: each loss
    as a new tensor, each gradient as a new tensor the gradient's accumulation may take over (a
    copy; the copies are the stand-in's own ops, counted in ``_Standin.replay_ops`` and
    subtracted)."""

    @staticmethod
    def forward(ctx: Any, stand: Any, grads: list, n: int, *tensors: torch.Tensor) -> Any:
        ctx.stand, ctx.grads, ctx.n = stand, grads, n
        return tuple(v.clone() for v in tensors[:n])

    @staticmethod
    def backward(ctx: Any, *_: torch.Tensor) -> tuple:
        copies = [None if g is None else g.clone() for g in ctx.grads]
        ctx.stand.replay_ops += sum(c is not None for c in copies)
        return (None, None, None, *[None] * ctx.n, *copies)


class _Standin:
    """An objective whose ``step`` yields the recorded passes' losses through ``_Replay``, one group
    per pass as the objective yields them (its own ops are counted apart and subtracted)."""

    def __init__(self, recorded: list, params: list) -> None:
        self.recorded, self.params = recorded, params
        self.replay_ops = 0

    def step(self, student: Any) -> Any:
        from benchmarks.perf.meta_ops import OpCounter

        for terms, grads in self.recorded:
            values = [v for _, v in terms.values()]
            with OpCounter() as own:  # the stand-in's clones, not the step's
                outs = _Replay.apply(self, grads, len(values), *values, *self.params)
            self.replay_ops += own.ops
            yield {name: (w, out) for (name, (w, _)), out in zip(terms.items(), outs)}


def _per_layer(one: dict, two: dict, depth: int) -> dict:
    per_layer = two["kernels"] - one["kernels"]
    rest = one["kernels"] - per_layer
    return {"per_layer": per_layer, "rest": rest, "at_depth": rest + depth * per_layer}


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m benchmarks perf-captured",
        description="Kernels of one HPSE inner step, eager and captured (compile_training), at a "
        "backbone's widths on 1 and 2 layers, extrapolated to its depth; a table, and JSON with "
        "--out.",
    )
    parser.add_argument("--hparams", default="hparams/HPSE/qwen2.5-7b.yaml", help="hparams file")
    parser.add_argument("--vocab", type=int, default=512, help="vocabulary ids kept (default 512)")
    parser.add_argument(
        "--lengths",
        type=int,
        nargs=3,
        default=list(LENGTHS),
        metavar=("PROMPT", "PASSAGE", "ROLLOUT"),
        help="student prompt, passage and rollout tokens of the counted step (default UnKEBench's "
        f"{' '.join(map(str, LENGTHS))}; the counts do not depend on them, the compile run's "
        "seconds do)",
    )
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)

    from hpse_easyedit.methods import load_hparams
    from hpse_easyedit.planner import backbone_config

    hparams = load_hparams(args.hparams)
    depth = backbone_config(hparams.model_name).num_hidden_layers
    runs = {}
    for captured in (False, True):
        name = "captured" if captured else "eager"
        runs[name] = [
            count_step(hparams, layers, args.vocab, captured, args.lengths) for layers in (1, 2)
        ]
        print(
            f"{name}: {[r['kernels'] for r in runs[name]]} kernels at 1, 2 layers", file=sys.stderr
        )
    figures = {name: _per_layer(*r, depth) for name, r in runs.items()}
    ratio = figures["captured"]["at_depth"] / figures["eager"]["at_depth"]
    result = {
        "hparams": args.hparams,
        "model": hparams.model_name,
        "dtype": hparams.dtype,
        "executor": hparams.executor,
        "depth": depth,
        "vocab": args.vocab,
        "lengths": dict(zip(("student_prompt", "passage", "rollout"), args.lengths)),
        "runs": runs,
        "figures": figures,
        "captured_over_eager": ratio,
        "host": {
            "machine": platform.machine(),
            "processor": platform.processor(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
    }
    rows = [
        [label, figures["eager"][key], figures["captured"][key]]
        for key, label in (
            ("per_layer", "kernels per layer"),
            ("rest", "kernels outside the layers"),
        )
    ]
    rows.append(
        [
            f"kernels at {depth} layers",
            figures["eager"]["at_depth"],
            f"{figures['captured']['at_depth']} ({ratio:.2f}x)",
        ]
    )
    head = [f"one inner step, {hparams.model_name} widths", "eager", "captured"]
    print("\n".join(md_table(head, rows, "lrr")))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
