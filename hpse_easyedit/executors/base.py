"""The executor contract: what an edit trains, how the frozen teacher is reached, how the edit is
saved and released."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ContextManager

import torch

__all__ = ["Executor", "copy_back", "num_layers"]


class Executor:
    """What moves in an edit, how the teacher is reached, and what restores the model.

    Attributes:
        model: the module the student runs as (may wrap the caller's model, e.g. a peft PeftModel).
    """

    name = "base"

    def __init__(self, model: Any, hparams: Any, keep_original_weight: bool = False) -> None:
        self.model = model
        self.hparams = hparams
        self.teacher_switches = (
            0  # times the teacher was reached (teacher_context / row_switch entered)
        )

    @classmethod
    def model_mismatch(cls, model: Any, hparams: Any) -> str | None:
        """Why ``hparams`` cannot edit ``model`` with this executor (naming the keys and the fix),
        or None when it can; checked when the model is loaded (``loading.check_against_model``) and
        when the executor is built."""
        return None

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        raise NotImplementedError

    def optimizer(self) -> torch.optim.Optimizer:
        """The Adam optimiser of an edit over ``trainable_parameters()``, as the hparams configure
        it: on CUDA the fused kernel (one launch per step for all tensors, the same update up to
        float rounding), elsewhere PyTorch's default implementation."""
        hp = self.hparams
        params = self.trainable_parameters()
        fused = {"fused": True} if params and all(p.device.type == "cuda" for p in params) else {}
        return torch.optim.Adam(
            params, lr=hp.lr, betas=tuple(hp.adam_betas), weight_decay=hp.weight_decay, **fused
        )

    def finish(self) -> None:
        """End of training: nothing of the edit trains any more (the edited values stay in the
        model)."""
        for p in self.trainable_parameters():
            p.grad = None
            p.requires_grad_(False)

    def teacher_context(self) -> ContextManager:
        """A context in which ``self.model`` computes the frozen base model pi_0 (counted in
        ``teacher_switches``)."""
        self.teacher_switches += 1
        return self._teacher_context()

    def row_switch(self, teacher_rows: torch.Tensor) -> ContextManager:
        """A context in which rows ``teacher_rows`` (bool ``[B]``) of a batch compute pi_0 and the
        others the student.

        Lets the rollout advance student and teacher in ONE batched forward (counted in
        ``teacher_switches``).
        """
        self.teacher_switches += 1
        return self._row_switch(teacher_rows)

    def _teacher_context(self) -> ContextManager:
        raise NotImplementedError

    def _row_switch(self, teacher_rows: torch.Tensor) -> ContextManager:
        raise NotImplementedError

    def weights_copy(self) -> dict[str, torch.Tensor]:
        """Detached copies, taken before training, of every tensor this edit will change."""
        raise NotImplementedError

    @staticmethod
    def save_edit(model: Any, hparams: Any, out_dir: Path) -> str:
        """Write what this executor added to the edited ``model`` under ``out_dir``; the path
        written, relative to it."""
        raise NotImplementedError

    @staticmethod
    def load_edit(model: Any, weights: Path) -> Any:
        """The unedited ``model`` with the edit ``save_edit`` wrote to ``weights`` put back in;
        returns the model to use."""
        raise NotImplementedError

    @staticmethod
    def release(model: Any) -> Any:
        """After a restore: drop what this executor added to ``model`` once it no longer changes
        anything (and give back the caller's ``requires_grad`` flags); returns the model to use."""
        return model


def copy_back(model: Any, weights_copy: dict[str, torch.Tensor]) -> None:
    """Put the tensors of ``weights_copy`` back into ``model``'s parameters, bit for bit (same
    device and dtype)."""
    with torch.no_grad():
        for name, value in weights_copy.items():
            param = model.get_parameter(name)
            param.copy_(value.to(device=param.device, dtype=param.dtype))


def num_layers(model: Any) -> int | None:
    """The number of decoder layers in ``model``'s config (its text config for a multimodal one), or
    None."""
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    return getattr(config, "num_hidden_layers", None)
