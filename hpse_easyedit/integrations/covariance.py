"""Offline second-moment statistics for MEMIT and AlphaEdit, from a local text corpus.

MEMIT and AlphaEdit weigh their updates by ``C = E[k k^T]``, the uncentred covariance of the keys
(the inputs of the edited ``down_proj``) over general text. EasyEdit computes ``C`` in
``easyeditor.models.rome.layer_stats.layer_stats`` after downloading Wikipedia. This module computes
the same statistic from local text and writes it where ``layer_stats`` looks for its cache, in the
``runningstats`` npz format, so EasyEdit loads it and never downloads anything.

Everything mirrors ``layer_stats`` so that, on the same corpus, the numbers are EasyEdit's own:

- documents: ``random.Random(1)`` shuffles the corpus and the first ``sample_size`` are used (all of
  them when the corpus is smaller), as EasyEdit's ``FixedRandomSubsetSampler`` does;
- tokens: ``tokenizer.encode(text, truncation=True, max_length=context)`` (special tokens included),
  ``context`` read from the config as EasyEdit reads it (capped at 4096 for Qwen and Mistral);
- features: the module's first input at every attended position, accumulated as ``sum k k^T`` and a
  row count, in ``mom2_dtype``;
- cache file: ``{stats_dir}/{model}/{mom2_dataset}_stats/{layer}_{dtype}_mom2_{sample_size}.npz``.

A JSON file next to each cache file records the corpus (sources, sha256, documents, tokens), so that
stale statistics are recomputed when the corpus behind a name changes, and every number can be
traced.

Corpora (``load_corpus``): built-in names read from the benchmark data directory
(``data_files.data_dir()``: ``$HPSE_DATA_DIR``, else ``../shared/data`` next to the repository; the
files as ``data_files`` names them) or paths to ``.txt`` files (documents separated by blank lines),
``.jsonl``/``.json`` files (strings or objects with a ``text`` field) and directories of those.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import torch

from ..atomic import replacing
from ..data_files import (
    EDITEVERY_FILE,
    MMLU_DIR,
    MQUAKE_FILE,
    UNKE_FILE,
    data_dir,
    mmlu_test_files,
    mmlu_text,
    read_mmlu_csv,
)
from ..model_calls import input_device
from ..padding import pad_rows, pad_token_id

__all__ = [
    "BUILTIN_CORPORA",
    "CorpusError",
    "context_length",
    "data_dir",
    "ensure_layer_stats",
    "load_corpus",
    "read_stats_file",
    "second_moments",
    "select_documents",
    "stats_file",
    "stats_relpath",
    "write_stats_file",
]

logger = logging.getLogger(__name__)

#: EasyEdit's class name written into the cache file, so that ``runningstats`` recognises it.
_STAT_CONSTRUCTOR = "easyeditor.util.runningstats.SecondMoment()"
#: ``mom2_dataset`` names that EasyEdit downloads itself (``layer_stats.get_ds``).
DOWNLOADED_DATASETS = ("wikipedia", "wikitext", "wikitext2")


class CorpusError(ValueError):
    """A corpus source cannot be read; the message names the source and what to pass instead."""


def _editevery(root: Path) -> list[str]:
    records = json.loads((root / EDITEVERY_FILE).read_text(encoding="utf-8"))
    return [f"{r['question']}\n\n{r['answer']}" for r in records]


def _mmlu(root: Path) -> list[str]:
    return [
        mmlu_text(question, choices)
        for path in mmlu_test_files(root)
        for question, choices, _ in read_mmlu_csv(path)
    ]


def _unkebench(root: Path) -> list[str]:
    return [r["answer"] for r in json.loads((root / UNKE_FILE).read_text(encoding="utf-8"))]


def _mquake_uns(root: Path) -> list[str]:
    cases = json.loads((root / MQUAKE_FILE).read_text(encoding="utf-8"))
    return [rw["fact_new_uns"] for case in cases for rw in case["requested_rewrite"]]


#: Built-in corpora: name -> (reader, what it is). The benchmark passages are offered for
#: completeness; statistics meant to PRESERVE knowledge should not be taken over the passages being
#: edited.
BUILTIN_CORPORA: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "editevery": (
        _editevery,
        f"AnyEdit's EditEverything set ({EDITEVERY_FILE}): 552 long-form question+answer "
        "texts on physics, biology, math, chemistry, code, poetry and news",
    ),
    "mmlu": (
        _mmlu,
        f"MMLU test questions with their four choices ({MMLU_DIR}/test/*_test.csv, 14,042 texts)",
    ),
    "unkebench": (_unkebench, f"UnKEBench edit passages ({UNKE_FILE})"),
    "mquake-uns": (_mquake_uns, f"MQuAKE-uns edit passages ({MQUAKE_FILE}, fact_new_uns)"),
}


def _read_file(path: Path) -> list[str]:
    suffix = path.suffix.lower()
    if suffix == ".txt":
        text = path.read_text(encoding="utf-8")
        return [
            block.strip() for block in text.replace("\r\n", "\n").split("\n\n") if block.strip()
        ]
    if suffix == ".jsonl":
        items = [
            json.loads(line)
            for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]
    elif suffix == ".json":
        items = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(items, list):
            raise CorpusError(
                f"{path}: expected a JSON list of strings or of objects with a 'text' field"
            )
    else:
        raise CorpusError(
            f"{path}: unsupported corpus file type {suffix!r}; use .txt, .json or .jsonl"
        )
    texts = []
    for i, item in enumerate(items):
        if isinstance(item, Mapping):
            item = item.get("text")
        if not isinstance(item, str):
            raise CorpusError(
                f"{path}: item {i} is neither a string nor an object with a string 'text' field"
            )
        if item.strip():
            texts.append(item)
    return texts


def load_corpus(
    sources: str | os.PathLike | Sequence[str | os.PathLike], root: str | os.PathLike | None = None
) -> list[str]:
    """Texts of every source, in order: built-in names (see ``BUILTIN_CORPORA``), files or
    directories."""
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    if not sources:
        raise CorpusError(
            "no corpus sources given; name a built-in corpus "
            f"({sorted(BUILTIN_CORPORA)}) or a .txt/.json/.jsonl file or directory"
        )
    base = Path(root) if root is not None else data_dir()
    texts: list[str] = []
    for source in sources:
        name = os.fspath(source)
        if name in BUILTIN_CORPORA:
            reader, what = BUILTIN_CORPORA[name]
            try:
                texts.extend(reader(base))
            except FileNotFoundError as err:
                raise CorpusError(
                    f"built-in corpus {name!r} ({what}) needs {err.filename}, which does not "
                    "exist; set HPSE_DATA_DIR to the benchmark data directory"
                ) from None
            continue
        path = Path(os.path.expandvars(os.path.expanduser(name)))
        if path.is_dir():
            files = sorted(
                p for p in path.rglob("*") if p.suffix.lower() in (".txt", ".json", ".jsonl")
            )
            if not files:
                raise CorpusError(f"corpus directory {path} holds no .txt, .json or .jsonl file")
            for f in files:
                texts.extend(_read_file(f))
        elif path.is_file():
            texts.extend(_read_file(path))
        else:
            raise CorpusError(
                f"corpus source {name!r} is neither a built-in corpus ({sorted(BUILTIN_CORPORA)}) "
                "nor an existing file or directory"
            )
    if not texts:
        raise CorpusError(f"the corpus {list(map(os.fspath, sources))} holds no text")
    return texts


def corpus_sha256(texts: Iterable[str]) -> str:
    """A digest of the documents, in order (what the statistics were computed from)."""
    h = hashlib.sha256()
    for t in texts:
        h.update(hashlib.sha256(t.encode("utf-8")).digest())
    return h.hexdigest()


def select_documents(n_documents: int, sample_size: int | None, seed: int = 1) -> list[int]:
    """The documents ``layer_stats`` reads: a ``random.Random(seed)`` shuffle, first
    ``sample_size``."""
    order = list(range(n_documents))
    if sample_size is None:
        return order
    random.Random(seed).shuffle(order)
    return order[: min(sample_size, n_documents)]


def context_length(model: Any) -> int:
    """The truncation length ``layer_stats`` uses for this model's config."""
    config = model.config
    for key in ("n_positions", "max_sequence_length", "max_position_embeddings", "seq_length"):
        value = getattr(config, key, None)
        if value:
            npos = int(value)
            break
    else:
        raise ValueError(
            f"{type(model).__name__}'s config has no context "
            "length (n_positions, max_position_embeddings)"
        )
    model_type = getattr(config, "model_type", "") or ""
    if "mistral" in model_type:
        npos = getattr(config, "sliding_window", None) or 4096
    if "qwen" in model_type:
        npos = min(npos, 4096)
    return npos


def easyedit_model_name(model: Any) -> str:
    """The model's directory name in EasyEdit's stats cache (``_name_or_path``'s last component)."""
    return str(getattr(model.config, "_name_or_path", "") or "").rsplit("/")[-1]


def stats_file(
    stats_dir: str | os.PathLike,
    model: Any,
    layer_name: str,
    ds_name: str,
    precision: str,
    sample_size: int | None,
) -> Path:
    """Where ``layer_stats`` caches ``mom2`` of ``layer_name`` (it re-reads the file when it
    exists)."""
    return (
        Path(stats_dir)
        / easyedit_model_name(model)
        / stats_relpath(layer_name, ds_name, precision, sample_size)
    )


def stats_relpath(layer_name: str, ds_name: str, precision: str, sample_size: int | None) -> str:
    """``stats_file`` below the model's folder:
    ``{ds_name}_stats/{layer}_{precision}_mom2[_{sample_size}].npz``."""
    suffix = "" if sample_size is None else f"_{sample_size}"
    return f"{ds_name}_stats/{layer_name}_{precision}_mom2{suffix}.npz"


def write_stats_file(
    path: str | os.PathLike,
    mom2: torch.Tensor,
    count: int,
    sample_size: int | None,
    provenance: Mapping[str, Any] | None = None,
) -> None:
    """Write ``mom2``/``count`` as ``runningstats.tally`` saves a
    ``CombinedStat(mom2=SecondMoment())``."""
    if sample_size is None:
        raise ValueError(
            "sample_size must be an int (mom2_n_samples); EasyEdit names and checks its cache by it"
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Runs that compute the same statistics at once (one per core, sharing a cache) each write their
    # own temporary file (``replacing``), so neither renames the other's half-written one away.
    with replacing(path, ".tmp.npz") as tmp:
        np.savez(
            tmp,
            **{
                "mom2.constructor": np.array(_STAT_CONSTRUCTOR),
                "mom2.count": np.array(int(count)),
                "mom2.mom2": mom2.detach().cpu().numpy(),
                "sample_size": np.array(int(sample_size)),
            },
        )
    if provenance is not None:
        with replacing(path.with_suffix(".json")) as tmp:
            tmp.write_text(json.dumps(dict(provenance), indent=1), encoding="utf-8")


def read_stats_file(path: str | os.PathLike) -> tuple[torch.Tensor, int]:
    """``(sum k k^T, count)`` from a cache file written by EasyEdit or by ``write_stats_file``."""
    with np.load(path) as data:
        return torch.from_numpy(data["mom2.mom2"].copy()), int(data["mom2.count"])


class _Stop(Exception):
    """Raised by the last feature hook: nothing after the deepest statistics layer needs
    computing."""


@torch.no_grad()
def second_moments(
    model: Any,
    tok: Any,
    module_names: Sequence[str],
    texts: Sequence[str],
    *,
    precision: str = "float32",
    max_length: int | None = None,
    batch_tokens: int = 4096,
) -> dict[str, tuple[torch.Tensor, int]]:
    """``{module: (sum k k^T, number of rows)}`` of each module's first input over ``texts``, in one
    pass.

    Sequences are truncated to ``max_length`` (default ``context_length(model)``), sorted by length
    and right-padded into batches of at most ``batch_tokens`` tokens; only attended positions count,
    so the result does not depend on the batching (up to float summation order).
    """
    if not module_names:
        raise ValueError(
            "module_names is empty: name the modules whose "
            "inputs to collect, e.g. model.layers.4.mlp.down_proj"
        )
    dtype = getattr(torch, precision, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(
            f"precision {precision!r} is not a torch dtype name such as float32 or float64"
        )
    maxlen = max_length or context_length(model)
    encoded = [tok.encode(t, truncation=True, max_length=maxlen) for t in texts]
    encoded = sorted((e for e in encoded if e), key=len, reverse=True)
    modules = {name: model.get_submodule(name) for name in module_names}
    sums: dict[str, torch.Tensor | None] = {name: None for name in module_names}
    counts = {name: 0 for name in module_names}
    state: dict[str, Any] = {"mask": None, "fired": set()}

    def hook_for(name: str):
        def hook(module: torch.nn.Module, args: tuple) -> None:
            feats = args[0]
            flat = feats.reshape(-1, feats.shape[-1])
            rows = flat[state["mask"].to(flat.device).reshape(-1).nonzero()[:, 0]].to(dtype)
            sums[name] = rows.T @ rows if sums[name] is None else sums[name] + rows.T @ rows
            counts[name] += rows.shape[0]
            state["fired"].add(name)
            if len(state["fired"]) == len(modules):
                raise _Stop

        return hook

    handles = [m.register_forward_pre_hook(hook_for(n)) for n, m in modules.items()]
    pad_id = pad_token_id(tok)
    device = input_device(model)
    was_training = model.training
    model.eval()
    try:
        start = 0
        while start < len(encoded):
            width = len(encoded[start])
            rows = max(1, batch_tokens // width)
            batch = encoded[start : start + rows]
            start += len(batch)
            ids, mask = pad_rows(batch, pad_id)
            positions = torch.arange(width).expand(len(batch), width)
            state["mask"], state["fired"] = mask, set()
            try:
                model(
                    input_ids=ids.to(device),
                    attention_mask=mask.to(device),
                    position_ids=positions.to(device),
                )
            except _Stop:
                pass
            if len(state["fired"]) != len(modules):
                missing = sorted(set(modules) - state["fired"])
                raise RuntimeError(
                    f"the forward pass never reached {missing}; check the module names"
                )
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return {name: (sums[name], counts[name]) for name in module_names}  # type: ignore[misc]


def ensure_layer_stats(
    model: Any,
    tok: Any,
    *,
    layers: Sequence[int],
    rewrite_module_tmp: str,
    stats_dir: str | os.PathLike,
    ds_name: str,
    sample_size: int,
    precision: str,
    sources: Sequence[str],
    root: str | os.PathLike | None = None,
    batch_tokens: int = 4096,
) -> list[Path]:
    """Make sure EasyEdit finds ``mom2`` of every edited layer in its cache, computed from
    ``sources``.

    Files that exist and were computed from the same documents are kept; missing or stale ones are
    computed in one pass over the corpus. Returns the cache files, one per layer.
    """
    if ds_name in DOWNLOADED_DATASETS:
        raise CorpusError(
            f"mom2_dataset {ds_name!r} names the dataset EasyEdit downloads; give the local "
            "statistics their own name (e.g. mom2_dataset: editevery) "
            "so the cache cannot be confused with Wikipedia's"
        )
    texts = load_corpus(sources, root)
    chosen = [texts[i] for i in select_documents(len(texts), sample_size)]
    digest = corpus_sha256(chosen)
    names = [rewrite_module_tmp.format(layer) for layer in layers]
    files = {
        name: stats_file(stats_dir, model, name, ds_name, precision, sample_size) for name in names
    }
    todo = []
    for name, path in files.items():
        meta_path = path.with_suffix(".json")
        if path.is_file() and meta_path.is_file():
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            if meta.get("corpus_sha256") == digest:
                continue
            logger.warning(
                "%s was computed from another corpus than %s; recomputing it", path, list(sources)
            )
        elif path.is_file():
            logger.warning(
                "%s exists without a provenance file; recomputing it from %s", path, list(sources)
            )
        todo.append(name)
    if todo:
        logger.info(
            "Computing mom2 of %s over %d local documents (%s) for EasyEdit's cache",
            todo,
            len(chosen),
            ", ".join(map(str, sources)),
        )
        moments = second_moments(
            model, tok, todo, chosen, precision=precision, batch_tokens=batch_tokens
        )
        for name in todo:
            mom2, count = moments[name]
            write_stats_file(
                files[name],
                mom2,
                count,
                sample_size,
                provenance={
                    "written_by": "hpse_easyedit.integrations.covariance",
                    "corpus_sources": [os.fspath(s) for s in sources],
                    "corpus_sha256": digest,
                    "documents": len(chosen),
                    "rows": count,
                    "module": name,
                    "precision": precision,
                    "mom2_n_samples": sample_size,
                },
            )
    return [files[name] for name in names]
