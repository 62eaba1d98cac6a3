"""Many independent edits at once (``hpse_edit_cases``) are exactly the solo edits: in float64 on
tiny models each case's trained tensors equal its solo edit's within 1e-9, for LoRA and FT-M, on the
dynamic and the static decode, with cases of different lengths, one case of two requests, and
rollouts that end at different steps."""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from hpse_easyedit import hpse_edit, restore_weights
from hpse_easyedit.batched import apply_case_edit, hpse_edit_cases
from tiny_models import make_config, make_tokenizer, tiny_hparams

CASES = [
    [
        {
            "subject": "AJ Lee",
            "target_new": "AJ Lee is a wrestler who speaks Russian fluently and lives in Moscow.",
        }
    ],
    [
        {"subject": "Ellie Kemper", "target_new": "Ellie Kemper is a citizen of Croatia."},
        {
            "subject": "The Firm",
            "target_new": "The Firm is a legal thriller novel written by John Grisham that was "
            "published in 1991.",
        },
    ],
    [
        {
            "subject": "Croatia",
            "target_new": "The head of state of Croatia is Kolinda Grabar-Kitarovic.",
        }
    ],
    [{"subject": "John Grisham", "target_new": "John Grisham wrote The Firm."}],
]

#: per family, the token whose output row (x 1.5) the end-of-turn token is given, so that greedy
#: rollouts stop where that token would have won: the rollouts of one batch then end at different
#: steps (found by trying the tokens of the families' first rollouts)
STOP_LIKE = {"llama": 20, "qwen2": 227, "gemma2": 260}


def _eager_attention_in_float64(module, query, key, value, attention_mask, dropout=0.0, **kw):
    """Gemma-2's eager attention with its softmax in the query's dtype: transformers computes it in
    float32, which rounds a float64 run to float32 (and turns a fully masked padding row into
    NaN)."""
    from transformers.models.gemma2 import modeling_gemma2 as g

    scaling = kw.get("scaling") or module.head_dim**-0.5
    key = g.repeat_kv(key, module.num_key_value_groups)
    value = g.repeat_kv(value, module.num_key_value_groups)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    softcap = kw.get("softcap")
    if softcap is not None:
        weights = torch.tanh(weights / softcap) * softcap
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = torch.softmax(weights, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


@pytest.fixture
def float64_model(monkeypatch):
    """A tiny float64 model of ``family`` whose rollouts end at different steps."""

    def build(family):
        tok = make_tokenizer(family)
        config = make_config(family, tok, init_std=0.2)
        if family == "gemma2":
            from transformers.models.gemma2 import modeling_gemma2

            config.sliding_window = 4096  # the static decode needs the whole decode in the window
            monkeypatch.setattr(
                modeling_gemma2, "eager_attention_forward", _eager_attention_in_float64
            )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(config)
        model = model.double().eval()
        model.generation_config.eos_token_id = tok.eos_token_id
        with torch.no_grad():
            head = model.get_output_embeddings().weight
            head[tok.eos_token_id] = head[STOP_LIKE[family]] * 1.5
        return model, tok

    return build


def _trained(model, names):
    params = dict(model.named_parameters())
    return {n: params[n].detach().clone() for n in names}


SETTINGS = [
    (family, executor, static, 4)
    for family in ("llama", "qwen2", "gemma2")
    for executor in ("lora", "ft_m")
    for static in (False, True)
] + [("llama", executor, False, per_pass) for executor in ("lora", "ft_m") for per_pass in (1, 3)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "family, executor, static, per_pass",
    SETTINGS,
    ids=[f"{f}-{e}-{'static' if s else 'dynamic'}-pass{p}" for f, e, s, p in SETTINGS],
)
def test_a_batched_edit_gives_each_case_its_solo_edit(
    float64_model, family, executor, static, per_pass
):
    """``per_pass`` 4: every case's training rows in one forward (stacked adapters per row); 1 and
    3: the cases' gradients accumulated over several passes."""
    model, tok = float64_model(family)
    hp = tiny_hparams(
        executor=executor,
        rounds=2,
        inner_steps=3,
        lr=5e-2,
        tau=0.5,
        kappa=0.05,
        static_decode=static,
        cases_per_pass=per_pass,
    )
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    batched = hpse_edit_cases(model, tok, CASES, hp)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # left as it came
    assert type(model).__name__.endswith("ForCausalLM")

    lengths, stepins = set(), 0
    for case, got in zip(CASES, batched):
        assert got.ok, got.error
        solo = hpse_edit(model, tok, case, hp)
        want = _trained(solo.model, got.tensors)
        assert set(got.tensors) == set(solo.weights_copy)
        for name, value in got.tensors.items():
            assert torch.allclose(value, want[name], rtol=0, atol=1e-9), name
        assert len(got.rounds) == len(solo.rounds) == 2
        for mine, theirs in zip(got.rounds, solo.rounds):
            assert mine["stepin_rate"] == theirs["stepin_rate"]
            assert mine["rollout_len"] == theirs["rollout_len"]
            for key in ("loss", "loss_last", "kl", "nll"):  # summed in float32 (losses.py)
                assert mine[key] == pytest.approx(theirs[key], rel=1e-6), key
        for mine, theirs in zip(got.rollouts, solo.rollouts):
            for a, b in zip(mine, theirs):
                assert torch.equal(a.tokens, b.tokens) and torch.equal(a.stepped_in, b.stepped_in)
                assert torch.equal(a.teacher_topk_ids, b.teacher_topk_ids)
                lengths.add(len(a))
                stepins += a.stepin_count
        if not static:
            assert got.teacher_forward_tokens == solo.teacher_forward_tokens
        model = restore_weights(solo.model, solo.weights_copy)
    assert len(lengths) >= 3 and max(lengths) == hp.max_new_tokens  # rollouts end apart
    assert stepins > 0  # the gate fired, each row against its own teacher


def test_the_case_edit_put_in_answers_as_the_solo_edit_and_restores_bit_exact(float64_model):
    model, tok = float64_model("llama")
    hp = tiny_hparams(rounds=1, inner_steps=2, lr=5e-2)
    probe = torch.tensor([tok("Who is AJ Lee?")["input_ids"]])
    with torch.no_grad():
        before = model(input_ids=probe).logits.clone()
    got = hpse_edit_cases(model, tok, CASES[:2], hp)[1]
    solo_model = copy.deepcopy(model)
    edited = apply_case_edit(model, hp, got.tensors)
    solo = hpse_edit(solo_model, tok, CASES[1], hp)
    with torch.no_grad():
        assert torch.allclose(
            edited(input_ids=probe).logits, solo.model(input_ids=probe).logits, atol=1e-9
        )
    restored = restore_weights(edited, got.start)
    assert type(restored) is type(solo_model)
    with torch.no_grad():
        assert torch.equal(restored(input_ids=probe).logits, before)


def test_a_failing_case_is_reported_and_never_harms_the_others(float64_model):
    model, tok = float64_model("llama")
    hp = tiny_hparams(rounds=2, inner_steps=2, lr=5e-2)
    bad = [{"subject": "", "target_new": ""}]
    alone = hpse_edit_cases(model, tok, [CASES[0]], hp)[0]
    got = hpse_edit_cases(model, tok, [bad, CASES[0]], hp)
    assert not got[0].ok and "request" in got[0].error
    assert got[1].ok
    for name, value in alone.tensors.items():
        assert torch.allclose(got[1].tensors[name], value, rtol=0, atol=1e-12)


def test_a_diverging_case_leaves_the_batch_and_the_others_go_on(float64_model, monkeypatch):
    """Case 0's loss is made non-finite from its second round: it fails with the solo edit's
    message and keeps its start; case 1 ends as it ends alone."""
    from hpse_easyedit import batched

    model, tok = float64_model("llama")
    hp = tiny_hparams(executor="ft_m", rounds=3, inner_steps=2, lr=5e-2, cases_per_pass=2)
    alone = hpse_edit_cases(model, tok, [CASES[2]], hp)[0]
    real = batched._nll_values
    calls = []

    def poisoned(model, batch, hparams):
        values = real(model, batch, hparams)
        calls.append(1)
        if len(calls) > 2 and len(values) == 2:  # round 2 on: case 0 blows up
            values[0] = values[0] * float("inf")
        return values

    monkeypatch.setattr(batched, "_nll_values", poisoned)
    got = hpse_edit_cases(model, tok, [CASES[0], CASES[2]], hp)
    assert not got[0].ok and "diverged in round 2" in got[0].error and "'lr'" in got[0].error
    assert all(torch.equal(got[0].tensors[n], got[0].start[n]) for n in got[0].start)
    assert got[0].rounds == [] and len(got[1].rounds) == 3
    for name, value in alone.tensors.items():
        assert torch.allclose(got[1].tensors[name], value, rtol=0, atol=1e-12)


def test_refusals_name_the_field():
    from tiny_models import make_tiny_model_and_tokenizer

    model, tok = make_tiny_model_and_tokenizer("llama")
    with pytest.raises(ValueError, match="lora_dropout"):
        hpse_edit_cases(model, tok, CASES[:1], tiny_hparams(lora_dropout=0.1))
    with pytest.raises(ValueError, match="kl_weight and nll_weight"):
        hpse_edit_cases(model, tok, CASES[:1], tiny_hparams(kl_weight=0.0, nll_weight=0.0))
    assert hpse_edit_cases(model, tok, [], tiny_hparams()) == []


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["lora", "ft_m"])
def test_the_batched_decode_step_compiles_whole(monkeypatch, executor):
    """``static_decode: compile`` (a GPU's ``auto``) puts the batched decode step, every case's
    adapter routing included, under ``torch.compile(fullgraph=True)``: traced here with the eager
    backend, it must not break the graph and gives the uncompiled static decode's tokens."""
    from hpse_easyedit import rollout, static_decode
    from tiny_models import make_tiny_model_and_tokenizer

    real = static_decode.compile_step
    monkeypatch.setattr(rollout, "compile_step", lambda d, backend=None: real(d, backend="eager"))
    model, tok = make_tiny_model_and_tokenizer("llama", init_std=0.2)
    got = {
        mode: hpse_edit_cases(
            model,
            tok,
            CASES,
            tiny_hparams(executor=executor, rounds=1, inner_steps=1, static_decode=mode),
        )
        for mode in ("compile", True)
    }
    for compiled, plain in zip(got["compile"], got[True]):
        assert compiled.ok and plain.ok
        for a, b in zip(compiled.rollouts[0], plain.rollouts[0]):
            assert torch.equal(a.tokens, b.tokens)


def test_stacked_ft_m_keeps_the_matrix_once_and_adds_a_steps_gradients_in_place():
    """In half precision, a first FT-M edit of several cases keeps the unedited matrix once (the
    teacher rows' weight is the start every case copies and what the model is restored from), and
    a case's later pass of a step adds its gradient into the float32 master's in place."""
    from hpse_easyedit.executors.stacked import StackedFTM, make_stacked

    tok = make_tokenizer("llama")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(make_config("llama", tok))
    model = model.to(torch.bfloat16).eval()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ex = make_stacked(model, tiny_hparams(executor="ft_m", dtype="bfloat16"), 2)
    try:
        assert ex._original is ex._start and ex._masters is not None
        copy, master = ex._copies[1], ex._masters[1]
        hook = StackedFTM._grad_to(master)
        gen = torch.Generator().manual_seed(0)
        grads = [torch.randn(copy.shape, generator=gen).to(torch.bfloat16) for _ in range(2)]
        copy.grad = grads[0].clone()
        hook(copy)
        first = master.grad
        copy.grad = grads[1].clone()
        hook(copy)
        assert copy.grad is None and master.grad is first and master.grad.dtype == torch.float32
        assert torch.equal(master.grad, grads[0].float() + grads[1].float())
    finally:
        ex.close()
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
