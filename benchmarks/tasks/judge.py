"""The UnKEBench judges: the paper's LLM judge behind any OpenAI-compatible endpoint, or an offline
lexical fallback.

``LLMJudge`` asks the paper's judge prompts (``benchmarks.tasks.llm.prompts``) through
``benchmarks.tasks.llm.client``'s ``ChatClient`` (its retries and its one on-disk cache): FActScore
atomic-fact decomposition of each answer sentence, FActScore support validation of each fact against
the edit passage, and the decomposed-recall coverage judge for the Dmp sub-questions.

``LexicalJudge`` needs no endpoint: atomic facts are the answer's sentences, a fact counts as
supported when most of its content words occur in the passage, and a sub-question counts as answered
when most of the expected answer's content words occur in the model answer. It is a rough stand-in,
so it is named ``lexical-fallback`` in every record and summary it produced.

The client and prompt names are importable from here too, where callers have always found them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Sequence

from hpse_easyedit.errors import choice_text

from .llm.client import (
    ChatClient,
    JudgeError,
    JudgeRefusedError,
    JudgeSettings,
    Parsed,
    ResponseCache,
)
from .llm.prompts import (
    _CONTENT_RE,
    DEMONSTRATIONS,
    FIXED_DEMOS,
    CoverageItem,
    build_coverage_prompt,
    build_decomposition_prompt,
    build_support_prompt,
    parse_coverage,
    parse_decomposition,
    parse_support,
)
from .metrics import split_sentences, supported_fraction

__all__ = [
    "JUDGES",
    "JUDGE_KINDS",
    "register_judge",
    "ChatClient",
    "CoverageItem",
    "DEMONSTRATIONS",
    "FIXED_DEMOS",
    "FactScoreResult",
    "Judge",
    "JudgeError",
    "JudgeRefusedError",
    "JudgeSettings",
    "LEXICAL_JUDGE_NAME",
    "LLMJudge",
    "LexicalJudge",
    "Parsed",
    "ResponseCache",
    "build_coverage_prompt",
    "build_decomposition_prompt",
    "build_support_prompt",
    "make_judge",
    "parse_coverage",
    "parse_decomposition",
    "parse_support",
]

log = logging.getLogger(__name__)

LEXICAL_JUDGE_NAME = "lexical-fallback"

_STOPWORDS = frozenset(
    "a an the and or but if of to in on at by for with from as into about over under after before "
    "between through during is are was were be been being has have had do does did will would "
    "shall should can could may might must it its this that these those there here he she they "
    "them his her their we our you your i me my not no yes so than then also very just what which "
    "who whom whose when where why how all any each "
    "both more most other some such only own same too s".split()
)


def _content_words(text: str) -> list[str]:
    return [w for w in _CONTENT_RE.findall(text.lower()) if w not in _STOPWORDS]


@dataclass
class FactScoreResult:
    """FActScore of one answer: its atomic facts, the judge's verdicts and the supported
    fraction."""

    facts: list[str]
    supported: list[bool]
    score: float
    complete: bool = True

    def to_dict(self) -> dict:
        return {
            "facts": self.facts,
            "supported": self.supported,
            "score": self.score,
            "complete": self.complete,
        }


class Judge:
    """What the UnKEBench scorer needs from a judge; ``name`` goes into every record it scores."""

    name: str = "judge"

    def factscore(self, answer: str, passage: str, subject: str) -> FactScoreResult:
        raise NotImplementedError

    def coverage(self, items: Sequence[CoverageItem]) -> tuple[list[int], bool]:
        """Binary scores per item and whether the judge answered every item."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the endpoint and the cache."""


class LLMJudge(Judge):
    """The paper's judge: FActScore decomposition + support validation, and the Dmp coverage
    prompt."""

    def __init__(self, client: ChatClient) -> None:
        self.client = client
        self.name = client.name

    def factscore(self, answer: str, passage: str, subject: str) -> FactScoreResult:
        sentences = split_sentences(answer)
        if not sentences:
            return FactScoreResult([], [], 0.0)
        decomposed = self.client.complete(
            build_decomposition_prompt(sentences), lambda t: parse_decomposition(t, len(sentences))
        )
        facts = decomposed.value
        if not facts:
            return FactScoreResult([], [], 0.0, complete=decomposed.complete)
        verdicts = self.client.complete(
            build_support_prompt(subject, passage, facts), lambda t: parse_support(t, len(facts))
        )
        supported = [v == 1 for v in verdicts.value]
        return FactScoreResult(
            facts,
            supported,
            supported_fraction(supported),
            decomposed.complete and verdicts.complete,
        )

    def coverage(self, items: Sequence[CoverageItem]) -> tuple[list[int], bool]:
        if not items:
            return [], True
        scores = self.client.complete(
            build_coverage_prompt(items), lambda t: parse_coverage(t, len(items))
        )
        return [int(v == 1) for v in scores.value], scores.complete

    def close(self) -> None:
        self.client.close()


class LexicalJudge(Judge):
    """Offline stand-in: content-word overlap instead of an LLM. Coarse; named
    ``lexical-fallback``."""

    name = LEXICAL_JUDGE_NAME

    def __init__(self, support_threshold: float = 0.6, coverage_threshold: float = 0.5) -> None:
        self.support_threshold = support_threshold
        self.coverage_threshold = coverage_threshold

    @staticmethod
    def _recall(words: Sequence[str], pool: set[str]) -> float:
        return sum(w in pool for w in words) / len(words) if words else 0.0

    def factscore(self, answer: str, passage: str, subject: str) -> FactScoreResult:
        """Facts = the answer's sentences with content words; supported = >= threshold of them in
        the passage."""
        pool = set(_content_words(passage))
        facts = [s for s in split_sentences(answer) if _content_words(s)]
        supported = [self._recall(_content_words(f), pool) >= self.support_threshold for f in facts]
        return FactScoreResult(facts, supported, supported_fraction(supported))

    def coverage(self, items: Sequence[CoverageItem]) -> tuple[list[int], bool]:
        """1 when >= threshold of the expected answer's content words (those not already in the
        question, unless that leaves none) occur in the model answer."""
        scores = []
        for it in items:
            expected = _content_words(it.expected)
            asked = set(_content_words(it.question))
            new = [w for w in expected if w not in asked] or expected
            scores.append(
                int(
                    bool(new)
                    and self._recall(new, set(_content_words(it.answer))) >= self.coverage_threshold
                )
            )
        return scores, True


def make_judge(kind: str, settings: JudgeSettings, warn: bool = True) -> Judge:
    """``kind``: 'llm' (needs an endpoint), 'lexical', or 'auto' (llm when an endpoint is
    configured).

    ``warn=False`` leaves the warning about the lexical fallback to the caller (the runner logs it
    after its pre-flight checks, so a bad option is the only line a user sees).
    """
    if kind not in JUDGE_KINDS:
        raise ValueError(f"--judge must be {choice_text(JUDGE_KINDS)}, got {kind!r}")
    if kind == "auto":
        kind = "llm" if settings.resolve().configured else "lexical"
        if kind == "lexical" and warn:
            log.warning(
                "no judge endpoint configured (--judge-base-url / HPSE_JUDGE_BASE_URL / "
                "OPENAI_BASE_URL or an API key): scoring UnKEBench with the offline LEXICAL "
                "FALLBACK judge; its Jnt/Dmp are not the paper's"
            )
    judge = JUDGES[kind](settings)
    if warn and isinstance(judge, LLMJudge):
        log.info(
            "judge: %s at %s",
            judge.client.name,
            judge.client.settings.base_url or "the OpenAI default URL",
        )
    return judge


#: ``--judge`` kind -> the judge it builds from the endpoint settings; ``auto`` picks ``llm`` when
#: an endpoint is configured, else ``lexical``. A new judge is one class plus one ``register_judge``
#: line; ``--help``, the option checks and ``make_judge`` follow.
JUDGES: dict[str, Callable[[JudgeSettings], Judge]] = {
    "llm": lambda settings: LLMJudge(ChatClient(settings)),
    "lexical": lambda settings: LexicalJudge(),
}
JUDGE_KINDS: list[str] = ["auto", *JUDGES]


def register_judge(kind: str, factory: Callable[[JudgeSettings], Judge]) -> None:
    """Make ``--judge KIND`` build ``factory(settings)``."""
    JUDGES[kind] = factory
    if kind not in JUDGE_KINDS:
        JUDGE_KINDS.append(kind)
