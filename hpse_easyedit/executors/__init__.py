"""Executors decide which parameters an edit moves and how the frozen teacher is reached.

An executor wraps ONE model: the student is the model as edited, the privileged teacher is the
same model seen through ``teacher_context()`` (LoRA adapter disabled, or the original FT-M matrix
swapped in). No second copy of the weights is ever made. What an edit leaves for later edits and
restores (the adapter, FT-M's original matrix, restore order) is the model's ``EditState``
(``state.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from .base import Executor, copy_back
from .ftm import FTMExecutor
from .lora import LoRAExecutor
from .state import EditState, edit_state, unwrapped

__all__ = [
    "EXECUTORS",
    "EditState",
    "Executor",
    "FTMExecutor",
    "LoRAExecutor",
    "edit_state",
    "make_executor",
    "restore_weights",
    "resume_edit",
    "unwrapped",
]

#: ``hparams.executor`` -> its class; a new executor is one module plus one line here (loading's
#: model check, saving and loading an edit, and restores dispatch over this table).
EXECUTORS: dict[str, type[Executor]] = {
    "lora": LoRAExecutor,
    "ft_m": FTMExecutor,
}


def make_executor(model: Any, hparams: Any, keep_original_weight: bool = False) -> Executor:
    """Build the executor named by ``hparams.executor`` around ``model``."""
    try:
        cls = EXECUTORS[hparams.executor]
    except KeyError:
        raise ValueError(
            f"executor {hparams.executor!r} is unknown; "
            f"set 'executor' to one of {sorted(EXECUTORS)}"
        ) from None
    return cls(model, hparams, keep_original_weight=keep_original_weight)


def restore_weights(model: Any, weights_copy: dict[str, torch.Tensor]) -> Any:
    """Put back the tensors of ``weights_copy`` (bit for bit) and return the unedited model.

    Then every executor releases what it added once it changes nothing any more: a LoRA adapter this
    package created is unloaded when all its ``lora_B`` are zero again (the caller's original module
    is returned); FT-M's kept original matrix is dropped once the model holds it again.
    """
    copy_back(model, weights_copy)
    for cls in EXECUTORS.values():
        model = cls.release(model)
    return model


def resume_edit(model: Any, hparams: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The unedited ``model`` put in the state an edit (or a sequence of edits) with ``hparams``
    left it in: the executor's structure around it (a LoRA adapter, FT-M's kept original matrix)
    with ``tensors``, the edited values of what the edits changed, copied in bit for bit. Returns
    the model to edit on with."""
    executor = make_executor(model, hparams)
    copy_back(executor.model, tensors)
    executor.finish()
    return executor.model
