"""Benchmark loaders: UnKEBench and MQuAKE-uns edit cases as ``datasets.Dataset``, plus the MMLU
subset.

Every case carries ``requests``: the edit as the engine takes it, a list of
``{"prompt": "Introduce {s}.", "subject": s, "target_new": passage}`` (one per passage; MQuAKE-uns
cases edit all their rewrites at once), and the evaluation questions with their gold answers.

The data directory is read-only input: ``--data``, else ``$HPSE_DATA_DIR``, else ``../shared/data``
relative to the repository root. Anything generated (LLM subjects, MQuAKE passages) goes to a cache
directory, never into the data directory (both defined in ``benchmarks.tasks.paths``). The data
files' names (``UNKE_FILE``, ``MQUAKE_FILE``, ...), the MMLU CSV reader and ``DataError`` come from
the core package's ``hpse_easyedit.data_files``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from hpse_easyedit.data_files import (
    MMLU_DIR,
    MQUAKE_FILE,
    UNKE_FILE,
    UNKE_SUBJECTS_FILE,
    DataError,
    mmlu_file,
    mmlu_test_files,
    read_data_json,
    read_mmlu_csv,
)
from hpse_easyedit.errors import choice_text

from .paths import default_cache_dir, default_data_dir

# ``datasets`` is imported where a loader builds one: a command that reads no data (``perf`` on a
# machine without the package) imports this module too
if TYPE_CHECKING:
    from datasets import Dataset

__all__ = [
    "SUBJECT_MODES",
    "DataError",
    "EDIT_PROMPT",
    "MMLUItem",
    "UNKE_FILE",
    "MQUAKE_FILE",
    "default_cache_dir",
    "default_data_dir",
    "file_sha256",
    "heuristic_subject",
    "load_mmlu_subset",
    "load_mquake_uns",
    "load_unkebench",
]

log = logging.getLogger(__name__)

EDIT_PROMPT = "Introduce {subject}."

SUBJECT_PROMPT = (
    "Read the passage below and name its topic as a short phrase of 1 to 8 words, such as "
    '"the novel The Firm by John Grisham" or "George Rankin". The phrase must say what the passage '
    "introduces without stating any of the facts it gives. Answer with the phrase only.\n\n"
    "PASSAGE:\n{passage}"
)
# AKEW's own generation prompt is not published with its data; this one asks for the same kind of
# passage (a short natural-language paragraph that asserts the new fact in context).
PASSAGE_PROMPT = (
    "Write a short, natural paragraph of about 80 words, in the style of an encyclopedia or news "
    "text, that states the following fact as true and places it in context. Treat the fact as "
    "true even if it contradicts what you know, state it explicitly, and do not mention that it "
    "is hypothetical.\n\nFACT: {fact}\n\nAnswer with the paragraph only."
)

#: where ``s`` of ``Introduce {s}.`` comes from for records without a subject (``--subjects``): the
#: subjects file, the judge model, a heuristic, or ``auto`` (file, then the judge model if
#: configured, then the heuristic)
SUBJECT_MODES = ("auto", "file", "llm", "heuristic")


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _resolve(data_dir: str | os.PathLike | None, name: str | os.PathLike) -> Path:
    path = Path(name)
    if not path.is_absolute():
        path = Path(data_dir if data_dir is not None else default_data_dir()) / path
    if not path.is_file():
        raise DataError(
            f"{path}: no such file; pass the data directory with --data DIR (or set "
            "HPSE_DATA_DIR), default is ../shared/data next to the repository"
        )
    return path


def _read_list(path: Path, what: str, limit: int | None) -> list:
    """The JSON list of ``path`` (its first ``limit`` entries when given); DataError naming ``what``
    otherwise."""
    items = read_data_json(path)
    if not isinstance(items, list):
        raise DataError(f"{path}: expected a JSON list of {what}, got {type(items).__name__}")
    return items if limit is None else items[: max(0, limit)]


def _require(record: dict, key: str, kind: type | tuple, path: Path, where: str) -> Any:
    if key not in record:
        raise DataError(
            f"{path}: {where} has no field '{key}'; this is "
            "not the expected schema (see data/SOURCES.md)"
        )
    value = record[key]
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise DataError(
            f"{path}: {where} field '{key}' must be {names}, got {type(value).__name__}"
        )
    return value


def _str_list(record: dict, key: str, path: Path, where: str) -> list[str]:
    value = _require(record, key, list, path, where)
    if not all(isinstance(v, str) for v in value):
        raise DataError(f"{path}: {where} field '{key}' must be a list of strings")
    return value


# ----------------------------------------------------------------------------------------- subjects
_CONNECTORS = {"of", "the", "de", "van", "von", "da", "del", "and", "&"}
_SKIP_WORDS = {
    "What",
    "Who",
    "Which",
    "When",
    "Where",
    "Why",
    "How",
    "Is",
    "Are",
    "Was",
    "Were",
    "Do",
    "Does",
    "Did",
    "Can",
    "Could",
    "In",
    "The",
    "A",
    "An",
    "Dr.",
    "Dr",
    "Rabbi",
    "Bishop",
    "Professor",
    "Prof.",
}


def _name_spans(question: str) -> list[str]:
    """Runs of capitalised words in the question, minus leading question words and titles. A
    possessive or a punctuation mark ends a run ("Heller's Moravian heritage" -> "Heller")."""
    runs: list[list[str]] = [[]]
    for raw in question.split():
        word = raw.strip("\"'()[]\u201c\u201d")
        closes = bool(re.search(r"(?:'s|'|[,;:?!])$", word))
        word = re.sub(r"(?:'s|'|[,;:?!]+)$", "", word)
        if word[:1].isupper() or (runs[-1] and word in _CONNECTORS):
            runs[-1].append(word)
        elif runs[-1]:
            runs.append([])
        if closes and runs[-1]:
            runs.append([])
    out = []
    for run in runs:
        while run and (run[0] in _SKIP_WORDS or run[0] in _CONNECTORS):
            run = run[1:]
        while run and run[-1] in _CONNECTORS:
            run = run[:-1]
        if run:
            out.append(" ".join(run))
    return out


def heuristic_subject(question: str, passage: str) -> str:
    """A topic phrase without an LLM: the first capitalised span of the question with two or more
    words (possessive dropped), else its first span, else the passage's first five words. Questions
    name their subject early ("What is George Rankin's occupation?"). Only a logged offline
    fallback."""
    spans = _name_spans(question)
    if spans:
        return next((s for s in spans if len(s.split()) > 1), spans[0])
    return " ".join(passage.split()[:5]).rstrip(".,;:")


def _generated(
    kind: str,
    keys: list[str],
    prompt_of: Callable[[str], str],
    clean: Callable[[str], str],
    client: Any,
    cache_dir: Path,
) -> dict[str, str]:
    """The judge model's answer for every key (a record id, a fact), asked through the client's one
    response cache, so a rerun asks nothing again. ``<cache_dir>/<kind>.<model>.json`` (key ->
    answer), the cache that earlier versions kept beside it, is read when present and its answers
    used as they are; it is never written or deleted."""
    slug = re.sub(r"[^\w.-]+", "_", client.model)
    legacy_path = cache_dir / f"{kind}.{slug}.json"
    legacy: dict[str, str] = read_data_json(legacy_path) if legacy_path.is_file() else {}
    out = {k: legacy[k] for k in keys if k in legacy}
    todo = [k for k in dict.fromkeys(keys) if k not in out]
    if todo:
        log.info("generating %d %s with %s", len(todo), kind.replace("_", " "), client.name)
    for k in todo:
        out[k] = clean(client.ask_text(prompt_of(k)))
    return out


def _llm_subjects(
    records: list[dict], ids: list[str], client: Any, cache_dir: Path
) -> dict[str, str]:
    """Subjects generated by the judge model for ``ids`` (see ``_generated``)."""
    by_id = {str(r["id"]): r for r in records}
    return _generated(
        "unkebench_subjects",
        ids,
        lambda i: SUBJECT_PROMPT.format(passage=by_id[i]["answer"]),
        lambda text: text.splitlines()[0].strip(" .\"'"),
        client,
        cache_dir,
    )


def _subjects_for(
    records: list[dict],
    path: Path,
    mode: str,
    subjects_file: Path | None,
    client: Any,
    cache_dir: Path,
) -> tuple[dict[str, str], dict[str, str]]:
    """Subject and its source ('file', 'llm:<model>', 'heuristic') for every record id."""
    if mode not in SUBJECT_MODES:
        raise ValueError(f"subjects must be {choice_text(SUBJECT_MODES)}, got {mode!r}")
    ids = [str(r["id"]) for r in records]
    subjects: dict[str, str] = {}
    source: dict[str, str] = {}
    if mode in {"auto", "file"}:
        if subjects_file is not None and subjects_file.is_file():
            table = read_data_json(subjects_file)
            if not isinstance(table, dict):
                raise DataError(
                    f"{subjects_file}: expected a JSON object mapping record id to subject phrase"
                )
            for i in ids:
                if isinstance(table.get(i), str) and table[i].strip():
                    subjects[i], source[i] = table[i].strip(), "file"
        elif mode == "file":
            raise DataError(
                f"{subjects_file}: no subject file; pass "
                "--subjects-file FILE or use --subjects llm/heuristic"
            )
        missing = [i for i in ids if i not in subjects]
        if missing and mode == "file":
            raise DataError(
                f"{subjects_file}: no subject for {len(missing)} record(s) of {path} (ids "
                f"{missing[:10]}...); use --subjects auto to generate "
                "them with the judge model (or the heuristic offline)"
            )
    missing = [i for i in ids if i not in subjects]
    if missing and (mode == "llm" or (mode == "auto" and client is not None)):
        if client is None:
            raise DataError(
                "--subjects llm needs a judge endpoint: set --judge-base-url / HPSE_JUDGE_BASE_URL"
            )
        for i, s in _llm_subjects(records, missing, client, cache_dir).items():
            subjects[i], source[i] = s, client.name
    missing = [i for i in ids if i not in subjects]
    if missing:
        if mode == "auto":
            log.warning(
                "HEURISTIC SUBJECT FALLBACK for %d UnKEBench record(s) (ids %s...): no subject in "
                "%s and no judge endpoint; the phrase is taken from "
                "the question. Configure a judge to generate real ones.",
                len(missing),
                missing[:10],
                subjects_file,
            )
        by_id = {str(r["id"]): r for r in records}
        for i in missing:
            subjects[i], source[i] = (
                heuristic_subject(by_id[i]["question"], by_id[i]["answer"]),
                "heuristic",
            )
    return subjects, source


# ---------------------------------------------------------------------------------------- UnKEBench
def load_unkebench(
    data_dir: str | os.PathLike | None = None,
    *,
    file: str | os.PathLike = UNKE_FILE,
    limit: int | None = None,
    subjects: str = "auto",
    subjects_file: str | os.PathLike | None = None,
    client: Any = None,
    cache_dir: str | os.PathLike | None = None,
    prompt_template: str = EDIT_PROMPT,
) -> Dataset:
    """UnKEBench edit cases (v2 schema, or v3 with ``mmlu_questions/mmlu_choices/mmlu_answer``).

    Columns: ``case_id``, ``subject``, ``subject_source``, ``requests`` (one request: the passage
    ``answer`` from ``Introduce {s}.``), ``passage``, ``question``, ``para_question``,
    ``sub_questions``, ``sub_answers``; v3 files add ``mmlu_questions``, ``mmlu_choices``,
    ``mmlu_answer``.

    ``subjects``: 'file' (``subjects_file``, default ``unkebench/subjects.json``), 'llm' (generated
    by ``client``, kept in its response cache), 'heuristic', or 'auto' = file, then llm if a client
    is given, then a logged heuristic fallback.
    """
    path = _resolve(data_dir, file)
    records = _read_list(path, "records", limit)
    is_v3 = bool(records) and all("mmlu_questions" in r for r in records if isinstance(r, dict))
    seen: set[str] = set()
    for n, r in enumerate(records):
        where = f"record #{n}"
        if not isinstance(r, dict):
            raise DataError(f"{path}: {where} is not an object")
        rid = _require(r, "id", (int, str), path, where)
        where = f"record #{n} (id {rid})"
        if str(rid) in seen:
            raise DataError(f"{path}: {where} repeats an id; ids must be unique")
        seen.add(str(rid))
        for key in ("question", "para_question", "answer"):
            _require(r, key, str, path, where)
        sq, sa = _str_list(r, "sub_question", path, where), _str_list(r, "sub_answer", path, where)
        if len(sq) != len(sa) or not sq:
            raise DataError(
                f"{path}: {where} has {len(sq)} sub_question(s) "
                f"but {len(sa)} sub_answer(s); they must pair up"
            )
        if is_v3:
            mq = _str_list(r, "mmlu_questions", path, where)
            mc = _require(r, "mmlu_choices", list, path, where)
            ma = _require(r, "mmlu_answer", list, path, where)
            if not (len(mq) == len(mc) == len(ma)) or not all(
                isinstance(c, list) and len(c) == 4 for c in mc
            ):
                raise DataError(
                    f"{path}: {where} mmlu_questions/mmlu_choices/mmlu_answer "
                    "must pair up, 4 choices each"
                )
    if subjects_file is None:
        subjects_file = (
            Path(data_dir if data_dir is not None else default_data_dir()) / UNKE_SUBJECTS_FILE
        )
    subject_of, source_of = _subjects_for(
        records, path, subjects, Path(subjects_file), client, Path(cache_dir or default_cache_dir())
    )
    rows: dict[str, list] = {
        k: []
        for k in (
            "case_id",
            "subject",
            "subject_source",
            "requests",
            "passage",
            "question",
            "para_question",
            "sub_questions",
            "sub_answers",
        )
    }
    if is_v3:
        rows.update(mmlu_questions=[], mmlu_choices=[], mmlu_answer=[])
    for r in records:
        cid = str(r["id"])
        s = subject_of[cid]
        rows["case_id"].append(cid)
        rows["subject"].append(s)
        rows["subject_source"].append(source_of[cid])
        rows["requests"].append(
            [{"prompt": prompt_template.format(subject=s), "subject": s, "target_new": r["answer"]}]
        )
        rows["passage"].append(r["answer"])
        rows["question"].append(r["question"])
        rows["para_question"].append(r["para_question"])
        rows["sub_questions"].append(list(r["sub_question"]))
        rows["sub_answers"].append(list(r["sub_answer"]))
        if is_v3:
            rows["mmlu_questions"].append(list(r["mmlu_questions"]))
            rows["mmlu_choices"].append([list(map(str, c)) for c in r["mmlu_choices"]])
            rows["mmlu_answer"].append([int(a) for a in r["mmlu_answer"]])
    from datasets import Dataset

    return Dataset.from_dict(rows)


# --------------------------------------------------------------------------------------- MQuAKE-uns
def _fact_new(rw: dict) -> str:
    """The rewrite as one sentence: AKEW's ``fact_new``, else MQuAKE's ``prompt`` filled +
    ``target_new``."""
    if isinstance(rw.get("fact_new"), str) and rw["fact_new"].strip():
        return rw["fact_new"].strip()
    return f"{rw['prompt'].format(rw['subject'])} {rw['target_new']['str']}."


def _generated_passages(facts: list[str], client: Any, cache_dir: Path) -> dict[str, str]:
    """Passages for structured facts, generated by the judge model (see ``_generated``)."""
    return _generated(
        "mquake_passages",
        facts,
        lambda fact: PASSAGE_PROMPT.format(fact=fact),
        lambda text: text,
        client,
        cache_dir,
    )


def load_mquake_uns(
    data_dir: str | os.PathLike | None = None,
    *,
    file: str | os.PathLike = MQUAKE_FILE,
    limit: int | None = None,
    client: Any = None,
    cache_dir: str | os.PathLike | None = None,
    prompt_template: str = EDIT_PROMPT,
) -> Dataset:
    """MQuAKE-uns edit cases from AKEW's ``MQuAKE-CF.json`` or a MQuAKE-CF-3k / Remastered file.

    Each rewrite becomes one request ``Introduce {subject}.`` -> passage, where the passage is the
    rewrite's ``fact_new_uns`` (AKEW) or, for files without it, a passage generated by ``client``
    from the rewrite's ``fact_new`` (cached). All rewrites of a case form one edit.

    Columns: ``case_id``, ``requests``, ``passage_source``, ``single_hop_questions``,
    ``single_hop_answers`` (answer + aliases per ``new_single_hops`` entry), ``multi_hop_questions``
    (the 3 ``questions``), ``multi_hop_answers`` (``new_answer`` + ``new_answer_alias``).
    """
    path = _resolve(data_dir, file)
    cases = _read_list(path, "MQuAKE cases", limit)
    need_passage: list[str] = []
    seen: set[str] = set()
    for n, c in enumerate(cases):
        where = f"case #{n}"
        if not isinstance(c, dict):
            raise DataError(f"{path}: {where} is not an object")
        _require(c, "case_id", (int, str), path, where)
        where = f"case #{n} (case_id {c['case_id']})"
        if str(c["case_id"]) in seen:
            raise DataError(f"{path}: {where} repeats a case_id; case ids must be unique")
        seen.add(str(c["case_id"]))
        rewrites = _require(c, "requested_rewrite", list, path, where)
        if not rewrites:
            raise DataError(f"{path}: {where} has an empty requested_rewrite list")
        for k, rw in enumerate(rewrites):
            w = f"{where} requested_rewrite[{k}]"
            _require(rw, "subject", str, path, w)
            if not (isinstance(rw.get("fact_new_uns"), str) and rw["fact_new_uns"].strip()):
                if "fact_new" not in rw:
                    _require(rw, "prompt", str, path, w)
                    _require(rw, "target_new", dict, path, w)
                need_passage.append(_fact_new(rw))
        _str_list(c, "questions", path, where)
        _require(c, "new_answer", str, path, where)
        hops = _require(c, "new_single_hops", list, path, where)
        for k, h in enumerate(hops):
            _require(h, "question", str, path, f"{where} new_single_hops[{k}]")
            _require(h, "answer", str, path, f"{where} new_single_hops[{k}]")
    generated: dict[str, str] = {}
    if need_passage:
        if client is None:
            raise DataError(
                f"{path}: {len(need_passage)} rewrite(s) have no 'fact_new_uns' passage; "
                "configure a judge endpoint (--judge-base-url / HPSE_JUDGE_BASE_URL) so passages "
                "are generated from 'fact_new', or use AKEW's MQuAKE-CF.json"
            )
        generated = _generated_passages(
            need_passage, client, Path(cache_dir or default_cache_dir())
        )
    rows: dict[str, list] = {
        k: []
        for k in (
            "case_id",
            "requests",
            "passage_source",
            "single_hop_questions",
            "single_hop_answers",
            "multi_hop_questions",
            "multi_hop_answers",
        )
    }
    for c in cases:
        requests, sources = [], []
        for rw in c["requested_rewrite"]:
            uns = rw.get("fact_new_uns")
            has_uns = isinstance(uns, str) and bool(uns.strip())
            passage = uns if has_uns else generated[_fact_new(rw)]
            sources.append("fact_new_uns" if has_uns else client.name)
            requests.append(
                {
                    "prompt": prompt_template.format(subject=rw["subject"]),
                    "subject": rw["subject"],
                    "target_new": passage,
                }
            )
        rows["case_id"].append(str(c["case_id"]))
        rows["requests"].append(requests)
        rows["passage_source"].append(
            sorted(set(sources))[0] if len(set(sources)) == 1 else ",".join(sorted(set(sources)))
        )
        rows["single_hop_questions"].append([h["question"] for h in c["new_single_hops"]])
        rows["single_hop_answers"].append(
            [[h["answer"], *h.get("answer_alias", [])] for h in c["new_single_hops"]]
        )
        rows["multi_hop_questions"].append(list(c["questions"]))
        rows["multi_hop_answers"].append([c["new_answer"], *c.get("new_answer_alias", [])])
    from datasets import Dataset

    return Dataset.from_dict(rows)


# --------------------------------------------------------------------------------------------- MMLU
@dataclass(frozen=True)
class MMLUItem:
    """One MMLU test question with its subject's dev-split few-shot examples."""

    subject: str
    question: str
    choices: tuple[str, str, str, str]
    answer: int
    shots: tuple[tuple[str, tuple[str, str, str, str], int], ...]


def load_mmlu_subset(
    data_dir: str | os.PathLike | None = None,
    n: int = 100,
    *,
    shots: int = 5,
    seed: int = 0,
    subdir: str = MMLU_DIR,
) -> list[MMLUItem]:
    """A fixed, subject-stratified subset of ``n`` MMLU test questions with ``shots`` dev examples
    each.

    Subjects are visited in sorted order, round-robin, each through a seeded permutation of its test
    rows, so the subset depends only on ``n`` and ``seed`` and spreads over all 57 subjects.
    """
    base = Path(data_dir if data_dir is not None else default_data_dir())
    root = base / subdir
    test_dir, dev_dir = root / "test", root / "dev"
    if not test_dir.is_dir() or not dev_dir.is_dir():
        raise DataError(
            f"{root}: expected test/ and dev/ folders of "
            "MMLU csv files; pass --data DIR or --mmlu-n 0"
        )
    subjects = sorted(p.name[: -len("_test.csv")] for p in mmlu_test_files(base, subdir))
    if not subjects:
        raise DataError(f"{test_dir}: no <subject>_test.csv files")
    if not 0 <= shots <= 5:
        raise ValueError(
            f"MMLU shots must be between 0 and 5 (the dev split has 5 per subject), got {shots}"
        )
    rng = random.Random(seed)
    queues = {}
    for s in subjects:
        rows = read_mmlu_csv(mmlu_file(base, "test", s, subdir))
        order = list(range(len(rows)))
        rng.shuffle(order)
        queues[s] = [rows[i] for i in order]
    dev = {s: tuple(read_mmlu_csv(mmlu_file(base, "dev", s, subdir))[:shots]) for s in subjects}
    items: list[MMLUItem] = []
    depth = 0
    while len(items) < n and any(depth < len(q) for q in queues.values()):
        for s in subjects:
            if len(items) >= n:
                break
            if depth < len(queues[s]):
                q, choices, ans = queues[s][depth]
                items.append(MMLUItem(s, q, choices, ans, dev[s]))
        depth += 1
    return items
