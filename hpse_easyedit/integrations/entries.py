"""The functions EasyEdit's ``BaseEditor`` calls for the registry's methods (its ``ALG_DICT`` entries), and the
``EditHandle`` HPSE and COIN* return as ``weights_copy``: a dict of the changed tensors that, called, restores
the edited model exactly (copies the tensors back, unloads a LoRA adapter this package created, gives back
``requires_grad`` flags). UnKE and AnyEdit change the weights of whole decoder layers in place and are
restored by EasyEdit's own copy-back.

Sequential editing with the LoRA executor: ``BaseEditor.edit(..., sequential_edit=True)`` passes its
unwrapped ``editor.model`` to every edit, while the adapter of the previous edit lives inside it
(peft injects LoRA layers in place). The edited ``PeftModel`` is therefore remembered on the model it
wraps and reused, so the edits accumulate in one adapter as they do when the ``PeftModel`` is passed in.
"""

from __future__ import annotations

import copy as copy_module
from typing import Any, Callable

import torch

from ..executors import restore_weights
from ..executors.lora import ADAPTER_NAME

__all__ = ["EditHandle", "UndoOrderError", "apply_coin_for_easyedit", "apply_hpse_for_easyedit",
           "apply_unke_for_easyedit"]

_WRAPPER_ATTR = "_hpse_easyedit_peft"
_UNDO_ATTR = "_hpse_easyedit_undo"  # on the unwrapped model: the handles of its edits not undone yet, in order


class UndoOrderError(RuntimeError):
    """Edits on one model were undone out of order; the message says which handle to call first."""


class EditHandle(dict):
    """``weights_copy`` for EasyEdit: the pre-edit tensors (a dict) that, called, restore the edited model.

    ``restore_weights(model, handle)`` works as with the plain dict; ``handle()`` restores the model
    the edit returned (EasyEdit calls it for methods in ``CALLABLE_RESTORE_ALGS``).
    """

    def __init__(self, model: Any, weights: dict[str, torch.Tensor]) -> None:
        super().__init__(weights)
        self.model = model
        self._pending = _base(model).__dict__.setdefault(_UNDO_ATTR, [])
        self._pending.append(self)

    def __call__(self) -> Any:
        if self._pending and self._pending[-1] is not self:
            if self not in self._pending:
                raise UndoOrderError("this edit was already undone; each weights_copy restores once")
            position, n = self._pending.index(self) + 1, len(self._pending)
            raise UndoOrderError(
                f"undo sequential edits last first: this weights_copy undoes edit {position} of the {n} still on the "
                f"model; call the weights_copy of edit {n} first"
            )
        restored = restore_weights(self.model, dict(self))
        if self._pending:
            self._pending.pop()
        if restored is not self.model:  # the adapter was unloaded: forget the wrapper
            restored.__dict__.pop(_WRAPPER_ATTR, None)
        return restored

    def __repr__(self) -> str:
        values = sum(t.numel() for t in self.values())
        return (f"<EditHandle: {len(self)} tensors ({values:,} values) from before the edit; call it to restore the "
                "edited model>")

    __str__ = __repr__


def _base(model: Any) -> Any:
    get_base = getattr(model, "get_base_model", None)
    return get_base() if get_base is not None else model


def _has_injected_adapter(model: Any) -> bool:
    from peft.tuners.lora import LoraLayer

    return any(isinstance(m, LoraLayer) and ADAPTER_NAME in getattr(m, "lora_A", {}) for m in model.modules())


def _live_model(model: Any) -> Any:
    """The model an edit must start from: the remembered ``PeftModel`` when ``model`` carries its adapter."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        return model
    wrapper = model.__dict__.get(_WRAPPER_ATTR)
    injected = _has_injected_adapter(model)
    if wrapper is not None and injected and wrapper.get_base_model() is model:
        return wrapper
    if injected:
        raise RuntimeError(
            f"this model carries an '{ADAPTER_NAME}' LoRA adapter from an earlier edit but not its PeftModel; pass the "
            "edited model that edit returned, or restore it first (hpse_easyedit.restore_weights)"
        )
    model.__dict__.pop(_WRAPPER_ATTR, None)
    return model


def _remember(edited: Any) -> None:
    from peft import PeftModel

    if isinstance(edited, PeftModel):
        edited.get_base_model().__dict__[_WRAPPER_ATTR] = edited  # plain attribute, not a registered submodule


def _plugin(edit: Callable[..., tuple[Any, dict]]) -> Callable[..., tuple[Any, EditHandle]]:
    def apply(model: Any, tok: Any, requests: Any, hparams: Any, copy: bool = False, return_orig_weights: bool = False,
              keep_original_weight: bool = False, **kwargs: Any) -> tuple[Any, EditHandle]:
        if copy:
            model = copy_module.deepcopy(model)
        model = _live_model(model) if not keep_original_weight else model
        edited, weights = edit(model, tok, requests, hparams, keep_original_weight=keep_original_weight)
        _remember(edited)
        return edited, EditHandle(edited, weights)

    apply.__doc__ = f"EasyEdit entry for {edit.__module__}.{edit.__name__}: ``(edited_model, EditHandle)``."
    return apply


def _hpse(model: Any, tok: Any, requests: Any, hparams: Any, keep_original_weight: bool) -> tuple[Any, dict]:
    from ..editor import apply_hpse_to_model

    return apply_hpse_to_model(model, tok, requests, hparams, keep_original_weight=keep_original_weight)


def _coin(model: Any, tok: Any, requests: Any, hparams: Any, keep_original_weight: bool) -> tuple[Any, dict]:
    from ..coin import apply_coin_to_model

    return apply_coin_to_model(model, tok, requests, hparams, keep_original_weight=keep_original_weight)


apply_hpse_for_easyedit = _plugin(_hpse)
apply_coin_for_easyedit = _plugin(_coin)


def apply_unke_for_easyedit(model: Any, tok: Any, requests: Any, hparams: Any, copy: bool = False,
                            return_orig_weights: bool = False, keep_original_weight: bool = False,
                            **kwargs: Any) -> tuple[Any, dict]:
    """EasyEdit entry for UnKE and AnyEdit (EasyEdit's own code, through the adapter): ``(model, weights_copy)``."""
    from .baselines import apply_unke_family

    return apply_unke_family(model, tok, requests, hparams, copy=copy)
