"""``BaseEditor`` for any method's hparams, on a model ``hpse_easyedit.load_model`` loaded (``make_editor``).

- ``make_editor(hparams)`` builds EasyEdit's ``BaseEditor`` for it, with the model loaded by
  ``hpse_easyedit.load_model`` (dtype from the file, the embedded SmolLM2 offline, no remote code), which
  EasyEdit's name-based loader cannot do for SmolLM2 or Gemma2.
- ``load_checked_model(hparams)``: that model, with the layers the hparams name checked against it before
  any edit (the ``load_model`` of the registry's COIN*, UnKE, AnyEdit, MEMIT and AlphaEdit specs).
"""

from __future__ import annotations

import copy as copy_module
from types import SimpleNamespace
from typing import Any

__all__ = ["check_model", "is_project_hparams", "load_checked_model", "make_editor"]

# EasyEdit's BaseEditor pads right for these methods and left for every other (editors/editor.py).
_RIGHT_PADDED = ("ROME", "MEMIT", "EMMET", "EAMET", "R-ROME", "AlphaEdit", "CORE", "SPHERE")


def _model_spec(hp: Any) -> Any:
    """What ``hpse_easyedit.load_model`` needs, for any hparams object."""
    from .baselines import LocateThenEditHParams

    if isinstance(hp, LocateThenEditHParams):
        import torch

        ee = hp.easyedit
        return SimpleNamespace(
            model_name=ee.model_name, device=ee.device, model_parallel=bool(getattr(ee, "model_parallel", False)),
            trust_remote_code=False, torch_dtype=getattr(torch, hp.options.dtype),
        )
    return hp


def check_model(model: Any, hp: Any) -> None:
    """``HParamsError`` when the layers an hparams object names do not exist in ``model`` (before any edit)."""
    from ..loading import check_against_model
    from .baselines import LocateThenEditHParams, UnKEHyperParams, check_depth

    if isinstance(hp, LocateThenEditHParams):
        check_depth(model, hp.easyedit.layers, [hp.easyedit.v_loss_layer], hp.source)
    elif isinstance(hp, UnKEHyperParams):
        check_depth(model, hp.layers, [hp.v_loss_layer], f"<{hp.alg_name} hparams>")
    else:
        check_against_model(model, hp)


def load_checked_model(hp: Any) -> tuple[Any, Any]:
    """``hpse_easyedit.load_model`` for any hparams object, then ``check_model``."""
    from ..loading import load_model

    model, tok = load_model(_model_spec(hp))
    check_model(model, hp)
    return model, tok


def is_project_hparams(hparams: Any) -> bool:
    """True for an hparams object whose model ``make_editor`` loads: our classes, and EasyEdit's MEMIT/AlphaEdit ones."""
    from ..hparams import YamlHParams
    from .baselines import LocateThenEditHParams, easyedit_locate_then_edit_classes

    if isinstance(getattr(hparams, "model_name", None), tuple):  # already a (model, tokenizer) pair
        return False
    return isinstance(hparams, (YamlHParams, LocateThenEditHParams, easyedit_locate_then_edit_classes()))


def make_editor(hparams: Any, model: Any = None, tok: Any = None, editor_cls: Any = None) -> Any:
    """EasyEdit's ``BaseEditor`` for ``hparams`` (any method), on ``model``/``tok`` or on the model the file names.

    The model comes from ``hpse_easyedit.load_model`` (dtype from the file, ``trust_remote_code`` only when
    the file asks, ``model_parallel``, the embedded SmolLM2 offline, the tokenizer's own end-of-turn tokens)
    and is handed to ``BaseEditor`` as the ``(model, tokenizer)`` pair it accepts in place of a name.
    After ``import hpse_easyedit.easyedit``, ``BaseEditor.from_hparams(hparams)`` comes here too.
    ``editor_cls``: a ``BaseEditor`` subclass to build (default ``BaseEditor``).
    """
    from .baselines import LocateThenEditHParams, as_locate_then_edit, prepare_locate_then_edit
    from .registration import register

    register()
    from easyeditor import BaseEditor

    hparams = as_locate_then_edit(hparams)
    if model is None:
        model, tok = load_checked_model(hparams)
    elif tok is None:
        raise ValueError("pass the tokenizer with the model: make_editor(hparams, model, tok)")
    else:
        check_model(model, hparams)
    call = prepare_locate_then_edit(model, tok, hparams) if isinstance(hparams, LocateThenEditHParams) else hparams
    proxy = copy_module.copy(call)
    proxy.model_name = (model, tok)  # BaseEditor takes a (model, tokenizer) pair instead of a name
    editor = (editor_cls or BaseEditor)(proxy)
    editor.model_name = call.model_name  # EasyEdit's evaluation reads the name as a string
    editor.hparams = call
    tok.padding_side = "right" if call.alg_name in _RIGHT_PADDED else "left"
    return editor
