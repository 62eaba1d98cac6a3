"""The hybrid rollout on tiny random models of each family: gate placement, caches, top-K
records."""

import pytest
import torch
import torch.nn.functional as F

from hpse_easyedit.losses import stepin_gate
from hpse_easyedit.prompts import build_edit_prompts, stop_token_ids
from hpse_easyedit.rollout import hybrid_rollout
from tiny_models import FAMILIES, make_tiny_model_and_tokenizer

REQUEST = [
    {
        "prompt": "Introduce AJ Lee.",
        "subject": "AJ Lee",
        "target_new": "AJ Lee speaks Russian fluently.",
    }
]


class BiasedTeacher(torch.nn.Module):
    """A hand-set teacher: the wrapped model with a fixed bonus on one token's logit."""

    def __init__(self, inner, token, bonus):
        super().__init__()
        self.inner, self.token, self.bonus = inner, token, bonus

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def forward(self, **kwargs):
        out = self.inner(**kwargs)
        out.logits[..., self.token] += self.bonus
        return out


def _prompts(model, tok):
    p = build_edit_prompts(tok, model.config.model_type, REQUEST)[0]
    return p.student_ids, p.teacher_ids


def _full_logprobs(model, prompt, tokens):
    ids = torch.tensor([list(prompt) + tokens.tolist()])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    start = len(prompt) - 1
    return F.log_softmax(logits[start : start + len(tokens)], dim=-1)


@pytest.mark.parametrize("family", FAMILIES)
def test_rollout_matches_no_cache_recomputation(family):
    student, tok = make_tiny_model_and_tokenizer(family, seed=0, init_std=0.3)
    teacher, _ = make_tiny_model_and_tokenizer(family, seed=1, init_std=0.3)
    s_ids, t_ids = _prompts(student, tok)
    tau, kappa = 1.0, 0.05
    ro = hybrid_rollout(
        student,
        teacher,
        s_ids,
        t_ids,
        tau=tau,
        kappa=kappa,
        top_k=5,
        max_new_tokens=16,
        stop_ids=[],
    )
    assert len(ro) == 16 and ro.tokens.dtype == torch.long
    s_lp = _full_logprobs(student, s_ids, ro.tokens)
    t_lp = _full_logprobs(teacher, t_ids, ro.tokens)
    gate, y_star = stepin_gate(t_lp, s_lp, tau, kappa)
    assert ro.stepped_in.tolist() == gate.tolist()
    expected = torch.where(gate, y_star, s_lp.argmax(-1))
    assert ro.tokens.tolist() == expected.tolist()
    values, ids = t_lp.topk(5, dim=-1)
    assert torch.equal(ro.teacher_topk_ids, ids)
    assert torch.allclose(ro.teacher_topk_logprobs, values, atol=1e-4)
    assert ro.teacher_forward_tokens == len(t_ids) + len(ro) - 1
    # the gate mixes both policies on this pair, so the test exercises both branches
    assert 0 < ro.stepin_count < len(ro)


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_hand_set_teacher_steps_in_everywhere(family):
    student, tok = make_tiny_model_and_tokenizer(family)
    target = tok.convert_tokens_to_ids("<bos>")
    teacher = BiasedTeacher(student, target, bonus=50.0)
    s_ids, t_ids = _prompts(student, tok)
    ro = hybrid_rollout(
        student, teacher, s_ids, t_ids, tau=2.0, kappa=0.3, top_k=4, max_new_tokens=8, stop_ids=[]
    )
    assert ro.tokens.tolist() == [target] * 8
    assert ro.stepped_in.all() and ro.stepin_rate == 1.0
    # the student itself never puts enough mass on it: with the same teacher but a huge tau, no
    # step-in
    ro = hybrid_rollout(
        student, teacher, s_ids, t_ids, tau=1e9, kappa=0.3, top_k=4, max_new_tokens=8, stop_ids=[]
    )
    assert not ro.stepped_in.any()


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_huge_tau_and_on_policy_reproduce_student_greedy(family):
    student, tok = make_tiny_model_and_tokenizer(family)
    teacher = BiasedTeacher(student, 7, bonus=50.0)
    s_ids, t_ids = _prompts(student, tok)
    greedy = student.generate(
        torch.tensor([s_ids]),
        max_new_tokens=10,
        min_new_tokens=10,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=tok.pad_token_id,
    )[0, len(s_ids) :]
    for kwargs in ({"tau": 1e9, "hybrid": True}, {"tau": -1e9, "hybrid": False}):
        ro = hybrid_rollout(
            student,
            teacher,
            s_ids,
            t_ids,
            kappa=0.0,
            top_k=3,
            max_new_tokens=10,
            stop_ids=[],
            **kwargs,
        )
        assert ro.tokens.tolist() == greedy.tolist()
        assert not ro.stepped_in.any()


def test_rollout_stops_at_eos_and_keeps_it():
    student, tok = make_tiny_model_and_tokenizer("llama")
    eos = tok.eos_token_id
    teacher = BiasedTeacher(student, eos, bonus=50.0)
    s_ids, t_ids = _prompts(student, tok)
    ro = hybrid_rollout(
        student,
        teacher,
        s_ids,
        t_ids,
        tau=2.0,
        kappa=0.3,
        top_k=4,
        max_new_tokens=20,
        stop_ids=stop_token_ids(student, tok),
    )
    assert ro.tokens.tolist() == [eos] and ro.stepped_in.tolist() == [True]


def test_teacher_context_is_entered_for_every_teacher_pass():
    student, tok = make_tiny_model_and_tokenizer("llama")
    s_ids, t_ids = _prompts(student, tok)
    entered = []

    class Ctx:
        def __enter__(self):
            entered.append(1)

        def __exit__(self, *exc):
            return False

    ro = hybrid_rollout(
        student,
        student,
        s_ids,
        t_ids,
        tau=2.0,
        kappa=0.3,
        top_k=4,
        max_new_tokens=6,
        stop_ids=[],
        teacher_context=Ctx,
    )
    assert len(entered) == len(ro)  # prefill + one per emitted token except the last


def _trained_executor(family, executor):
    """An executor whose student differs from the teacher (weights moved by hand, not by an
    edit)."""
    from hpse_easyedit.executors import make_executor
    from tiny_models import tiny_hparams

    model, tok = make_tiny_model_and_tokenizer(family, init_std=0.3)
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    ex = make_executor(model, tiny_hparams(executor=executor))
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        for p in ex.trainable_parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return ex, tok, reference


@pytest.mark.parametrize("executor", ["lora", "ft_m"])
@pytest.mark.parametrize("family", FAMILIES)
def test_batched_rollout_equals_two_cache_rollout(family, executor):
    from hpse_easyedit.rollout import batched_hybrid_rollout

    ex, tok, _ = _trained_executor(family, executor)
    s_ids, t_ids = _prompts(ex.model, tok)
    gate = dict(tau=1.0, kappa=0.05, top_k=5, max_new_tokens=12, stop_ids=[])
    seq = hybrid_rollout(
        ex.model, ex.model, s_ids, t_ids, teacher_context=ex.teacher_context, **gate
    )
    bat = batched_hybrid_rollout(
        ex.model, ex.row_switch, s_ids, t_ids, pad_id=tok.pad_token_id, **gate
    )
    assert bat.tokens.tolist() == seq.tokens.tolist()
    assert bat.stepped_in.tolist() == seq.stepped_in.tolist()
    assert torch.equal(bat.teacher_topk_ids, seq.teacher_topk_ids)
    assert torch.allclose(bat.teacher_topk_logprobs, seq.teacher_topk_logprobs, atol=1e-4)
    assert bat.teacher_forward_tokens == seq.teacher_forward_tokens


@pytest.mark.parametrize("executor", ["lora", "ft_m"])
def test_teacher_views_compute_the_unedited_model_exactly(executor):
    from transformers import AutoModelForCausalLM

    ex, tok, reference = _trained_executor("llama", executor)
    base = AutoModelForCausalLM.from_config(ex.model.config)
    base.load_state_dict(reference)
    base.eval()
    ids = torch.tensor([tok("AJ Lee speaks Russian fluently.")["input_ids"]])
    with torch.no_grad():
        want = base(input_ids=ids).logits
        assert not torch.equal(ex.model(input_ids=ids).logits, want)
        with ex.teacher_context():
            assert torch.equal(ex.model(input_ids=ids).logits, want)
        student = ex.model(input_ids=ids.expand(2, -1)).logits
        with ex.row_switch(torch.tensor([False, True])):
            both = ex.model(input_ids=ids.expand(2, -1)).logits
        assert torch.equal(
            ex.model(input_ids=ids.expand(2, -1)).logits, student
        )  # switched back on exit
    assert torch.equal(
        both[0], student[0]
    )  # the student row is computed exactly as without the switch
    assert torch.allclose(both[1], want[0], atol=1e-5)
    assert not torch.allclose(both[0], want[0], atol=1e-3)


@pytest.mark.parametrize("family", FAMILIES)
def test_rollouts_pass_the_cache_under_the_keyword_the_model_takes(family):
    """transformers 5.24 renamed the forward's past_key_values to cache (the old name warns until
    its removal in 5.40): both rollout drivers use the name the model takes, so neither warns on any
    transformers."""
    import warnings

    from hpse_easyedit.rollout import batched_hybrid_rollout

    ex, tok, _ = _trained_executor(family, "lora")
    s_ids, t_ids = _prompts(ex.model, tok)
    gate = dict(tau=1.0, kappa=0.05, top_k=5, max_new_tokens=6, stop_ids=[])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*")
        seq = hybrid_rollout(
            ex.model, ex.model, s_ids, t_ids, teacher_context=ex.teacher_context, **gate
        )
        bat = batched_hybrid_rollout(
            ex.model, ex.row_switch, s_ids, t_ids, pad_id=tok.pad_token_id, **gate
        )
    assert len(seq) == len(bat) == 6


@pytest.mark.parametrize("family", FAMILIES)
def test_lean_lora_row_switch_computes_the_hooked_forward_bit_for_bit(family, monkeypatch):
    """The LoRA row switch runs plain tensor calls in place of peft's forward and a hook on each
    lora_B: the same tokens, step-ins and teacher records, bit for bit, as the hooked path it
    replaces."""
    from hpse_easyedit.executors import lora
    from hpse_easyedit.rollout import batched_hybrid_rollout

    ex, tok, _ = _trained_executor(family, "lora")
    assert all(
        lora._plain_lora_linear(layer) for layer in ex._lora_layers
    )  # the lean path is the one taken
    s_ids, t_ids = _prompts(ex.model, tok)
    gate = dict(tau=1.0, kappa=0.05, top_k=5, max_new_tokens=12, stop_ids=[])
    lean = batched_hybrid_rollout(
        ex.model, ex.row_switch, s_ids, t_ids, pad_id=tok.pad_token_id, **gate
    )
    assert not any(
        "forward" in vars(layer) for layer in ex._lora_layers
    )  # peft's forward is back on exit
    monkeypatch.setattr(lora, "_plain_lora_linear", lambda layer: False)
    hooked = batched_hybrid_rollout(
        ex.model, ex.row_switch, s_ids, t_ids, pad_id=tok.pad_token_id, **gate
    )
    assert torch.equal(lean.tokens, hooked.tokens) and torch.equal(
        lean.stepped_in, hooked.stepped_in
    )
    assert torch.equal(lean.teacher_topk_ids, hooked.teacher_topk_ids)
    assert torch.equal(lean.teacher_topk_logprobs, hooked.teacher_topk_logprobs)
    assert torch.equal(lean.gate_gap, hooked.gate_gap)


def test_lean_lora_row_switch_only_where_peft_computes_plain_lora():
    """Dropout (or another adapter active, a DoRA variant, a hook) keeps peft's own forward under
    the row switch."""
    from hpse_easyedit.executors import lora, make_executor
    from tiny_models import tiny_hparams

    model, _ = make_tiny_model_and_tokenizer("llama")
    ex = make_executor(model, tiny_hparams(executor="lora", lora_dropout=0.1))
    assert not any(lora._plain_lora_linear(layer) for layer in ex._lora_layers)
    with ex.row_switch(torch.tensor([False, True])):
        assert not any("forward" in vars(layer) for layer in ex._lora_layers)
