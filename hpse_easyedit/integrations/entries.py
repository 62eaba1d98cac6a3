"""The editor contract EasyEdit calls, ``apply_X_to_model(model, tok, requests, hparams, copy=False,
return_orig_weights=False, keep_original_weight=False, **kwargs) -> (edited_model, weights_copy)``,
for the registry's methods (their ``ALG_DICT`` entries), over the engine's own edits (``hpse_edit``,
``coin_edit``: an ``EditResult``), and the ``EditHandle`` HPSE and COIN* return as ``weights_copy``:
a dict of the changed tensors that, called, restores the edited model exactly (copies the tensors
back, unloads a LoRA adapter this package created, gives back ``requires_grad`` flags). UnKE and
AnyEdit change the weights of whole decoder layers in place and are restored by EasyEdit's own
copy-back.

Sequential editing with the LoRA executor: ``BaseEditor.edit(..., sequential_edit=True)`` passes its
unwrapped ``editor.model`` to every edit, while the adapter of the previous edit lives inside it
(peft injects LoRA layers in place). The edit therefore starts from the ``PeftModel`` the model's
edit state remembers (``executors.edit_state``), so the edits accumulate in one adapter as they do
when the ``PeftModel`` is passed in.
"""

from __future__ import annotations

import copy as copy_module
from typing import Any, Callable

from ..coin import coin_edit
from ..editor import hpse_edit
from ..executors import edit_state, restore_weights, unwrapped
from ..executors.lora import ADAPTER_NAME
from ..training import EditResult
from .sdft import sdft_edit

__all__ = [
    "EditHandle",
    "UndoOrderError",
    "apply_coin_to_model",
    "apply_hpse_to_model",
    "apply_sdft_to_model",
    "apply_unke_family_to_model",
    "easyedit_entry",
]


class UndoOrderError(RuntimeError):
    """Edits on one model were undone out of order; the message says which handle to call first."""


class EditHandle(dict):
    """``weights_copy`` for EasyEdit: the pre-edit tensors (a dict) that, called, restore the edited
    model.

    ``restore_weights(model, handle)`` works as with the plain dict; ``handle()`` restores the model
    the edit returned (EasyEdit calls it for methods in ``CALLABLE_RESTORE_ALGS``).
    ``handle.result`` is the edit's ``EditResult``: per-round statistics (``.rounds``),
    ``.seconds``, the rollouts.
    """

    def __init__(self, result: EditResult) -> None:
        super().__init__(result.weights_copy)
        self.model = result.model
        self.result = result
        self._pending = edit_state(result.model).pending_restores
        self._pending.append(self)

    def __call__(self) -> Any:
        if self._pending and self._pending[-1] is not self:
            if self not in self._pending:
                raise UndoOrderError(
                    "this edit was already undone; each weights_copy restores once"
                )
            position, n = self._pending.index(self) + 1, len(self._pending)
            raise UndoOrderError(
                f"undo sequential edits last first: this weights_copy undoes edit {position} of "
                f"the {n} still on the model; call the weights_copy of edit {n} first"
            )
        restored = restore_weights(self.model, dict(self))
        if self._pending:
            self._pending.pop()
        return restored

    def __repr__(self) -> str:
        values = sum(t.numel() for t in self.values())
        return (
            f"<EditHandle: {len(self)} tensors ({values:,} values) from before the edit; call it "
            "to restore the edited model>"
        )

    __str__ = __repr__


def _has_injected_adapter(model: Any) -> bool:
    from peft.tuners.lora import LoraLayer

    return any(
        isinstance(m, LoraLayer) and ADAPTER_NAME in getattr(m, "lora_A", {})
        for m in model.modules()
    )


def _live_model(model: Any) -> Any:
    """The model an edit must start from: the remembered ``PeftModel`` when ``model`` carries its
    adapter."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        return model
    state = edit_state(model)
    wrapper = state.adapter_model
    injected = _has_injected_adapter(model)
    if wrapper is not None and injected and unwrapped(wrapper) is model:
        return wrapper
    if injected:
        raise RuntimeError(
            f"this model carries an '{ADAPTER_NAME}' LoRA adapter from an earlier edit but not "
            "its PeftModel; pass the edited model that edit returned, or restore it first "
            "(hpse_easyedit.restore_weights)"
        )
    state.adapter_model, state.adapter_created, state.adapter_grad_flags = None, False, {}
    return model


def easyedit_entry(
    edit: Callable[..., EditResult], name: str
) -> Callable[..., tuple[Any, EditHandle]]:
    """EasyEdit's editor contract around an engine edit ``edit(model, tok, requests, hparams,
    keep_original_weight=...) -> EditResult``: ``apply(model, tok, requests, hparams, copy=False,
    return_orig_weights=False, keep_original_weight=False, **kwargs)`` returns ``(edited_model,
    EditHandle)``.

    ``weights_copy`` (the ``EditHandle``) holds, for the tensors the edit changed only (LoRA adapter
    weights or the one FT-M matrix), their values before the edit; ``restore_weights(edited_model,
    weights_copy)`` or ``weights_copy()`` brings back the unedited model bit for bit. It is returned
    whatever ``return_orig_weights`` says, since it costs only those tensors.
    ``weights_copy.result`` is the edit's ``EditResult`` (per-round statistics in ``.rounds``).
    Other keywords EasyEdit passes are not used.
    """

    def apply(
        model: Any,
        tok: Any,
        requests: Any,
        hparams: Any,
        copy: bool = False,
        return_orig_weights: bool = False,
        keep_original_weight: bool = False,
        **kwargs: Any,
    ) -> tuple[Any, EditHandle]:
        if copy:
            model = copy_module.deepcopy(model)
        model = _live_model(model) if not keep_original_weight else model
        result = edit(model, tok, requests, hparams, keep_original_weight=keep_original_weight)
        return result.model, EditHandle(result)

    apply.__name__ = apply.__qualname__ = name
    apply.__doc__ = f"``{edit.__name__}`` under EasyEdit's editor contract.\n\n" + (
        easyedit_entry.__doc__ or ""
    )
    return apply


#: HPSE (and its ablations and plain executor baselines) under EasyEdit's editor contract
apply_hpse_to_model = easyedit_entry(hpse_edit, "apply_hpse_to_model")
#: COIN* under EasyEdit's editor contract
apply_coin_to_model = easyedit_entry(coin_edit, "apply_coin_to_model")
#: SDFT (TRL): TRL's SDFTTrainer in the LoRA executor's adapter, under EasyEdit's editor contract
apply_sdft_to_model = easyedit_entry(sdft_edit, "apply_sdft_to_model")


def apply_unke_family_to_model(
    model: Any,
    tok: Any,
    requests: Any,
    hparams: Any,
    copy: bool = False,
    return_orig_weights: bool = False,
    keep_original_weight: bool = False,
    timer: dict | None = None,
    **kwargs: Any,
) -> tuple[Any, dict]:
    """UnKE and AnyEdit (EasyEdit's own code, through the adapter) under EasyEdit's editor contract:
    ``(model, weights_copy)``. ``timer``: a dict that receives ``"algorithm_seconds"``, the time
    inside EasyEdit's function (the benchmark runner's ``timed_edit``)."""
    from .baselines import apply_unke_family

    return apply_unke_family(model, tok, requests, hparams, copy=copy, timer=timer)
