"""The locality data UnKE and AnyEdit preserve (``ex_data``; Alpaca in the original): read from a
built-in set or local files, rendered as chat turns, drawn per edit and cut to a token budget."""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any, Mapping, Sequence

from ...data_files import (
    EDITEVERY_FILE,
    MMLU_LETTERS,
    data_dir,
    mmlu_test_files,
    mmlu_text,
    read_mmlu_csv,
)
from ...hparams import HParamsError
from ..covariance import CorpusError, load_corpus

__all__ = ["LocalityTexts", "check_locality_data", "draw_locality_texts", "load_instruction_texts"]


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
                f"{where}: record {i} is not a string, an Alpaca record (instruction, input, "
                "output), a question/answer record or an object with 'text'"
            )
    return pairs


def _instruction_pairs(source: str, root: Path) -> list[tuple[str, str | None]]:
    if source == "editevery":
        return _pairs_from_records(
            json.loads((root / EDITEVERY_FILE).read_text(encoding="utf-8")), source
        )
    if source == "mmlu":
        return [
            (mmlu_text(question, choices), f"{MMLU_LETTERS[answer]}. {choices[answer]}")
            for path in mmlu_test_files(root)
            for question, choices, answer in read_mmlu_csv(path)
        ]
    path = Path(os.path.expandvars(os.path.expanduser(source)))
    if path.suffix.lower() in (".json", ".jsonl") and path.is_file():
        text = path.read_text(encoding="utf-8")
        records = (
            [json.loads(line) for line in text.splitlines() if line.strip()]
            if path.suffix.lower() == ".jsonl"
            else json.loads(text)
        )
        return _pairs_from_records(records, str(path))
    return [(t, None) for t in load_corpus([source], root)]


def load_instruction_texts(
    tok: Any,
    sources: Sequence[str],
    template_kwargs: Mapping[str, Any] | None = None,
    root: str | os.PathLike | None = None,
) -> list[str]:
    """Locality texts for UnKE/AnyEdit: instruction/answer pairs rendered as chat turns (plain texts
    as they are)."""
    base = Path(root) if root is not None else data_dir()
    texts = []
    for source in sources:
        try:
            pairs = _instruction_pairs(os.fspath(source), base)
        except FileNotFoundError as err:
            raise CorpusError(
                f"locality source {source!r} needs {err.filename}; set HPSE_DATA_DIR or give a file"
            ) from None
        for user, answer in pairs:
            if answer is None:
                texts.append(user)
            else:
                texts.append(
                    tok.apply_chat_template(
                        [
                            {"role": "user", "content": user},
                            {"role": "assistant", "content": answer},
                        ],
                        tokenize=False,
                        **dict(template_kwargs or {}),
                    )
                )
    if not texts:
        raise CorpusError(f"the locality sources {list(sources)} hold no text")
    return texts


def check_locality_data(hp: Any) -> None:
    """Before any model is loaded: every UnKE/AnyEdit locality source (``ex_data``) can be read on
    this machine."""
    where = f"{getattr(hp, '_source', f'<{hp.alg_name} hparams>')}: key 'ex_data'"
    for source in hp.ex_data:
        try:
            pairs = _instruction_pairs(os.fspath(source), data_dir())
        except FileNotFoundError as err:
            raise HParamsError(
                f"{where}: the locality source {source!r} needs {err.filename}, which is not "
                "there; set HPSE_DATA_DIR to the benchmark data, or "
                "give a local JSON/JSONL file of instruction/answer pairs"
            ) from None
        except CorpusError as err:
            raise HParamsError(f"{where}: {err}") from None
        if not pairs:
            raise HParamsError(f"{where}: the locality source {source!r} holds no text")


def _draw(texts: Sequence[str], k: int, seed: int, reqs: Sequence[Mapping[str, str]]) -> list[str]:
    key = hashlib.sha256(
        ("\x00".join(r["target_new"] for r in reqs) + f"\x00{seed}").encode("utf-8")
    ).hexdigest()
    return random.Random(key).sample(list(texts), min(k, len(texts)))


def _cut(tok: Any, text: str, max_tokens: int) -> str:
    if max_tokens <= 0:
        return text
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return (
        text if len(ids) <= max_tokens else tok.decode(ids[:max_tokens], skip_special_tokens=False)
    )


class LocalityTexts:
    """A cache of loaded locality texts, owned by whoever edits many times with the same sources.

    Keyed by the data directory, the sources and the tokenizer's chat template with its arguments,
    so one object serves any hparams; without one, each edit reads its sources again (the same
    texts).
    """

    def __init__(self) -> None:
        self._texts: dict[tuple, list[str]] = {}

    def texts(
        self, tok: Any, sources: Sequence[str], template_kwargs: Mapping[str, Any]
    ) -> list[str]:
        """``load_instruction_texts(tok, sources, template_kwargs)``, read once per key."""
        key = (
            str(data_dir()),
            tuple(sources),
            str(getattr(tok, "chat_template", "")),
            json.dumps(template_kwargs, sort_keys=True),
        )
        if key not in self._texts:
            self._texts[key] = load_instruction_texts(tok, sources, template_kwargs)
        return self._texts[key]


def draw_locality_texts(
    tok: Any, hparams: Any, reqs: Sequence[Mapping[str, str]], cache: LocalityTexts | None = None
) -> list[str]:
    """The ``ex_data_num`` locality texts of one edit (a draw seeded by its passages), each cut to
    ``ex_data_max_tokens``."""
    texts = (cache or LocalityTexts()).texts(tok, hparams.ex_data, hparams.chat_template_kwargs)
    drawn = _draw(texts, hparams.ex_data_num, hparams.ex_data_seed, reqs)
    return [_cut(tok, t, hparams.ex_data_max_tokens) for t in drawn]
