"""One self-contained HTML file for one or more benchmark runs: tables, the step-in plot, every
case.

``python -m benchmarks report RUN [RUN ...] --html FILE`` writes it
(``benchmarks/report/__main__.py``). The file needs no network: styles, the filter script and the
plot (a base64 PNG) are inline. It holds

- the paper-layout table (``report.paper_cells``) and the case-by-case comparison of
  ``benchmarks.analysis.paired`` (means with 95% bootstrap intervals; every run against the first:
  paired differences with their intervals, wins / ties / losses);
- the mean step-in rate per round (``report.plot_stepin_rates``);
- every case: its passages, questions, expected answers with aliases, each run's answer side by side
  with the matched answer marked and the official verdict (MQuAKE-uns: the substring check per
  question and the record's Ind / Cmp; UnKEBench: the judge's facts and verdicts, Dmp per
  sub-question), and, for runs that stored them (``benchmarks.records.rollouts``), each round's
  rollout per request with the tokens the teacher wrote highlighted and the gate's numbers on hover;
- filters: all cases, cases where the runs disagree, wins or losses of run B against run A (on the
  per-case Avg, as ``benchmarks.analysis.paired`` counts them).

Rollout text is decoded with the tokenizer of the run's ``hparams.model_name`` (the embedded SmolLM2
works offline); without a tokenizer the token ids are shown.

The markup is in ``templates/report.html.j2`` (Jinja2 macros, one per piece of the page), the style
sheet and the script in ``templates/report.css`` and ``report.js``; this module reads the runs and
hands the templates plain values.
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from jinja2.ext import Extension
from markupsafe import Markup

from hpse_easyedit.atomic import replacing

from ..analysis.paired import multi_report, paired_report
from ..analysis.runs import ANSWER_DIVERSITY, METRICS, load_run
from ..records.rollouts import unpack_gaps, unpack_rollout
from ..tasks.metrics import answer_matches
from ..tasks.task import TASKS, Question
from . import judge_note, paper_cells, plot_stepin_rates

__all__ = ["RunData", "load_tokenizer", "read_run", "write_html_report"]

log = logging.getLogger(__name__)

Decoder = Callable[[Sequence[int]], str]


@dataclass
class RunData:
    """One run directory: its label, config, summary (None if not written yet) and ``{case_id:
    record}``."""

    path: Path
    label: str
    benchmark: str
    config: dict
    summary: dict | None
    records: dict[str, dict]
    decode: Decoder | None = field(default=None, repr=False)

    @property
    def hparams(self) -> dict:
        return self.config.get("hparams") or {}


def read_run(path: str | os.PathLike, label: str | None = None) -> RunData:
    """A run directory as ``RunData``; the label defaults to the run's own ``--label``, else its
    directory name."""
    path = Path(path)
    benchmark, records = load_run(path)
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    summary_file = path / "summary.json"
    summary = (
        json.loads(summary_file.read_text(encoding="utf-8")) if summary_file.is_file() else None
    )
    label = label or (summary or {}).get("label") or path.name
    return RunData(path, label, benchmark, config, summary, records)


def load_tokenizer(model_name: str) -> Decoder | None:
    """A decoder for ``model_name``'s token ids (local directory, HF cache, or the embedded
    SmolLM2), or None.

    Never runs remote code; a tokenizer that cannot be had offline gives None and the report shows
    ids.
    """
    try:
        from transformers import AutoTokenizer

        from hpse_easyedit.loading import (
            model_source,
        )  # the loader's own lookup, embedded-model fallback included

        source = model_source(model_name)
        tok = AutoTokenizer.from_pretrained(source, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - any failure means "no tokenizer": the report shows ids
        log.warning(
            "no tokenizer for %s (%s); rollouts are shown as token ids",
            model_name,
            str(err).splitlines()[0][:200],
        )
        return None
    return lambda ids: tok.decode(
        list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
    )


# ---------------------------------------------------------------------------------------- templates
class JoinLines(Extension):
    """A line break in a template and the indentation after it are not output, so the templates can
    be indented for reading while the page stays one run of elements (as the report was always
    written)."""

    def preprocess(self, source: str, name: str | None, filename: str | None = None) -> str:
        return re.sub(r"\n[ \t]*", "", source)


def _escape(value: Any) -> Markup:
    """Every ``{{ value }}`` through ``html.escape`` (quotes as ``&quot;``/``&#x27;``); Markup stays
    as it is."""
    return value if isinstance(value, Markup) else Markup(html.escape(str(value), quote=True))


_TEMPLATES = Path(__file__).with_name("templates")
_ENV = Environment(
    loader=FileSystemLoader(_TEMPLATES),
    autoescape=True,
    finalize=_escape,
    extensions=[JoinLines],
    undefined=StrictUndefined,
)
_ENV.globals["zip"] = zip
_ENV.filters["bool"] = bool


def _macros() -> Any:
    """The report template's macros, callable from Python (each returns Markup)."""
    return _ENV.get_template("report.html.j2").module


def _static(name: str) -> Markup:
    """The style sheet or script, inlined after a line break (the page needs no other file)."""
    return Markup("\n" + (_TEMPLATES / name).read_text(encoding="utf-8"))


# -------------------------------------------------------------------------------------- html pieces
def _paper_table_html(runs: Sequence[RunData]) -> Markup:
    rows = [(r.label, {r.benchmark: r.summary or _summary_from_records(r)}) for r in runs]
    groups, names, body = paper_cells(rows)
    note = judge_note([r.summary or _summary_from_records(r) for r in runs]).strip()
    return _macros().paper_table(groups, names, body, note)


def _summary_from_records(run: RunData) -> dict:
    """The task's summary of the records there are (a run whose summary.json is not written yet)."""
    return TASKS[run.benchmark].partial_summary(list(run.records.values()))


def _comparison_html(
    runs: Sequence[RunData], resamples: int
) -> tuple[Markup, dict[str, list[float | None]], int]:
    """Means with intervals, paired differences against the first run; also the step-in series and n
    cases."""
    loaded = [(r.benchmark, r.records) for r in runs]
    if len(runs) == 1:
        rep = paired_report(
            runs[0].path, runs[0].path, resamples=resamples, runs=(loaded[0], loaded[0])
        )
        pairs, n = [rep], rep["n_cases"]
    else:
        multi = multi_report([r.path for r in runs], resamples=resamples, loaded=loaded)
        pairs, n = multi["pairs"], multi["n_cases"]
    metrics = [m for m in pairs[0]["metrics"] if all(m in p["metrics"] for p in pairs)]
    series = {runs[0].label: pairs[0]["stepin_rate_by_round"]["a"]}
    for run, p in zip(runs[1:], pairs if len(runs) > 1 else []):
        series[run.label] = p["stepin_rate_by_round"]["b"]
    table = _macros().comparison(
        [r.label for r in runs], pairs, metrics, n, resamples, ANSWER_DIVERSITY
    )
    return table, series, n


def _plot_png(series: Mapping[str, Sequence[float | None]], benchmark: str, n: int) -> str:
    """The step-in plot as base64 PNG."""
    buf = io.BytesIO()
    plot_stepin_rates(series, buf, title=f"Step-in rate per round, {benchmark}, {n} cases")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _match(answer: str, aliases: Sequence[str]) -> tuple[tuple[str, str, str] | None, bool]:
    """The answer cut around the first matching alias (None when none is marked), and the official
    verdict."""
    ok = answer_matches(answer, aliases)
    low = answer.lower()
    if ok and len(low) == len(answer):
        for alias in aliases:
            at = low.find(alias.lower()) if alias else -1
            if at >= 0:
                end = at + len(alias)
                return (answer[:at], answer[at:end], answer[end:]), ok
    return None, ok


def _answer_cell(q: Question, rec: Mapping[str, Any] | None) -> dict:
    """One run's answer to ``q`` with its verdict: the alias found (``alias``), the judge's verdict
    (``coverage``) or the judge's facts (``facts``); ``missing`` when the run has no record of the
    case."""
    if rec is None:
        return {"kind": "missing"}
    answer = q.answer(rec)
    if q.check == "facts":
        fs = (
            (rec.get("factscore") or [None, None])[q.facts]
            if len(rec.get("factscore") or []) > q.facts
            else None
        )
        return {"kind": "facts", "answer": answer, "facts": fs}
    if q.check == "coverage":
        dmp = rec.get("dmp_scores") or []
        ok = bool(dmp[q.index]) if q.index < len(dmp) and dmp[q.index] is not None else None
        return {"kind": "coverage", "answer": answer, "ok": ok}
    match, ok = _match(answer, q.expected)
    return {"kind": "alias", "answer": answer, "ok": ok, "match": match}


def _questions(questions: Sequence[Question], recs: Sequence[dict | None]) -> list[dict]:
    """One row per question of a case (``Task.case_questions``): the question, the expected answer
    (with its aliases; None for a question judged against the passage) and every run's answer."""
    return [
        {
            "kind": q.kind,
            "text": q.text,
            "expected": q.expected,
            "cells": [_answer_cell(q, rec) for rec in recs],
        }
        for q in questions
    ]


def rollout_html(stored: Mapping[str, Any], decode: Decoder | None, attrs: str) -> str:
    """One stored rollout as a block of text, each stepped-in token in ``<mark data-t=INDEX data-p=P
    data-g=G>``.

    ``P`` is the teacher's probability of the token in percent (``pi*(y*)``, what the gate compares
    with kappa), ``G`` the gate's margin ``log pi*(y*) - log pi_theta(y*)`` in nats (what it
    compares with tau; runs stored before the margin was kept have none); the page's script turns
    it, with the block's tau and kappa, into the hover text, so the file carries a few bytes per
    step-in instead of a sentence. Runs of student tokens are decoded together (multi-byte
    characters split over tokens survive); each stepped-in token is decoded alone. Without
    ``decode`` the ids are shown. ``attrs``: HTML attributes of the block.
    """
    ids, mask, probs = unpack_rollout(stored)
    gaps = unpack_gaps(stored)
    show: Decoder = decode or (lambda seg: "".join(f"\u27e8{t}\u27e9" for t in seg))
    pieces: list[tuple[str, dict | None]] = []
    start = 0
    for t, stepped in enumerate(mask + [True]):
        if not stepped:
            continue
        if start < t:
            pieces.append((show(ids[start:t]), None))
        if t < len(ids):
            pieces.append(
                (
                    show(ids[t : t + 1]),
                    {
                        "t": t,
                        "p": f"{100 * probs[t]:.0f}" if probs else None,
                        "g": f"{gaps[t]:g}" if gaps else None,
                    },
                )
            )
        start = t + 1
    return _macros().rollout(pieces, Markup(attrs), len(ids), sum(mask))


def _rollouts_html(run_index: int, run: RunData, rec: Mapping[str, Any]) -> Markup | str:
    rounds = rec.get("rollouts")
    if not rounds:
        return ""
    subjects = rec.get("subjects") or []
    shown, previous = [], None
    for r, requests in enumerate(rounds, 1):
        if requests is None:
            shown.append({"round": r, "requests": None})
        elif previous is not None and requests == rounds[previous - 1]:
            shown.append({"round": r, "requests": requests, "same_as": previous})
        else:
            previous = r
            blocks = [
                (
                    subjects[k] if k < len(subjects) else f"request {k + 1}",
                    rollout_html(
                        stored,
                        run.decode,
                        f'data-run="{run_index}" data-round="{r}" data-req="{k}"',
                    ),
                )
                for k, stored in enumerate(requests)
            ]
            shown.append({"round": r, "requests": blocks, "same_as": None})
    hp = run.hparams
    return _macros().rollouts(run.label, hp.get("tau"), hp.get("kappa"), shown)


def _case_values(run: RunData, rec: Mapping[str, Any]) -> list[float]:
    return [float(rec[m]) for m in METRICS[run.benchmark]]


def _case_html(cid: str, case: Mapping[str, Any] | None, runs: Sequence[RunData]) -> Markup:
    recs = [r.records.get(cid) for r in runs]
    values = [None if rec is None else _case_values(run, rec) for run, rec in zip(runs, recs)]
    present = [tuple(round(x, 9) for x in v) for v in values if v is not None]
    metrics = METRICS[runs[0].benchmark]
    subjects = next((rec.get("subjects") for rec in recs if rec and rec.get("subjects")), None) or (
        [r["subject"] for r in case["requests"]] if case else []
    )
    view = {
        "id": cid,
        "avgs": ["" if v is None else f"{sum(v) / len(v):.6f}" for v in values],
        "disagree": int(len(set(present)) > 1),
        "subjects": subjects,
        "chips": [
            (run.label, metrics, v, v is not None and rec.get("judge_complete") is False)
            for run, v, rec in zip(runs, values, recs)
        ],
        "passages": None
        if case is None
        else [(r["subject"], r["target_new"]) for r in case["requests"]],
        "questions": None
        if case is None
        else _questions(TASKS[runs[0].benchmark].case_questions(case), recs),
        "answers": [
            (run.label, json.dumps(rec.get("answers"), ensure_ascii=False))
            for run, rec in zip(runs, recs)
            if rec
        ],
        "rollouts": [
            _rollouts_html(i, run, rec) for i, (run, rec) in enumerate(zip(runs, recs)) if rec
        ],
    }
    return _macros().case(view, [r.label for r in runs])


def _runs_view(runs: Sequence[RunData]) -> list[dict]:
    return [
        {
            "label": r.label,
            "path": r.path,
            "editor": r.config.get("editor", ""),
            "model": r.hparams.get("model_name", ""),
            "cases": len(r.records),
            "judge": (r.summary or {}).get("judge") or "",
            "with_rollouts": sum(bool(rec.get("rollouts")) for rec in r.records.values()),
        }
        for r in runs
    ]


def _load_cases(
    runs: Sequence[RunData], data_dir: str | os.PathLike | None, data_file: str | None, strict: bool
) -> dict[str, Mapping[str, Any]] | None:
    """The benchmark's cases by id, from the data file the runs recorded (checked by its sha256).

    None, with a warning, when the file is absent (unless ``strict``: the user named ``--data``) or
    is not the file a run used: its questions would then not be the ones the run answered.
    """
    from ..tasks.datasets import DataError, default_data_dir, file_sha256

    task = TASKS[runs[0].benchmark]
    where = Path(data_dir or default_data_dir())
    file = data_file or task.data_file
    path = Path(file) if Path(file).is_absolute() else where / file
    try:
        if not path.is_file():
            raise DataError(f"{path}: no such data file")
        digest = file_sha256(path)
        strangers = [
            str(r.path) for r in runs if digest not in (r.config.get("data") or {}).values()
        ]
        if strangers:
            raise DataError(
                f"{path} is not the data file that {', '.join(strangers)} recorded in config.json "
                "(its sha256 differs); pass --data DIR and "
                "--data-file FILE naming the file the runs used"
            )
        cases = task.load_cases(where, file)
    except DataError:
        if strict:
            raise
        log.warning("%s; the report lists the answers without their questions", sys.exc_info()[1])
        return None
    return {str(c["case_id"]): c for c in cases}


def write_html_report(
    run_dirs: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    labels: Sequence[str] | None = None,
    data_dir: str | os.PathLike | None = None,
    data_file: str | None = None,
    resamples: int = 10000,
    tokenizer: str | None = None,
    rollouts: bool = True,
    title: str | None = None,
) -> Path:
    """Write the report of ``run_dirs`` (the first is the baseline) to ``out``; returns its path.

    ``data_dir`` / ``data_file``: where the runs' data file is (default: the default data directory
    and the benchmark's default file); questions are shown only when its sha256 is the one every run
    recorded. ``tokenizer``: a model name or directory to decode rollouts with, instead of each
    run's ``hparams.model_name``. ``rollouts=False`` leaves the rollouts out (a smaller file).
    """
    labels = list(labels or [])
    runs = [read_run(d, labels[i] if i < len(labels) else None) for i, d in enumerate(run_dirs)]
    seen: dict[str, int] = {}
    for r in runs:  # labels name columns and filter choices: make them unique
        seen[r.label] = seen.get(r.label, 0) + 1
        if seen[r.label] > 1:
            r.label = f"{r.label} ({r.path.name})"
    benches = {r.benchmark for r in runs}
    if len(benches) > 1:
        raise ValueError(
            f"the runs mix benchmarks ({', '.join(sorted(benches))}); one report per benchmark"
        )
    benchmark = runs[0].benchmark
    if not rollouts:
        for r in runs:
            r.records = {
                c: {k: v for k, v in rec.items() if k != "rollouts"} for c, rec in r.records.items()
            }
    decoders: dict[str, Decoder | None] = {}
    for r in runs:
        if any(rec.get("rollouts") for rec in r.records.values()):
            name = tokenizer or r.hparams.get("model_name")
            if name and name not in decoders:
                decoders[name] = load_tokenizer(name)
            r.decode = decoders.get(name) if name else None
    cases = _load_cases(
        runs, data_dir, data_file, strict=data_dir is not None or data_file is not None
    )
    table, series, n_common = _comparison_html(runs, resamples)
    ids = set().union(*(r.records for r in runs))
    order = [c for c in cases if c in ids] if cases else []
    order += sorted(ids - set(order), key=lambda c: (len(c), c))
    names = (
        " vs ".join(r.label for r in runs)
        if len(runs) <= 3
        else f"{len(runs)} runs against {runs[0].label}"
    )
    title = title or f"{TASKS[benchmark].title}: {names}"
    page = _macros().page(
        {
            "title": title,
            "css": _static("report.css"),
            "js": _static("report.js"),
            "runs": _runs_view(runs),
            "labels": [r.label for r in runs],
            "paper_table": _paper_table_html(runs),
            "comparison": table,
            "plot": _plot_png(series, benchmark, n_common),
            "cases": [_case_html(c, (cases or {}).get(c), runs) for c in order],
        }
    )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with replacing(out) as tmp:
        tmp.write_text(str(page), encoding="utf-8")
    return out
