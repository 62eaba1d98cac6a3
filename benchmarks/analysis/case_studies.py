"""Case studies: the cases where two runs differ most, every question with its expected answer
and each run's answer side by side (``python -m benchmarks paired --show N``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from ..markdown import md_table
from ..tasks.task import TASKS
from .runs import METRICS, load_run, record_values

__all__ = ["case_studies"]


def _qa_rows(
    benchmark: str, case: Mapping[str, Any], recs: Sequence[Mapping]
) -> list[tuple[str, str, list[str]]]:
    """(question, expected, [answer of each record]) for every question of one case the case studies
    show."""
    return [
        (
            q.text,
            "(the passage)" if q.expected is None else " / ".join(q.expected[:3]),
            [q.answer(r) for r in recs],
        )
        for q in TASKS[benchmark].case_questions(case)
        if q.in_case_studies
    ]


def case_studies(
    report: Mapping[str, Any],
    data_dir: str | Path,
    n: int,
    *,
    label_a: str = "A",
    label_b: str = "B",
    max_chars: int = 240,
    records: tuple[dict, dict] | None = None,
    before: tuple[str, dict] | None = None,
) -> str:
    """Markdown for the ``n`` cases where the two runs differ most on Avg (ties broken by case
    order): every question with its expected answer and both runs' answers (cut to ``max_chars``).

    ``records``: both runs' ``{case_id: record}`` when the caller already read them. ``before``:
    (label, records) of a third run, e.g. the UNEDITED reference, shown as the first answer column.
    """
    benchmark = report["benchmark"]
    recs_a, recs_b = records or (load_run(report["a"])[1], load_run(report["b"])[1])
    metrics = METRICS[benchmark]
    common = sorted(set(recs_a) & set(recs_b), key=lambda c: (len(c), c))
    gap = {
        c: record_values(recs_b[c], metrics)["Avg"] - record_values(recs_a[c], metrics)["Avg"]
        for c in common
    }
    chosen = sorted(common, key=lambda c: -abs(gap[c]))[:n]
    by_id = {str(c["case_id"]): c for c in TASKS[benchmark].load_cases(data_dir)}

    def cut(text: str) -> str:
        text = " ".join(str(text).split()).replace("|", "/")
        return text if len(text) <= max_chars else text[:max_chars] + " ..."

    columns = ([before[0]] if before else []) + [label_a, label_b]
    out = []
    for cid in chosen:
        case = by_id.get(cid)
        if case is None:
            raise ValueError(
                f"case {cid} of {report['a']} is not in the {benchmark} data under {data_dir}; "
                "pass the --data directory the runs used"
            )
        recs = [recs_a[cid], recs_b[cid]]
        if before:
            if cid not in before[1]:
                raise ValueError(
                    f"case {cid} has no result in the --before "
                    "run; finish it on the same cases first"
                )
            recs.insert(0, before[1][cid])
        scores = " ".join(
            f"{m} {100 * recs_a[cid][m]:.0f} -> {100 * recs_b[cid][m]:.0f}" for m in metrics
        )
        out += [
            f"#### case {cid} ({label_a} -> {label_b}: {scores})",
            "",
        ]
        out += md_table(
            ["question", "expected", *columns],
            ([cut(x) for x in (q, g, *ans)] for q, g, ans in _qa_rows(benchmark, case, recs)),
            "ll" + "l" * len(columns),
        )
        out.append("")
    return "\n".join(out)
