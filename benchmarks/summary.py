"""A finished run's summary: ``summary.json`` and ``table.md`` from all its records.

Failed edits (diverged) are left out of every mean and counted; cases the judge could not judge are
left out of the judge's metrics and counted; in continual mode with checkpoints each checkpoint gets
the task's summary of the cases evaluated there.

``rebuild`` recomputes a finished run directory's summary from its files alone (what the runner
would write for its records now, plus UnKE's own metrics as ``benchmarks.unke_metrics --write`` adds
them) and ``summary_differences`` lists each field where a stored ``summary.json`` disagrees with
it: ``python -m benchmarks.study docs/study --check`` runs both on every committed run. Two keys
are provenance, kept from the stored summary and never compared (``PROVENANCE_KEYS``): ``label``
and ``out_dir``. Every other key is recomputed: the task's metrics and ``Avg``, the judge counts,
``unke_metrics``, ``failed_cases``, the MMLU keys, ``n_cases``, ``stepin_rate_by_round``, the mean
edit and algorithm seconds the records hold, the run's description from ``config.json``
(``benchmark``, ``editor``, ``mode``, ``sequential``, ``judge``, ``hparams``) and every checkpoint's
summary. ``editor`` is the one recomputed key with two right values: the method's table label
(``LoRA + HPSE``), which the runner writes now, or the ``alg_name`` that config.json records
(``HPSE``), which it wrote before. Two parts of ``unke_metrics`` describe the machine, not the
records: ``Bert Score`` (the MiniLM cosine, computed only where that model is on the machine) is
compared where both summaries have it, and ``not_computed`` (why it is missing) never.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from .metrics import mean
from .report import judge_note, paper_table
from .rollouts import stepin_rate_by_round
from .sequence import checkpoint_records
from .store import write_json_atomic, write_text_atomic
from .tasks import Task, unjudged_metrics

__all__ = [
    "PROVENANCE_KEYS",
    "RunSummary",
    "failed_note",
    "rebuild",
    "summary_differences",
    "unjudged_note",
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
            from .unke_metrics import write_run

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


def rebuild(
    run_dir: str | Path,
    stored: Mapping[str, Any],
    *,
    unke_cases: Mapping[str, Mapping[str, Any]] | None = None,
    encoder: Any = None,
    bert_reason: str = "",
) -> tuple[RunSummary, dict]:
    """The summary of the finished run directory ``run_dir`` recomputed from its files: its
    records, ``checkpoints.jsonl``, ``mmlu_before.json`` and ``config.json``, through
    ``RunSummary.build`` as the runner calls it, with ``stored``'s ``PROVENANCE_KEYS``; and the
    ``RunSummary`` whose ``write`` puts it in place (summary.json and table.md, as the runner does).

    An UnKEBench run whose records predate UnKE's own metrics gets them as ``benchmarks.unke_metrics
    --write`` adds them, from the stored answers and ``unke_cases`` (case id -> loaded case; needed
    only then). ``encoder``, ``bert_reason``: the MiniLM for ``Bert Score``, as that command loads
    it (None: left out, ``not_computed`` says so).
    """
    from .methods import method_label
    from .store import merge_results
    from .tasks import TASKS
    from .unke_scores import KEY

    run_dir = Path(run_dir)
    config = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    task = TASKS[config["benchmark"]]
    hparams = config.get("hparams") or {}
    summary = RunSummary(
        task,
        run_dir,
        label=stored.get("label", run_dir.name),
        method=method_label(str(config.get("editor")), hparams),
        judge=config.get("judge"),
        sequential=config.get("sequential"),
        checkpoints=config.get("checkpoints"),
    )
    records = sorted(merge_results(run_dir, None).values(), key=lambda r: r.get("index", 0))
    before = run_dir / "mmlu_before.json"
    mmlu_before = (
        json.loads(before.read_text(encoding="utf-8"))["MMLU_before"]
        if task.measures_mmlu and config.get("mmlu") and before.is_file()
        else None
    )
    out = summary.build(mmlu_before, records, hparams)
    out["out_dir"] = stored.get("out_dir", out["out_dir"])
    if stored.get("editor") == config.get("editor"):  # the name an earlier runner wrote
        out["editor"] = stored["editor"]
    if task.name == "unkebench" and KEY not in out:  # records written before UnKE's metrics
        from .unke_metrics import run_metrics

        if unke_cases is None:
            raise ValueError(
                f"{run_dir}: its records predate UnKE's own metrics, which are recomputed from its "
                "answers and the UnKEBench data; pass the data directory the run used"
            )
        out[KEY] = run_metrics(run_dir, unke_cases, encoder, bert_reason)
        for c, part in out.get("checkpoints", {}).items():
            if KEY not in part:
                part[KEY] = run_metrics(f"{run_dir}@{c}", unke_cases, encoder, bert_reason)
    return summary, out


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def summary_differences(stored: Any, rebuilt: Any, field: str = "") -> list[str]:
    """``field: stored X, recomputed Y`` for every field of a stored summary that differs from its
    ``rebuild`` (numbers to 1e-9, relative, so that a sum taken in another order agrees), a key one
    has and the other lacks included; ``PROVENANCE_KEYS`` at the top level are not compared, nor
    what depends on the machine rather than the records (see the module's docstring)."""
    from .unke_scores import BERT

    if isinstance(stored, Mapping) and isinstance(rebuilt, Mapping):
        out = []
        for key in dict.fromkeys([*stored, *rebuilt]):
            name = f"{field}.{key}" if field else str(key)
            if not field and key in PROVENANCE_KEYS:
                continue
            # the machine's, not the records' (see the module's docstring)
            if key == "not_computed" or (key == BERT and (key not in rebuilt or key not in stored)):
                continue
            if key not in rebuilt or key not in stored:
                have = "absent" if key not in stored else f"{stored[key]!r}"
                want = "absent" if key not in rebuilt else f"{rebuilt[key]!r}"
                out.append(f"{name}: stored {_short(have)}, recomputed {_short(want)}")
            else:
                out += summary_differences(stored[key], rebuilt[key], name)
        return out
    if isinstance(stored, list) and isinstance(rebuilt, list) and len(stored) == len(rebuilt):
        return [
            d
            for i, (a, b) in enumerate(zip(stored, rebuilt))
            for d in summary_differences(a, b, f"{field}[{i}]")
        ]
    if _number(stored) and _number(rebuilt):
        same = math.isclose(stored, rebuilt, rel_tol=1e-9, abs_tol=1e-9)
    else:
        same = stored == rebuilt
    return (
        []
        if same
        else [f"{field}: stored {_short(repr(stored))}, recomputed {_short(repr(rebuilt))}"]
    )


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
