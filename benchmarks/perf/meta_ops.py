"""What the GPU figures are counted with, on the ``meta`` device (shapes without data): the aten-op
counter (``OpCounter``: an op that runs a kernel is one launch on a GPU, a value read on the host a
stall of the launch queue), the backbone of an hparams file cut to a few layers with its executor,
the static decode step's graph breaks, and the H100 and UnKEBench lengths the roofline assumes.
``gpu_path`` (one edit's decode and training), ``gpu_batched`` (the batched engine's cases) and
``captured`` (the captured inner step) count with these; this module imports none of them."""

from __future__ import annotations

import collections
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "H100",
    "HOST_READS",
    "KERNEL_FREE",
    "ROLLOUT",
    "STUDENT_PROMPT",
    "TEACHER_PROMPT",
    "OpCounter",
    "at_depth",
    "is_view",
    "kernel_op",
    "meta_executor",
    "meta_model",
    "static_step_graph_breaks",
    "top_ops",
]

#: the aten ops that read a device value on the host (besides a ``_to_copy`` to the CPU)
HOST_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default)
#: ops that only re-describe a storage although their schema does not say so (no kernel runs)
KERNEL_FREE = (torch.ops.aten._unsafe_view.default,)
#: the card of the roofline: H100 SXM, HBM3 bandwidth and dense bf16 tensor-core peak (NVIDIA's data
#: sheet)
H100 = {"card": "H100 SXM", "bandwidth_gb_s": 3350.0, "bf16_tflops": 989.0}
#: the rollout lengths of the roofline and the GPU run: UnKEBench's (planner.WORKLOADS)
STUDENT_PROMPT, TEACHER_PROMPT, ROLLOUT = 37, 171 + 157, 128


def is_view(func: Any) -> bool:
    """An op that only re-describes its input's storage (a view: no kernel runs), unlike an in-place
    op."""
    return any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


def kernel_op(func: Any) -> bool:
    """Does the aten op ``func`` run a kernel: not a view and not ``KERNEL_FREE``?"""
    return not is_view(func) and func not in KERNEL_FREE


class OpCounter(TorchDispatchMode):
    """Counts aten ops that run a kernel (views and ``KERNEL_FREE`` excluded), by op, and host
    reads; on the meta device a host read returns 0 (``nonzero``: nothing found)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = self.host_reads = 0
        self.by_op: collections.Counter = collections.Counter()

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        if kernel_op(func):
            self.ops += 1
            self.by_op[func.overloadpacket.__name__] += 1
        to_host = func is torch.ops.aten._to_copy.default and (kwargs or {}).get(
            "device"
        ) == torch.device("cpu")
        if (
            to_host and args[0].device.type != "cpu"
        ):  # a copy to the host (``.tolist()``, ``.cpu()``)
            self.host_reads += 1
            if args[0].device.type == "meta":
                return torch.zeros(args[0].shape, dtype=kwargs.get("dtype") or args[0].dtype)
        if func in HOST_READS:
            self.host_reads += 1
            if args[0].device.type == "meta":
                return (
                    0
                    if func is HOST_READS[0]
                    else torch.zeros(0, args[0].dim(), dtype=torch.long, device="meta")
                )
        return func(*args, **(kwargs or {}))


def at_depth(hparams: Any, layers: int) -> Any:
    """``hparams`` for the backbone cut to ``layers`` layers (FT-M trains the last of them)."""
    return hparams.with_overrides({"ftm_layer": min(hparams.ftm_layer, layers - 1)})


def meta_model(hparams: Any, layers: int | None) -> Any:
    """``hparams``' backbone (cut to ``layers`` layers) on the meta device, in eval mode."""
    from transformers import AutoModelForCausalLM

    from hpse_easyedit.planner import backbone_config

    config = backbone_config(hparams.model_name, layers)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=hparams.torch_dtype).eval()


def meta_executor(hparams: Any, layers: int | None, cases: int | None = None) -> Any:
    """The executor of ``hparams`` around its backbone (cut to ``layers`` layers) on the meta
    device; with ``cases``, the batched engine's stacked executor for that many cases."""
    from hpse_easyedit.executors import make_executor
    from hpse_easyedit.executors.stacked import make_stacked

    model = meta_model(hparams, layers)
    hp = at_depth(hparams, model.config.num_hidden_layers)
    return make_executor(model, hp) if cases is None else make_stacked(model, hp, cases)


def static_step_graph_breaks(hparams: Any, layers: int = 2, cases: int | None = None) -> int:
    """Graph breaks ``torch._dynamo.explain`` finds in one static decode step of the backbone cut to
    ``layers`` layers, with the executor's row switch on (meta device); with ``cases``, the batched
    engine's step: that many cases' student rows, each on its own adapter, and their teachers."""
    from hpse_easyedit.static_decode import StaticDecoder

    executor = meta_executor(hparams, layers, cases)
    rows = cases or 1
    switch = executor.row_switch if cases is None else executor.row_switch_for(list(range(rows)))
    decoder = StaticDecoder(executor.model, [[7] * 30] * rows + [[9] * 60] * rows, 0, 8)
    with torch.no_grad(), switch(torch.tensor([False] * rows + [True] * rows)):
        tokens = decoder.prefill().argmax(-1).view(2 * rows, 1)
        torch._dynamo.reset()
        return torch._dynamo.explain(decoder.step)(tokens).graph_break_count


def top_ops(counts: dict[str, float], n: int) -> dict[str, float]:
    """The ``n`` ops of ``counts`` (op name -> count) with the largest nonzero counts, largest
    first; a tie goes by the op's name, so the list does not move with the order the names came
    in."""
    return dict(
        sorted(((k, v) for k, v in counts.items() if v), key=lambda kv: (-kv[1], kv[0]))[:n]
    )
