"""Every method of the paper's comparison behind one interface: hparams files, BaseEditors, benchmark runners.

- ``load_hparams(path)`` reads any of our hparams files; its ``alg_name`` picks the class (HPSE, COIN,
  UnKE, AnyEdit: our validated dataclasses; MEMIT, AlphaEdit: EasyEdit's own classes plus adapter options).
- ``make_editor(hparams)`` builds EasyEdit's ``BaseEditor`` for it, with the model loaded by
  ``hpse_easyedit.load_model`` (dtype from the file, the embedded SmolLM2 offline, no remote code), which
  EasyEdit's name-based loader cannot do for SmolLM2 or Gemma2.
- ``runner_spec(alg_name)`` gives ``benchmarks.editors`` what it needs to run the method.
"""

from __future__ import annotations

import copy as copy_module
import os
import time
from types import SimpleNamespace
from typing import Any, Callable, Mapping, Sequence

import yaml

from ..editor import EditResult
from ..hparams import HParamsError, HPSEHyperParams

__all__ = ["METHODS", "check_model", "is_project_hparams", "load_hparams", "make_editor", "runner_spec"]

#: alg_name -> what runs it. MEMIT and AlphaEdit are EasyEdit's own ALG_DICT entries.
METHODS = ("HPSE", "COIN", "MEMIT", "AlphaEdit", "UnKE", "AnyEdit")
# EasyEdit's BaseEditor pads right for these methods and left for every other (editors/editor.py).
_RIGHT_PADDED = ("ROME", "MEMIT", "EMMET", "EAMET", "R-ROME", "AlphaEdit", "CORE", "SPHERE")


def _alg_name(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            config = yaml.safe_load(fh)
    except FileNotFoundError:
        raise HParamsError(f"{path}: no such hparams file") from None
    except yaml.YAMLError as err:
        raise HParamsError(f"{path}: not valid YAML ({err}); fix the syntax") from None
    alg = config.get("alg_name") if isinstance(config, dict) else None
    if alg not in METHODS:
        raise HParamsError(f"{path}: alg_name must be one of {list(METHODS)}, got {alg!r}")
    return alg


def _dataclass_for(alg: str) -> Any:
    if alg == "HPSE":
        return HPSEHyperParams
    if alg == "COIN":
        from ..coin import COINHyperParams

        return COINHyperParams
    from .baselines import AnyEditHyperParams, UnKEHyperParams

    return {"UnKE": UnKEHyperParams, "AnyEdit": AnyEditHyperParams}[alg]


def load_hparams(path: str | os.PathLike, overrides: Sequence[str] | Mapping[str, Any] = ()) -> Any:
    """The hparams object of any method's YAML file, with ``key=value`` overrides applied."""
    path = os.fspath(path)
    alg = _alg_name(path)
    if alg in ("MEMIT", "AlphaEdit"):
        from .baselines import load_locate_then_edit_hparams

        return load_locate_then_edit_hparams(path, overrides)
    hp = _dataclass_for(alg).from_hparams(path)
    return hp.with_overrides(overrides) if overrides else hp


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


def _load_model(hp: Any) -> tuple[Any, Any]:
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
        model, tok = _load_model(hparams)
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


def _timed(edit: Callable[..., tuple[Any, dict]]) -> Callable[..., EditResult]:
    def run(model: Any, tok: Any, requests: list[dict], hp: Any) -> EditResult:
        start = time.perf_counter()
        edited, weights_copy = edit(model, tok, requests, hp)
        return EditResult(model=edited, weights_copy=weights_copy, rounds=[], seconds=time.perf_counter() - start)

    return run


def runner_spec(alg_name: str) -> dict[str, Callable[..., Any]]:
    """``load_hparams``, ``hparams_dict``, ``load_model``, ``edit`` and ``restore`` of ``alg_name`` for the benchmark runner."""
    if alg_name == "COIN":
        from ..coin import COINHyperParams, coin_edit
        from ..executors import restore_weights

        return dict(
            load_hparams=lambda path, overrides: COINHyperParams.from_hparams(path).with_overrides(list(overrides)),
            hparams_dict=lambda hp: hp.to_dict(),
            load_model=_load_model,
            edit=coin_edit,
            restore=restore_weights,
        )
    if alg_name in ("UnKE", "AnyEdit"):
        from .baselines import apply_unke_family, restore_copied_weights

        cls = _dataclass_for(alg_name)
        return dict(
            load_hparams=lambda path, overrides: cls.from_hparams(path).with_overrides(list(overrides)),
            hparams_dict=lambda hp: hp.to_dict(),
            load_model=_load_model,
            edit=_timed(lambda model, tok, requests, hp: apply_unke_family(model, tok, requests, hp)),
            restore=restore_copied_weights,
        )
    if alg_name in ("MEMIT", "AlphaEdit"):
        from .baselines import apply_locate_then_edit, load_locate_then_edit_hparams, restore_copied_weights

        def load(path: str, overrides: Sequence[str]) -> Any:
            hp = load_locate_then_edit_hparams(path, list(overrides))
            if hp.alg_name != alg_name:
                raise HParamsError(f"{path}: alg_name is {hp.alg_name!r}, expected {alg_name!r}")
            return hp

        return dict(
            load_hparams=load,
            hparams_dict=lambda hp: hp.to_dict(),
            load_model=_load_model,
            edit=_timed(apply_locate_then_edit),
            restore=restore_copied_weights,
        )
    raise KeyError(f"no runner for alg_name {alg_name!r}; known: {[m for m in METHODS if m != 'HPSE']} (HPSE has its own)")
