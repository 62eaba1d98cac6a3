"""The host-independent greedy comparison (``tests/greedy_ties.py``): a tie within rounding may part
two runs, a real mismatch before any tie fails, and so do log-probabilities apart beyond the
tolerance."""

from __future__ import annotations

import math

import pytest
import torch

from greedy_ties import (
    assert_same_greedy,
    hybrid_margin,
    recorded_rollouts,
    rollout_decisions,
    rounding,
    top_two_margin,
)

BF16 = torch.bfloat16
V = 6


def _logprobs(*favourites: tuple[int, float]) -> torch.Tensor:
    """One position's log-probs ``[V]``: ``favourites`` (token, logit) over a floor of -4."""
    logits = torch.full((V,), -4.0)
    for token, logit in favourites:
        logits[token] = logit
    return torch.log_softmax(logits, -1)


def _run():
    """A reference decode of 5 positions whose position 2 has its top two tokens (3 and 4) tied."""
    positions = [
        _logprobs((1, 2.0)),
        _logprobs((2, 3.0), (0, 1.0)),
        _logprobs((3, 1.0), (4, 1.0)),
        _logprobs((5, 2.5)),
        _logprobs((0, 2.0)),
    ]
    return [int(p.argmax()) for p in positions], positions


def test_a_planted_tie_may_part_the_runs():
    tokens, logprobs = _run()
    # the other host: the same log-probs within rounding, the tied token 4 won at position 2, and
    # from there its own continuation (other log-probs, other tokens)
    other = [p + 0.01 for p in logprobs[:2]] + [logprobs[2]]
    other_tokens = tokens[:2] + [4, 0, 1]
    other += [_logprobs((0, 3.0)), _logprobs((1, 3.0))]
    assert (
        assert_same_greedy(tokens, other_tokens, logprobs, other, dtype=BF16) == 3
    )  # compared through the tie
    assert assert_same_greedy(tokens, tokens, logprobs, logprobs, dtype=BF16) == 5


def test_a_mismatch_before_any_tie_fails():
    tokens, logprobs = _run()
    wrong = list(tokens)
    wrong[1] = 0  # 2 logits below the winner: no rounding explains it
    with pytest.raises(AssertionError, match="position 1: 0 where the reference has 2.*not a tie"):
        assert_same_greedy(tokens, wrong, logprobs, logprobs, dtype=BF16)


def test_log_probs_apart_beyond_the_tolerance_fail_even_with_the_same_tokens():
    tokens, logprobs = _run()
    shifted = [p.clone() for p in logprobs]
    shifted[3][0] += 0.5  # a wrong path that still picks the same token
    with pytest.raises(AssertionError, match="position 3: the log-probs differ by 0.5"):
        assert_same_greedy(tokens, tokens, logprobs, shifted, dtype=BF16)


def test_a_run_that_stops_early_without_a_tie_fails():
    tokens, logprobs = _run()
    with pytest.raises(AssertionError, match="ended after 4 positions"):
        assert_same_greedy(tokens, tokens[:4], logprobs, logprobs, dtype=BF16)


def test_rounding_is_spacings_of_the_dtype_at_the_logits_size():
    logprobs = torch.tensor([-0.5, -3.0, -20.5])  # range 20: bfloat16's spacing there is 2**-3
    assert rounding(logprobs, BF16, ulps=3) == 3 * 0.125
    assert rounding(logprobs, torch.float32, ulps=1) == 2.0**-23 * 16


def test_top_two_margin_is_half_the_gap():
    assert top_two_margin(_logprobs((1, 2.0), (3, 1.5))) == pytest.approx(0.25)
    assert top_two_margin(torch.stack([_logprobs((1, 2.0)), _logprobs((2, 1.0), (3, 1.0))])) == 0


def _position(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    return torch.stack([student, teacher])[:, None]  # [2, R=1, V], as recorded_rollouts keeps it


def test_hybrid_margin_counts_only_the_choices_that_decide():
    """In a row where the teacher stepped in, the student's own tie does not decide the token; the
    gate's distance from tau and from kappa, and the teacher's top two, do; where the teacher did
    not step in, the student's top two do."""
    student_tie = _logprobs((1, 1.0), (2, 1.0))
    confident = _logprobs((3, 4.0))  # y* = 3, far above the student's log-prob of 3
    assert hybrid_margin(0.5, 0.05)(_position(student_tie, confident)) > 1  # stepped in
    # the gate: gap = tau exactly
    student = confident.clone()
    student[3] -= 0.5
    assert hybrid_margin(0.5, 0.05)(_position(student, confident)) == pytest.approx(0, abs=1e-6)
    # kappa: pi*(y*) = kappa exactly
    teacher = torch.full((V,), math.log(0.05))
    teacher[1] = math.log(0.75)
    margin = hybrid_margin(0.5, 0.75)(_position(_logprobs((0, 9.0)), teacher))
    assert margin == pytest.approx(0, abs=1e-6)
    # no step-in (gap 0.56 < tau = 2): the student's greedy choice decides, and its tie is one
    teacher = _logprobs((1, 1.0), (2, -1.0))
    assert hybrid_margin(2.0, 0.05)(_position(student_tie, teacher)) == 0
    assert hybrid_margin(2.0, 0.05)(_position(teacher, teacher)) == pytest.approx(1.0)
    # the teacher's own tie
    assert hybrid_margin(0.5, 0.05)(_position(confident, student_tie)) == 0


def test_recorded_rollouts_are_what_the_rollouts_decided_from():
    from hpse_easyedit.executors import make_executor
    from hpse_easyedit.losses import stepin_decision
    from hpse_easyedit.rollout import batched_hybrid_rollout
    from tiny_models import make_tiny_model_and_tokenizer, tiny_hparams

    model, tok = make_tiny_model_and_tokenizer("llama", init_std=0.2)
    ex = make_executor(model, tiny_hparams())
    with torch.no_grad():
        for p in ex.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.3)
    s, t = tok("Introduce AJ Lee.")["input_ids"], tok("AJ Lee speaks Russian. Who?")["input_ids"]
    kw = dict(tau=0.5, kappa=0.05, top_k=4, max_new_tokens=7, stop_ids=[-5], pad_id=0)
    with recorded_rollouts() as runs:
        rollouts = [
            batched_hybrid_rollout(ex.model, ex.row_switch, s, t, static_decode=static, **kw)
            for static in (False, True)
        ]
    assert len(runs) == 2 and all(ro.stepin_count > 0 for ro in rollouts)  # the gate decided too
    for ro, logprobs in zip(rollouts, runs):
        assert len(logprobs) >= len(ro) == 7 and logprobs[0].shape == (2, 1, len(tok))
        student, teacher = torch.stack(logprobs[: len(ro)]).unbind(1)
        gate, y_star, _ = stepin_decision(teacher[:, 0], student[:, 0], 0.5, 0.05)
        assert gate.tolist() == ro.stepped_in.tolist()
        assert torch.where(gate, y_star, student[:, 0].argmax(-1)).tolist() == ro.tokens.tolist()
    assert rollout_decisions(rollouts[0]) == list(
        zip(rollouts[0].tokens.tolist(), rollouts[0].stepped_in.tolist())
    )
