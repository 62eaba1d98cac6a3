"""Finished run directories read for analysis: a run's records (``load_run``, ``DIR@N`` for a
continual run's checkpoint), the per-case values the comparisons average (``record_values``), the
benchmark's cases (``load_cases``), the model the runs edited (``run_model_name``) and the note on
how answers were scored (``scoring_note``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from hpse_easyedit.cli import DEBUG_FLAG, DEBUG_HELP

from ..records.store import IncompleteRunError, merge_results
from ..tasks.task import TASKS
from .stats import average

__all__ = [
    "ANSWER_DIVERSITY",
    "METRICS",
    "add_reading_arguments",
    "load_cases",
    "load_run",
    "record_values",
    "run_model_name",
    "scoring_note",
]


METRICS = {name: task.metrics for name, task in TASKS.items()}


# Not a paper metric: 1 - SelfBLEU-4 among ALL of a MQuAKE-uns case's answers. An editor that
# answers every question by reciting the passage scores near 0 here, and can still pass the
# substring check.
ANSWER_DIVERSITY = "AnsDiv"


def load_run(run_dir: str | Path) -> tuple[str, dict[str, dict]]:
    """(benchmark name, {case_id: record}) of a run directory, the cases whose edit diverged left
    out (they have no scores; the run's summary counts them); ``DIR@N``: the run's checkpoint after
    N edits of each sequence (``--checkpoints``); clear errors for anything else."""
    from ..records.sequence import checkpoint_records, split_checkpoint

    run_dir, checkpoint = split_checkpoint(run_dir)
    config = run_dir / "config.json"
    if not config.is_file():
        raise FileNotFoundError(
            f"{run_dir}: no config.json; pass a directory written by a benchmark run (--out DIR)"
        )
    benchmark = json.loads(config.read_text(encoding="utf-8")).get("benchmark")
    if benchmark not in METRICS:
        raise ValueError(
            f"{config}: 'benchmark' is {benchmark!r}; expected one of {sorted(METRICS)}"
        )
    if checkpoint is not None:
        found = checkpoint_records(run_dir)
        if checkpoint not in found:
            raise ValueError(
                f"{run_dir}@{checkpoint}: {run_dir} has no checkpoint after {checkpoint} edits "
                f"(it has {sorted(found) or 'none'}); give DIR@N with one of them"
            )
        records = found[checkpoint]
    else:
        try:
            records = merge_results(run_dir, None)
        except IncompleteRunError as err:  # a case recorded twice
            raise ValueError(str(err)) from None
    return benchmark, {
        cid: r for cid, r in records.items() if "failed" not in r
    }  # a failed edit has no scores


def record_values(rec: Mapping[str, Any], metrics: Sequence[str]) -> dict[str, float]:
    vals = {m: float(rec[m]) for m in metrics}
    vals["Avg"] = average([vals[m] for m in metrics])
    answers = rec.get("answers") or {}
    if "single_hop" in answers:
        from ..tasks.metrics import diversity

        div = diversity([*answers.get("single_hop", []), *answers.get("multi_hop", [])])
        if div is not None:
            vals[ANSWER_DIVERSITY] = div
    return vals


def scoring_note(report: Mapping[str, Any]) -> str:
    n = report.get("whole_word_aliases") or 0
    return (
        f"; rescored: aliases of <= {n} characters as whole words (not the official check)"
        if n
        else ""
    )


def load_cases(benchmark: str, data_dir: str | Path | None, why: str) -> dict[str, dict]:
    """{case id: case} of the benchmark's data under ``data_dir`` (default: the default data
    directory)."""
    from ..tasks.datasets import DataError, default_data_dir

    try:
        cases = TASKS[benchmark].load_cases(data_dir or default_data_dir())
    except DataError as err:
        raise ValueError(
            f"{why} needs the {benchmark} data the runs used (--data): {err}"
        ) from None
    return {str(c["case_id"]): c for c in cases}


def run_model_name(run_dirs: Sequence[str | Path]) -> str:
    """The ``hparams.model_name`` all the runs' ``config.json`` name (an error if they differ)."""
    from ..records.sequence import split_checkpoint

    names = {
        json.loads((split_checkpoint(d)[0] / "config.json").read_text(encoding="utf-8"))
        .get("hparams", {})
        .get("model_name")
        for d in run_dirs
    }
    names.discard(None)
    if len(names) != 1:
        raise ValueError(
            f"the runs name {len(names)} models ({', '.join(sorted(names)) or 'none'}) in "
            "config.json hparams.model_name; --recitation cuts tokens with one model's tokenizer"
        )
    return names.pop()


def add_reading_arguments(parser: argparse.ArgumentParser) -> None:
    """``--resamples`` and ``--debug``, as every reading tool (paired, continual, variants) takes
    them."""
    parser.add_argument(
        "--resamples", type=int, default=10000, help="bootstrap resamples (default 10000)"
    )
    parser.add_argument(DEBUG_FLAG, action="store_true", help=DEBUG_HELP)
