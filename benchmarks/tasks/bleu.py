"""NLTK's sentence BLEU with the n-grams counted once per text: the same numbers, bit for bit.

Both BLEUs the benchmarks report are NLTK's ``sentence_bleu``: UnKE's on the characters of two
strings (``unke_scores.bleu``) and Texygen's Self-BLEU on word tokens (``metrics.self_bleu``: each
answer of a case against all the others). NLTK counts every n-gram of every reference again in each
call, with a Python generator per n-gram, which was most of the time of recomputing the committed
study's tables (``python -m benchmarks study``). Here a text's n-grams are counted once
(``NgramCounts``, with ``Counter`` over ``zip``) and reused by every BLEU that reads it; the rest is
NLTK's own arithmetic in NLTK's order (``corpus_bleu`` for one sentence: the modified precisions as
NLTK's ``Fraction``, its ``closest_ref_length``, ``brevity_penalty`` and smoothing function, the
weighted log sum by ``math.fsum``), so the score is the same float. ``tests/test_bench_metrics.py``
compares it with ``nltk.translate.bleu_score.sentence_bleu`` on the committed runs' answers with
``==``.

No library keeps the counts between calls (sacrebleu computes another BLEU: its own tokenisation
and smoothing), hence this module.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from typing import Any, Callable, Sequence

__all__ = ["NgramCounts", "sentence_bleu"]


class NgramCounts:
    """A text's (a string's characters or a list of tokens) n-grams of orders 1 to ``max_n``,
    counted once: ``orders[n - 1]`` is NLTK's ``Counter(ngrams(text, n))`` (empty where the text is
    shorter than ``n``)."""

    __slots__ = ("length", "orders", "text")

    def __init__(self, text: Sequence[Any], max_n: int) -> None:
        self.text, self.length = text, len(text)
        self.orders = [
            Counter(zip(*(text[i:] for i in range(n)))) if len(text) >= n else Counter()
            for n in range(1, max_n + 1)
        ]


def _modified_precision(references: Sequence[NgramCounts], hypothesis: NgramCounts, n: int) -> Any:
    """NLTK's ``modified_precision(references, hypothesis, n)`` on counted texts: each hypothesis
    n-gram's count clipped by its largest count in one reference, over the hypothesis's n-grams."""
    from nltk.translate import bleu_score

    counts = hypothesis.orders[n - 1]
    # NLTK takes every hypothesis n-gram's largest count in any reference, 0 where none has it, and
    # sums the clipped counts: the n-grams no reference has add 0, so only the shared ones are
    # visited (a set intersection), and the sum of the same integers is the same. The lookups run
    # through map (in C): this is most of the time of a study's BLEUs
    max_counts: dict = {}
    for reference in references:
        reference_counts = reference.orders[n - 1]
        shared = tuple(counts.keys() & reference_counts.keys())
        most = map(reference_counts.__getitem__, shared)
        if max_counts:
            most = map(max, most, map(max_counts.get, shared, itertools.repeat(0)))
        max_counts.update(zip(shared, most))
    numerator = sum(map(min, map(counts.__getitem__, max_counts), max_counts.values()))
    denominator = max(1, sum(counts.values()))
    return bleu_score.Fraction(numerator, denominator, _normalize=False)


def sentence_bleu(
    references: Sequence[NgramCounts],
    hypothesis: NgramCounts,
    weights: Sequence[float],
    smoothing_function: Callable[..., list] | None = None,
) -> float:
    """NLTK's ``sentence_bleu([r.text for r in references], hypothesis.text, weights,
    smoothing_function)`` (one weight tuple, no ``auto_reweigh``), each text's n-grams counted up to
    ``len(weights)``."""
    from nltk.translate import bleu_score

    if not references:
        raise ValueError("BLEU needs at least one reference")
    p_n = [_modified_precision(references, hypothesis, n) for n in range(1, len(weights) + 1)]
    hyp_len = hypothesis.length
    ref_len = bleu_score.closest_ref_length([r.text for r in references], hyp_len)
    bp = bleu_score.brevity_penalty(ref_len, hyp_len)
    if p_n[0].numerator == 0:
        return 0
    smoothing = smoothing_function or bleu_score.SmoothingFunction().method0
    p_n = smoothing(
        p_n, references=[r.text for r in references], hypothesis=hypothesis.text, hyp_len=hyp_len
    )
    s = (w_i * math.log(p_i) for w_i, p_i in zip(weights, p_n) if p_i > 0)
    return bp * math.exp(math.fsum(s))
