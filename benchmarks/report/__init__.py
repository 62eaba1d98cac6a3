"""Tables in the paper's layout, the step-in-rate plot, and the command that reports runs.

The paper's main table puts UnKEBench (Jnt, Dmp, Div, Avg, MMLU) and MQuAKE-uns (Ind, Cmp, Avg) side
by side, one row per method, numbers in percent with one decimal. ``paper_table`` renders that as
markdown for any subset of the two benchmarks; a benchmark a row has no summary for shows dashes.

    python -m benchmarks.report runs/mq-lora runs/mq-hpse  # the paper-layout table
    # one self-contained HTML file:
    python -m benchmarks.report runs/mq-lora runs/mq-hpse --html runs/mq.html

``__main__`` is that command; ``html`` writes the HTML report, which adds the case-by-case
comparison with intervals, the step-in plot, and every case with its questions, answers, verdicts
and rollouts.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ..judge import LEXICAL_JUDGE_NAME
from ..rollouts import plot_stepin_rates
from ..tasks import TASKS

__all__ = ["judge_note", "paper_cells", "paper_table", "plot_stepin_rates"]


def _fmt(value: object) -> str:
    return (
        f"{value:.1f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"
    )


def paper_cells(
    rows: Sequence[tuple[str, Mapping[str, Mapping | None]]],
) -> tuple[list[tuple[str, int]], list[str], list[list[str]]]:
    """The paper-layout table as cells: benchmark groups (title, number of columns), metric names,
    body rows.

    One body row per (label, {benchmark: summary}), columns for every benchmark present, numbers
    with one decimal and dashes where a row has no summary for a benchmark. ``paper_table`` renders
    these as markdown, ``benchmarks.report.html`` as HTML.
    """
    present = [t for t in TASKS.values() if any(s.get(t.name) for _, s in rows)]
    if not present:
        raise ValueError("no summaries to tabulate")
    groups = [(t.title, len(t.table_columns)) for t in present]
    metric_names = ["method"] + [label for t in present for label, _ in t.table_columns]
    body = []
    for label, summaries in rows:
        cells = [label]
        for t in present:
            summary = summaries.get(t.name) or {}
            cells += [_fmt(summary.get(key)) for _, key in t.table_columns]
        body.append(cells)
    return groups, metric_names, body


def paper_table(rows: Sequence[tuple[str, Mapping[str, Mapping | None]]]) -> str:
    """Markdown table: one row per (label, {benchmark: summary}); columns for every benchmark
    present.

    With both benchmarks the header row names the benchmark groups and the first body row, in bold,
    names the metrics (markdown has a single header row).
    """
    groups, metric_names, body = paper_cells(rows)
    rule = "|---|" + "---:|" * (len(metric_names) - 1)
    if len(groups) == 1:
        lines = ["| " + " | ".join(metric_names) + " |", rule]
    else:
        heads = [""] + [c for title, n in groups for c in [f"**{title}**"] + [""] * (n - 1)]
        lines = [
            "| " + " | ".join(heads) + " |",
            rule,
            "| " + " | ".join(f"**{m}**" for m in metric_names) + " |",
        ]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines) + "\n"


def judge_note(summaries: Sequence[Mapping]) -> str:
    """A line under a table naming the UnKEBench judge(s), loudly when the lexical fallback was
    used."""
    judges = sorted({str(s["judge"]) for s in summaries if s and s.get("judge")})
    if not judges:
        return ""
    note = f"\nJnt/Dmp judge: {', '.join(judges)}."
    if LEXICAL_JUDGE_NAME in judges:
        note += " lexical-fallback is an offline word-overlap stand-in, NOT the paper's LLM judge."
    return note + "\n"
