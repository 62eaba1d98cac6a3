"""A finished run's summary: ``summary.json`` and ``table.md`` from all its records.

Failed edits (diverged) are left out of every mean and counted; cases the judge could not judge are
left out of the judge's metrics and counted; in continual mode with checkpoints each checkpoint gets
the task's summary of the cases evaluated there. ``benchmarks.analysis.summaries`` recomputes a
committed run's summary from its records with this code and compares it with the stored one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..records.sequence import checkpoint_records
from ..records.store import write_json_atomic, write_text_atomic
from ..tasks.metrics import mean, stepin_rate_by_round
from ..tasks.task import Task, unjudged_metrics
from ..tasks.unke_scores import KEY
from .tables import UNKE_TABLE_MARK, judge_note, metrics_table, paper_table

__all__ = [
    "PROVENANCE_KEYS",
    "RunSummary",
    "failed_note",
    "unjudged_note",
    "write_run",
]

#: summary.json keys that say how a run was started, not what its records hold: its ``--label`` (or
#: the name built from its hparams file and overrides, which config.json does not keep) and the
#: directory it was written to (a committed run has been moved since). Kept, never recomputed.
PROVENANCE_KEYS = ("label", "out_dir")


@dataclass
class RunSummary:
    """The summary of one run directory's records, as the task averages them, with the run's
    description."""

    task: Task
    out_dir: Path
    label: str
    method: str
    judge: str | None
    sequential: int | None
    checkpoints: Sequence[int] | None

    def build(self, mmlu_before: float | None, all_records: list[dict], hparams: dict) -> dict:
        """The summary of ``all_records``; ``hparams``: as config.json recorded them when the run
        started."""
        records = [r for r in all_records if "failed" not in r]  # failed edits have no scores
        out: dict[str, Any] = self.task.summarize(records)
        if len(records) < len(all_records):
            out["failed_cases"] = len(all_records) - len(records)
        if self.task.measures_mmlu:
            out["MMLU_before"] = mmlu_before
            out["MMLU_after"] = mean(r.get("MMLU_after") for r in records)
            out["MMLU_edits"] = sum(
                r.get("MMLU_after") is not None for r in records
            )  # < n_cases under --mmlu-every
        if self.task.needs_judge:
            out["judge"] = self.judge
            out["unjudged_cases"] = sum(bool(unjudged_metrics(r)) for r in records)
        out.update(
            n_cases=len(all_records),
            stepin_rate_by_round=stepin_rate_by_round(records),
            edit_seconds_mean=mean(r["edit_seconds"] for r in all_records),
            **(
                {"algorithm_seconds_mean": mean(r["algorithm_seconds"] for r in records)}
                if records and all("algorithm_seconds" in r for r in records)
                else {}
            ),
            label=self.label,
            benchmark=self.task.name,
            editor=self.method,
            mode="sequential" if self.sequential else "single",
            sequential=self.sequential,
            **(
                {"checkpoints": self._checkpoint_summaries(all_records)} if self.checkpoints else {}
            ),
            out_dir=str(self.out_dir),
            hparams=hparams,
        )
        return out

    def _checkpoint_summaries(self, records: list[dict]) -> dict:
        """Per checkpoint (edits made in each sequence), the task's summary of the cases evaluated
        there."""
        blocks = {r.get("block") for r in records}
        out = {}
        for c, recs in sorted(checkpoint_records(self.out_dir).items()):
            recs = [r for r in recs.values() if r.get("block") in blocks]
            failed = sum("failed" in r for r in recs)
            recs = [r for r in recs if "failed" not in r]
            summary: dict[str, Any] = self.task.summarize(recs)
            if failed:
                summary["failed_cases"] = failed
            if self.task.measures_mmlu:
                summary["MMLU_after"] = mean(r.get("MMLU_after") for r in recs)
            summary["n_cases"] = len(recs)
            out[str(c)] = summary
        return out

    def write(self, summary: dict, *, table: bool = True) -> None:
        """``summary.json``, ``table.md`` (a row per checkpoint, then the run's), and UnKE's own
        metrics. ``table``: write table.md too (the runner always does; ``rebuild``'s caller only
        where the directory kept one)."""
        write_json_atomic(self.out_dir / "summary.json", summary)
        rows = [
            (f"{self.label} after {c} edits", {self.task.name: part})
            for c, part in summary.get("checkpoints", {}).items()
        ]
        if table:
            write_text_atomic(
                self.out_dir / "table.md",
                paper_table([*rows, (self.label, {self.task.name: summary})])
                + judge_note([summary])
                + unjudged_note([summary])
                + failed_note([summary]),
            )
        if summary.get(
            "unke_metrics"
        ):  # UnKE's own metrics: the same section `unke_metrics --write` adds
            checkpoints = {
                c: part["unke_metrics"]
                for c, part in summary.get("checkpoints", {}).items()
                if "unke_metrics" in part
            }
            write_run(self.out_dir, summary["unke_metrics"], checkpoints)


def failed_note(summaries: Sequence[Mapping]) -> str:
    """A line under a table saying how many cases' edits diverged (left out of the means, not
    counted as 0)."""
    n = sum(int(s.get("failed_cases") or 0) for s in summaries if s)
    if not n:
        return ""
    total = sum(int(s.get("n_cases") or 0) for s in summaries if s)
    return (
        f"\nFAILED: the edits of {n} of {total} case(s) diverged (results.jsonl says why); they "
        "are left out of every mean, not counted as 0. Lower "
        "lr and rerun with --retry-failed to edit them again.\n"
    )


def unjudged_note(summaries: Sequence[Mapping]) -> str:
    """A line under a table saying how many cases the judge could not judge (stored unjudged, not as
    0)."""
    n = sum(int(s.get("unjudged_cases") or 0) for s in summaries if s)
    if not n:
        return ""
    total = sum(int(s.get("n_cases") or 0) for s in summaries if s and "unjudged_cases" in s)
    return (
        f"\nUNJUDGED: {n} of {total} UnKEBench case(s) have no Jnt/Dmp yet (the judge could not "
        "judge them; they are left out of Jnt/Dmp, not counted as 0). Rerun the same command to "
        "judge them; nothing is edited again.\n"
    )


def write_run(
    run_dir: str | Path,
    metrics: Mapping[str, Any],
    checkpoints: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """Add ``metrics`` to ``run_dir``'s summary.json under ``unke_metrics`` (every other key as it
    was), and ``checkpoints`` (checkpoint -> metrics of the cases evaluated there) to each of its
    checkpoints' summaries, and a section to its table.md (replacing the one an earlier call
    added), a row per checkpoint before the run's."""
    run_dir = Path(run_dir)
    summary_file = run_dir / "summary.json"
    if not summary_file.is_file():
        raise ValueError(
            f"{run_dir}: no summary.json yet (the run has not finished); finish it first"
        )
    summary = json.loads(summary_file.read_text(encoding="utf-8"))
    summary[KEY] = dict(metrics)
    for c, part in (checkpoints or {}).items():
        summary["checkpoints"][c][KEY] = dict(part)
    write_json_atomic(summary_file, summary)
    table = run_dir / "table.md"
    if table.is_file():
        kept = (
            table.read_text(encoding="utf-8").split("\n" + UNKE_TABLE_MARK)[0].rstrip("\n") + "\n"
        )
        label = summary.get("label") or run_dir.name
        section = (
            f"\n{UNKE_TABLE_MARK}\nUnKE's own metrics (EasyEdit's `eval_akew_unstructured`, "
            "percent):\n\n"
            + metrics_table(
                [
                    *((f"{label} after {c} edits", m) for c, m in (checkpoints or {}).items()),
                    (label, metrics),
                ]
            )
        )
        write_text_atomic(table, kept + section)
