"""The paper's metrics (appendix C) as pure functions on strings and numbers.

- MQuAKE-uns: ``Ind`` = mean correctness over a case's ``new_single_hops``; ``Cmp`` = any of the 3
  multi-hop ``questions`` correct. Correctness is the official MQuAKE keyword check: the lower-cased
  gold answer or any alias is a substring of the lower-cased generation.
- UnKEBench: ``Jnt`` = FActScore (fraction of an answer's atomic facts the judge finds supported by
  the passage), ``Dmp`` = fraction of sub-questions the judge scores 1, ``Div`` = 1 - SelfBLEU-4
  among one case's sub-question answers (Texygen's SelfBLEU: each answer is the hypothesis, all the
  others are its references; NLTK ``sentence_bleu`` with uniform 4-gram weights and smoothing
  method 1).

No model, judge or file in sight: the judge's verdicts come in as booleans, so every number here is
checkable by hand.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Iterable, Mapping, Sequence

from hpse_easyedit.text import sentence_spans

from .bleu import NgramCounts, sentence_bleu

__all__ = [
    "answer_matches",
    "cut_to_tokens",
    "first_sentence",
    "mean",
    "stepin_rate_by_round",
    "mquake_case_scores",
    "split_sentences",
    "supported_fraction",
    "bleu",
    "self_bleu",
    "diversity",
    "word_tokens",
]

_WORD_RE = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def mean(values: Iterable[float | None]) -> float | None:
    """Arithmetic mean of the values that are not None; None when there are none."""
    kept = [float(v) for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def answer_matches(generation: str, answers: Sequence[str], *, whole_word_max: int = 0) -> bool:
    """The official MQuAKE check: some lower-cased gold answer/alias is a substring of the
    lower-cased generation.

    ``whole_word_max`` > 0 is a stricter diagnostic outside the paper: an alias of at most that many
    characters must then occur as a whole word, so Germany's alias "de" no longer matches inside
    "despite" (nor Norway's "NO" inside "known"); longer aliases keep the substring check.
    """
    text = generation.lower()
    return any(a and _alias_in(a.lower(), text, len(a) <= whole_word_max) for a in answers)


def _alias_in(alias: str, text: str, whole_word: bool) -> bool:
    if not whole_word:
        return alias in text
    return re.search(r"(?<!\w)" + re.escape(alias) + r"(?!\w)", text) is not None


def mquake_case_scores(
    single_hop_generations: Sequence[str],
    single_hop_answers: Sequence[Sequence[str]],
    multi_hop_generations: Sequence[str],
    multi_hop_answers: Sequence[str],
    *,
    whole_word_max: int = 0,
) -> dict[str, float]:
    """``Ind`` (mean over single hops) and ``Cmp`` (any of the multi-hop questions) for one case, in
    [0, 1].

    ``single_hop_answers[i]`` is hop i's answer followed by its aliases; ``multi_hop_answers`` is
    the case's ``new_answer`` followed by ``new_answer_alias``. ``whole_word_max``: see
    ``answer_matches`` (0, the default, is the official check).
    """
    if len(single_hop_generations) != len(single_hop_answers):
        raise ValueError(
            f"{len(single_hop_generations)} single-hop generations "
            f"for {len(single_hop_answers)} single-hop questions"
        )
    if not single_hop_answers or not multi_hop_generations:
        raise ValueError("a MQuAKE case needs at least one single-hop and one multi-hop question")
    hops = [
        answer_matches(g, a, whole_word_max=whole_word_max)
        for g, a in zip(single_hop_generations, single_hop_answers)
    ]
    return {
        "Ind": sum(hops) / len(hops),
        "Cmp": float(
            any(
                answer_matches(g, multi_hop_answers, whole_word_max=whole_word_max)
                for g in multi_hop_generations
            )
        ),
    }


def supported_fraction(supported: Sequence[bool]) -> float:
    """FActScore of one answer: supported atomic facts / all atomic facts (0 for an answer with no
    facts)."""
    return sum(bool(s) for s in supported) / len(supported) if supported else 0.0


def split_sentences(text: str) -> list[str]:
    """Split a model answer into sentences for atomic-fact decomposition (line breaks also split):
    ``hpse_easyedit.text.sentence_spans``, the one sentence splitter."""
    return [text[a:b] for a, b in sentence_spans(text)]


def word_tokens(text: str) -> list[str]:
    """Words and punctuation marks, as NLTK's ``word_tokenize`` would roughly give them (case
    kept)."""
    return _WORD_RE.findall(text)


def bleu(hypothesis: Sequence[str], references: Sequence[Sequence[str]], max_n: int = 4) -> float:
    """Sentence BLEU of token lists: NLTK's ``sentence_bleu(references, hypothesis)`` with uniform
    weights up to ``max_n`` and ``SmoothingFunction().method1`` (epsilon 0.1 for empty orders), as
    Texygen calls it (the same float: ``bleu.sentence_bleu``).

    Modified n-gram precision clips each hypothesis n-gram count by its maximum count in any one
    reference; the brevity penalty uses the reference length closest to the hypothesis length
    (the shorter one on ties). No unigram match at all gives 0.
    """
    return _bleu(
        NgramCounts(list(hypothesis), max_n),
        [NgramCounts(list(r), max_n) for r in references],
        max_n,
    )


def _bleu(hypothesis: NgramCounts, references: Sequence[NgramCounts], max_n: int) -> float:
    from nltk.translate.bleu_score import SmoothingFunction  # nltk's import costs ~1 s: only here

    return float(
        sentence_bleu(
            references,
            hypothesis,
            (1.0 / max_n,) * max_n,
            smoothing_function=SmoothingFunction().method1,
        )
    )


def self_bleu(texts: Sequence[str], max_n: int = 4) -> float | None:
    """Mean BLEU-``max_n`` of each text (``word_tokens``) against all the others; None for fewer
    than two texts."""
    if len(texts) < 2:
        return None
    return _self_bleu(tuple(texts), max_n)


#: a pure function of the texts, and every table that reads a run scores its answers again
#: (``benchmarks.analysis.study`` regenerates RESULTS.md's tables): a process keeps the scores
@functools.lru_cache(maxsize=1 << 15)
def _self_bleu(texts: tuple[str, ...], max_n: int) -> float:
    counted = [NgramCounts(word_tokens(t), max_n) for t in texts]  # once per text, not per pair
    return sum(
        _bleu(counted[i], counted[:i] + counted[i + 1 :], max_n) for i in range(len(counted))
    ) / len(counted)


def diversity(texts: Sequence[str]) -> float | None:
    """``Div`` of one case: 1 - SelfBLEU-4 of its sub-question answers (None for fewer than two)."""
    sb = self_bleu(texts)
    return None if sb is None else 1.0 - sb


# ----------------------------------------------------------------------- recitation diagnostics
# Not paper metrics: an answer cut short, so that a passage recited after (or instead of) the answer
# no longer collects substring hits. ``benchmarks.analysis.paired --recitation`` rescores stored
# answers with them.


def first_sentence(text: str) -> str:
    """The first sentence of an answer as ``split_sentences`` splits it (a line break also ends
    one); "" if none."""
    spans = sentence_spans(text)
    return text[spans[0][0] : spans[0][1]] if spans else ""


def cut_to_tokens(text: str, n: int, token_spans=None) -> str:
    """``text`` up to the end of its ``n``-th token, the rest dropped (the whole text if it has at
    most ``n``).

    ``token_spans(text)`` gives each token's ``(start, end)`` character offsets, e.g. a fast
    tokenizer's ``offset_mapping``; the default counts words and punctuation marks
    (``word_tokens``).
    """
    if n < 1:
        raise ValueError(f"cut to {n} tokens: give a number >= 1")
    spans = (
        list(token_spans(text))
        if token_spans is not None
        else [m.span() for m in _WORD_RE.finditer(text)]
    )
    return text if len(spans) <= n else text[: spans[n - 1][1]]


def stepin_rate_by_round(records: Sequence[Mapping[str, Any]]) -> list[float | None]:
    """Mean step-in rate per round index over the records (rounds without a rollout are left
    out)."""
    n_rounds = max((len(r.get("rounds") or []) for r in records), default=0)
    return [
        mean(
            (r.get("rounds") or [])[i].get("stepin_rate")
            for r in records
            if len(r.get("rounds") or []) > i
        )
        for i in range(n_rounds)
    ]
