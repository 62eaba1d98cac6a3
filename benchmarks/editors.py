"""Editing methods the runner can drive, found by the ``alg_name`` of an hparams file.

The runner knows nothing about any method. An ``Editor`` tells it how to read the hparams (with
``--set key=value`` overrides), load the model, apply one edit and undo it. ``edit`` follows the
EasyEdit / ROME contract: it returns an object with ``.model`` (the edited model, possibly a wrapper
such as a peft ``PeftModel``), ``.weights_copy`` (what ``restore`` needs to get the unedited model
back) and ``.rounds`` (per-round diagnostics, a list of dicts; empty for methods without rounds).
For continual editing the runner passes the returned ``.model`` into the next ``edit`` and restores
with the FIRST edit's ``weights_copy``.

To add a method, write a factory returning an ``Editor`` and register it, e.g. for an EasyEdit
baseline::

    def _memit() -> Editor:
        from easyeditor import MEMITHyperParams, apply_memit_to_model
        ...
        return Editor("MEMIT", load_hparams=..., hparams_dict=..., load_model=..., edit=..., restore=...)

    register_editor("MEMIT", _memit)

Factories import their method lazily, so a missing optional package only matters when it is used.
The plain LoRA / FT-M baselines need no entry: they are HPSE files with ``kl_weight: 0``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import yaml

__all__ = ["Editor", "editor_for_hparams_file", "get_editor", "register_editor", "registered_editors"]


@dataclass(frozen=True)
class Editor:
    """How to run one editing method (see the module docstring for the contract)."""

    name: str
    load_hparams: Callable[[str, Sequence[str]], Any]  # (hparams file, ["key=value", ...]) -> hparams
    hparams_dict: Callable[[Any], dict]  # hparams -> plain dict (recorded in config.json / summary.json)
    load_model: Callable[[Any], tuple[Any, Any]]  # hparams -> (model, tokenizer)
    edit: Callable[[Any, Any, list[dict], Any], Any]  # (model, tok, requests, hparams) -> result
    restore: Callable[[Any, dict], Any]  # (edited model, weights_copy) -> unedited model
    needs_easyedit: bool = False  # runs EasyEdit's own code (checked by run_compare before its first row)


_FACTORIES: dict[str, Callable[[], Editor]] = {}


def register_editor(alg_name: str, factory: Callable[[], Editor]) -> None:
    """Make ``alg_name`` (the hparams files' ``alg_name``) runnable; ``factory`` builds its Editor on demand."""
    _FACTORIES[alg_name] = factory


def registered_editors() -> list[str]:
    return sorted(_FACTORIES)


def get_editor(alg_name: str) -> Editor:
    if alg_name not in _FACTORIES:
        raise KeyError(
            f"no editor registered for alg_name {alg_name!r} (registered: {registered_editors()}); "
            "register one in benchmarks/editors.py"
        )
    return _FACTORIES[alg_name]()


def editor_for_hparams_file(path: str | os.PathLike) -> Editor:
    """The Editor named by the ``alg_name`` key of a YAML hparams file (``HParamsError`` naming the file otherwise)."""
    from hpse_easyedit.hparams import HParamsError

    if os.path.isdir(path):
        raise HParamsError(f"{path}: is a directory; pass an hparams YAML file such as hparams/HPSE/smollm2-135m.yaml")
    try:
        with open(path, encoding="utf-8") as fh:
            config = yaml.safe_load(fh)
    except FileNotFoundError:
        raise HParamsError(f"{path}: no such hparams file; pass --hparams hparams/HPSE/<model>.yaml") from None
    except yaml.YAMLError as err:
        raise HParamsError(f"{path}: not valid YAML ({' '.join(str(err).split())}); fix the syntax") from None
    except UnicodeDecodeError:
        raise HParamsError(f"{path}: not a text file; pass an hparams YAML file") from None
    if not isinstance(config, dict) or not isinstance(config.get("alg_name"), str):
        raise HParamsError(f"{path}: the hparams file needs a top-level 'alg_name' (e.g. alg_name: HPSE)")
    if config["alg_name"] not in _FACTORIES:
        raise HParamsError(
            f"{path}: alg_name {config['alg_name']!r} is not a method the runner knows; use one of {registered_editors()}"
        )
    return get_editor(config["alg_name"])


def _hpse() -> Editor:
    import hpse_easyedit as hpse

    return Editor(
        name="HPSE",
        load_hparams=lambda path, overrides: hpse.HPSEHyperParams.from_hparams(path).with_overrides(list(overrides)),
        hparams_dict=lambda hp: hp.to_dict(),
        load_model=hpse.load_model,
        edit=hpse.hpse_edit,
        restore=hpse.restore_weights,
    )


register_editor("HPSE", _hpse)


def _hpse_easyedit_method(alg_name: str) -> Callable[[], Editor]:
    """COIN* (ours) and MEMIT, AlphaEdit, UnKE, AnyEdit (EasyEdit's own, through hpse_easyedit.easyedit)."""

    def factory() -> Editor:
        from hpse_easyedit.integrations.methods import runner_spec

        return Editor(name=alg_name, **runner_spec(alg_name), needs_easyedit=alg_name != "COIN")

    return factory


register_editor("COIN", _hpse_easyedit_method("COIN"))
register_editor("MEMIT", _hpse_easyedit_method("MEMIT"))
register_editor("AlphaEdit", _hpse_easyedit_method("AlphaEdit"))
register_editor("UnKE", _hpse_easyedit_method("UnKE"))
register_editor("AnyEdit", _hpse_easyedit_method("AnyEdit"))


def _reference(alg_name: str) -> Callable[[], Editor]:
    """UNEDITED and IN_CONTEXT: the pre-edit and the passages-in-context reference rows (benchmarks.references)."""

    def factory() -> Editor:
        import hpse_easyedit as hpse

        from .references import load_reference_hparams, reference_edit

        return Editor(
            name=alg_name,
            load_hparams=lambda path, overrides: load_reference_hparams(alg_name, path, overrides),
            hparams_dict=lambda hp: hp.to_dict(),
            load_model=hpse.load_model,
            edit=reference_edit,
            restore=lambda model, weights_copy: model,
        )

    return factory


register_editor("UNEDITED", _reference("UNEDITED"))
register_editor("IN_CONTEXT", _reference("IN_CONTEXT"))
