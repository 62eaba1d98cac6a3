"""Make the registry's methods (HPSE, COIN*, UnKE, AnyEdit) first-class EasyEdit methods (``register``).

EasyEdit's ``BaseEditor`` looks a method up in ``easyeditor.util.alg_dict.ALG_DICT`` (bound into
``easyeditor.editors.editor`` by a star import, so entries are added to that same dict object), lets
``batch_edit`` run only methods its ``BatchEditor.is_batchable_method`` lists, and after a
non-sequential edit restores ``editor.model`` in ``restore_after_edit``: methods in
``CALLABLE_RESTORE_ALGS`` get ``weights_copy()`` called, all others have ``weights_copy`` copied back by
parameter name. ``register`` adds every method of the registry (``hpse_easyedit.methods``) that has an
``easyedit_apply`` to ``ALG_DICT``, extends the batchable check to them (wrapping EasyEdit's own, which
keeps answering for its methods), and puts those with ``callable_restore`` (HPSE and COIN*) in
``CALLABLE_RESTORE_ALGS``: their ``weights_copy`` is an ``EditHandle``, a dict of the changed tensors that,
called, restores the edited model exactly (copies the tensors back, unloads a LoRA adapter this
package created, gives back ``requires_grad`` flags). UnKE and AnyEdit change the weights of whole
decoder layers in place and are restored by EasyEdit's own copy-back.

Sequential editing with the LoRA executor: ``BaseEditor.edit(..., sequential_edit=True)`` passes its
unwrapped ``editor.model`` to every edit, while the adapter of the previous edit lives inside it
(peft injects LoRA layers in place). The edited ``PeftModel`` is therefore remembered on the model it
wraps and reused, so the edits accumulate in one adapter as they do when the ``PeftModel`` is passed in.
"""

from __future__ import annotations

import copy as copy_module
import importlib
import logging
from typing import Any, Callable

import torch

from ..executors import restore_weights
from ..executors.lora import ADAPTER_NAME
from .easyedit_import import import_easyedit

__all__ = [
    "EditHandle", "apply_coin_for_easyedit", "apply_hpse_for_easyedit", "apply_unke_for_easyedit", "plugin_methods",
    "register",
]

logger = logging.getLogger(__name__)

_WRAPPER_ATTR = "_hpse_easyedit_peft"


class EditHandle(dict):
    """``weights_copy`` for EasyEdit: the pre-edit tensors (a dict) that, called, restore the edited model.

    ``restore_weights(model, handle)`` works as with the plain dict; ``handle()`` restores the model
    the edit returned (EasyEdit calls it for methods in ``CALLABLE_RESTORE_ALGS``).
    """

    def __init__(self, model: Any, weights: dict[str, torch.Tensor]) -> None:
        super().__init__(weights)
        self.model = model

    def __call__(self) -> Any:
        restored = restore_weights(self.model, dict(self))
        if restored is not self.model:  # the adapter was unloaded: forget the wrapper
            restored.__dict__.pop(_WRAPPER_ATTR, None)
        return restored


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


def plugin_methods() -> dict[str, Callable[..., tuple[Any, Any]]]:
    """alg_name -> the ``apply_X_to_model`` EasyEdit calls, for every registered method that has one."""
    from ..methods import method_specs

    return {spec.name: spec.easyedit_apply for spec in method_specs() if spec.easyedit_apply is not None}


def _batchable_wrapper(original: Callable[[str], bool]) -> Callable[[str], bool]:
    def is_batchable_method(alg_name: str) -> bool:
        """The registry's EasyEdit methods edit all requests of a batch jointly (``batch_edit``)."""
        return alg_name in plugin_methods() or original(alg_name)

    is_batchable_method._hpse_original = original  # type: ignore[attr-defined]
    return is_batchable_method


def _from_hparams_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    def from_hparams(cls: Any, hparams: Any) -> Any:
        """``BaseEditor.from_hparams``: hpse_easyedit's hparams get their model from ``hpse_easyedit.load_model``
        (``make_editor``); any other hparams go to EasyEdit's own loader."""
        from .factory import is_project_hparams, make_editor

        if is_project_hparams(hparams):
            return make_editor(hparams, editor_cls=cls)
        return original(cls, hparams)

    from_hparams._hpse_original = original  # type: ignore[attr-defined]
    return from_hparams


def register() -> None:
    """Add the registry's methods (HPSE, COIN, UnKE, AnyEdit) to the imported EasyEdit (idempotent; imports it if needed).

    Also routes ``BaseEditor.from_hparams`` for this package's hparams objects (and EasyEdit's own MEMIT and
    AlphaEdit ones) through ``make_editor``: the model is loaded by ``hpse_easyedit.load_model`` and handed
    to ``BaseEditor`` as the ``(model, tokenizer)`` pair its constructor accepts in place of a name, so
    EasyEdit's name-based loader (which knows neither SmolLM2 nor Gemma-2, trusts remote code for Qwen
    and ignores the file's dtype) is never asked. ``BaseEditor(hparams)`` itself is left as EasyEdit wrote it.
    """
    import_easyedit()
    alg_dict = importlib.import_module("easyeditor.util.alg_dict").ALG_DICT
    utils = importlib.import_module("easyeditor.editors.utils")
    batch_editor = importlib.import_module("easyeditor.editors.batch_editor").BatchEditor
    for name, fn in plugin_methods().items():
        current = alg_dict.get(name)
        if current is not None and current is not fn:
            logger.warning("EasyEdit's ALG_DICT already has %r (%r); hpse_easyedit replaces it", name, current)
        alg_dict[name] = fn
    from ..methods import method_specs

    utils.CALLABLE_RESTORE_ALGS.update(spec.name for spec in method_specs() if spec.callable_restore)
    current = batch_editor.is_batchable_method
    if not hasattr(current, "_hpse_original"):
        batch_editor.is_batchable_method = staticmethod(_batchable_wrapper(current))
    base_editor = importlib.import_module("easyeditor.editors.editor").BaseEditor
    factory = base_editor.__dict__.get("from_hparams")
    if isinstance(factory, classmethod) and not hasattr(factory.__func__, "_hpse_original"):
        base_editor.from_hparams = classmethod(_from_hparams_wrapper(factory.__func__))
