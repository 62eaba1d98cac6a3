"""Recitation diagnostics (not the paper's metrics): every stored answer rescored as it is, cut
to its first sentence and cut to its first N tokens of the runs' tokenizer, with the share of each
official score kept and each run's Avg difference from the first run. ``python -m benchmarks paired
--recitation`` and ``continual --recitation`` print them."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..markdown import md_table
from ..tasks.task import TASKS
from .runs import METRICS, scoring_note
from .stats import average, bootstrap_ci

__all__ = ["CUTS", "model_token_spans", "recitation_report", "recitation_table"]


CUTS = ("official", "first sentence", "first {n} tokens")


@functools.lru_cache(maxsize=8)  # one tokenizer per model per process (study reads ~40 tables)
def model_token_spans(model_name: str) -> tuple[Callable[[str], list[tuple[int, int]]] | None, str]:
    """``(token_spans, description)``: character spans of ``model_name``'s tokens (its tokenizer
    loaded offline through ``hpse_easyedit``'s model cache, special tokens left out), or
    ``(None, ...)`` naming the fallback (words and punctuation marks) when that tokenizer cannot be
    loaded."""
    try:
        from transformers import AutoTokenizer

        from hpse_easyedit.loading import (
            model_source,
        )  # the same lookup load_model uses, without loading weights

        tok = AutoTokenizer.from_pretrained(model_source(model_name))
        if not tok.is_fast:
            raise ValueError("not a fast tokenizer, so no character offsets")
    except Exception as err:  # any failure leaves the documented fallback, named in the table
        logging.getLogger(__name__).warning(
            "the tokenizer of %s could not be loaded (%s); "
            "counting words and punctuation marks instead",
            model_name,
            (str(err).splitlines() or [""])[0][:160],
        )
        return (
            None,
            "words and punctuation marks (fallback: the runs' tokenizer could not be loaded)",
        )

    # the same answers are cut again by every table that reads their run (the study's ~40 tables)
    @functools.lru_cache(maxsize=1 << 16)
    def spans(text: str) -> list[tuple[int, int]]:
        return [
            tuple(o)
            for o in tok(text, add_special_tokens=False, return_offsets_mapping=True)[
                "offset_mapping"
            ]
        ]

    return spans, f"tokens of {model_name}'s tokenizer"


def _recitation_values(benchmark: str, rec: Mapping[str, Any]) -> dict[str, float | None]:
    metrics = METRICS[benchmark]
    vals = {m: None if rec.get(m) is None else float(rec[m]) for m in metrics}
    vals["Avg"] = (
        None if any(vals[m] is None for m in metrics) else average([vals[m] for m in metrics])
    )
    return vals


def recitation_report(
    dirs: Sequence[str | Path],
    loaded: Sequence[tuple[str, dict]],
    cases: Mapping[str, Mapping],
    *,
    tokens: int = 32,
    token_spans: Callable[[str], Sequence[tuple[int, int]]] | None = None,
    token_kind: str = "words and punctuation marks",
    whole_word_max: int = 0,
    resamples: int = 10000,
    seed: int = 0,
) -> dict:
    """Every run's scores on the cases ALL runs finished, official and with every answer cut to its
    first sentence and to its first ``tokens`` tokens (``metrics.cut_to_tokens`` with
    ``token_spans``), in percent, with the share of the official mean kept and, per cut, each run's
    Avg difference from the first run (bootstrap interval, wins / ties / losses). ``cases``: case id
    -> loaded case of the data."""
    from ..tasks.metrics import cut_to_tokens, first_sentence

    benches = {b for b, _ in loaded}
    if len(benches) != 1:
        raise ValueError(
            f"the runs mix benchmarks ({', '.join(sorted(benches))}); compare runs of one benchmark"
        )
    benchmark = benches.pop()
    common = sorted(set.intersection(*(set(recs) for _, recs in loaded)), key=lambda c: (len(c), c))
    if not common:
        raise ValueError(f"the runs {', '.join(map(str, dirs))} have no finished case in common")
    cuts: dict[str, Callable[[str], str] | None] = {
        CUTS[0]: None,
        CUTS[1]: first_sentence,
        CUTS[2].format(n=tokens): lambda t: cut_to_tokens(t, tokens, token_spans),
    }
    metrics = (*METRICS[benchmark], "Avg")
    task = TASKS[benchmark]
    per_cut: dict[str, list[list[dict]]] = {}
    for name, cut in cuts.items():
        runs = []
        for _, recs in loaded:
            kept = task.rescore(
                {c: recs[c] for c in common}, cases, cut=cut, whole_word_max=whole_word_max
            )
            runs.append([_recitation_values(benchmark, kept[c]) for c in common])
        per_cut[name] = runs
    out: dict[str, Any] = {
        "benchmark": benchmark,
        "runs": [str(d) for d in dirs],
        "n_cases": len(common),
        "cases": common,
        "tokens": tokens,
        "token_kind": token_kind,
        "whole_word_aliases": whole_word_max,
        "cuts": {},
    }
    official = per_cut[CUTS[0]]
    for name, runs in per_cut.items():
        rows = []
        for i, vals in enumerate(runs):
            row: dict[str, Any] = {}
            for m in metrics:
                xs = [v[m] for v in vals]
                if any(x is None for x in xs):
                    continue
                mean_ = 100 * average(xs)
                base = (
                    100 * average([v[m] for v in official[i]])
                    if all(v[m] is not None for v in official[i])
                    else None
                )
                row[m] = {"mean": mean_, "kept": None if not base else mean_ / base}
            if i and "Avg" in row and all(v["Avg"] is not None for v in runs[0]):
                diff = [100 * (b["Avg"] - a["Avg"]) for a, b in zip(runs[0], vals)]
                lo, hi = bootstrap_ci(diff, resamples=resamples, seed=seed)
                row["Avg_diff"] = {
                    "diff": average(diff),
                    "ci95": [lo, hi],
                    "wins": sum(d > 1e-9 for d in diff),
                    "ties": sum(abs(d) <= 1e-9 for d in diff),
                    "losses": sum(d < -1e-9 for d in diff),
                }
            rows.append(row)
        out["cuts"][name] = rows
    return out


def recitation_table(report: Mapping[str, Any], labels: Sequence[str]) -> str:
    """Markdown: per run and cut, each metric's mean and (cut rows) the share of the official mean
    kept, with the Avg difference from the first run."""
    metrics = [*METRICS[report["benchmark"]], "Avg"]
    base = labels[0]
    lines = [
        f"Recitation diagnostics (not the paper's metrics), {report['benchmark']}, "
        f"{report['n_cases']} cases of all {len(labels)} runs: every answer rescored as it is "
        f"(official), cut to its first sentence, and cut to its first {report['tokens']} "
        f"{report['token_kind']}; in brackets the share of the official score kept"
        + scoring_note(report),
        "",
    ]
    body = []
    for i, label in enumerate(labels):
        for name, rows in report["cuts"].items():
            row = rows[i]
            cells = []
            for m in metrics:
                if m not in row:
                    cells.append("n/a")
                    continue
                kept = row[m]["kept"]
                share = "" if name == CUTS[0] or kept is None else f" ({100 * kept:.0f}%)"
                cells.append(f"{row[m]['mean']:.1f}{share}")
            d = row.get("Avg_diff")
            diff = (
                ["", ""]
                if d is None
                else [
                    f"{d['diff']:+.1f} [{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}]",
                    f"{d['wins']} / {d['ties']} / {d['losses']}",
                ]
            )
            body.append([label, name, *cells, *diff])
    head = ["run", "answers", *metrics, f"Avg - {base} (95% CI)", f"wins / ties / losses vs {base}"]
    lines += md_table(head, body, "ll" + "r" * (len(metrics) + 2))
    note = TASKS[report["benchmark"]].recitation_note
    if note:
        lines.append("\n" + note)
    return "\n".join(lines) + "\n"
