"""Thin adapters that run EasyEdit's own MEMIT, AlphaEdit, UnKE and AnyEdit on unstructured edits.

Nothing here re-implements a method: each adapter turns our requests (editing prompt ``Introduce {s}.``,
passage, subject) into what EasyEdit's implementation takes, supplies what it would otherwise download
or hard-code, calls it, and hands back ``(model, weights_copy)``.

- Requests. The editing prompt goes through the tokenizer's chat template (the edited models are chat
  models and are asked through their template); the target is the passage followed by the template's
  end-of-turn token, as in AnyEdit's and UnKE's own data. MEMIT and AlphaEdit get
  ``{prompt, subject, target_new}``; UnKE and AnyEdit get ``{question, answer}``.
- MEMIT / AlphaEdit run through EasyEdit's own ``ALG_DICT`` entries with EasyEdit's own hparams classes,
  read from our YAML files (which keep EasyEdit's schema, so ``MEMITHyperParams.from_hparams`` reads them
  too). Their covariance statistics are computed offline by ``hpse_easyedit.covariance`` when
  ``mom2_dataset`` names a local corpus; AlphaEdit's null-space projection ``P`` is computed once per
  model with EasyEdit's own ``get_project`` and stored at ``P_loc``. EasyEdit keeps per-process caches
  that assume one model (``COV_CACHE``, AlphaEdit's ``P`` and ``cache_c``); they are reset when another
  model is edited, and AlphaEdit's ``cache_c`` also after every restore (each single edit starts fresh).
- UnKE / AnyEdit (EasyEdit's ``models/unke`` and ``models/unke_ARE``, outside ``ALG_DICT``, with JSON
  hparams) are called with EasyEdit's own hparams classes built from our YAML, and the locality data
  they preserve (``ex_data``: 20 instruction/answer texts, Alpaca in the original) drawn from a local set.

Three places where EasyEdit's code decides by model name get a name it recognises, chosen from the
model's config, never changing the algorithm (``easyedit_model_name``):

- AlphaEdit sizes ``P`` and ``cache_c`` from ``down_proj``'s layout only when the name contains
  ``llama``/``qwen``; every backbone we ship has that ``(hidden, intermediate)`` layout.
- UnKE and AnyEdit call one decoder layer directly and pick the call by name; only the
  ``Qwen2.5-7B-Instruct`` branch passes ``position_embeddings``, which every decoder layer of
  transformers >= 4.48 requires (the ``Llama3-8B-Instruct`` branch would fail there).
- The same direct call indexes ``layer(...)[0]``, written for decoder layers that return a tuple.
  transformers >= 4.54 returns the hidden-state tensor itself, where ``[0]`` would silently take the
  first example of the batch (and broadcast it against the 20 locality examples). While UnKE/AnyEdit
  run, a forward hook gives direct calls of the edited layers their tuple back
  (``_tuple_layer_outputs``); calls inside the model's own forward are untouched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import json
import logging
import os
import random
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from .covariance import (
    BUILTIN_CORPORA,
    DOWNLOADED_DATASETS,
    CorpusError,
    ensure_layer_stats,
    load_corpus,
    stats_relpath,
)
from ..data_files import EDITEVERY_FILE, MMLU_LETTERS, data_dir, mmlu_test_files, mmlu_text, read_mmlu_csv
from ..edit_requests import RequestError, normalize_requests
from ..executors import restore_weights
from ..hparams import (
    EditorHParams,
    HParamsError,
    YamlHParams,
    hp_field,
    parse_overrides,
    read_hparams_file,
    read_hparams_json,
)
from ..loading import offline_mode
from ..prompts import end_of_turn_id
from .easyedit_import import import_easyedit

__all__ = [
    "AnyEditHyperParams",
    "LocateThenEditHParams",
    "UnKEHyperParams",
    "apply_locate_then_edit",
    "apply_unke_family",
    "as_locate_then_edit",
    "chat_text",
    "check_depth",
    "check_locality_data",
    "check_statistics_obtainable",
    "easyedit_locate_then_edit_classes",
    "easyedit_model_name",
    "load_instruction_texts",
    "load_locate_then_edit_hparams",
    "prepare_locate_then_edit",
    "restore_copied_weights",
]

logger = logging.getLogger(__name__)

LOCATE_THEN_EDIT = ("MEMIT", "AlphaEdit")
# Substrings EasyEdit's code tests model names for (see the module docstring).
_ALPHAEDIT_NAMES = ("llama", "qwen", "gpt-j-6b", "gpt2-xl")
_ALPHAEDIT_TAG = "llama"
_UNKE_CALL_TAG = "Qwen2.5-7B-Instruct"
# model_type values whose down_proj weight is (hidden, intermediate), like Llama's.
_LLAMA_LAYOUT = ("llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mistral", "gemma", "gemma2", "gemma3_text")


# ---------------------------------------------------------------------------------------------- prompts
def chat_text(tok: Any, user: str, template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The chat-templated text of a one-turn user message, ending with the assistant header."""
    return tok.apply_chat_template(
        [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True, **dict(template_kwargs or {})
    )


def _end_of_turn_text(tok: Any, template_kwargs: Mapping[str, Any] | None = None) -> str:
    eot = end_of_turn_id(tok, template_kwargs)
    return "" if eot is None else tok.decode([eot], skip_special_tokens=False)


def easyedit_model_name(model_name: str, model: Any, method: str) -> str:
    """The ``model_name`` EasyEdit's ``method`` code must see to take the branch that fits ``model``."""
    model_type = getattr(getattr(model, "config", None), "model_type", "") or ""
    if method == "AlphaEdit":
        if any(s in model_name.lower() for s in _ALPHAEDIT_NAMES):
            return model_name
        if model_type not in _LLAMA_LAYOUT:
            raise HParamsError(
                f"EasyEdit's AlphaEdit supports Llama-, Qwen-, GPT-J- and GPT2-XL-style models; {model_name!r} is a "
                f"{model_type!r} model whose down_proj layout it cannot size"
            )
        return f"{model_name} ({_ALPHAEDIT_TAG}-layout {model_type})"
    if method in ("UnKE", "AnyEdit"):
        if not hasattr(getattr(model, "model", None), "rotary_emb"):
            raise HParamsError(
                f"EasyEdit's {method} calls model.model.rotary_emb, which {type(model).__name__} does not have"
            )
        return f"{model_name} ({_UNKE_CALL_TAG} call path)"
    return model_name


# ---------------------------------------------------------------------------------------------- locality data
def _pairs_from_records(records: Sequence[Any], where: str) -> list[tuple[str, str | None]]:
    pairs: list[tuple[str, str | None]] = []
    for i, r in enumerate(records):
        if isinstance(r, str):
            pairs.append((r, None))
        elif isinstance(r, Mapping) and "instruction" in r and "output" in r:
            instruction = r["instruction"] + (("\n" + r["input"]) if r.get("input") else "")
            pairs.append((instruction, r["output"]))
        elif isinstance(r, Mapping) and "question" in r and "answer" in r:
            pairs.append((r["question"], r["answer"]))
        elif isinstance(r, Mapping) and isinstance(r.get("text"), str):
            pairs.append((r["text"], None))
        else:
            raise CorpusError(
                f"{where}: record {i} is not a string, an Alpaca record (instruction, input, output), a "
                "question/answer record or an object with 'text'"
            )
    return pairs


def _instruction_pairs(source: str, root: Path) -> list[tuple[str, str | None]]:
    if source == "editevery":
        return _pairs_from_records(json.loads((root / EDITEVERY_FILE).read_text(encoding="utf-8")), source)
    if source == "mmlu":
        return [(mmlu_text(question, choices), f"{MMLU_LETTERS[answer]}. {choices[answer]}")
                for path in mmlu_test_files(root) for question, choices, answer in read_mmlu_csv(path)]
    path = Path(os.path.expandvars(os.path.expanduser(source)))
    if path.suffix.lower() in (".json", ".jsonl") and path.is_file():
        text = path.read_text(encoding="utf-8")
        records = ([json.loads(l) for l in text.splitlines() if l.strip()] if path.suffix.lower() == ".jsonl"
                   else json.loads(text))
        return _pairs_from_records(records, str(path))
    return [(t, None) for t in load_corpus([source], root)]


def load_instruction_texts(tok: Any, sources: Sequence[str], template_kwargs: Mapping[str, Any] | None = None,
                           root: str | os.PathLike | None = None) -> list[str]:
    """Locality texts for UnKE/AnyEdit: instruction/answer pairs rendered as chat turns (plain texts as they are)."""
    base = Path(root) if root is not None else data_dir()
    texts = []
    for source in sources:
        try:
            pairs = _instruction_pairs(os.fspath(source), base)
        except FileNotFoundError as err:
            raise CorpusError(f"locality source {source!r} needs {err.filename}; set HPSE_DATA_DIR or give a file") from None
        for user, answer in pairs:
            if answer is None:
                texts.append(user)
            else:
                texts.append(tok.apply_chat_template(
                    [{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
                    tokenize=False, **dict(template_kwargs or {})))
    if not texts:
        raise CorpusError(f"the locality sources {list(sources)} hold no text")
    return texts


def check_locality_data(hp: Any) -> None:
    """Before any model is loaded: every UnKE/AnyEdit locality source (``ex_data``) can be read on this machine."""
    where = f"{getattr(hp, '_source', f'<{hp.alg_name} hparams>')}: key 'ex_data'"
    for source in hp.ex_data:
        try:
            pairs = _instruction_pairs(os.fspath(source), data_dir())
        except FileNotFoundError as err:
            raise HParamsError(
                f"{where}: the locality source {source!r} needs {err.filename}, which is not there; set HPSE_DATA_DIR "
                "to the benchmark data, or give a local JSON/JSONL file of instruction/answer pairs") from None
        except CorpusError as err:
            raise HParamsError(f"{where}: {err}") from None
        if not pairs:
            raise HParamsError(f"{where}: the locality source {source!r} holds no text")


# ---------------------------------------------------------------------------------------------- UnKE / AnyEdit
@dataclass
class UnKEHyperParams(EditorHParams):
    """EasyEdit's UnKE fields (``models/unke/unke_hparams.py``), the fields BaseEditor reads, and the locality data."""

    ALG_NAME = "UnKE"

    alg_name: str = hp_field("UnKE", "Method name; must be UnKE.", choices=("UnKE",))
    layers: list = hp_field([7], "Decoder layers UnKE rewrites (whole blocks, one after another).", nonempty=True)
    layer_selection: str = hp_field("all", "EasyEdit field (unused by UnKE's code).", choices=("all", "random"))
    fact_token: str = hp_field("last", "EasyEdit field (unused by UnKE's code).",
                               choices=("last", "subject_first", "subject_last", "subject_first_after_last"))
    lr: float = hp_field(2e-4, "AdamW step size of the layer optimisation.", min=0.0, exclusive_min=True)
    v_num_grad_steps: int = hp_field(25, "Steps of the target-representation (z) optimisation.", min=1)
    v_lr: float = hp_field(0.5, "Step size of the z optimisation.", min=0.0, exclusive_min=True)
    v_loss_layer: int = hp_field(27, "Layer whose output the z loss reads (the last layer in EasyEdit's files).", min=0)
    v_weight_decay: float = hp_field(1e-3, "Weight decay of the z optimisation.", min=0.0)
    clamp_norm_factor: float = hp_field(4.0, "Bound on the z update's norm, relative to the original.", min=0.0)
    optim_num_step: int = hp_field(50, "AdamW steps on each rewritten layer.", min=1)
    ex_data_num: int = hp_field(20, "Locality texts drawn per edit from ex_data.", min=1)
    rewrite_module_tmp: str = hp_field("model.layers.{}.mlp.down_proj", "EasyEdit module template.")
    layer_module_tmp: str = hp_field("model.layers.{}", "EasyEdit module template of a decoder layer.")
    mlp_module_tmp: str = hp_field("model.layers.{}.mlp", "EasyEdit module template.")
    attn_module_tmp: str = hp_field("model.layers.{}.self_attn", "EasyEdit module template.")
    ln_f_module: str = hp_field("model.norm", "Final norm module.")
    lm_head_module: str = hp_field("lm_head", "Output projection module (model.embed_tokens for tied embeddings).")
    ex_data: list = hp_field(
        ["editevery"],
        "Locality data UnKE preserves (Alpaca in the original): built-in 'editevery' or 'mmlu', or Alpaca/"
        "question-answer JSON/JSONL files, or text corpora.", nonempty=True,
    )
    ex_data_seed: int = hp_field(0, "Seed of the per-edit draw of ex_data_num locality texts.", min=0)
    ex_data_max_tokens: int = hp_field(
        256, "Locality texts are cut to this many tokens (0 = no cap): EditEverything texts average ~300 tokens, "
             "Alpaca's ~100, and UnKE runs the whole model on all of them at once.", min=0)

    def check(self, source: str) -> None:
        if not all(isinstance(l, int) and not isinstance(l, bool) and l >= 0 for l in self.layers):
            raise HParamsError(f"{source}: key 'layers' must be a list of layer indices, got {self.layers!r}")
        if self.v_loss_layer < max(self.layers):
            raise HParamsError(
                f"{source}: v_loss_layer ({self.v_loss_layer}) must be >= the rewritten layers {self.layers}")


@dataclass
class AnyEditHyperParams(UnKEHyperParams):
    """AnyEdit = EasyEdit's ``unke_ARE``: UnKE with the passage edited autoregressively in token windows."""

    ALG_NAME = "AnyEdit"

    alg_name: str = hp_field("AnyEdit", "Method name; must be AnyEdit.", choices=("AnyEdit",))
    window_size: int = hp_field(50, "Tokens of the passage per autoregressive chunk.", min=1)
    overlap: int = hp_field(0, "Tokens shared by consecutive chunks.", min=0)

    def check(self, source: str) -> None:
        super().check(source)
        if self.overlap >= self.window_size:
            raise HParamsError(f"{source}: overlap ({self.overlap}) must be < window_size ({self.window_size})")


def _easyedit_unke(alg_name: str) -> tuple[type, Any]:
    import_easyedit()
    if alg_name == "UnKE":
        mod = importlib.import_module("easyeditor.models.unke.unke_main")
        return mod.unkeHyperParams, mod.apply_unke_to_model
    mod = importlib.import_module("easyeditor.models.unke_ARE.unke_ARE_main")
    return mod.unkeAREHyperParams, mod.apply_unke_ARE_to_model


@contextlib.contextmanager
def _tuple_layer_outputs(model: Any, layer_names: Sequence[str]) -> Iterator[None]:
    """Direct calls of these layers return ``(hidden,)``, as UnKE's code expects; calls inside the model's forward don't."""
    inner = getattr(model, "model", model)
    depth = [0]

    def enter(module: Any, args: Any) -> None:
        depth[0] += 1

    def leave(module: Any, args: Any, output: Any) -> None:
        depth[0] -= 1

    def as_tuple(module: Any, args: Any, output: Any) -> Any:
        if depth[0] == 0 and isinstance(output, torch.Tensor):
            return (output,)
        return None

    handles = [inner.register_forward_pre_hook(enter), inner.register_forward_hook(leave, always_call=True)]
    handles += [model.get_submodule(n).register_forward_hook(as_tuple) for n in layer_names]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def _padding_side(tok: Any, side: str) -> Iterator[None]:
    before = tok.padding_side
    tok.padding_side = side
    try:
        yield
    finally:
        tok.padding_side = before


@contextlib.contextmanager
def _grad_flags_kept(model: Any) -> Iterator[None]:
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    try:
        yield
    finally:
        for n, p in model.named_parameters():
            p.requires_grad_(flags.get(n, p.requires_grad))


def check_depth(model: Any, layers: Sequence[int], extra: Sequence[int], source: str) -> None:
    n = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if n is not None and max(list(layers) + list(extra)) >= n:
        raise HParamsError(
            f"{source}: layers {list(layers)} / loss layer {list(extra)} exceed the model's {n} layers (0..{n - 1}); "
            "fix the hparams for this model"
        )


def _draw(texts: Sequence[str], k: int, seed: int, reqs: Sequence[Mapping[str, str]]) -> list[str]:
    key = hashlib.sha256(("\x00".join(r["target_new"] for r in reqs) + f"\x00{seed}").encode("utf-8")).hexdigest()
    return random.Random(key).sample(list(texts), min(k, len(texts)))


def _cut(tok: Any, text: str, max_tokens: int) -> str:
    if max_tokens <= 0:
        return text
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return text if len(ids) <= max_tokens else tok.decode(ids[:max_tokens], skip_special_tokens=False)


_EX_CACHE: dict[tuple, list[str]] = {}


def _record_algorithm_time(timer: dict | None, start: float) -> None:
    if timer is not None:
        timer["algorithm_seconds"] = time.perf_counter() - start


def apply_unke_family(model: Any, tok: Any, requests: Any, hparams: UnKEHyperParams, copy: bool = False,
                      timer: dict | None = None) -> tuple[Any, dict]:
    """Edit with EasyEdit's ``apply_unke_to_model`` / ``apply_unke_ARE_to_model``; returns ``(model, weights_copy)``.

    ``timer``: a dict that receives ``"algorithm_seconds"``, the time spent inside EasyEdit's function.
    """
    if copy:
        import copy as copy_module

        model = copy_module.deepcopy(model)
    ee_cls, ee_apply = _easyedit_unke(hparams.alg_name)
    reqs = normalize_requests(requests, hparams)
    check_depth(model, hparams.layers, [hparams.v_loss_layer], f"<{hparams.alg_name} hparams>")
    ee_fields = {f.name for f in dataclasses.fields(ee_cls)}
    values = {name: getattr(hparams, name) for name in ee_fields}
    values["model_name"] = easyedit_model_name(hparams.model_name, model, hparams.alg_name)
    ee_hparams = ee_cls(**values)
    eot_text = _end_of_turn_text(tok, hparams.chat_template_kwargs)
    batch = [{"question": chat_text(tok, r["prompt"], hparams.chat_template_kwargs), "answer": r["target_new"] + eot_text}
             for r in reqs]
    cache_key = (str(data_dir()), tuple(hparams.ex_data), str(getattr(tok, "chat_template", "")),
                 json.dumps(hparams.chat_template_kwargs, sort_keys=True))
    if cache_key not in _EX_CACHE:
        _EX_CACHE[cache_key] = load_instruction_texts(tok, hparams.ex_data, hparams.chat_template_kwargs)
    ex_data = [_cut(tok, t, hparams.ex_data_max_tokens)
               for t in _draw(_EX_CACHE[cache_key], hparams.ex_data_num, hparams.ex_data_seed, reqs)]
    if tok.pad_token_id is None:
        raise RequestError("the tokenizer has no pad token; UnKE pads its batches (set tok.pad_token = tok.eos_token)")
    layer_names = [hparams.layer_module_tmp.format(l) for l in hparams.layers]
    with _grad_flags_kept(model), _padding_side(tok, "right"), _tuple_layer_outputs(model, layer_names):
        start = time.perf_counter()
        weights_copy = ee_apply(model, tok, ee_hparams, batch, ex_data)
        _record_algorithm_time(timer, start)
    return model, weights_copy


# ---------------------------------------------------------------------------------------------- MEMIT / AlphaEdit
@dataclass
class AdapterOptions(YamlHParams):
    """Options of the MEMIT/AlphaEdit adapters that are not EasyEdit fields (optional top-level YAML keys)."""

    stats_corpus: Any = hp_field(
        None, "Local corpus of the covariance statistics: built-in names or .txt/.json/.jsonl files or dirs; "
              "null = from mom2_dataset.", types=(list, type(None)))
    editing_prompt: str = hp_field("Introduce {subject}.", "Untargeted editing prompt; '{subject}' is filled in.",
                                   contains="{subject}")
    chat_template_kwargs: dict = hp_field({}, "Extra keyword arguments for apply_chat_template.")
    dtype: str = hp_field("float32", "Weights dtype when hpse_easyedit loads the model.",
                          choices=("float32", "bfloat16", "float16"))
    use_chat_template: bool = hp_field(True, "EasyEdit evaluation: score prompts through the chat template.")

    def check(self, source: str) -> None:
        if self.stats_corpus is not None and not all(isinstance(s, str) and s for s in self.stats_corpus):
            raise HParamsError(
                f"{source}: key 'stats_corpus' must be a list of corpus names or paths, got {self.stats_corpus!r}")


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
    def load(cls, path: str | os.PathLike, overrides: Sequence[str] | Mapping[str, Any] = ()) -> "LocateThenEditHParams":
        """A MEMIT/AlphaEdit file with ``key=value`` overrides (applied before EasyEdit's class reads the keys)."""
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
    """EasyEdit's own ``MEMITHyperParams`` and ``AlphaEditHyperParams`` when EasyEdit is imported (else ``()``)."""
    import sys

    out = []
    for modname, cls in (("easyeditor.models.memit.memit_hparams", "MEMITHyperParams"),
                         ("easyeditor.models.alphaedit.AlphaEdit_hparams", "AlphaEditHyperParams")):
        mod = sys.modules.get(modname)
        if mod is not None and hasattr(mod, cls):
            out.append(getattr(mod, cls))
    return tuple(out)


def as_locate_then_edit(hparams: Any) -> Any:
    """EasyEdit's own MEMIT/AlphaEdit hparams object wrapped with the adapter's default options; anything else as is."""
    classes = easyedit_locate_then_edit_classes()
    if classes and isinstance(hparams, classes):
        return LocateThenEditHParams(alg_name=hparams.alg_name, easyedit=hparams, options=AdapterOptions(),
                                     source=f"<{type(hparams).__name__}>")
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
        raise HParamsError(f"{path}: alg_name is {alg!r} in the file; an override cannot change the method, "
                           "pass the other method's hparams file")
    adapter_keys = {f.name for f in dataclasses.fields(AdapterOptions)}
    opts = AdapterOptions.from_dict({k: config.pop(k) for k in list(config) if k in adapter_keys}, source=path)
    import_easyedit()
    if alg == "MEMIT":
        from easyeditor.models.memit.memit_hparams import MEMITHyperParams as cls
    else:
        from easyeditor.models.alphaedit.AlphaEdit_hparams import AlphaEditHyperParams as cls
    from easyeditor.util.hparams import HyperParams

    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(config) - known)
    missing = sorted(f.name for f in dataclasses.fields(cls)
                     if f.name not in config and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    if unknown or missing:
        raise HParamsError(
            f"{path}: {'unknown key(s) ' + str(unknown) if unknown else ''}{'; ' if unknown and missing else ''}"
            f"{'missing key(s) ' + str(missing) if missing else ''} for EasyEdit's {cls.__name__} "
            f"(its keys: {sorted(known)}; adapter keys: {sorted(adapter_keys)})"
        )
    config = HyperParams.construct_float_from_scientific_notation(config)
    return LocateThenEditHParams(alg_name=alg, easyedit=cls(**config), options=opts, source=path)


class _ModuleState:
    """Which model EasyEdit's per-process caches of MEMIT/AlphaEdit were filled for, and what was prepared for it."""

    model: "weakref.ReferenceType[Any] | None" = None
    prepared: set = set()
    p_loc: str | None = None  # where AlphaEdit's module-global P was loaded from
    alphaedit_fresh: bool = True


def _reset_easyedit_caches(model: Any) -> None:
    memit = importlib.import_module("easyeditor.models.memit.memit_main")
    alpha = importlib.import_module("easyeditor.models.alphaedit.AlphaEdit_main")
    last = _ModuleState.model() if _ModuleState.model is not None else None
    if last is not model:
        memit.COV_CACHE.clear()
        alpha.COV_CACHE.clear()
        alpha.P_loaded = False
        alpha.cache_c_new = False
        _ModuleState.model = weakref.ref(model)
        _ModuleState.prepared = set()
        _ModuleState.p_loc = None
        _ModuleState.alphaedit_fresh = True


def _projection(model: Any, tok: Any, hp: LocateThenEditHParams, call_hparams: Any) -> None:
    """AlphaEdit's ``P`` at ``P_loc``, computed once with EasyEdit's ``get_project`` (it would save it to the cwd)."""
    ee = hp.easyedit
    p_loc = Path(ee.P_loc)
    meta = {"model": getattr(model.config, "_name_or_path", ""), "layers": list(ee.layers),
            "rewrite_module_tmp": ee.rewrite_module_tmp, "mom2_dataset": ee.mom2_dataset,
            "mom2_n_samples": ee.mom2_n_samples, "nullspace_threshold": ee.nullspace_threshold, "corpus": hp.corpus}
    meta_path = p_loc.with_suffix(".json")
    if p_loc.is_file() and (not meta_path.is_file() or json.loads(meta_path.read_text(encoding="utf-8")) == meta):
        return
    alpha = importlib.import_module("easyeditor.models.alphaedit.AlphaEdit_main")
    w = model.get_parameter(f"{ee.rewrite_module_tmp.format(ee.layers[-1])}.weight")
    dim = w.shape[1]
    P = torch.zeros((len(ee.layers), dim, dim), device="cpu")
    for i, layer in enumerate(ee.layers):
        P[i] = alpha.get_project(model, tok, layer, call_hparams)
    kept = [round(float(P[i].trace())) for i in range(len(ee.layers))]  # P = U U^T: its trace is the null space's dimension
    logger.info("AlphaEdit null space of %s: %s of %d dimensions per layer (threshold %g)", ee.layers, kept, dim,
                ee.nullspace_threshold)
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
            f"{hp.source}: mom2_dataset {hp.easyedit.mom2_dataset!r} is neither a built-in local corpus "
            f"({sorted(BUILTIN_CORPORA)}) nor one EasyEdit downloads ({list(DOWNLOADED_DATASETS)}); add "
            "stats_corpus: [FILES] to compute it offline"
        )
    return corpus


def _hub_reachable(timeout: float = 5.0) -> bool:
    """Whether EasyEdit could download its statistics dataset now: not in offline mode, and the Hub answers."""
    if offline_mode() or os.environ.get("HF_DATASETS_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    import socket

    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def check_statistics_obtainable(hp: LocateThenEditHParams) -> None:
    """Before any model is loaded: MEMIT's / AlphaEdit's covariance statistics can be had on this machine.

    A local corpus (``stats_corpus``, or a built-in ``mom2_dataset``) must be readable; a dataset EasyEdit
    downloads needs either statistics already in ``stats_dir`` (for every edited layer, any model folder)
    or a reachable Hub. Otherwise ``HParamsError`` names the file, the key and the fix.
    """
    ee = hp.easyedit
    corpus = _statistics_corpus(hp)
    if corpus is not None:
        try:
            load_corpus(corpus)
        except CorpusError as err:
            raise HParamsError(f"{hp.source}: the covariance statistics cannot be computed offline: {err}") from None
        return
    missing = [layer for layer in ee.layers if not any(Path(ee.stats_dir).glob("*/" + stats_relpath(
        ee.rewrite_module_tmp.format(layer), ee.mom2_dataset, ee.mom2_dtype, ee.mom2_n_samples)))]
    if missing and not _hub_reachable():
        raise HParamsError(
            f"{hp.source}: no covariance statistics for layers {missing} in stats_dir {ee.stats_dir!r}, and "
            f"mom2_dataset {ee.mom2_dataset!r} must be downloaded but the Hugging Face Hub cannot be reached (or offline "
            "mode is set); add stats_corpus: [editevery] to compute them offline, or copy the statistics into stats_dir"
        )


def prepare_locate_then_edit(model: Any, tok: Any, hp: LocateThenEditHParams) -> Any:
    """Offline statistics, AlphaEdit's projection and fresh caches for ``model``; returns the hparams EasyEdit gets."""
    import_easyedit()
    ee = hp.easyedit
    check_depth(model, ee.layers, [ee.v_loss_layer], hp.source)
    call = dataclasses.replace(ee, model_name=easyedit_model_name(ee.model_name, model, hp.alg_name))
    corpus = _statistics_corpus(hp)
    _reset_easyedit_caches(model)
    if hp.alg_name == "AlphaEdit" and _ModuleState.p_loc != ee.P_loc:  # another P (and cache_c size) than loaded
        alpha = importlib.import_module("easyeditor.models.alphaedit.AlphaEdit_main")
        alpha.P_loaded = alpha.cache_c_new = False
        _ModuleState.p_loc = ee.P_loc
    key = json.dumps([hp.alg_name, dataclasses.asdict(ee), corpus], sort_keys=True, default=str)
    if key in _ModuleState.prepared:
        return call
    for name in ("easyeditor.models.memit.memit_main", "easyeditor.models.alphaedit.AlphaEdit_main"):
        importlib.import_module(name).COV_CACHE.clear()  # keyed by model and layer only, not by dataset
    if corpus is not None:
        ensure_layer_stats(model, tok, layers=ee.layers, rewrite_module_tmp=ee.rewrite_module_tmp,
                           stats_dir=ee.stats_dir, ds_name=ee.mom2_dataset, sample_size=ee.mom2_n_samples,
                           precision=ee.mom2_dtype, sources=corpus)
    if hp.alg_name == "AlphaEdit":
        _projection(model, tok, hp, call)
    _ModuleState.prepared.add(key)
    return call


def easyedit_requests(tok: Any, requests: Any, hp: LocateThenEditHParams) -> list[dict]:
    """``{prompt, subject, target_new}`` for EasyEdit: chat-templated editing prompt, passage + end of turn."""
    reqs = normalize_requests(requests, hp.options)
    eot_text = _end_of_turn_text(tok, hp.options.chat_template_kwargs)
    out = []
    for i, r in enumerate(reqs):
        prompt = chat_text(tok, r["prompt"], hp.options.chat_template_kwargs)
        if "{" in prompt or "}" in prompt:
            raise RequestError(f"request {i}: the chat-templated prompt contains '{{' or '}}', which EasyEdit's "
                               f"{hp.alg_name} formats with str.format; remove them from the prompt")
        if prompt.count(r["subject"]) != 1:
            raise RequestError(
                f"request {i}: subject {r['subject']!r} occurs {prompt.count(r['subject'])} times in the chat-templated "
                f"prompt; EasyEdit's {hp.alg_name} needs it exactly once"
            )
        out.append({"prompt": prompt, "subject": r["subject"], "target_new": r["target_new"] + eot_text, "case_id": i})
    return out


def apply_locate_then_edit(model: Any, tok: Any, requests: Any, hp: LocateThenEditHParams,
                           timer: dict | None = None) -> tuple[Any, dict]:
    """One MEMIT/AlphaEdit edit through EasyEdit's own ``ALG_DICT`` entry; returns ``(model, weights_copy)``.

    ``timer``: a dict that receives ``"algorithm_seconds"``, the time spent inside EasyEdit's function (the
    statistics and AlphaEdit's projection, computed once per model by ``prepare_locate_then_edit``, are not in it).
    """
    call = prepare_locate_then_edit(model, tok, hp)
    ee_requests = easyedit_requests(tok, requests, hp)
    apply = importlib.import_module("easyeditor.util.alg_dict").ALG_DICT[hp.alg_name]
    kwargs: dict[str, Any] = {}
    if hp.alg_name == "AlphaEdit":
        kwargs["reset_cache"] = _ModuleState.alphaedit_fresh
        _ModuleState.alphaedit_fresh = False
    with _grad_flags_kept(model), _padding_side(tok, "right"):
        start = time.perf_counter()
        edited, weights_copy = apply(model, tok, ee_requests, call, copy=False, return_orig_weights=True,
                                     keep_original_weight=False, **kwargs)
        _record_algorithm_time(timer, start)
    return edited, weights_copy


def restore_copied_weights(model: Any, weights_copy: Mapping[str, torch.Tensor]) -> Any:
    """Copy ``weights_copy`` back by parameter name (``restore_weights``), and let AlphaEdit start its next edit fresh."""
    model = restore_weights(model, weights_copy)
    _ModuleState.alphaedit_fresh = True
    return model
