"""The model of any method's hparams, loaded the project's way and checked before any edit.

- ``load_checked_model(hparams)``: the model ``hpse_easyedit.load_model`` loads for it (dtype from
  the file, the embedded SmolLM2 offline, no remote code), which EasyEdit's name-based loader cannot
  do for SmolLM2 or Gemma2, with the layers the hparams name checked against it (the ``load_model``
  of the registry's COIN*, UnKE, AnyEdit, MEMIT and AlphaEdit specs; ``registration.make_editor``
  builds ``BaseEditor`` on it).
- ``check_model``, ``is_project_hparams``: the check alone, and which hparams objects are this
  package's.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

__all__ = ["check_model", "is_project_hparams", "load_checked_model"]


def _model_spec(hp: Any) -> Any:
    """What ``hpse_easyedit.load_model`` needs, for any hparams object."""
    from .baselines import LocateThenEditHParams

    if isinstance(hp, LocateThenEditHParams):
        import torch

        ee = hp.easyedit
        return SimpleNamespace(
            model_name=ee.model_name,
            device=ee.device,
            model_parallel=bool(getattr(ee, "model_parallel", False)),
            trust_remote_code=False,
            torch_dtype=getattr(torch, hp.options.dtype),
        )
    return hp


def check_model(model: Any, hp: Any) -> None:
    """``HParamsError`` when the layers an hparams object names do not exist in ``model`` (before
    any edit)."""
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
    """True for an hparams object whose model ``make_editor`` loads: our classes, and EasyEdit's
    MEMIT/AlphaEdit ones."""
    from ..hparams import YamlHParams
    from .baselines import LocateThenEditHParams, easyedit_locate_then_edit_classes

    if isinstance(getattr(hparams, "model_name", None), tuple):  # already a (model, tokenizer) pair
        return False
    return isinstance(
        hparams, (YamlHParams, LocateThenEditHParams, easyedit_locate_then_edit_classes())
    )
