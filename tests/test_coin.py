"""COIN*: sentence chunks, the two regularisers as pure tensor functions, hparams, and the edit on
tiny models."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hpse_easyedit import HParamsError, restore_weights
from hpse_easyedit.coin import (
    COINHyperParams,
    coin_edit,
    context_consistency_kl,
    hidden_alignment,
    sentence_chunks,
)
from hpse_easyedit.prompts import chat_prompt_ids
from tiny_models import make_tiny_model_and_tokenizer, same_weights, weights_snapshot

REPO = Path(__file__).resolve().parents[1]
PASSAGE = "AJ Lee is a professional wrestler. She speaks Russian fluently. She lives in Moscow."


# ------------------------------------------------------------------------------------------- chunks
def _offsets(words):
    """Character offsets of whitespace-led word tokens, as a byte-level BPE reports them."""
    out, pos = [], 0
    for w in words:
        out.append((pos, pos + len(w)))
        pos += len(w)
    return "".join(words), out


def test_sentence_chunks_cut_at_sentence_ends_and_cover_every_token():
    text, offsets = _offsets(["One", " two", ".", " Three", " four", " five", "!", " Six", "?"])
    assert sentence_chunks(text, offsets, min_tokens=1, max_tokens=10) == [(0, 3), (3, 7), (7, 9)]


def test_sentence_chunks_merge_short_and_split_long():
    text, offsets = _offsets(["One", " two", ".", " Three", " four", " five", "!", " Six", "?"])
    # " Six?" (2 tokens) is shorter than 3: it joins the sentence before it.
    assert sentence_chunks(text, offsets, min_tokens=3, max_tokens=10) == [(0, 3), (3, 9)]
    # max 2 tokens: every sentence is split into windows of 2, in order.
    assert sentence_chunks(text, offsets, min_tokens=1, max_tokens=2) == [
        (0, 2),
        (2, 3),
        (3, 5),
        (5, 7),
        (7, 9),
    ]
    # No sentence end at all: one chunk.
    text, offsets = _offsets(["no", " end", " here"])
    assert sentence_chunks(text, offsets, min_tokens=1, max_tokens=10) == [(0, 3)]


def test_sentence_chunks_with_a_real_tokenizer_decode_to_the_sentences():
    tok = make_tiny_model_and_tokenizer("llama")[1]
    enc = tok(PASSAGE, add_special_tokens=False, return_offsets_mapping=True)
    spans = sentence_chunks(PASSAGE, enc["offset_mapping"], min_tokens=2, max_tokens=64)
    pieces = [tok.decode(enc["input_ids"][a:b]).strip() for a, b in spans]
    assert pieces == [
        "AJ Lee is a professional wrestler.",
        "She speaks Russian fluently.",
        "She lives in Moscow.",
    ]


# ------------------------------------------------------------------------------------------- losses
def test_context_consistency_kl_matches_hand_computed_value_and_trains_only_the_short_context():
    long_logits = torch.log(torch.tensor([[0.5, 0.25, 0.25]])).requires_grad_(True)
    short_logits = torch.log(torch.tensor([[0.25, 0.5, 0.25]])).requires_grad_(True)
    kl = context_consistency_kl(long_logits, short_logits)
    expected = 0.5 * torch.log(torch.tensor(2.0)) + 0.25 * torch.log(
        torch.tensor(0.5)
    )  # sum p (log p - log q)
    assert torch.allclose(kl, expected, atol=1e-6)
    kl.backward()
    assert long_logits.grad is None and short_logits.grad is not None
    same = torch.randn(4, 7)
    assert context_consistency_kl(same, same.clone()).abs() < 1e-6


def test_hidden_alignment_is_one_minus_cosine_summed_with_gradient_through_both():
    a = torch.tensor([[1.0, 0.0], [1.0, 1.0]], requires_grad=True)
    b = torch.tensor([[0.0, 2.0], [2.0, 2.0]], requires_grad=True)
    loss = hidden_alignment(a, b)
    assert torch.allclose(loss, torch.tensor(1.0), atol=1e-6)  # orthogonal row: 1, parallel row: 0
    loss.backward()
    assert a.grad is not None and b.grad is not None


# ------------------------------------------------------------------------------------------ hparams
@pytest.mark.parametrize(
    "path", sorted((REPO / "hparams" / "COIN").glob("*.yaml")), ids=lambda p: p.name
)
def test_shipped_coin_files_load(path):
    hp = COINHyperParams.from_hparams(path)
    assert (
        hp.alg_name == "COIN"
        and hp.executor == "lora"
        and (hp.lora_rank, hp.lora_alpha) == (12, 24.0)
    )
    assert (
        hp.steps == 40 and min(hp.long_weight, hp.short_weight, hp.cons_weight, hp.align_weight) > 0
    )
    assert hp.fp16 is False and hp.use_chat_template is True  # read by EasyEdit's BaseEditor


def test_coin_files_for_the_four_backbones_and_smollm_exist():
    names = {p.stem for p in (REPO / "hparams" / "COIN").glob("*.yaml")}
    assert names == {"qwen2.5-7b", "qwen3-8b", "llama3.1-8b", "gemma2-9b", "smollm2-135m"}


@pytest.mark.parametrize(
    "text, fragment",
    [
        (
            "model_name: m\nlong_weight: 0\nshort_weight: 0\ncons_weight: 0\nalign_weight: 0\n",
            "every loss weight is 0",
        ),
        (
            "model_name: m\nmin_chunk_tokens: 9\nmax_chunk_tokens: 4\n",
            "min_chunk_tokens (9) must be <= max_chunk_tokens",
        ),
        ("model_name: m\nalg_name: HPSE\n", "alg_name must be 'COIN'"),
        ("model_name: m\nsteps: 0\n", "key 'steps' must be >= 1"),
        ("model_name: m\nchunking: words\n", "unknown key(s) ['chunking']"),
    ],
)
def test_bad_coin_files_name_the_key_and_the_file(tmp_path, text, fragment):
    path = tmp_path / "coin.yaml"
    path.write_text(text)
    with pytest.raises(HParamsError) as err:
        COINHyperParams.from_hparams(path)
    assert fragment in str(err.value) and str(path) in str(err.value)


# ----------------------------------------------------------------------------------------- the edit
@pytest.mark.parametrize("executor", ["lora", "ft_m"])
def test_coin_edit_changes_the_model_and_restores_it_exactly(executor):
    model, tok = make_tiny_model_and_tokenizer("llama")
    snap = weights_snapshot(model)
    hp = COINHyperParams(
        model_name="tiny", executor=executor, ftm_layer=1, steps=3, lr=1e-2, min_chunk_tokens=2
    )
    requests = [
        {"subject": "AJ Lee", "target_new": PASSAGE},
        {"subject": "Ellie Kemper", "target_new": "Ellie Kemper is a citizen of Croatia."},
    ]
    res = coin_edit(model, tok, requests, hp)
    changed = {
        n
        for n, p in res.model.named_parameters()
        if n in snap[0] and not torch.equal(p, snap[0][n])
    }
    if executor == "ft_m":
        assert changed == {"model.layers.1.mlp.down_proj.weight"}
    else:
        assert type(res.model).__name__.startswith("PeftModel") and set(res.weights_copy)
        assert all("lora_" in n for n in res.weights_copy)
    restored = restore_weights(res.model, res.weights_copy)
    assert same_weights(restored, snap)


def _short_nll(model, tok, prompt, sentence):
    """NLL of one sentence right after the chat-templated editing prompt (no preceding
    sentences)."""
    p = chat_prompt_ids(tok, prompt)
    s = tok(sentence, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([p + s])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(p) - 1 : -1]
    return float(F.cross_entropy(logits, torch.tensor(s), reduction="sum"))


def test_short_contexts_teach_a_late_sentence_without_the_sentences_before_it():
    """The point of COIN*: after the edit the last fact is recalled from its own sentence alone,
    better than after the same number of steps of plain next-token prediction on the whole
    passage."""
    model, tok = make_tiny_model_and_tokenizer("llama", init_std=0.05)
    late = " She lives in Moscow."
    request = [{"subject": "AJ Lee", "target_new": PASSAGE}]
    results = {}
    for name, weights in {
        "ntp": dict(short_weight=0.0, cons_weight=0.0, align_weight=0.0),
        "coin": dict(),
    }.items():
        hp = COINHyperParams(model_name="tiny", steps=15, lr=1e-2, min_chunk_tokens=2, **weights)
        res = coin_edit(model, tok, request, hp)
        results[name] = _short_nll(res.model, tok, "Introduce AJ Lee.", late.strip())
        model = restore_weights(res.model, res.weights_copy)
    before = _short_nll(model, tok, "Introduce AJ Lee.", late.strip())
    assert results["coin"] < results["ntp"] < before
