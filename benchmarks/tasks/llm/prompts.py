"""The judge's prompts (paper Fig. ``judge_prompt``, verbatim) and the parsers of their answers.

FActScore atomic-fact decomposition of each answer sentence (7 fixed + 1 BM25-retrieved
demonstrations), FActScore support validation of each fact against the edit passage, and the
decomposed-recall coverage judge for the Dmp sub-questions. A parser returns ``Parsed`` with
``complete=False`` when something the prompt asked for is missing, so the client asks again.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

from .client import Parsed

__all__ = [
    "CoverageItem",
    "DEMONSTRATIONS",
    "FIXED_DEMOS",
    "build_coverage_prompt",
    "build_decomposition_prompt",
    "build_support_prompt",
    "parse_coverage",
    "parse_decomposition",
    "parse_support",
]

# Paper Fig. judge_prompt, verbatim ({c} = edit passage, {s} = subject).
DECOMPOSITION_DEMO = (
    "Please breakdown the following sentence into independent facts: {sentence}\n{facts}\n\n"
)
DECOMPOSITION_TASK = (
    "Now break down EACH of the following sentences into independent facts. For each sentence, "
    "output its header then one '- fact' line per fact:\n\n"
)
SUPPORT_HEAD = "Answer the questions about {subject} based on the given context.\n\n{passage}\n\n"
SUPPORT_ITEM = "ITEM {i}: Input: {fact} True or False?\n"
SUPPORT_TAIL = (
    "\nThink briefly about each item, then output ONE line per item, in order, EXACTLY like:\n"
    "ITEM 1: <answer>1</answer>\n"
    "(1 = True/supported by the context, 0 = False/not supported)"
)
COVERAGE_HEAD = (
    "You are scoring atomic sub-questions. For each item, judge whether the model ANSWER "
    "expresses the EXPECTED FACT for that sub-question.\n\n"
    "The expected fact is knowledge the model was deliberately given; it may be COUNTERFACTUAL "
    "(it can contradict real-world knowledge on purpose). Judge ONLY whether the answer expresses "
    "the expected fact -- never penalize the answer for disagreeing with reality, and never "
    "reward real-world-correct content that is not the expected fact.\n\n"
)
COVERAGE_ITEM = (
    "ITEM {i}:\n  Sub-question: {question}\n  Expected fact: {expected}\n  Model answer: {answer}\n"
)
COVERAGE_TAIL = (
    "\nFor each item, output <score>1</score> if the answer states or clearly entails that "
    "expected fact, otherwise <score>0</score>. Then add one sentence <explanation>. Output one "
    "line per item, in the given order, formatted exactly like this:\n\n"
    "ITEM 1: <score>SCORE</score> <explanation>EXPLANATION</explanation>\n"
    "ITEM 2: <score>SCORE</score> <explanation>EXPLANATION</explanation>\n"
    "..."
)


@dataclass
class CoverageItem:
    """One Dmp sub-question: the question, the gold ``sub_answer`` and the model's answer."""

    question: str
    expected: str
    answer: str


# FActScore-style decomposition demonstrations (a sentence and its '- fact' lines), written for this
# project. The first FIXED_DEMOS are always shown; one more is retrieved from the rest by BM25.
DEMONSTRATIONS: list[tuple[str, list[str]]] = [
    (
        "Maria Lopez (born 3 May 1961) is a Chilean "
        "architect who designed the Valparaiso harbour museum.",
        [
            "Maria Lopez was born on 3 May 1961.",
            "Maria Lopez is Chilean.",
            "Maria Lopez is an architect.",
            "Maria Lopez designed the Valparaiso harbour museum.",
        ],
    ),
    (
        "She studied law at the University of Toronto and later worked as a prosecutor in Ottawa.",
        [
            "She studied law.",
            "She studied at the University of Toronto.",
            "She later worked as a prosecutor.",
            "She worked in Ottawa.",
        ],
    ),
    (
        "The band released its debut album, Northern Lights, "
        "in 1998 and toured Europe the following year.",
        [
            "The band released a debut album.",
            "The band's debut album is Northern Lights.",
            "Northern Lights was released in 1998.",
            "The band toured Europe in 1999.",
        ],
    ),
    (
        "He served two terms as mayor of Leeds before being elected to Parliament in 2005.",
        [
            "He served as mayor of Leeds.",
            "He served two terms as mayor.",
            "He was elected to Parliament.",
            "He was elected to Parliament in 2005.",
            "He was mayor of Leeds before he was elected to Parliament.",
        ],
    ),
    (
        "Known for her detective novels, Anne Berg has won the Glass Key award twice.",
        [
            "Anne Berg is known for her detective novels.",
            "Anne Berg writes detective novels.",
            "Anne Berg has won the Glass Key award.",
            "Anne Berg has won the Glass Key award twice.",
        ],
    ),
    (
        "The company, founded by two engineers in Osaka, makes batteries for electric bicycles.",
        [
            "The company was founded by two engineers.",
            "The company was founded in Osaka.",
            "The company makes batteries.",
            "The company's batteries are for electric bicycles.",
        ],
    ),
    (
        "He is a retired goalkeeper who played for Ajax and the Dutch national team.",
        [
            "He is retired.",
            "He is a goalkeeper.",
            "He played for Ajax.",
            "He played for the Dutch national team.",
        ],
    ),
    (
        "The river rises in the Alps, flows north through "
        "three countries and empties into the North Sea.",
        [
            "The river rises in the Alps.",
            "The river flows north.",
            "The river flows through three countries.",
            "The river empties into the North Sea.",
        ],
    ),
    (
        "The novel, set in 1920s Shanghai, follows a "
        "young journalist who uncovers a smuggling ring.",
        [
            "The novel is set in Shanghai.",
            "The novel is set in the 1920s.",
            "The novel follows a young journalist.",
            "The journalist uncovers a smuggling ring.",
        ],
    ),
    (
        "Water boils at 100 degrees Celsius at sea level, "
        "but at a lower temperature on high mountains.",
        [
            "Water boils at 100 degrees Celsius at sea level.",
            "Water boils at a lower temperature on high mountains.",
        ],
    ),
    (
        "The species is native to Madagascar, feeds mainly on insects and is active at night.",
        [
            "The species is native to Madagascar.",
            "The species feeds mainly on insects.",
            "The species is active at night.",
        ],
    ),
    (
        "As chief executive from 2010 to 2016, she doubled "
        "the firm's revenue and opened offices in Brazil.",
        [
            "She was chief executive.",
            "She was chief executive from 2010 to 2016.",
            "She doubled the firm's revenue.",
            "She opened offices in Brazil.",
        ],
    ),
]
FIXED_DEMOS = 7

_CONTENT_RE = re.compile(r"\w+", re.UNICODE)


def _bm25_best(query: str, documents: Sequence[str], k1: float = 1.5, b: float = 0.75) -> int:
    """Index of the document with the highest Okapi BM25 score for ``query`` (first on ties)."""
    docs = [_CONTENT_RE.findall(d.lower()) for d in documents]
    avgdl = sum(map(len, docs)) / len(docs)
    n = len(docs)
    df: dict[str, int] = {}
    for d in docs:
        for w in set(d):
            df[w] = df.get(w, 0) + 1
    terms = _CONTENT_RE.findall(query.lower())
    scores = []
    for d in docs:
        s = 0.0
        for w in terms:
            tf = d.count(w)
            if tf:
                idf = math.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5))
                s += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(d) / avgdl))
        scores.append(s)
    return max(range(n), key=lambda i: (scores[i], -i))


def build_decomposition_prompt(sentences: Sequence[str]) -> str:
    """The FActScore decomposition prompt for all sentences of one answer."""
    pool = DEMONSTRATIONS[FIXED_DEMOS:]
    retrieved = pool[_bm25_best(" ".join(sentences), [s for s, _ in pool])]
    demos = DEMONSTRATIONS[:FIXED_DEMOS] + [retrieved]
    text = "".join(
        DECOMPOSITION_DEMO.format(sentence=s, facts="\n".join(f"- {f}" for f in facts))
        for s, facts in demos
    )
    text += DECOMPOSITION_TASK
    text += "".join(f"Sentence {i}: {s}\n" for i, s in enumerate(sentences, 1))
    return text


def build_support_prompt(subject: str, passage: str, facts: Sequence[str]) -> str:
    """The FActScore support-validation prompt: every fact of one answer against the edit
    passage."""
    items = "".join(SUPPORT_ITEM.format(i=i, fact=f) for i, f in enumerate(facts, 1))
    return SUPPORT_HEAD.format(subject=subject, passage=passage) + items + SUPPORT_TAIL


def build_coverage_prompt(items: Sequence["CoverageItem"]) -> str:
    """The decomposed-recall coverage prompt for all sub-questions of one case."""
    body = "".join(
        COVERAGE_ITEM.format(i=i, question=it.question, expected=it.expected, answer=it.answer)
        for i, it in enumerate(items, 1)
    )
    return COVERAGE_HEAD + body + COVERAGE_TAIL


_BULLET_RE = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+(.*\S)\s*$")
_HEADER_RE = re.compile(r"^\s*\**\s*sentence\s*(\d+)\s*\**\s*:", re.IGNORECASE)


def parse_decomposition(text: str, n_sentences: int) -> Parsed[list[str]]:
    """Atomic facts from a decomposition answer: every '- fact' line (de-duplicated, order kept).

    Complete when there is at least one fact and, if the judge wrote ``Sentence k:`` headers, every
    sentence header appears (a truncated answer loses the last ones).
    """
    facts: list[str] = []
    headers: set[int] = set()
    for line in text.splitlines():
        h = _HEADER_RE.match(line)
        if h:
            headers.add(int(h.group(1)))
            line = line[h.end() :]
        m = _BULLET_RE.match(line)
        if m and m.group(1) not in facts:
            facts.append(m.group(1))
    complete = bool(facts) and (not headers or headers >= set(range(1, n_sentences + 1)))
    return Parsed(facts, complete)


_TRUE = {"1", "true", "yes", "supported"}
_FALSE = {"0", "false", "no", "not supported", "unsupported"}


def _item_values(text: str, tag: str, n_items: int) -> dict[int, int]:
    """``ITEM k: ... <tag>v</tag>`` verdicts; the last one per item wins (reasoning may come
    first)."""
    found: dict[int, int] = {}
    pattern = re.compile(rf"ITEM\s*(\d+)\s*:?[^\n<]*<{tag}>\s*([^<]*?)\s*</{tag}>", re.IGNORECASE)
    for m in pattern.finditer(text):
        i, raw = int(m.group(1)), m.group(2).strip().lower().strip("*. ")
        if 1 <= i <= n_items and (raw in _TRUE or raw in _FALSE):
            found[i] = int(raw in _TRUE)
    return found


def parse_support(text: str, n_facts: int) -> Parsed[list[int | None]]:
    """Per-fact support verdicts (1/0, None where the answer has no verdict for that item)."""
    found = _item_values(text, "answer", n_facts)
    return Parsed([found.get(i) for i in range(1, n_facts + 1)], len(found) == n_facts)


def parse_coverage(text: str, n_items: int) -> Parsed[list[int | None]]:
    """Per-sub-question coverage scores (1/0, None where the answer has no score for that item)."""
    found = _item_values(text, "score", n_items)
    return Parsed([found.get(i) for i in range(1, n_items + 1)], len(found) == n_items)
