"""FT-M executor: full fine-tuning of one MLP matrix; the teacher pass sees the original matrix
(swap, no copy of the model)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, ContextManager, Iterator

import torch

from .base import Executor, copy_back, num_layers
from .state import edit_state, kept_tensor, unwrapped, workspace

__all__ = ["FTMExecutor", "grad_to_master"]


def grad_to_master(master: torch.Tensor, weight: torch.Tensor) -> None:
    """``weight``'s half-precision gradient moved into its float32 ``master``'s: the first backward
    of a step makes the master's gradient, a later one of the same step adds in place (float32 +=
    the half gradient, no new tensor); ``weight.grad`` is cleared."""
    if master.grad is None:
        master.grad = weight.grad.float()
    else:
        master.grad.add_(weight.grad)
    weight.grad = None


def _kept_original(base: Any, name: str) -> torch.Tensor:
    """A first edit's copy of the original matrix ``name``: the one the model's decode workspace
    kept from an earlier edit when it holds the same values (single edits restored in between), so
    the row switch reads it at the same address and a captured decode step is replayed rather than
    captured again; a new copy, kept there, otherwise. A tensor whose values differ is never
    written: an earlier edit's restore handle may hold it."""
    weight = base.get_parameter(name).detach()
    space = workspace(base)
    key = ("ftm_original", name)
    kept = space.get(key)
    if (
        kept is not None
        and (kept.shape, kept.dtype, kept.device) == (weight.shape, weight.dtype, weight.device)
        and torch.equal(kept, weight)
    ):
        return kept
    kept = space[key] = weight.clone()
    torch._dynamo.mark_static_address(kept)
    return kept


class FTMExecutor(Executor):
    """Trains ``ftm_module_template.format(ftm_layer) + '.weight'`` only.

    The original matrix of the unedited model is kept once (one matrix, not a model) and swapped in
    for teacher passes, so in continual editing the teacher stays the unedited pi_0.

    In a half-precision model (bfloat16/float16) Adam's steps of about ``lr`` round away against the
    format's spacing, so most entries would never move: Adam then updates a float32 master copy of
    the matrix (one extra matrix, its moments in float32) and the model's matrix is its cast after
    every step; each backward pass's gradient is accumulated into the master's float32 gradient.
    """

    name = "ft_m"

    def __init__(self, model: Any, hparams: Any, keep_original_weight: bool = False) -> None:
        super().__init__(model, hparams)
        base = unwrapped(model)
        problem = self.model_mismatch(base, hparams)
        if problem is not None:
            raise ValueError(f"{getattr(hparams, '_source', None) or 'the hparams'}: {problem}")
        self.module_name = hparams.ftm_module_template.format(hparams.ftm_layer)
        self.param_name = f"{self.module_name}.weight"
        self.weight: torch.nn.Parameter = base.get_parameter(self.param_name)
        state = edit_state(base)
        first = state.ftm_original is None or keep_original_weight
        if first:
            state.ftm_original = (self.param_name, _kept_original(base, self.param_name))
            state.ftm_grad_flags = {n: p.requires_grad for n, p in base.named_parameters()}
        elif state.ftm_original[0] != self.param_name:
            raise ValueError(
                f"this model was already edited with FT-M at {state.ftm_original[0]}, not "
                f"{self.param_name}; restore it first or keep the same 'ftm_layer'"
            )
        self._original = state.ftm_original[1]
        # the matrix before this edit (what restores it): the original itself on a first edit (the
        # same values; neither is ever written), a copy of its current value on a later one
        self._before = self._original if first else self.weight.detach().clone()
        for p in base.parameters():
            p.requires_grad_(False)
        self.weight.requires_grad_(True)
        self._master: torch.Tensor | None = None
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            self._master = self.weight.detach().float().requires_grad_(True)
            self._grad_hook = self.weight.register_post_accumulate_grad_hook(self._grad_to_master)

    @classmethod
    def model_mismatch(cls, model: Any, hparams: Any) -> str | None:
        """``ftm_module_template.format(ftm_layer) + '.weight'`` must be a parameter of the
        model."""
        name = hparams.ftm_module_template.format(hparams.ftm_layer) + ".weight"
        if name in dict(unwrapped(model).named_parameters()):
            return None
        n_layers = num_layers(model)
        where = f" (it has {n_layers} layers, 0..{n_layers - 1})" if n_layers else ""
        return (
            f"keys 'ftm_layer'/'ftm_module_template' give {name}, which is not a parameter of "
            f"{hparams.model_name}{where}; fix 'ftm_layer' or 'ftm_module_template'"
        )

    def _grad_to_master(self, weight: torch.Tensor) -> None:
        grad_to_master(self._master, weight)

    def _cast_master(self, *_: Any) -> None:
        with torch.no_grad():
            self.weight.copy_(self._master)

    def trainable_parameters(self) -> list[torch.Tensor]:
        return [self.weight] if self._master is None else [self._master]

    def optimizer(self) -> torch.optim.Optimizer:
        optimizer = super().optimizer()
        if self._master is not None:
            optimizer.register_step_post_hook(self._cast_master)
        return optimizer

    def finish(self) -> None:
        super().finish()
        if self._master is not None:
            self._grad_hook.remove()
            self.weight.grad = None
            self.weight.requires_grad_(False)

    @contextlib.contextmanager
    def _swap(self) -> Iterator[None]:
        edited = self.weight.data
        self.weight.data = self._original
        try:
            yield
        finally:
            self.weight.data = edited

    def _teacher_context(self) -> ContextManager:
        return self._swap()

    @contextlib.contextmanager
    def _row_switch(self, teacher_rows: torch.Tensor) -> Iterator[None]:
        """Rows marked True see the original matrix, the rest the edited one (one extra matmul, no
        model copy)."""
        module = unwrapped(self.model).get_submodule(self.module_name)
        # once per decode, not in every captured step, into a tensor kept with the model
        rows = kept_tensor(
            self.model, "ftm_rows", teacher_rows.view(-1, 1, 1), module.weight.device, torch.bool
        )

        def original_for_teacher_rows(
            mod: torch.nn.Module, inputs: Any, output: torch.Tensor
        ) -> torch.Tensor:
            # on the input's device: the device the layer runs on, wherever device_map put it
            original = torch.nn.functional.linear(
                inputs[0],
                self._original.to(device=inputs[0].device, dtype=inputs[0].dtype),
                mod.bias,
            )
            return torch.where(rows.to(output.device), original, output)

        handle = module.register_forward_hook(original_for_teacher_rows)
        try:
            yield
        finally:
            handle.remove()

    def weights_copy(self) -> dict[str, torch.Tensor]:
        prefix = "base_model.model." if unwrapped(self.model) is not self.model else ""
        return {prefix + self.param_name: self._before}

    @staticmethod
    def save_edit(model: Any, hparams: Any, out_dir: Path) -> str:
        """The one edited matrix, as ``ft_m.safetensors`` keyed by its parameter name."""
        from safetensors.torch import save_file

        name = hparams.ftm_module_template.format(hparams.ftm_layer) + ".weight"
        save_file(
            {name: model.get_parameter(name).detach().cpu().contiguous()},
            str(out_dir / "ft_m.safetensors"),
        )
        return "ft_m.safetensors"

    @staticmethod
    def load_edit(model: Any, weights: Path) -> Any:
        """The saved matrix copied into ``model`` (bit for bit, in the model's dtype and device)."""
        from safetensors.torch import load_file

        copy_back(model, load_file(str(weights)))
        return model

    @staticmethod
    def release(model: Any) -> Any:
        """Drop the kept original matrix once the model holds it again, and give back requires_grad
        flags."""
        base = unwrapped(model)
        state = edit_state(base)
        if state.ftm_original is None:
            return model
        name, original = state.ftm_original
        if torch.equal(base.get_parameter(name).detach(), original):
            for n, p in base.named_parameters():
                if n in state.ftm_grad_flags:
                    p.requires_grad_(state.ftm_grad_flags[n])
            state.ftm_original, state.ftm_grad_flags = None, {}
        return model
