"""ONE registry of editing methods: an hparams file's ``alg_name`` -> the ``MethodSpec`` that runs
it.

A spec says everything the rest of the project asks about a method: how its hparams file is read
(its hparams class's ``load``), how its model is loaded, the edit the benchmark runner calls, the
restore that undoes it, and the ``ALG_DICT`` entry EasyEdit's ``BaseEditor`` calls (with whether
EasyEdit restores by calling ``weights_copy``). The benchmark runner (``benchmarks.run.methods``),
``run_compare``, ``hpse_easyedit.easyedit.load_hparams``/``make_editor`` and ``register``
(EasyEdit's ``ALG_DICT``, ``CALLABLE_RESTORE_ALGS`` and batchable methods) all read this one table.

This module is the table only and imports no method: the project's own methods are registered by
``builtin_methods`` (imported with the package), the benchmark's reference rows (``UNEDITED``,
``IN_CONTEXT``) by ``benchmarks.run.methods``, each by the layer it belongs to. A new method is one
module (its hparams class and its edit) plus one line::

    register_method(
        MethodSpec(
            "MYEDIT", MyHParams.load, hparams_dict, load_model, timed_edit(apply_my_edit),
            restore_weights, easyedit_apply=apply_my_edit,
        )
    )

The runner's ``edit`` returns an object with ``.model``, ``.weights_copy``, ``.rounds`` and
``.seconds`` (``EditResult``); ``timed_edit`` makes one from the ROME/EasyEdit contract
``apply_X_to_model(model, tok, requests, hparams) -> (model, weights_copy)``. The plain LoRA / FT-M
baselines are HPSE files with ``kl_weight: 0``.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from .hparams import HParamsError, read_hparams_file
from .training import EditResult

__all__ = [
    "MethodSpec",
    "get_method",
    "hparams_dict",
    "load_hparams",
    "method_for_file",
    "method_specs",
    "register_method",
    "registered_methods",
    "timed_edit",
]


@dataclass(frozen=True)
class MethodSpec:
    """How every part of the project runs one method (see the module docstring)."""

    name: str  # the alg_name of its hparams files
    load_hparams: Callable[
        [str, Sequence[str]], Any
    ]  # (file, ["key=value", ...]) -> hparams; its class's ``load``
    hparams_dict: Callable[
        [Any], dict
    ]  # hparams -> plain dict (recorded in config.json / summary.json)
    load_model: Callable[[Any], tuple[Any, Any]]  # hparams -> (model, tokenizer)
    edit: Callable[
        [Any, Any, list[dict], Any], Any
    ]  # (model, tok, requests, hparams) -> EditResult-like
    restore: Callable[[Any, Any], Any]  # (edited model, weights_copy) -> unedited model
    needs_easyedit: bool = (
        False  # runs EasyEdit's own code (checked by run_compare before its first row)
    )
    easyedit_apply: Callable[..., tuple[Any, Any]] | None = (
        None  # its ALG_DICT entry; None: EasyEdit's own or none
    )
    callable_restore: bool = (
        False  # EasyEdit restores it by calling weights_copy() (CALLABLE_RESTORE_ALGS)
    )
    preflight: Callable[[Any], None] | None = (
        None  # hparams -> raises the user error when it cannot run here (before loading)
    )
    #: (unedited model, hparams, {name: edited tensor}) -> the model as its edits left it: lets a
    #: stopped continual sequence resume from a snapshot; None: the runner replays the sequence's
    #: edits instead
    resume: Callable[[Any, Any, dict], Any] | None = None
    #: (model, tok, [each case's requests], hparams) -> one ``batched.CaseEdit`` per case: several
    #: independent edits in one batched pass (the runners' ``--cases-at-once``), each put into the
    #: model for answering with ``resume`` and undone with ``restore(model, case.start)``; None: the
    #: method edits one case at a time
    edit_cases: Callable[[Any, Any, list, Any], list] | None = None

    @property
    def hparams_class(self) -> type | None:
        """The class whose ``load`` reads this method's files (None for a hand-written loader)."""
        owner = getattr(self.load_hparams, "__self__", None)
        return owner if isinstance(owner, type) else None


_METHODS: dict[str, MethodSpec] = {}


def register_method(spec: MethodSpec) -> None:
    """Make ``spec.name`` (an hparams file's ``alg_name``) a method of the runner, run_compare and
    EasyEdit."""
    _METHODS[spec.name] = spec


def registered_methods() -> list[str]:
    return sorted(_METHODS)


def method_specs() -> list[MethodSpec]:
    """Every registered spec, by name."""
    return [_METHODS[name] for name in sorted(_METHODS)]


def get_method(alg_name: str) -> MethodSpec:
    if alg_name not in _METHODS:
        raise KeyError(
            f"no method registered for alg_name {alg_name!r} (registered: {registered_methods()}); "
            "register one with hpse_easyedit.methods.register_method"
        )
    return _METHODS[alg_name]


def method_for_file(path: str | os.PathLike) -> MethodSpec:
    """The spec named by the ``alg_name`` of a YAML hparams file: the one place ``alg_name`` is read
    from a file."""
    path = os.fspath(path)
    config = read_hparams_file(path)
    alg = config.get("alg_name")
    if not isinstance(alg, str):
        raise HParamsError(
            f"{path}: the hparams file needs a top-level 'alg_name' (e.g. alg_name: HPSE)"
        )
    if alg not in _METHODS:
        raise HParamsError(
            f"{path}: alg_name {alg!r} is not a method the runner knows; "
            f"alg_name must be one of {registered_methods()}"
        )
    return _METHODS[alg]


def load_hparams(path: str | os.PathLike, overrides: Sequence[str] | Mapping[str, Any] = ()) -> Any:
    """The hparams object of any method's YAML file (its ``alg_name`` picks the class), overrides
    applied."""
    return method_for_file(path).load_hparams(os.fspath(path), overrides)


def hparams_dict(hparams: Any) -> dict:
    """The plain dict of an hparams object (every hparams class has ``to_dict``)."""
    return hparams.to_dict()


def timed_edit(
    apply: Callable[..., tuple[Any, Any]], *, timer: bool = False
) -> Callable[..., EditResult]:
    """The runner's ``edit`` for an ``apply_X_to_model(model, tok, requests, hparams) -> (model,
    weights_copy)``.

    ``timer=True``: ``apply`` takes ``timer=dict`` and puts the seconds of EasyEdit's own algorithm
    under ``"algorithm_seconds"`` (``EditResult.algorithm_seconds``; the rest of the edit is our
    integration).
    """

    @functools.wraps(apply)
    def edit(model: Any, tok: Any, requests: list[dict], hparams: Any) -> EditResult:
        start = time.perf_counter()
        clock: dict = {}
        edited, weights_copy = apply(
            model, tok, requests, hparams, **({"timer": clock} if timer else {})
        )
        return EditResult(
            model=edited,
            weights_copy=weights_copy,
            rounds=[],
            seconds=time.perf_counter() - start,
            algorithm_seconds=clock.get("algorithm_seconds"),
        )

    return edit
