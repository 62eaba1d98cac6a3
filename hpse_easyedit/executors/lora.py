"""LoRA executor: low-rank adapters through peft; the teacher is the same model with the adapter
off."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, ContextManager, Iterator

import torch
import torch.nn.functional as F

from .base import Executor, num_layers
from .state import edit_state, kept_tensor, workspace

__all__ = ["LoRAExecutor", "ADAPTER_NAME"]

ADAPTER_NAME = "hpse"
#: base-model dtypes whose decode computes the adapters in that dtype
#: (``LoRAExecutor._half_weights``)
HALF = (torch.float16, torch.bfloat16)


class LoRAExecutor(Executor):
    """Adapters on ``target_modules`` of ``layers`` (all by default); base weights frozen and
    shared."""

    name = "lora"

    def __init__(self, model: Any, hparams: Any, keep_original_weight: bool = False) -> None:
        from peft import LoraConfig, PeftModel, get_peft_model

        super().__init__(model, hparams)
        reuse = (
            isinstance(model, PeftModel)
            and ADAPTER_NAME in model.peft_config
            and not keep_original_weight
        )
        state = edit_state(model)
        alone = state.adapter_model is None  # no adapter of ours left on this model
        if reuse:
            self.model = model
            # peft's set_adapter writes each layer's active-adapter list anew even where it is
            # ours already, which a captured step's guards see as a change (a recompilation):
            # called only where another adapter is on the model
            if list(model.active_adapters) != [ADAPTER_NAME] or len(model.peft_config) > 1:
                self.model.set_adapter(ADAPTER_NAME)
            if (
                state.adapter_model is not model
            ):  # an adapter from elsewhere: remembered, never unloaded
                state.adapter_model, state.adapter_created, state.adapter_grad_flags = (
                    model,
                    False,
                    {},
                )
        else:
            if isinstance(model, PeftModel):
                raise ValueError(
                    "keep_original_weight=True needs an unwrapped model, but this one already "
                    "carries a peft adapter; restore it first (hpse_easyedit.restore_weights) or "
                    "pass keep_original_weight=False to keep editing it"
                )
            grad_flags = {n: p.requires_grad for n, p in model.named_parameters()}
            config = LoraConfig(
                r=hparams.lora_rank,
                lora_alpha=hparams.lora_alpha,
                lora_dropout=hparams.lora_dropout,
                bias="none",
                target_modules=list(hparams.target_modules),
                layers_to_transform=list(hparams.layers) if hparams.layers is not None else None,
                task_type="CAUSAL_LM",
            )
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(hparams.seed)
                self.model = get_peft_model(model, config, adapter_name=ADAPTER_NAME)
            state.adapter_model, state.adapter_created, state.adapter_grad_flags = (
                self.model,
                True,
                grad_flags,
            )
        self._params = [
            p for n, p in self.model.named_parameters() if "lora_" in n and f".{ADAPTER_NAME}." in n
        ]
        if not self._params:
            raise ValueError(
                "no LoRA parameters were created: none of target_modules "
                f"{hparams.target_modules} matched a module of {type(model).__name__} in layers "
                f"{hparams.layers}; fix 'target_modules'/'layers' in the hparams"
            )
        if not reuse and getattr(hparams, "compile_training", False) == "graphs":
            _into_kept_memory(self.model, self._params, reuse_kept=alone)
        for p in self._params:
            p.requires_grad_(True)
        from peft.tuners.lora import LoraLayer

        self._lora_layers = [m for m in self.model.modules() if isinstance(m, LoraLayer)]

    @classmethod
    def model_mismatch(cls, model: Any, hparams: Any) -> str | None:
        """Every ``target_modules`` name must end some module name, and every ``layers`` index be a
        layer."""
        leaves = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        missing = [m for m in hparams.target_modules if m not in leaves]
        if missing:
            known = sorted(n for n in leaves if n.endswith("proj")) or sorted(leaves)[:12]
            return (
                f"key 'target_modules' names {missing}, which {type(model).__name__} does not "
                f"have; use module names of this model, e.g. {known}"
            )
        n_layers = num_layers(model)
        if hparams.layers is not None and n_layers is not None and max(hparams.layers) >= n_layers:
            return (
                f"key 'layers' is {list(hparams.layers)} but {hparams.model_name} has {n_layers} "
                f"layers (0..{n_layers - 1}); use indices below {n_layers}, or null for all layers"
            )
        return None

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return self._params

    @contextlib.contextmanager
    def _adapters_off(self) -> Iterator[None]:
        # peft's PeftModel.disable_adapter() walks every module and builds a layer-status report on
        # each call (~80 ms on SmolLM2, as long as a decode step); the rollout enters the teacher
        # once per token, so flip the flag LoRA layers read in forward() on the layers collected
        # once.
        saved = [layer._disable_adapters for layer in self._lora_layers]
        for layer in self._lora_layers:
            layer._disable_adapters = True
        try:
            yield
        finally:
            for layer, flag in zip(self._lora_layers, saved):
                layer._disable_adapters = flag

    @contextlib.contextmanager
    def _row_switch(self, teacher_rows: torch.Tensor) -> Iterator[None]:
        """Rows marked True compute the frozen base model (their adapter output is zeroed), the rest
        the student."""
        keep = (~teacher_rows).view(-1, 1, 1)
        if self._lora_layers and all(_plain_lora_linear(layer) for layer in self._lora_layers):
            half = self._lora_layers[0].base_layer.weight.dtype in HALF
            students = _leading_students(teacher_rows) if half else 0
            if students:
                with _half_forwards(self._lora_layers, students, self._half_weights()):
                    yield
                return
            with _lean_forwards(self._lora_layers, keep, self.model):
                yield
            return

        def zero_teacher_rows(
            module: torch.nn.Module, inputs: Any, output: torch.Tensor
        ) -> torch.Tensor:
            return output * keep.to(device=output.device, dtype=output.dtype)

        handles = [
            layer.lora_B[ADAPTER_NAME].register_forward_hook(zero_teacher_rows)
            for layer in self._lora_layers
            if ADAPTER_NAME in layer.lora_B
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _half_weights(self) -> list[torch.Tensor]:
        """Every adapter matrix (``lora_A``, ``lora_B`` per layer) cast to the base model's half
        dtype: one cast of the float32 adapters per decode (a rollout is no-grad, so they cannot
        change inside it) instead of a cast of each projection's input on every call. The copies are
        kept in the model's decode workspace (``state.workspace``: one rank-r pair per
        projection) and refreshed in place, so a captured decode step reads the same tensors in
        every round and in every later edit of the same adapter shapes."""
        masters = [
            w
            for layer in self._lora_layers
            for w in (layer.lora_A[ADAPTER_NAME].weight, layer.lora_B[ADAPTER_NAME].weight)
        ]
        dtype = self._lora_layers[0].base_layer.weight.dtype
        space = workspace(self.model)
        kept = space.get("lora_half", [])
        if [(h.shape, h.dtype, h.device) for h in kept] != [
            (w.shape, dtype, w.device) for w in masters
        ]:
            kept = space["lora_half"] = [torch.empty_like(w, dtype=dtype) for w in masters]
            for w in kept:
                torch._dynamo.mark_static_address(w)
        with torch.no_grad():
            torch._foreach_copy_(kept, masters)
        return kept

    def _teacher_context(self) -> ContextManager:
        if self._lora_layers and all(
            hasattr(layer, "_disable_adapters") for layer in self._lora_layers
        ):
            return self._adapters_off()
        return self.model.disable_adapter()

    def weights_copy(self) -> dict[str, torch.Tensor]:
        names = {id(p): n for n, p in self.model.named_parameters()}
        return {names[id(p)]: p.detach().clone() for p in self._params}

    @staticmethod
    def save_edit(model: Any, hparams: Any, out_dir: Path) -> str:
        """The adapter; load it with ``PeftModel.from_pretrained(base_model, out_dir /
        "adapter/hpse")``."""
        model.save_pretrained(str(out_dir / "adapter"), selected_adapters=[ADAPTER_NAME])
        return f"adapter/{ADAPTER_NAME}"

    @staticmethod
    def load_edit(model: Any, weights: Path) -> Any:
        """The saved adapter around ``model`` (a peft ``PeftModel``, frozen), which later edits
        continue in."""
        from peft import PeftModel

        return PeftModel.from_pretrained(model, str(weights), adapter_name=ADAPTER_NAME)

    @staticmethod
    def release(model: Any) -> Any:
        """Unload an adapter this package created once it adds nothing again; returns the model to
        use."""
        state = edit_state(model)
        if state.adapter_model is not model or not state.adapter_created:
            return model
        lora_b = [
            p for n, p in model.named_parameters() if "lora_B" in n and f".{ADAPTER_NAME}." in n
        ]
        if any(bool(p.detach().ne(0).any()) for p in lora_b):
            return model
        flags = state.adapter_grad_flags
        state.adapter_model, state.adapter_created, state.adapter_grad_flags = None, False, {}
        base = model.unload()
        for n, p in base.named_parameters():
            if n in flags:
                p.requires_grad_(flags[n])
        return base


def _into_kept_memory(model: Any, params: list[torch.nn.Parameter], reuse_kept: bool) -> None:
    """Under ``compile_training: graphs``: a new adapter's matrices moved into the memory of the
    last adapter created on ``model`` (kept in its workspace, ``state.workspace``) when that
    adapter is gone (``reuse_kept``) and its shapes were the same: the new values copied there and
    each parameter pointed at it. So the captured inner step's CUDA graphs, recorded on the
    parameters' addresses, are replayed in every single edit of a run, not recorded again for each
    new adapter; the values, and so the edit, are the same either way."""
    space = workspace(model)
    kept = space.get("lora_params")
    if (
        reuse_kept
        and kept is not None
        and [(k.shape, k.dtype, k.device) for k in kept]
        == [(p.shape, p.dtype, p.device) for p in params]
    ):
        with torch.no_grad():
            for k, p in zip(kept, params):
                k.copy_(p)
                p.data = k
        return
    space["lora_params"] = [p.detach() for p in params]


def _plain_lora_linear(layer: Any) -> bool:
    """Whether ``layer`` is a peft LoRA ``Linear`` whose forward is exactly base +
    ``lora_B(lora_A(x)) * scaling`` for our one adapter (no dropout, variant such as DoRA, merge,
    bias or hook in the way), so that ``_lean_forwards`` can compute it without peft's per-call
    dispatch."""
    from peft.tuners.lora.layer import Linear

    if (
        type(layer) is not Linear
        or ADAPTER_NAME not in layer.lora_A
        or "forward" in vars(layer)
        or list(layer.active_adapters) != [ADAPTER_NAME]
        or not hasattr(layer, "lora_variant")
        or not hasattr(layer, "_cast_input_dtype")
    ):  # peft < 0.15: hooks
        return False
    lora_a, lora_b = layer.lora_A[ADAPTER_NAME], layer.lora_B[ADAPTER_NAME]
    modules = (layer, lora_a, lora_b)
    return (
        ADAPTER_NAME not in layer.lora_variant
        and isinstance(layer.lora_dropout[ADAPTER_NAME], torch.nn.Identity)
        and not layer.merged
        and type(lora_a) is torch.nn.Linear
        and type(lora_b) is torch.nn.Linear
        and lora_a.bias is None
        and lora_b.bias is None
        and not any(
            m._forward_hooks or m._forward_pre_hooks or hasattr(m, "_hf_hook") for m in modules
        )
    )


@contextlib.contextmanager
def _lean_forwards(layers: list, keep: torch.Tensor, model: Any) -> Iterator[None]:
    """The row switch as plain tensor calls: each LoRA layer computes ``base(x) +
    (lora_B(lora_A(x)) * keep) * scaling``, the very operations (and so the very bits) of peft's
    forward under the ``lora_B`` forward hook that zeroes the teacher rows, without peft's per-call
    dispatch, the two adapter modules' calls and the hook: 210 layers per decode step of SmolLM2,
    about 1.1x on a CPU rollout. ``keep`` is cast once per device and dtype into a tensor kept with
    ``model`` (``kept_tensor``)."""
    keep_as: dict = {}

    def make(layer: Any) -> Any:
        base, scaling = layer.base_layer, layer.scaling[ADAPTER_NAME]
        weight_a, weight_b = layer.lora_A[ADAPTER_NAME].weight, layer.lora_B[ADAPTER_NAME].weight

        def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            result = base(x, *args, **kwargs)
            if layer.disable_adapters:
                return result
            dtype = result.dtype
            delta = F.linear(
                F.linear(layer._cast_input_dtype(x, weight_a.dtype), weight_a), weight_b
            )
            mask = keep_as.get((delta.device, delta.dtype))
            if mask is None:
                mask = keep_as[delta.device, delta.dtype] = kept_tensor(
                    model, "lora_keep", keep, delta.device, delta.dtype
                )
            return (result + (delta * mask) * scaling).to(dtype)

        return forward

    for layer in layers:
        layer.forward = make(layer)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward


def _leading_students(teacher_rows: torch.Tensor) -> int:
    """How many student rows lead the batch when its rows are ``[student] * n + [teacher] * m`` (the
    rollouts' layout), else 0; one host read per decode, not per token."""
    flags = teacher_rows.tolist()
    students = flags.index(True) if True in flags else len(flags)
    return students if not any(flags[:students]) and all(flags[students:]) else 0


@contextlib.contextmanager
def _half_forwards(layers: list, students: int, half: list[torch.Tensor]) -> Iterator[None]:
    """The row switch of a half-precision model: each LoRA layer adds ``scaling * x B^T A^T`` to its
    base output for the leading ``students`` rows only, in the model's dtype (``half``: the adapters
    cast once per decode), the teacher rows keep the base output. Two kernels per adapted projection
    (the rank-r product and one ``addmm_`` into the base output) instead of peft's input cast, two
    products, mask, scale, add and cast back."""

    def make(layer: Any, weight_a: torch.Tensor, weight_b: torch.Tensor) -> Any:
        base, scaling = layer.base_layer, layer.scaling[ADAPTER_NAME]

        def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            result = base(x, *args, **kwargs)
            if layer.disable_adapters:
                return result
            low = F.linear(x[:students], weight_a)
            out = result[:students]
            out.view(-1, out.shape[-1]).addmm_(
                low.view(-1, low.shape[-1]), weight_b.t(), alpha=scaling
            )
            return result

        return forward

    for i, layer in enumerate(layers):
        layer.forward = make(layer, half[2 * i], half[2 * i + 1])
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward
