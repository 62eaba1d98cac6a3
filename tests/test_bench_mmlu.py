"""MMLU locality scoring: the prompt format, letter tokens, and batched scoring equal to
one-by-one."""

import warnings

import pytest
import torch

from benchmarks.tasks.datasets import MMLUItem
from benchmarks.tasks.mmlu import format_mmlu_prompt, letter_scores, letter_token_ids, mmlu_accuracy
from tiny_models import make_tiny_model_and_tokenizer

SHOT = ("What is 1 + 1?", ("1", "2", "3", "4"), 1)


def _items():
    return [
        MMLUItem("college_mathematics", "What is 2 + 2?", ("4", "3", "2", "1"), 0, (SHOT,)),
        MMLUItem(
            "anatomy",
            "Which organ pumps blood through the body of a mammal?",
            ("lung", "liver", "heart", "skin"),
            2,
            (),
        ),
        MMLUItem(
            "virology",
            "Which of these is a virus?",
            ("E. coli", "influenza", "yeast", "amoeba"),
            1,
            (SHOT, SHOT),
        ),
    ]


def test_prompt_is_hendrycks_format():
    assert format_mmlu_prompt(_items()[0]) == (
        "The following are multiple choice questions (with answers) about college mathematics.\n\n"
        "What is 1 + 1?\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer: B\n\n"
        "What is 2 + 2?\nA. 4\nB. 3\nC. 2\nD. 1\nAnswer:"
    )


def test_batched_scores_equal_unpadded_scores():
    model, tok = make_tiny_model_and_tokenizer("qwen2")
    letters = letter_token_ids(tok)
    assert len(letters) == 4 and all(letters)
    for j, cands in enumerate(letters):
        assert {tok.decode([c]).strip() for c in cands} == {"ABCD"[j]}
    items = _items()
    single = []
    with torch.no_grad():
        for it in items:
            ids = torch.tensor([tok(format_mmlu_prompt(it))["input_ids"]])
            logits = model(input_ids=ids).logits[0, -1]
            single.append([max(logits[c].item() for c in letters[j]) for j in range(4)])
    batched = letter_scores(
        model, tok, items, batch_size=3
    )  # left padding, one batch of three lengths
    for got, want in zip(batched, single):
        assert got == pytest.approx(want, abs=1e-5)
    expected = [max(range(4), key=lambda j: s[j]) for s in single]
    acc1, preds1 = mmlu_accuracy(model, tok, items, batch_size=1)
    acc3, preds3 = mmlu_accuracy(model, tok, items, batch_size=3)
    assert preds1 == preds3 == expected
    assert acc1 == acc3 == sum(p == it.answer for p, it in zip(expected, items)) / 3


SHOT2 = ("Which planet is known as the red planet?", ("Venus", "Mars", "Jupiter", "Mercury"), 1)


def _subject_items():
    """Several questions per subject (shared header and shots), a subject with one question, one
    without shots."""
    shots = (SHOT, SHOT2)
    return [
        MMLUItem(
            "astronomy", "Which planet is largest?", ("Earth", "Mars", "Jupiter", "Venus"), 2, shots
        ),
        MMLUItem(
            "anatomy", "Which organ pumps blood?", ("lung", "liver", "heart", "skin"), 2, (SHOT2,)
        ),
        MMLUItem(
            "astronomy",
            "What orbits the Earth?",
            ("the Moon", "the Sun", "Mars", "Venus"),
            0,
            shots,
        ),
        MMLUItem(
            "astronomy",
            "What is a star made of mostly? Answer with the main element of its mass.",
            ("iron", "hydrogen", "carbon", "gold"),
            1,
            shots,
        ),
        MMLUItem(
            "virology",
            "Which of these is a virus?",
            ("E. coli", "influenza", "yeast", "amoeba"),
            1,
            (),
        ),
        MMLUItem("virology", "Which is not alive?", ("virus", "cat", "tree", "fungus"), 0, ()),
        MMLUItem("astronomy", "What is 1 + 1?", ("1", "2", "3", "4"), 1, shots),
    ]


@pytest.mark.parametrize("family", ["qwen2", "gemma2"])
@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_shared_prefix_gives_identical_predictions(family, batch_size):
    """The per-subject prefix KV path predicts exactly what running every prompt whole predicts."""
    model, tok = make_tiny_model_and_tokenizer(family, init_std=0.3)
    items = _subject_items()
    whole = letter_scores(model, tok, items, batch_size=batch_size, share_prefix=False)
    with (
        warnings.catch_warnings()
    ):  # the prefix cache goes under the keyword the model takes (cache from transformers 5.24)
        warnings.filterwarnings("error", message=".*past_key_values.*")
        shared = letter_scores(model, tok, items, batch_size=batch_size, share_prefix=True)
    for got, want in zip(shared, whole):
        assert got == pytest.approx(want, abs=1e-4)
    _, preds_whole = mmlu_accuracy(model, tok, items, batch_size=batch_size, share_prefix=False)
    _, preds_shared = mmlu_accuracy(model, tok, items, batch_size=batch_size)
    assert preds_shared == preds_whole
    assert (
        len(set(preds_whole)) > 1
    )  # the tiny model's predictions vary, so the comparison can fail


def test_shared_prefix_is_the_common_token_prefix():
    from benchmarks.tasks.mmlu import _shared_prefix_len

    assert _shared_prefix_len([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert _shared_prefix_len([[1, 2, 3]]) == 2  # a lone prompt keeps its last token to compute
    assert _shared_prefix_len([[1, 2], [1, 2, 3]]) == 1
    assert _shared_prefix_len([[7, 2], [1, 2]]) == 0
