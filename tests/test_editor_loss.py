"""The first inner step's loss of ``hpse_edit``, hand-computed on a tiny model with a hand-set
rollout.

The paper's objective (Eq. ``ours``) for one request is

    J = kl_weight * sum_{t=1..|y|} KL[pi*_K(. | x, y_<t) || pi_theta(. | x, y_<t)]
        -  nll_weight * log pi_theta(c | x)

with pi* the frozen model reading the passage (its top-K renormalised, the student's full-vocabulary
log-probabilities of those K tokens) and c the passage tokens followed by the chat template's
end-of-turn token. Both terms are SUMS over positions; the editor averages them over the requests of
one call. Here the rollout is fixed by the test (the editor's rollout function is replaced by one
that returns chosen tokens and the teacher's top-K the test computes on an untouched copy of the
model), every term is recomputed with plain ``log_softmax``/``gather`` on unpadded sequences, and
compared with ``EditResult.rounds[0]`` (the first inner step, taken before any Adam update). A
second test shows the comparison catches an off-by-one in the KL span or the NLL labels and a
per-token mean.
"""

import copy

import pytest
import torch
import torch.nn.functional as F

from hpse_easyedit import editor
from hpse_easyedit import rollout as rollout_module
from hpse_easyedit.rollout import Rollout
from tiny_models import make_tiny_model_and_tokenizer, tiny_hparams

REQUESTS = [
    {
        "subject": "AJ Lee",
        "target_new": "AJ Lee is a wrestler who speaks Russian fluently and lives in Moscow.",
    },
    {"subject": "Ellie Kemper", "target_new": "Ellie Kemper is a citizen of Croatia."},
]
# Hand-set rollout tokens per request, of different lengths so both the KL and the NLL batches pad.
ROLLOUT_TEXT = [
    "AJ Lee lives in Moscow.",
    "Ellie Kemper is a citizen of Croatia, a country in Southeast Europe.",
]
KL_WEIGHT, NLL_WEIGHT, TOP_K = 0.7, 1.3, 16
REL = (
    1e-5  # measured: editor vs hand within 3e-7 relative (float32 sums, padded vs unpadded batches)
)


def _logprobs(model, ids):
    with torch.no_grad():
        return F.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)


def _student_ids(tok, subject):
    return [
        int(t)
        for t in tok.apply_chat_template(
            [{"role": "user", "content": f"Introduce {subject}."}],
            tokenize=True,
            add_generation_prompt=True,
            return_dict=False,
        )
    ]


def _setup(executor_name, n_requests, monkeypatch, **overrides):
    """A tiny model, its untouched copy (= pi_0) and the editor's rollout replaced by a hand-set
    one."""
    model, tok = make_tiny_model_and_tokenizer(
        "llama", init_std=0.3
    )  # peaky: positions differ clearly
    reference = copy.deepcopy(model)
    requests = REQUESTS[:n_requests]
    rollout_ids = [tok(t, add_special_tokens=False)["input_ids"] for t in ROLLOUT_TEXT[:n_requests]]
    student_ids = [_student_ids(tok, r["subject"]) for r in requests]
    hp = tiny_hparams(
        executor=executor_name,
        rounds=1,
        inner_steps=1,
        top_k=TOP_K,
        kl_weight=KL_WEIGHT,
        nll_weight=NLL_WEIGHT,
        kl_student="full",
        max_new_tokens=48,
        **overrides,
    )
    # the privileged prompts as the editor words them (pinned by test_prompts.py); only their top-K
    # matters here
    teacher_ids = [p.teacher_ids for p in editor.edit_prompts(model, tok, requests, hp)]
    seen = []

    def hand_set_rollout(model_, teacher_or_switch, s_ids, t_ids, **kw):
        i = student_ids.index(
            list(s_ids)
        )  # the editor asks for the rollout of the student prompt we built
        assert list(t_ids) == teacher_ids[i]
        tokens = rollout_ids[i]
        assert len(tokens) <= kw["max_new_tokens"]  # a rollout the real loop could have drawn
        # teacher = pi_0 reading the teacher prompt; logprobs at position len(t_ids) - 1 + t predict
        # token t
        t_lp = _logprobs(reference, list(t_ids) + tokens)[
            len(t_ids) - 1 : len(t_ids) - 1 + len(tokens)
        ]
        values, ids = t_lp.topk(kw["top_k"], dim=-1)
        seen.append(i)
        return Rollout(
            torch.tensor(tokens),
            torch.zeros(len(tokens), dtype=torch.bool),
            ids,
            values,
            teacher_forward_tokens=len(t_ids) + len(tokens),
        )

    # the rollout choice lives in rollout.draw_rollout, which calls one of these two
    monkeypatch.setattr(rollout_module, "hybrid_rollout", hand_set_rollout)
    monkeypatch.setattr(rollout_module, "batched_hybrid_rollout", hand_set_rollout)
    return model, tok, reference, requests, rollout_ids, student_ids, teacher_ids, hp, seen


def _hand_loss(tok, reference, requests, rollout_ids, student_ids, teacher_ids, hp):
    """(total, kl, nll) of the paper's formula, summed over positions, averaged over requests."""
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    kls, nlls = [], []
    for req, tokens, s_ids, t_ids in zip(requests, rollout_ids, student_ids, teacher_ids):
        passage = tok(req["target_new"], add_special_tokens=False)["input_ids"] + [eot]
        # NLL: -sum_j log pi_theta(c_j | x, c_<j); logits at len(x) - 1 + j predict c_j
        lp = _logprobs(reference, s_ids + passage)
        nlls.append(-sum(lp[len(s_ids) - 1 + j, c] for j, c in enumerate(passage)))
        # KL over exactly the |y| rollout positions: student logits at len(x) - 1 + t predict y_t
        q = _logprobs(reference, s_ids + tokens)[len(s_ids) - 1 : len(s_ids) - 1 + len(tokens)]
        t_lp = _logprobs(reference, t_ids + tokens)[len(t_ids) - 1 : len(t_ids) - 1 + len(tokens)]
        values, ids = t_lp.topk(hp.top_k, dim=-1)
        log_p = values - torch.logsumexp(
            values, dim=-1, keepdim=True
        )  # teacher's top-K renormalised
        kls.append((log_p.exp() * (log_p - q.gather(-1, ids))).sum())
    kl, nll = float(sum(kls)) / len(requests), float(sum(nlls)) / len(requests)
    return KL_WEIGHT * kl + NLL_WEIGHT * nll, kl, nll


def _mismatches(stats, expected):
    total, kl, nll = expected
    got = {"loss": stats["loss"], "kl": stats["kl"], "nll": stats["nll"]}
    want = {"loss": total, "kl": kl, "nll": nll}
    return {k: (got[k], want[k]) for k in got if got[k] != pytest.approx(want[k], rel=REL)}


@pytest.mark.parametrize("scored_logits_only", [True, False])
@pytest.mark.parametrize("n_requests", [1, 2])
@pytest.mark.parametrize("executor_name", ["lora", "ft_m"])
def test_first_inner_step_loss_is_the_papers_sum_averaged_over_requests(
    executor_name, n_requests, scored_logits_only, monkeypatch
):
    model, tok, reference, requests, rollout_ids, student_ids, teacher_ids, hp, seen = _setup(
        executor_name, n_requests, monkeypatch, scored_logits_only=scored_logits_only
    )
    expected = _hand_loss(tok, reference, requests, rollout_ids, student_ids, teacher_ids, hp)
    res = editor.hpse_edit(model, tok, requests, hp)

    assert sorted(seen) == list(
        range(n_requests)
    )  # one hand-set rollout per request, nothing else drawn
    stats = res.rounds[0]
    assert stats["rollout_len"] == sum(map(len, rollout_ids)) / n_requests
    assert _mismatches(stats, expected) == {}
    # the terms are of a size that a per-token mean or a dropped request could not hide in the
    # tolerance
    assert expected[1] > 1.0 and expected[2] > 50.0


def _shift_kl_span(monkeypatch):
    init = editor._KLBatch.__init__

    def shifted(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.spans = [(row, start + 1, length) for row, start, length in self.spans]

    monkeypatch.setattr(editor._KLBatch, "__init__", shifted)


def _shift_nll_labels(monkeypatch):
    init = editor._NLLBatch.__init__

    def shifted(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.labels = torch.cat(
            [self.labels[:, 1:], torch.full_like(self.labels[:, :1], -100)], dim=1
        )

    monkeypatch.setattr(editor._NLLBatch, "__init__", shifted)


def _mean_kl(monkeypatch):
    kl = editor.topk_forward_kl
    monkeypatch.setattr(
        editor, "topk_forward_kl", lambda logits, *a, **k: kl(logits, *a, **k) / logits.shape[0]
    )


def _mean_nll(monkeypatch):
    nll = editor.sequence_nll
    monkeypatch.setattr(
        editor,
        "sequence_nll",
        lambda logits, labels, *a, **k: nll(logits, labels, *a, **k) / (labels != -100).sum(),
    )


@pytest.mark.parametrize(
    "mutation, broken",
    [
        (_shift_kl_span, {"kl", "loss"}),
        (_shift_nll_labels, {"nll", "loss"}),
        (_mean_kl, {"kl", "loss"}),
        (_mean_nll, {"nll", "loss"}),
    ],
)
def test_the_hand_computation_catches_an_off_by_one_or_a_per_token_mean(
    mutation, broken, monkeypatch
):
    model, tok, reference, requests, rollout_ids, student_ids, teacher_ids, hp, _ = _setup(
        "lora", 2, monkeypatch
    )
    expected = _hand_loss(tok, reference, requests, rollout_ids, student_ids, teacher_ids, hp)
    mutation(monkeypatch)
    res = editor.hpse_edit(model, tok, requests, hp)
    assert set(_mismatches(res.rounds[0], expected)) == broken


@pytest.mark.slow
@pytest.mark.parametrize("executor_name", ["lora", "ft_m"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "gemma2"])
def test_scored_logits_only_trains_the_same_weights_with_the_head_on_fewer_positions(
    family, executor_name
):
    """``scored_logits_only`` (the default) runs the output head only where a loss scores; the
    edit's rollouts and trained tensors are bit-identical to every position's logits (``false``),
    which runs the head on all."""
    edits = {}
    for scored_only in (True, False):
        model, tok = make_tiny_model_and_tokenizer(family, init_std=0.05)
        kept = []
        hook = model.register_forward_pre_hook(
            lambda m, args, kwargs, kept=kept: (
                kept.append((kwargs["input_ids"].shape[1], kwargs.get("logits_to_keep")))
                if torch.is_grad_enabled()
                else None
            ),
            with_kwargs=True,
        )
        hp = tiny_hparams(executor=executor_name, scored_logits_only=scored_only)
        res = editor.hpse_edit(model, tok, REQUESTS, hp)
        hook.remove()
        edits[scored_only] = (
            {n: p.detach().clone() for n, p in res.model.named_parameters()},
            [[ro.tokens.tolist() for ro in rs] for rs in res.rollouts],
            kept,
        )
    (w_on, ro_on, kept_on), (w_off, ro_off, kept_off) = edits[True], edits[False]
    assert ro_on == ro_off
    assert w_on.keys() == w_off.keys() and all(torch.equal(w_on[n], w_off[n]) for n in w_on)
    # the training forwards (grad on): every one keeps fewer positions than it feeds when on, all of
    # them when off
    assert kept_on and all(keep is not None and 0 < keep < width for width, keep in kept_on)
    assert kept_off and all(keep is None for _, keep in kept_off)


def test_scored_logits_only_is_a_kernel_choice_for_the_run_config():
    """Like ``fast_decode``: a committed run directory resumes with either value (same weights,
    last-bit losses)."""
    from benchmarks.run.runner import config_policy, default_out_dir

    assert config_policy(tiny_hparams()).ignored(("hparams", "scored_logits_only"))
    assert default_out_dir("mquake-uns", "x.yaml", ["scored_logits_only=false"]) == default_out_dir(
        "mquake-uns", "x.yaml", []
    )
