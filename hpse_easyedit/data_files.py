"""The benchmark data files, defined once: the data directory, where each file lies in it, the MMLU
CSV reader.

The data directory is read-only input: ``$HPSE_DATA_DIR``, else ``../shared/data`` next to the
repository. Every benchmark file the project reads is named here, relative to that directory; the
core package's built-in corpora (``covariance``), the UnKE/AnyEdit locality data
(``integrations.baselines``) and the benchmark loaders (``benchmarks.tasks.datasets``) all take
their paths from these names, and all MMLU CSV files are read by ``read_mmlu_csv``.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

from .encoding import TextEncodingError, decode_text

__all__ = [
    "DataError",
    "EDITEVERY_FILE",
    "MMLU_DIR",
    "MMLU_LETTERS",
    "MQUAKE_FILE",
    "MMLURow",
    "UNKE_FILE",
    "UNKE_SUBJECTS_FILE",
    "data_dir",
    "mmlu_file",
    "mmlu_test_files",
    "mmlu_text",
    "read_data_json",
    "read_data_text",
    "read_mmlu_csv",
]

#: AnyEdit's EditEverything set: a JSON list of {question, answer} long-form records.
EDITEVERY_FILE = "anyedit/editevery.json"
#: UnKEBench's edit cases (v2 schema).
UNKE_FILE = "unkebench/final_data_v2.json"
#: A JSON object record id -> subject phrase for UnKEBench (optional; generated subjects live in the
#: cache).
UNKE_SUBJECTS_FILE = "unkebench/subjects.json"
#: AKEW's MQuAKE-CF with the unstructured ``fact_new_uns`` passages.
MQUAKE_FILE = "akew/MQuAKE-CF.json"
#: MMLU: ``test/<subject>_test.csv`` and ``dev/<subject>_dev.csv``, rows
#: ``question,A,B,C,D,answer``.
MMLU_DIR = "mmlu"
MMLU_LETTERS = "ABCD"
_ANSWERS = tuple(MMLU_LETTERS)

#: One MMLU row: (question, (A, B, C, D), index of the right answer).
MMLURow = tuple[str, tuple[str, str, str, str], int]


class DataError(ValueError):
    """A data file is missing or does not have the expected schema; the message names file, field
    and fix."""


def data_dir() -> Path:
    """The benchmark data directory: ``$HPSE_DATA_DIR``, else ``../shared/data`` next to the
    repository."""
    env = os.environ.get("HPSE_DATA_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"


def mmlu_file(root: str | os.PathLike, split: str, subject: str, subdir: str = MMLU_DIR) -> Path:
    """One MMLU file under data directory ``root``: ``<subdir>/<split>/<subject>_<split>.csv``
    (split test or dev)."""
    return Path(root) / subdir / split / f"{subject}_{split}.csv"


def mmlu_test_files(root: str | os.PathLike, subdir: str = MMLU_DIR) -> list[Path]:
    """The MMLU test files under data directory ``root``, sorted (one ``<subject>_test.csv`` per
    subject)."""
    return sorted((Path(root) / subdir / "test").glob("*_test.csv"))


def read_data_text(path: str | os.PathLike) -> str:
    """The text of a data file: UTF-8, or Unicode with a byte-order mark (``encoding.decode_text``);
    another encoding (a Latin-1 file) is a ``DataError`` naming the file and the encoding it looks
    like."""
    try:
        return decode_text(Path(path).read_bytes(), os.fspath(path))
    except TextEncodingError as err:
        raise DataError(f"{err}; benchmark data files are UTF-8") from None


def read_data_json(path: str | os.PathLike) -> Any:
    """A JSON data file (``read_data_text``); invalid JSON is a ``DataError`` naming the file."""
    try:
        return json.loads(read_data_text(path))
    except json.JSONDecodeError as err:
        raise DataError(
            f"{path}: not valid JSON ({err}); use the unmodified benchmark file"
        ) from None


def read_mmlu_csv(path: str | os.PathLike) -> list[MMLURow]:
    """The rows of one MMLU CSV file; a row that is not ``question,A,B,C,D,answer(A-D)`` is a
    ``DataError``."""
    rows = []
    with io.StringIO(read_data_text(path), newline="") as fh:
        for n, row in enumerate(csv.reader(fh), 1):
            if len(row) != 6 or row[5] not in _ANSWERS:
                raise DataError(
                    f"{path}: row {n} must have 6 fields "
                    f"'question,A,B,C,D,answer(A-D)', got {row[:1]}..."
                )
            rows.append((row[0], (row[1], row[2], row[3], row[4]), MMLU_LETTERS.index(row[5])))
    return rows


def mmlu_text(question: str, choices: tuple[str, ...]) -> str:
    """A question with its lettered choices, one a line (``Q\nA. ...\nB. ...``): MMLU as a plain
    text corpus."""
    return (
        question
        + "\n"
        + "\n".join(f"{letter}. {choice}" for letter, choice in zip(MMLU_LETTERS, choices))
    )
