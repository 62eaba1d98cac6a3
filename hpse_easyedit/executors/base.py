"""The executor contract and the exact restore that goes with ``weights_copy``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ContextManager

import torch

__all__ = ["Executor", "restore_weights"]


class Executor:
    """What moves in an edit, how the teacher is reached, and what restores the model.

    Attributes:
        model: the module the student runs as (may wrap the caller's model, e.g. a peft PeftModel).
    """

    name = "base"

    def __init__(self, model: Any, hparams: Any, keep_original_weight: bool = False) -> None:
        self.model = model
        self.hparams = hparams

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        raise NotImplementedError

    def optimizer(self) -> torch.optim.Optimizer:
        """The Adam optimiser of an edit over ``trainable_parameters()``, as the hparams configure it."""
        hp = self.hparams
        return torch.optim.Adam(self.trainable_parameters(), lr=hp.lr, betas=tuple(hp.adam_betas),
                                weight_decay=hp.weight_decay)

    def finish(self) -> None:
        """End of training: nothing of the edit trains any more (the edited values stay in the model)."""
        for p in self.trainable_parameters():
            p.grad = None
            p.requires_grad_(False)

    def teacher_context(self) -> ContextManager:
        """A context in which ``self.model`` computes the frozen base model pi_0."""
        raise NotImplementedError

    def row_switch(self, teacher_rows: torch.Tensor) -> ContextManager:
        """A context in which rows ``teacher_rows`` (bool ``[B]``) of a batch compute pi_0 and the others the student.

        Lets the rollout advance student and teacher in ONE batched forward.
        """
        raise NotImplementedError

    def weights_copy(self) -> dict[str, torch.Tensor]:
        """Detached copies, taken before training, of every tensor this edit will change."""
        raise NotImplementedError

    @staticmethod
    def save_edit(model: Any, hparams: Any, out_dir: Path) -> str:
        """Write what this executor added to the edited ``model`` under ``out_dir``; the path written, relative to it."""
        raise NotImplementedError


def restore_weights(model: Any, weights_copy: dict[str, torch.Tensor]) -> Any:
    """Put back the tensors of ``weights_copy`` (bit for bit) and return the unedited model.

    If the edit wrapped the model in a LoRA adapter and the restore brings that adapter back to
    its fresh state (all ``lora_B`` zero, so it adds nothing), the adapter is unloaded and the
    caller's original module is returned. FT-M bookkeeping is dropped once the original matrix is back.
    """
    with torch.no_grad():
        for name, value in weights_copy.items():
            param = model.get_parameter(name)
            param.copy_(value.to(device=param.device, dtype=param.dtype))
    from .ftm import FTMExecutor
    from .lora import LoRAExecutor

    model = LoRAExecutor.release_if_fresh(model)
    FTMExecutor.release_if_original(model)
    return model
