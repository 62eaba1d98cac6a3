"""The GPU path measured without a GPU (``benchmarks.perf``): kernels and host syncs per decoded
token, graph breaks of the static decode step, and the memory planner against a measured CPU edit.

On a GPU each aten op of a decode step that is not a view is about one kernel launch, and each read
of a device value on the host (``.item()``, ``bool()``, ``nonzero``) stalls the launch queue; at 7B
widths a launch-bound decode pays for both, not for bandwidth. The counts run the project's own
rollout (``rollout.batched_hybrid_rollout``, dynamic or ``static_decode``) on the ``meta`` device
(shapes without data; a value read on the host is counted and answered with 0, which keeps the loop
going) for two rollout lengths and two depths, and scale to the model's depth: ``per_token =
(ops(2k) - ops(k)) / k`` (k: the stop test's period, 1 on the dynamic path), ``per_layer =
per_token(3 layers) - per_token(2 layers)``, the rest is outside the layers. Graph breaks:
``torch._dynamo.explain`` of the static decode step."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpCounter", "decode_counts", "planner_check", "static_step_graph_breaks"]

#: the aten ops that read a device value on the host
HOST_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default)


def _is_view(func: Any) -> bool:
    """An op that only re-describes its input's storage (a view: no kernel runs), unlike an in-place
    op."""
    return any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


class OpCounter(TorchDispatchMode):
    """Counts aten ops that run a kernel (views excluded) and host reads; on the meta device a host
    read returns 0 (``nonzero``: nothing found)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = self.host_reads = 0

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        self.ops += not _is_view(func)
        if func in HOST_READS:
            self.host_reads += 1
            if args[0].device.type == "meta":
                return (
                    0
                    if func is HOST_READS[0]
                    else torch.zeros(0, args[0].dim(), dtype=torch.long, device="meta")
                )
        return func(*args, **(kwargs or {}))


def _at_depth(hparams: Any, layers: int) -> Any:
    """``hparams`` for the backbone cut to ``layers`` layers (FT-M trains the last of them)."""
    return hparams.with_overrides({"ftm_layer": min(hparams.ftm_layer, layers - 1)})


def _rollout_counts(hparams: Any, layers: int, tokens: int, static: bool) -> tuple[int, int]:
    from transformers import AutoModelForCausalLM

    from hpse_easyedit.executors import make_executor
    from hpse_easyedit.planner import backbone_config
    from hpse_easyedit.rollout import batched_hybrid_rollout

    config = backbone_config(hparams.model_name, layers)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=hparams.torch_dtype).eval()
    executor = make_executor(model, _at_depth(hparams, layers))
    gate = dict(
        tau=hparams.tau,
        kappa=hparams.kappa,
        top_k=hparams.top_k,
        max_new_tokens=tokens,
        stop_ids=[0],
        pad_id=0,
        static_decode=static,
        stop_every=hparams.decode_stop_every,
    )
    with OpCounter() as count:
        batched_hybrid_rollout(executor.model, executor.row_switch, [7] * 30, [9] * 60, **gate)
    return count.ops, count.host_reads


def decode_counts(hparams: Any, static: bool) -> dict:
    """Aten ops and host reads per decoded rollout token (student and teacher rows in one forward)
    at the depth of ``hparams``' backbone, from 2- and 3-layer counts; see the module docstring."""
    from hpse_easyedit.planner import backbone_config

    depth = backbone_config(hparams.model_name).num_hidden_layers
    every = hparams.decode_stop_every if static else 1
    per_token = {}
    for layers in (2, 3):
        short = _rollout_counts(hparams, layers, every, static)
        long = _rollout_counts(hparams, layers, 2 * every, static)
        per_token[layers] = ((long[0] - short[0]) / every, (long[1] - short[1]) / every)
    per_layer = per_token[3][0] - per_token[2][0]
    outside = per_token[2][0] - 2 * per_layer
    return {
        "ops_per_layer": per_layer,
        "ops_outside_layers": outside,
        "layers": depth,
        "ops_per_token": outside + depth * per_layer,
        "host_syncs_per_token": per_token[2][1],
    }


def static_step_graph_breaks(hparams: Any, layers: int = 2) -> int:
    """Graph breaks ``torch._dynamo.explain`` finds in one static decode step of the backbone cut to
    ``layers`` layers, with the executor's row switch on (meta device)."""
    from transformers import AutoModelForCausalLM

    from hpse_easyedit.executors import make_executor
    from hpse_easyedit.planner import backbone_config
    from hpse_easyedit.static_decode import StaticDecoder

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            backbone_config(hparams.model_name, layers), dtype=hparams.torch_dtype
        ).eval()
    executor = make_executor(model, _at_depth(hparams, layers))
    decoder = StaticDecoder(executor.model, [[7] * 30, [9] * 60], 0, 8)
    with torch.no_grad(), executor.row_switch(torch.tensor([False, True])):
        tokens = decoder.prefill().argmax(-1).view(2, 1)
        torch._dynamo.reset()
        return torch._dynamo.explain(decoder.step)(tokens).graph_break_count


def planner_check(model: Any, tok: Any, hparams: Any, passage: str) -> dict:
    """The planner's predicted peak of one cut-down edit (one round, two inner steps) on ``model``
    against the peak that PyTorch's CPU allocator reached for it: every allocation and free of the
    edit recorded by ``torch.profiler(profile_memory=True)``, summed in time order, plus the weights
    the edit started with. The plan gets the edit's real lengths (prompts, passage, rollout), so the
    comparison tests the planner's model of the edit, not the benchmark's typical lengths. ``error``
    = predicted / measured - 1."""
    from torch.profiler import ProfilerActivity, profile

    from hpse_easyedit import hpse_edit, restore_weights
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
    plan = plan_edit(hp.with_overrides({"model_name": hparams.model_name}), workload)
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
