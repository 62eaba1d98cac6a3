"""MEMIT and AlphaEdit through EasyEdit's own ``ALG_DICT`` entries and hparams classes: our YAML
files (EasyEdit's schema plus adapter keys), offline covariance statistics, AlphaEdit's projection,
and the bookkeeping of EasyEdit's per-process caches (``EasyEditCaches``)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from ...edit_requests import RequestError, normalize_requests
from ...executors import restore_weights
from ...hparams import (
    HParamsError,
    YamlHParams,
    hp_field,
    parse_overrides,
    read_hparams_file,
    read_hparams_json,
)
from ...loading import offline_mode
from ..covariance import (
    BUILTIN_CORPORA,
    DOWNLOADED_DATASETS,
    CorpusError,
    ensure_layer_stats,
    load_corpus,
    stats_relpath,
)
from ..easyedit_import import LOCATE_THEN_EDIT, import_easyedit
from .common import algorithm_timer, check_depth, easyedit_model_name, grad_flags_kept, padding_side
from .prompts import chat_text, end_of_turn_text

__all__ = [
    "LOCATE_THEN_EDIT",
    "AdapterOptions",
    "EasyEditCaches",
    "LocateThenEditHParams",
    "apply_locate_then_edit",
    "as_locate_then_edit",
    "check_statistics_obtainable",
    "easyedit_locate_then_edit_classes",
    "easyedit_requests",
    "load_locate_then_edit_hparams",
    "prepare_locate_then_edit",
    "restore_copied_weights",
]

logger = logging.getLogger(__name__)

_MEMIT_MAIN = "easyeditor.models.memit.memit_main"
_ALPHAEDIT_MAIN = "easyeditor.models.alphaedit.AlphaEdit_main"


@dataclass
class AdapterOptions(YamlHParams):
    """Options of the MEMIT/AlphaEdit adapters that are not EasyEdit fields (optional top-level YAML
    keys)."""

    stats_corpus: Any = hp_field(
        None,
        "Local corpus of the covariance statistics: built-in names or .txt/.json/.jsonl files or "
        "dirs; null = from mom2_dataset.",
        types=(list, type(None)),
    )
    editing_prompt: str = hp_field(
        "Introduce {subject}.",
        "Untargeted editing prompt; '{subject}' is filled in.",
        contains="{subject}",
    )
    chat_template_kwargs: dict = hp_field({}, "Extra keyword arguments for apply_chat_template.")
    dtype: str = hp_field(
        "float32",
        "Weights dtype when hpse_easyedit loads the model.",
        choices=("float32", "bfloat16", "float16"),
    )
    use_chat_template: bool = hp_field(
        True, "EasyEdit evaluation: score prompts through the chat template."
    )

    def check(self, source: str) -> None:
        if self.stats_corpus is not None and not all(
            isinstance(s, str) and s for s in self.stats_corpus
        ):
            raise HParamsError(
                f"{source}: key 'stats_corpus' must be a list of "
                f"corpus names or paths, got {self.stats_corpus!r}"
            )


@dataclass
class LocateThenEditHParams:
    """A MEMIT/AlphaEdit hparams file: EasyEdit's own hparams object plus the adapter's options."""

    alg_name: str
    easyedit: Any
    options: AdapterOptions
    source: str = "<hparams>"

    @property
    def model_name(self) -> str:
        return self.easyedit.model_name

    @property
    def device(self) -> Any:
        return self.easyedit.device

    @property
    def model_parallel(self) -> bool:
        return bool(getattr(self.easyedit, "model_parallel", False))

    @classmethod
    def from_hparams(cls, path: str | os.PathLike) -> "LocateThenEditHParams":
        """Read a MEMIT/AlphaEdit YAML file (``load_locate_then_edit_hparams``)."""
        return load_locate_then_edit_hparams(path)

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "LocateThenEditHParams":
        """Read a MEMIT/AlphaEdit JSON file with the keys of the YAML files (``json.load``), checked
        the same way."""
        return load_locate_then_edit_hparams(path, read=read_hparams_json)

    @classmethod
    def load(
        cls, path: str | os.PathLike, overrides: Sequence[str] | Mapping[str, Any] = ()
    ) -> "LocateThenEditHParams":
        """A MEMIT/AlphaEdit file with ``key=value`` overrides (applied before EasyEdit's class
        reads the keys)."""
        return load_locate_then_edit_hparams(path, overrides)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self.easyedit), "adapter": dataclasses.asdict(self.options)}

    @property
    def chat_template_kwargs(self) -> dict:
        return self.options.chat_template_kwargs

    @property
    def corpus(self) -> list | None:
        """The local corpus of the statistics, or None when EasyEdit downloads its dataset."""
        if self.options.stats_corpus:
            return list(self.options.stats_corpus)
        name = self.easyedit.mom2_dataset
        return [name] if name in BUILTIN_CORPORA else None


def easyedit_locate_then_edit_classes() -> tuple[type, ...]:
    """EasyEdit's own ``MEMITHyperParams`` and ``AlphaEditHyperParams`` when EasyEdit is imported
    (else ``()``)."""
    out = []
    for modname, cls in (
        ("easyeditor.models.memit.memit_hparams", "MEMITHyperParams"),
        ("easyeditor.models.alphaedit.AlphaEdit_hparams", "AlphaEditHyperParams"),
    ):
        mod = sys.modules.get(modname)
        if mod is not None and hasattr(mod, cls):
            out.append(getattr(mod, cls))
    return tuple(out)


def as_locate_then_edit(hparams: Any) -> Any:
    """EasyEdit's own MEMIT/AlphaEdit hparams object wrapped with the adapter's default options;
    anything else as is."""
    classes = easyedit_locate_then_edit_classes()
    if classes and isinstance(hparams, classes):
        return LocateThenEditHParams(
            alg_name=hparams.alg_name,
            easyedit=hparams,
            options=AdapterOptions(),
            source=f"<{type(hparams).__name__}>",
        )
    return hparams


def load_locate_then_edit_hparams(
    path: str | os.PathLike,
    overrides: Sequence[str] | Mapping[str, Any] = (),
    read: Callable[[str], dict] = read_hparams_file,
) -> LocateThenEditHParams:
    """Read a MEMIT/AlphaEdit YAML file (EasyEdit's schema + optional adapter keys) into EasyEdit's
    hparams class; ``read=read_hparams_json`` reads the same keys from a JSON file."""
    path = os.fspath(path)
    config = read(path)
    alg = config.get("alg_name")
    if alg not in LOCATE_THEN_EDIT:
        raise HParamsError(f"{path}: alg_name must be one of {list(LOCATE_THEN_EDIT)}, got {alg!r}")
    config.update(dict(overrides) if isinstance(overrides, Mapping) else parse_overrides(overrides))
    if config.get("alg_name") != alg:
        raise HParamsError(
            f"{path}: alg_name is {alg!r} in the file; an override cannot change the method, "
            "pass the other method's hparams file"
        )
    adapter_keys = {f.name for f in dataclasses.fields(AdapterOptions)}
    opts = AdapterOptions.from_dict(
        {k: config.pop(k) for k in list(config) if k in adapter_keys}, source=path
    )
    import_easyedit()
    if alg == "MEMIT":
        from easyeditor.models.memit.memit_hparams import MEMITHyperParams as cls
    else:
        from easyeditor.models.alphaedit.AlphaEdit_hparams import AlphaEditHyperParams as cls
    from easyeditor.util.hparams import HyperParams

    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(config) - known)
    missing = sorted(
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in config
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    )
    if unknown or missing:
        raise HParamsError(
            f"{path}: {'unknown key(s) ' + str(unknown) if unknown else ''}"
            f"{'; ' if unknown and missing else ''}"
            f"{'missing key(s) ' + str(missing) if missing else ''} for EasyEdit's {cls.__name__} "
            f"(its keys: {sorted(known)}; adapter keys: {sorted(adapter_keys)})"
        )
    config = HyperParams.construct_float_from_scientific_notation(config)
    return LocateThenEditHParams(alg_name=alg, easyedit=cls(**config), options=opts, source=path)


class EasyEditCaches:
    """What EasyEdit's per-process MEMIT/AlphaEdit caches were filled for, and the resets that keep
    them right.

    EasyEdit keeps module globals that assume one model: ``COV_CACHE`` (MEMIT's and AlphaEdit's,
    keyed by model name and layer only), AlphaEdit's ``P`` (``P_loaded``) and ``cache_c``
    (``cache_c_new``). The object that knows what they hold is kept on EasyEdit's AlphaEdit module
    (``for_easyedit``), so it lives exactly as long as the state it describes; pass another to the
    functions below only to edit with a separately imported EasyEdit.
    """

    _ATTRIBUTE = "_hpse_easyedit_caches"

    def __init__(self, memit: Any, alpha: Any) -> None:
        self.memit, self.alpha = memit, alpha
        self.model: "weakref.ReferenceType[Any] | None" = (
            None  # the model the caches were filled for
        )
        self.prepared: set = set()  # (method, hparams, corpus) keys prepared for that model
        self.p_loc: str | None = None  # where AlphaEdit's module-global P was loaded from
        self.alphaedit_fresh = True  # the next AlphaEdit edit starts from a fresh cache_c

    @classmethod
    def for_easyedit(cls) -> "EasyEditCaches":
        """The object kept with the imported EasyEdit's MEMIT/AlphaEdit modules (made on first
        use)."""
        memit = importlib.import_module(_MEMIT_MAIN)
        alpha = importlib.import_module(_ALPHAEDIT_MAIN)
        caches = getattr(alpha, cls._ATTRIBUTE, None)
        if caches is None:
            caches = cls(memit, alpha)
            setattr(alpha, cls._ATTRIBUTE, caches)
        return caches

    @classmethod
    def if_imported(cls) -> "EasyEditCaches | None":
        """The object kept with EasyEdit's AlphaEdit module when that module is imported, else
        None."""
        return getattr(sys.modules.get(_ALPHAEDIT_MAIN), cls._ATTRIBUTE, None)

    def clear_covariances(self) -> None:
        for module in (self.memit, self.alpha):
            module.COV_CACHE.clear()

    def reset_for(self, model: Any) -> None:
        """Empty EasyEdit's caches when they were filled for another model than ``model``."""
        last = self.model() if self.model is not None else None
        if last is not model:
            self.clear_covariances()
            self.alpha.P_loaded = False
            self.alpha.cache_c_new = False
            self.model = weakref.ref(model)
            self.prepared = set()
            self.p_loc = None
            self.alphaedit_fresh = True

    def use_projection(self, p_loc: str) -> None:
        """AlphaEdit reloads ``P`` (and sizes ``cache_c`` again) when ``p_loc`` is not the one
        loaded."""
        if self.p_loc != p_loc:
            self.alpha.P_loaded = self.alpha.cache_c_new = False
            self.p_loc = p_loc

    def take_fresh(self) -> bool:
        """Whether this AlphaEdit edit resets ``cache_c``; the edits after it (until a restore) do
        not."""
        fresh, self.alphaedit_fresh = self.alphaedit_fresh, False
        return fresh


def _projection(
    model: Any, tok: Any, hp: LocateThenEditHParams, call_hparams: Any, alpha: Any
) -> None:
    """AlphaEdit's ``P`` at ``P_loc``, computed once with EasyEdit's ``get_project`` (it would save
    it to the cwd)."""
    ee = hp.easyedit
    p_loc = Path(ee.P_loc)
    meta = {
        "model": getattr(model.config, "_name_or_path", ""),
        "layers": list(ee.layers),
        "rewrite_module_tmp": ee.rewrite_module_tmp,
        "mom2_dataset": ee.mom2_dataset,
        "mom2_n_samples": ee.mom2_n_samples,
        "nullspace_threshold": ee.nullspace_threshold,
        "corpus": hp.corpus,
    }
    meta_path = p_loc.with_suffix(".json")
    if p_loc.is_file() and (
        not meta_path.is_file() or json.loads(meta_path.read_text(encoding="utf-8")) == meta
    ):
        return
    w = model.get_parameter(f"{ee.rewrite_module_tmp.format(ee.layers[-1])}.weight")
    dim = w.shape[1]
    P = torch.zeros((len(ee.layers), dim, dim), device="cpu")
    for i, layer in enumerate(ee.layers):
        P[i] = alpha.get_project(model, tok, layer, call_hparams)
    kept = [
        round(float(P[i].trace())) for i in range(len(ee.layers))
    ]  # P = U U^T: its trace is the null space's dimension
    logger.info(
        "AlphaEdit null space of %s: %s of %d dimensions per layer (threshold %g)",
        ee.layers,
        kept,
        dim,
        ee.nullspace_threshold,
    )
    p_loc.parent.mkdir(parents=True, exist_ok=True)
    torch.save(P, p_loc)
    meta_path.write_text(json.dumps({**meta, "null_space_dims": kept}, indent=1), encoding="utf-8")
    alpha.P_loaded = False


def _statistics_corpus(hp: LocateThenEditHParams) -> list | None:
    """The local corpus of the statistics, or None for a dataset EasyEdit downloads; any other
    ``mom2_dataset`` is an ``HParamsError`` naming the file and the fix."""
    corpus = hp.corpus
    if corpus is None and hp.easyedit.mom2_dataset not in DOWNLOADED_DATASETS:
        raise HParamsError(
            f"{hp.source}: mom2_dataset {hp.easyedit.mom2_dataset!r} is neither a built-in local "
            f"corpus ({sorted(BUILTIN_CORPORA)}) nor one EasyEdit downloads "
            f"({list(DOWNLOADED_DATASETS)}); add stats_corpus: [FILES] to compute it offline"
        )
    return corpus


def _hub_reachable(timeout: float = 5.0) -> bool:
    """Whether EasyEdit could download its statistics dataset now: not in offline mode, and the Hub
    answers."""
    if offline_mode() or os.environ.get("HF_DATASETS_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    import socket

    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def check_statistics_obtainable(hp: LocateThenEditHParams) -> None:
    """Before any model is loaded: MEMIT's / AlphaEdit's covariance statistics can be had on this
    machine.

    A local corpus (``stats_corpus``, or a built-in ``mom2_dataset``) must be readable; a dataset
    EasyEdit downloads needs either statistics already in ``stats_dir`` (for every edited layer, any
    model folder) or a reachable Hub. Otherwise ``HParamsError`` names the file, the key and the
    fix.
    """
    ee = hp.easyedit
    corpus = _statistics_corpus(hp)
    if corpus is not None:
        try:
            load_corpus(corpus)
        except CorpusError as err:
            raise HParamsError(
                f"{hp.source}: the covariance statistics cannot be computed offline: {err}"
            ) from None
        return
    missing = [
        layer
        for layer in ee.layers
        if not any(
            Path(ee.stats_dir).glob(
                "*/"
                + stats_relpath(
                    ee.rewrite_module_tmp.format(layer),
                    ee.mom2_dataset,
                    ee.mom2_dtype,
                    ee.mom2_n_samples,
                )
            )
        )
    ]
    if missing and not _hub_reachable():
        raise HParamsError(
            f"{hp.source}: no covariance statistics for layers {missing} in stats_dir "
            f"{ee.stats_dir!r}, and mom2_dataset {ee.mom2_dataset!r} must be downloaded but the "
            "Hugging Face Hub cannot be reached (or offline mode is set); add stats_corpus: "
            "[editevery] to compute them offline, or copy the statistics into stats_dir"
        )


def prepare_locate_then_edit(
    model: Any, tok: Any, hp: LocateThenEditHParams, caches: EasyEditCaches | None = None
) -> Any:
    """Offline statistics, AlphaEdit's projection and fresh caches for ``model``; returns the
    hparams EasyEdit gets.

    ``caches``: EasyEdit's caches to keep right (default: those of the imported EasyEdit).
    """
    import_easyedit()
    ee = hp.easyedit
    check_depth(model, ee.layers, [ee.v_loss_layer], hp.source)
    call = dataclasses.replace(
        ee, model_name=easyedit_model_name(ee.model_name, model, hp.alg_name)
    )
    corpus = _statistics_corpus(hp)
    caches = caches or EasyEditCaches.for_easyedit()
    caches.reset_for(model)
    if hp.alg_name == "AlphaEdit":  # another P (and cache_c size) than loaded
        caches.use_projection(ee.P_loc)
    key = json.dumps([hp.alg_name, dataclasses.asdict(ee), corpus], sort_keys=True, default=str)
    if key in caches.prepared:
        return call
    caches.clear_covariances()  # keyed by model and layer only, not by dataset
    if corpus is not None:
        ensure_layer_stats(
            model,
            tok,
            layers=ee.layers,
            rewrite_module_tmp=ee.rewrite_module_tmp,
            stats_dir=ee.stats_dir,
            ds_name=ee.mom2_dataset,
            sample_size=ee.mom2_n_samples,
            precision=ee.mom2_dtype,
            sources=corpus,
        )
    if hp.alg_name == "AlphaEdit":
        _projection(model, tok, hp, call, caches.alpha)
    caches.prepared.add(key)
    return call


def easyedit_requests(tok: Any, requests: Any, hp: LocateThenEditHParams) -> list[dict]:
    """``{prompt, subject, target_new}`` for EasyEdit: chat-templated editing prompt, passage + end
    of turn."""
    reqs = normalize_requests(requests, hp.options)
    eot_text = end_of_turn_text(tok, hp.options.chat_template_kwargs)
    out = []
    for i, r in enumerate(reqs):
        prompt = chat_text(tok, r["prompt"], hp.options.chat_template_kwargs)
        if "{" in prompt or "}" in prompt:
            raise RequestError(
                f"request {i}: the chat-templated prompt contains '{{' or '}}', which EasyEdit's "
                f"{hp.alg_name} formats with str.format; remove them from the prompt"
            )
        if prompt.count(r["subject"]) != 1:
            raise RequestError(
                f"request {i}: subject {r['subject']!r} occurs {prompt.count(r['subject'])} times "
                f"in the chat-templated prompt; EasyEdit's {hp.alg_name} needs it exactly once"
            )
        out.append(
            {
                "prompt": prompt,
                "subject": r["subject"],
                "target_new": r["target_new"] + eot_text,
                "case_id": i,
            }
        )
    return out


def apply_locate_then_edit(
    model: Any,
    tok: Any,
    requests: Any,
    hp: LocateThenEditHParams,
    timer: dict | None = None,
    caches: EasyEditCaches | None = None,
) -> tuple[Any, dict]:
    """One MEMIT/AlphaEdit edit through EasyEdit's own ``ALG_DICT`` entry; returns ``(model,
    weights_copy)``.

    ``timer``: a dict that receives ``"algorithm_seconds"``, the time spent inside EasyEdit's
    function (the statistics and AlphaEdit's projection, computed once per model by
    ``prepare_locate_then_edit``, are not in it). ``caches``: EasyEdit's caches to keep right
    (default: those of the imported EasyEdit).
    """
    call = prepare_locate_then_edit(model, tok, hp, caches)
    caches = caches or EasyEditCaches.for_easyedit()
    ee_requests = easyedit_requests(tok, requests, hp)
    apply = importlib.import_module("easyeditor.util.alg_dict").ALG_DICT[hp.alg_name]
    kwargs: dict[str, Any] = {}
    if hp.alg_name == "AlphaEdit":
        kwargs["reset_cache"] = caches.take_fresh()
    with grad_flags_kept(model), padding_side(tok, "right"), algorithm_timer(timer):
        edited, weights_copy = apply(
            model,
            tok,
            ee_requests,
            call,
            copy=False,
            return_orig_weights=True,
            keep_original_weight=False,
            **kwargs,
        )
    return edited, weights_copy


def restore_copied_weights(
    model: Any, weights_copy: Mapping[str, torch.Tensor], caches: EasyEditCaches | None = None
) -> Any:
    """Copy ``weights_copy`` back by parameter name (``restore_weights``), and let AlphaEdit start
    its next edit fresh.

    ``caches``: EasyEdit's caches (default: those of the imported EasyEdit, if it is imported).
    """
    model = restore_weights(model, weights_copy)
    caches = caches or EasyEditCaches.if_imported()
    if caches is not None:
        caches.alphaedit_fresh = True
    return model
