"""Make the registry's methods (HPSE, COIN*, UnKE, AnyEdit) first-class EasyEdit methods
(``register``).

EasyEdit's ``BaseEditor`` looks a method up in ``easyeditor.util.alg_dict.ALG_DICT`` (bound into
``easyeditor.editors.editor`` by a star import, so entries are added to that same dict object), lets
``batch_edit`` run only methods its ``BatchEditor.is_batchable_method`` lists, and after a
non-sequential edit restores ``editor.model`` in ``restore_after_edit``: methods in
``CALLABLE_RESTORE_ALGS`` get ``weights_copy()`` called, all others have ``weights_copy`` copied
back by parameter name. ``register`` adds every method of the registry (``hpse_easyedit.methods``)
that has an ``easyedit_apply`` to ``ALG_DICT`` and puts those with ``callable_restore`` (HPSE and
COIN*) in ``CALLABLE_RESTORE_ALGS``: their ``weights_copy`` is an ``EditHandle`` (``entries``) that,
called, restores the edited model exactly. What EasyEdit has no table for (the batchable check,
``from_hparams``, request checks) is patched in ``patches``.

``make_editor(hparams)`` builds EasyEdit's ``BaseEditor`` for any method's hparams on the model
``factory.load_checked_model`` loads; after ``register``, ``BaseEditor.from_hparams`` of this
package's hparams comes here too.
"""

from __future__ import annotations

import copy as copy_module
import importlib
import logging
from typing import Any, Callable

from ..methods import method_specs
from .easyedit_import import import_easyedit
from .factory import check_model, is_project_hparams, load_checked_model
from .patches import check_requests_first, patch_batchable, patch_from_hparams

__all__ = ["make_editor", "plugin_methods", "register"]

logger = logging.getLogger(__name__)

# EasyEdit's BaseEditor pads right for these methods and left for every other (editors/editor.py).
_RIGHT_PADDED = ("ROME", "MEMIT", "EMMET", "EAMET", "R-ROME", "AlphaEdit", "CORE", "SPHERE")


def plugin_methods() -> dict[str, Callable[..., tuple[Any, Any]]]:
    """alg_name -> the ``apply_X_to_model`` EasyEdit calls, for every registered method that has
    one."""
    return {
        spec.name: spec.easyedit_apply for spec in method_specs() if spec.easyedit_apply is not None
    }


def register() -> None:
    """Add the registry's methods (HPSE, COIN, UnKE, AnyEdit) to the imported EasyEdit (idempotent;
    imports it if needed).

    Also routes ``BaseEditor.from_hparams`` for this package's hparams objects (and EasyEdit's own
    MEMIT and AlphaEdit ones) through ``make_editor``: the model is loaded by
    ``hpse_easyedit.load_model`` and handed to ``BaseEditor`` as the ``(model, tokenizer)`` pair its
    constructor accepts in place of a name, so EasyEdit's name-based loader (which knows neither
    SmolLM2 nor Gemma-2, trusts remote code for Qwen and ignores the file's dtype) is never asked.
    ``BaseEditor(hparams)`` itself is left as EasyEdit wrote it.
    """
    import_easyedit()
    alg_dict = importlib.import_module("easyeditor.util.alg_dict").ALG_DICT
    utils = importlib.import_module("easyeditor.editors.utils")
    batch_editor = importlib.import_module("easyeditor.editors.batch_editor").BatchEditor
    for name, fn in plugin_methods().items():
        current = alg_dict.get(name)
        if current is not None and current is not fn:
            logger.warning(
                "EasyEdit's ALG_DICT already has %r (%r); hpse_easyedit replaces it", name, current
            )
        alg_dict[name] = fn
    utils.CALLABLE_RESTORE_ALGS.update(
        spec.name for spec in method_specs() if spec.callable_restore
    )
    patch_batchable(batch_editor, lambda alg_name: alg_name in plugin_methods())
    base_editor = importlib.import_module("easyeditor.editors.editor").BaseEditor
    patch_from_hparams(
        base_editor, is_project_hparams, lambda cls, hparams: make_editor(hparams, editor_cls=cls)
    )


def make_editor(hparams: Any, model: Any = None, tok: Any = None, editor_cls: Any = None) -> Any:
    """EasyEdit's ``BaseEditor`` for ``hparams`` (any method), on ``model``/``tok`` or on the model
    the file names.

    The model comes from ``hpse_easyedit.load_model`` (dtype from the file, ``trust_remote_code``
    only when the file asks, ``model_parallel``, the embedded SmolLM2 offline, the tokenizer's own
    end-of-turn tokens) and is handed to ``BaseEditor`` as the ``(model, tokenizer)`` pair it
    accepts in place of a name. After ``import hpse_easyedit.easyedit``,
    ``BaseEditor.from_hparams(hparams)`` comes here too. ``editor_cls``: a ``BaseEditor`` subclass
    to build (default ``BaseEditor``).
    """
    from .baselines import LocateThenEditHParams, as_locate_then_edit, prepare_locate_then_edit

    register()
    from easyeditor import BaseEditor

    hparams = as_locate_then_edit(hparams)
    if model is None:
        model, tok = load_checked_model(hparams)
    elif tok is None:
        raise ValueError("pass the tokenizer with the model: make_editor(hparams, model, tok)")
    else:
        check_model(model, hparams)
    call = (
        prepare_locate_then_edit(model, tok, hparams)
        if isinstance(hparams, LocateThenEditHParams)
        else hparams
    )
    proxy = copy_module.copy(call)
    proxy.model_name = (model, tok)  # BaseEditor takes a (model, tokenizer) pair instead of a name
    editor = (editor_cls or BaseEditor)(proxy)
    editor.model_name = call.model_name  # EasyEdit's evaluation reads the name as a string
    editor.hparams = call
    tok.padding_side = "right" if call.alg_name in _RIGHT_PADDED else "left"
    if getattr(call, "alg_name", None) in plugin_methods() and hasattr(call, "editing_prompt"):
        check_requests_first(editor, call)
    return editor
