"""UnKE's own unstructured metrics, the ones UnKE, AnyEdit and EasyEdit report, from stored answers.

Those three share one evaluation, EasyEdit's ``eval_akew_unstructured``
(``easyeditor/evaluate/evaluate_uns.py``). For an UnKEBench case it compares the answer to the
original question (``Original``) and to its paraphrase (``Para``) with the passage, and each
sub-question's answer (``Sub``) with its gold sub-answer. This module computes the same numbers
the same way, per case, with no model time, so that our rows can be set beside those papers':

- ``BLEU SCORE``: nltk's ``sentence_bleu([reference], prediction)`` called on the two strings, as
  EasyEdit calls it. nltk iterates over a string, so its tokens are characters: the score is
  character 1- to 4-gram precision (uniform weights, no smoothing) times a brevity penalty on
  character length, not the word BLEU the name suggests.
- ``ROUGE-1``, ``ROUGE-2``, ``ROUGE-L``: the recall (``r``) of the ``rouge`` package's
  ``Rouge().get_scores(prediction, reference)``: case-sensitive words split at whitespace, counted
  once each (sets of n-grams), the text cut into sentences at every ``.``, ROUGE-L the
  summary-level union LCS over those sentences. ``Sub`` is each case's mean over its
  sub-questions (ROUGE only, as in EasyEdit).
- ``Bert Score``: the cosine between ``all-MiniLM-L6-v2`` sentence embeddings of the passage and an
  answer (``Original`` and ``Para``), only where sentence-transformers and that model are already
  on the machine (it is never downloaded); otherwise left out, with the reason in the summary.

As in EasyEdit, a prediction without a space gets one appended first (``rouge`` rejects an empty
text otherwise). Records keep the fractions EasyEdit returns; summaries and tables hold
percentages, like the task's other numbers. Our answers are what the runner generated (at most
its ``max_new_tokens``, 200 by default on UnKEBench); EasyEdit's own UnKEBench script
(``examples/run_AKEW_both.py``) generates up to 512 new tokens from the raw question.

The UnKEBench task stores ``record_metrics`` in each new record and ``summarize_metrics`` in its
summary; ``benchmarks.analysis.unke_metrics`` computes them for run directories (committed ones
included) and prints or writes them.
"""

from __future__ import annotations

import functools
import logging
import warnings
from typing import Any, Mapping, Protocol, Sequence

from .bleu import NgramCounts, sentence_bleu
from .metrics import mean

__all__ = [
    "BERT",
    "BLEU",
    "KEY",
    "MINILM",
    "ORIGINAL",
    "PARA",
    "ROUGE",
    "SUB",
    "Encoder",
    "bleu",
    "case_metrics",
    "cosine",
    "load_encoder",
    "record_metrics",
    "rouge_recall",
    "summarize_metrics",
]

log = logging.getLogger(__name__)

#: the key of these metrics in a record and in summary.json
KEY = "unke_metrics"
ORIGINAL, PARA, SUB = "Original", "Para", "Sub"
BLEU, BERT = "BLEU SCORE", "Bert Score"
ROUGE = ("ROUGE-1", "ROUGE-2", "ROUGE-L")
#: the sentence-embedding model of EasyEdit's ``Bert Score`` (its ``model_path`` default)
MINILM = "all-MiniLM-L6-v2"
_NO_BERT = (
    "not in every record (computed only where sentence-transformers and the MiniLM are on "
    "the machine)"
)


class Encoder(Protocol):
    """What ``cosine`` needs of a sentence-transformers model."""

    def encode(self, sentences: list[str], *, convert_to_tensor: bool) -> Any: ...


def _padded(text: str) -> str:
    """EasyEdit's guard: a prediction without a space gets one appended before it is scored."""
    return text if " " in text else text + " "


#: ``bleu`` and ``rouge_recall`` are pure functions of two strings, and the same answers are scored
#: again by every table that reads a run (``benchmarks.analysis.study`` regenerates each of
#: RESULTS.md's tables from the committed runs, some 60,000 scores): a process keeps them all
SCORE_CACHE = 1 << 17


@functools.lru_cache(maxsize=SCORE_CACHE)
def bleu(reference: str, prediction: str) -> float:
    """nltk's ``sentence_bleu([reference], prediction)`` on the strings: character n-grams (the
    same float, each text's n-grams counted once: ``bleu.sentence_bleu``)."""
    with warnings.catch_warnings():  # nltk warns when an n-gram order has no match (the score is 0)
        warnings.simplefilter("ignore", UserWarning)
        return float(
            sentence_bleu([_reference_ngrams(reference)], NgramCounts(prediction, 4), (0.25,) * 4)
        )


#: the references (passages, gold answers) are few and each is scored against many answers; an
#: answer's counts are made once per score (``bleu`` keeps the score itself), so only a bounded
#: number of references' counts, a few hundred kB each for a long passage, stay in memory
@functools.lru_cache(maxsize=1024)
def _reference_ngrams(text: str) -> NgramCounts:
    """A reference's character 1- to 4-grams."""
    return NgramCounts(text, 4)


@functools.lru_cache(maxsize=1)
def _rouge() -> Any:
    from rouge import Rouge

    return Rouge(metrics=["rouge-1", "rouge-2"])


def rouge_recall(reference: str, prediction: str) -> dict[str, float]:
    """ROUGE-1/2/L recall of ``prediction`` against ``reference`` as the ``rouge`` package's
    ``Rouge().get_scores`` gives them (ROUGE-L by ``_rouge_l_recall``, the same arithmetic)."""
    return dict(zip(ROUGE, _rouge_recall(reference, prediction)))


@functools.lru_cache(maxsize=SCORE_CACHE)
def _rouge_recall(reference: str, prediction: str) -> tuple[float, ...]:
    scores = _rouge().get_scores(prediction, reference)[0]  # raises on an empty text, as rouge does
    return (
        float(scores["rouge-1"]["r"]),
        float(scores["rouge-2"]["r"]),
        _rouge_l_recall(_sentences(reference), _sentences(prediction)),
    )


def _sentences(text: str) -> list[str]:
    """The ``rouge`` package's sentences of ``text``: cut at every ``.``, whitespace collapsed."""
    return [" ".join(part.split()) for part in text.split(".") if len(part) > 0]


def _rouge_l_recall(reference: list[str], prediction: list[str]) -> float:
    """The ``rouge`` package's summary-level ROUGE-L recall (``rouge_l_summary_level``, exclusive
    n-grams): the words on the union of each reference sentence's LCS with each predicted sentence,
    over the distinct reference words. The package builds each LCS table as a dict of ``(i, j)``
    keys (most of the time RESULTS.md's regeneration spent); this is the same table in lists and
    the same path back through it, so the same words and the same float."""
    distinct = len({w for sentence in reference for w in sentence.split(" ")})
    union: set[str] = set()
    for ref in reference:
        ref_words = ref.split(" ")
        for sentence in prediction:
            union |= _lcs_words(ref_words, sentence.split(" "))
    return len(union) / distinct


def _lcs_words(x: list[str], y: list[str]) -> set[str]:
    """The words of ``x`` on the longest common subsequence that ``rouge_score._recon_lcs`` walks
    back: a match goes diagonally, otherwise up where the cell above is strictly larger, else
    left. Sentences without a common word have none (no table)."""
    n, m = len(x), len(y)
    if set(y).isdisjoint(x):
        return set()
    table = [[0] * (m + 1)]
    for xi in x:
        above, left = table[-1], 0
        row = [0]
        for j, yj in enumerate(y):  # row[j + 1] from above[j] (diagonal), above[j + 1] and left
            if xi == yj:
                left = above[j] + 1
            else:
                up = above[j + 1]
                if up > left:
                    left = up
            row.append(left)
        table.append(row)
    words: set[str] = set()
    i, j = n, m
    while i and j:
        if x[i - 1] == y[j - 1]:
            words.add(x[i - 1])
            i, j = i - 1, j - 1
        elif table[i - 1][j] > table[i][j - 1]:
            i -= 1
        else:
            j -= 1
    return words


def cosine(encoder: Encoder, references: Sequence[str], predictions: Sequence[str]) -> list[float]:
    """Per pair, the cosine between the embeddings of a reference and its prediction (EasyEdit's
    ``Bert Score`` is their mean: the diagonal of ``util.cos_sim``)."""
    import torch

    a = torch.as_tensor(encoder.encode(list(references), convert_to_tensor=True)).float()
    b = torch.as_tensor(encoder.encode(list(predictions), convert_to_tensor=True)).float()
    return [float(x) for x in torch.nn.functional.cosine_similarity(a, b, dim=-1)]


@functools.lru_cache(maxsize=None)
def load_encoder(name: str = MINILM) -> tuple[Encoder | None, str]:
    """(the sentence-transformers model ``name`` from this machine's files, "") or (None, why not).

    Never downloads (``local_files_only``); loaded once per process, on the CPU (it is small)."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None, "sentence-transformers is not installed"
    try:
        return SentenceTransformer(name, device="cpu", local_files_only=True), ""
    except Exception as err:  # noqa: BLE001 - whatever fails offline means: not on this machine
        log.debug("loading %s offline failed: %s", name, err)
        return None, f"{name} is not on this machine (it is loaded offline only, never downloaded)"


def case_metrics(
    passage: str,
    sub_answers: Sequence[str],
    answers: Mapping[str, Any],
    encoder: Encoder | None = None,
) -> dict[str, dict[str, float]]:
    """One UnKEBench case's metrics, as fractions.

    ``answers`` is a record's ``answers`` (``question``, ``para_question``, ``sub_questions``); the
    references are the case's passage and gold sub-answers. ``Bert Score`` joins ``Original`` and
    ``Para`` when an ``encoder`` is given."""
    original, para = _padded(answers["question"]), _padded(answers["para_question"])
    subs = [_padded(a) for a in answers["sub_questions"]]
    if not subs:
        raise ValueError("the record keeps no sub-question answers")
    out = {
        group: {BLEU: bleu(passage, text), **rouge_recall(passage, text)}
        for group, text in ((ORIGINAL, original), (PARA, para))
    }
    # as EasyEdit: answer i against gold sub-answer i, divided by the number of answers
    per_sub = [rouge_recall(sub_answers[i], text) for i, text in enumerate(subs)]
    out[SUB] = {m: sum(s[m] for s in per_sub) / len(per_sub) for m in ROUGE}
    if encoder is not None:
        similar = cosine(encoder, [passage, passage], [original, para])
        out[ORIGINAL][BERT], out[PARA][BERT] = similar
    return out


def record_metrics(passage: str, sub_answers: Sequence[str], answers: Mapping[str, Any]) -> dict:
    """What a new run's record keeps: ``case_metrics`` with this machine's MiniLM when it has one,
    otherwise without ``Bert Score`` and with ``not_computed`` saying why."""
    encoder, reason = load_encoder()
    out: dict[str, Any] = case_metrics(passage, sub_answers, answers, encoder)
    if encoder is None:
        out["not_computed"] = {BERT: reason}
    return out


def summarize_metrics(per_case: Sequence[Mapping[str, Any]], *, bert_reason: str = "") -> dict:
    """The means of ``case_metrics`` over cases, in percent, grouped as EasyEdit groups them, and
    ``n_cases``.

    ``Bert Score`` is averaged only when every case has it; otherwise ``not_computed`` says why
    (``bert_reason``, else the reason a record gives, else that some records lack it)."""
    given = [c["not_computed"][BERT] for c in per_case if BERT in c.get("not_computed", {})]
    out: dict[str, Any] = {}
    for group in (ORIGINAL, PARA, SUB):
        names = (BLEU, *ROUGE, BERT) if group != SUB else ROUGE
        out[group] = {
            m: 100.0 * mean(c[group][m] for c in per_case)
            for m in names
            if per_case and all(m in c[group] for c in per_case)
        }
    if not all(BERT in c[g] for c in per_case for g in (ORIGINAL, PARA)):
        out["not_computed"] = {BERT: bert_reason or (given[0] if given else _NO_BERT)}
    out["n_cases"] = len(per_case)
    return out
