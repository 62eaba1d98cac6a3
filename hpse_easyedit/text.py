"""Sentence boundaries, defined once: ``sentence_spans`` (COIN's chunks, the benchmarks' atomic
facts and first sentences).

A sentence ends at ``.``, ``!`` or ``?`` (plus closing quotes/brackets) followed by whitespace and
an upper-case letter, a digit or an opening quote, unless the dot closes an abbreviation (an initial
"J.", a dotted acronym "U.S.", a title "Dr."); a line break always ends one.
Kept instead of nltk (its trained punkt models are not installed here): the untrained
``PunktSentenceTokenizer`` splits after initials and list numbers ("J.J. Liu", "1. **Bold**"); even
applied line by line it changes the splits of 165 of the 6,088 answers stored under docs/study (248
on whole answers, where it also ignores line breaks).
"""

from __future__ import annotations

import re

__all__ = ["sentence_spans"]

# A candidate sentence end: . ! or ? (plus closing quotes/brackets) before whitespace and an
# upper-case letter, digit or opening quote.
_SENT_END_RE = re.compile(r"[.!?]+[\"')\]]*(?=\s+[\"'(\[]?[A-Z0-9])")
# Words whose final dot is not a sentence end: initials ("J."), dotted acronyms ("U.S."), titles.
_ABBREV_RE = re.compile(
    r"(?:^|\s)(?:[A-Z]|(?:[A-Za-z]\.)+[A-Za-z]|Mr|Mrs|Ms|Dr|Prof|St|Jr|Sr|vs|etc|No|Inc|Co|Ltd)\.$"
)


def _stripped(text: str, start: int, end: int) -> tuple[int, int]:
    """``[start, end)`` without the leading and trailing whitespace ``str.strip`` removes."""
    piece = text[start:end]
    return start + len(piece) - len(piece.lstrip()), end - len(piece) + len(piece.rstrip())


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of the sentences of ``text``, in order, without surrounding
    whitespace.

    Line breaks (every one ``str.splitlines`` knows) also end a sentence; empty sentences are
    dropped.
    """
    spans: list[tuple[int, int]] = []
    offset = 0
    for raw in text.splitlines(keepends=True):
        line = raw.splitlines()[0] if raw.splitlines() else ""
        start = 0
        for m in _SENT_END_RE.finditer(line):
            if m.group().startswith(".") and _ABBREV_RE.search(line[start : m.start() + 1]):
                continue
            spans.append(_stripped(text, offset + start, offset + m.end()))
            start = m.end()
        spans.append(_stripped(text, offset + start, offset + len(line)))
        offset += len(raw)
    return [(a, b) for a, b in spans if a < b]
