"""The one Markdown-table helper of the wing: every table a command prints or a run writes is built
from these rows, so all of them share one layout (``| a | b |``, a rule that right-aligns the
numeric columns). A wing-level module, below every room."""

from __future__ import annotations

from typing import Iterable, Sequence

__all__ = ["md_row", "md_rule", "md_table"]


def md_row(cells: Iterable[object]) -> str:
    """One table row: ``| a | b |``."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def md_rule(align: str) -> str:
    """The rule under the header, one character per column: ``l`` left (``---``), ``r`` right
    (``---:``)."""
    if set(align) - {"l", "r"}:
        raise ValueError(f"align takes 'l' and 'r' per column, got {align!r}")
    return "|" + "".join("---:|" if a == "r" else "---|" for a in align)


def md_table(head: Sequence[object], rows: Iterable[Sequence[object]], align: str) -> list[str]:
    """The lines of a table: the header, the rule (``align``: one ``l``/``r`` per column), a line
    per row."""
    if len(align) != len(head):
        raise ValueError(f"align names {len(align)} columns, the header {len(head)}")
    return [md_row(head), md_rule(align), *(md_row(r) for r in rows)]
