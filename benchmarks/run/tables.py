"""The markdown a run writes under its results: the paper's table (``paper_table``: UnKEBench's
Jnt, Dmp, Div, Avg, MMLU and MQuAKE-uns' Ind, Cmp, Avg side by side, one row per method, percent
with one decimal; ``paper_cells`` the same as cells, which the HTML report renders), the line
naming the judge (``judge_note``) and UnKE's own metrics (``metrics_table``; ``UNKE_TABLE_MARK``
marks their section of ``table.md``). The runner's ``table.md``, the run and compare commands and
the report print them."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..markdown import md_table
from ..tasks.judge import LEXICAL_JUDGE_NAME
from ..tasks.task import TASKS
from ..tasks.unke_scores import BERT, BLEU, MINILM, ORIGINAL, PARA, ROUGE, SUB

__all__ = ["UNKE_TABLE_MARK", "judge_note", "metrics_table", "paper_cells", "paper_table"]

UNKE_TABLE_MARK = "<!-- unke-metrics: python -m benchmarks.unke_metrics -->"
# (group, metric) of the table's columns, in EasyEdit's order
_COLUMNS = [(g, m) for g in (ORIGINAL, PARA) for m in (BLEU, *ROUGE)] + [(SUB, m) for m in ROUGE]
_SHORT = {
    ORIGINAL: "Ori",
    PARA: "Para",
    SUB: "Sub",
    BLEU: "BLEU",
    "ROUGE-1": "R-1",
    "ROUGE-2": "R-2",
    "ROUGE-L": "R-L",
}


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
    align = "l" + "r" * (len(metric_names) - 1)
    if len(groups) == 1:
        return "\n".join(md_table(metric_names, body, align)) + "\n"
    heads = [""] + [c for title, n in groups for c in [f"**{title}**"] + [""] * (n - 1)]
    bold = [f"**{m}**" for m in metric_names]
    return "\n".join(md_table(heads, [bold, *body], align)) + "\n"


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


def metrics_table(
    rows: Sequence[tuple[str, Mapping[str, Any]]], caps: Sequence[int | None] | None = None
) -> str:
    """A markdown table: per (label, ``summarize_metrics`` output) row its cases, the answer cap
    when ``caps`` are given, and every BLEU and ROUGE column in percent; then a line on
    ``Bert Score``, which the table shows only for the rows that have it."""
    head = ["run", "cases"] + (["answer cap (tokens)"] if caps is not None else [])
    head += [f"{_SHORT[g]} {_SHORT[m]}" for g, m in _COLUMNS]
    body = []
    for i, (label, m) in enumerate(rows):
        cells = [label, str(m["n_cases"])] + ([str(caps[i] or "-")] if caps is not None else [])
        cells += [f"{m[g][name]:.1f}" if name in m[g] else "-" for g, name in _COLUMNS]
        body.append(cells)
    lines = md_table(head, body, "l" + "r" * (len(head) - 1))
    bert = [(label, m) for label, m in rows if BERT in m[ORIGINAL] and BERT in m[PARA]]
    if bert:
        lines += [
            "",
            "Bert Score (MiniLM cosine, Ori / Para): "
            + "; ".join(
                f"{label} {m[ORIGINAL][BERT]:.1f} / {m[PARA][BERT]:.1f}" for label, m in bert
            ),
        ]
    if len(bert) < len(rows):
        lines += [
            "",
            f"Bert Score ({MINILM} cosine) is not in this table"
            + (" for the other runs" if bert else "")
            + ": `python -m benchmarks unke-metrics RUN --write` computes it, into "
            "summary.json, only where sentence-transformers and that model are on the "
            "machine.",
        ]
    return "\n".join(lines) + "\n"
