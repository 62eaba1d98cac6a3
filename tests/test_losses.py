"""The loss and gate math on 2-3-token vocabularies, against values computed by hand."""

import math

import pytest
import torch

from hpse_easyedit.losses import renormalise_topk, sequence_nll, stepin_gate, topk_forward_kl


def test_renormalise_topk_sums_to_one():
    lp = torch.log(torch.tensor([0.5, 0.3]))
    assert torch.allclose(renormalise_topk(lp).exp(), torch.tensor([0.625, 0.375]))


def test_topk_forward_kl_hand_computed():
    # teacher keeps tokens 0 and 1 with p = 0.5, 0.3 -> renormalised 0.625, 0.375; student uniform
    # over 3.
    ids = torch.tensor([[0, 1]])
    lp = torch.log(torch.tensor([[0.5, 0.3]]))
    student = torch.zeros(1, 3)
    expected = 0.625 * math.log(0.625 * 3) + 0.375 * math.log(0.375 * 3)
    assert math.isclose(topk_forward_kl(student, ids, lp).item(), expected, rel_tol=1e-6)


def test_topk_forward_kl_zero_when_student_matches_and_sums_positions():
    ids = torch.tensor([[1, 0], [2, 1]])
    # student puts all its mass on the teacher's renormalised top-2 at each position
    student = torch.log(torch.tensor([[0.25, 0.75, 1e-12], [1e-12, 0.5, 0.5]]))
    lp = torch.log(torch.tensor([[0.6, 0.2], [0.1, 0.1]]))
    assert abs(topk_forward_kl(student, ids, lp).item()) < 1e-5
    # a second position with a known KL adds up; mask drops it
    student2 = torch.zeros(2, 3)
    per_pos = [0.75 * math.log(0.75 * 3) + 0.25 * math.log(0.25 * 3), 2 * 0.5 * math.log(0.5 * 3)]
    assert math.isclose(topk_forward_kl(student2, ids, lp).item(), sum(per_pos), rel_tol=1e-6)
    assert math.isclose(
        topk_forward_kl(student2, ids, lp, mask=torch.tensor([1, 0])).item(),
        per_pos[0],
        rel_tol=1e-6,
    )


def test_topk_forward_kl_gradient_pushes_student_toward_teacher():
    logits = torch.zeros(1, 3, requires_grad=True)
    topk_forward_kl(logits, torch.tensor([[2]]), torch.tensor([[0.0]])).backward()
    assert logits.grad[0, 2] < 0 and logits.grad[0, 0] > 0


def test_student_renormalised_topk_kl_hand_computed():
    # teacher top-2 = tokens 0, 1 at 0.5, 0.3 -> 0.625, 0.375. Student probabilities 1/8, 3/8, 1/2:
    # the paper's form uses 1/8 and 3/8 as they are; the student-renormalised form uses 1/4 and 3/4.
    ids = torch.tensor([[0, 1]])
    lp = torch.log(torch.tensor([[0.5, 0.3]]))
    student = torch.log(torch.tensor([[0.125, 0.375, 0.5]]))
    paper = 0.625 * math.log(0.625 / 0.125) + 0.375 * math.log(0.375 / 0.375)
    renormalised = 0.625 * math.log(0.625 / 0.25) + 0.375 * math.log(0.375 / 0.75)
    assert math.isclose(topk_forward_kl(student, ids, lp).item(), paper, rel_tol=1e-6)
    assert math.isclose(
        topk_forward_kl(student, ids, lp, student="full").item(), paper, rel_tol=1e-6
    )
    assert math.isclose(
        topk_forward_kl(student, ids, lp, student="topk").item(), renormalised, rel_tol=1e-6
    )
    # a uniform student is 1/2, 1/2 over the top-2 once renormalised; the mask drops the second
    # position
    two = torch.zeros(2, 3)
    per_pos = 0.625 * math.log(1.25) + 0.375 * math.log(0.75)
    got = topk_forward_kl(
        two, ids.repeat(2, 1), lp.repeat(2, 1), mask=torch.tensor([1, 0]), student="topk"
    )
    # 0.032 is the difference of float32 terms of 0.14 and 0.11: their rounding (which differs
    # between CPUs' vector log/exp) is ~1e-8 absolute, 2e-6 relative to the difference
    assert math.isclose(got.item(), per_pos, rel_tol=1e-6, abs_tol=1e-7)


def test_student_renormalised_topk_kl_ignores_mass_outside_the_topk():
    ids = torch.tensor([[0, 1]])
    lp = torch.log(torch.tensor([[0.5, 0.3]]))
    # the student matches the teacher's renormalised top-2 in ratio but keeps 90% of its mass on
    # token 2
    logits = torch.log(torch.tensor([[0.0625, 0.0375, 0.9]])).requires_grad_(True)
    kl = topk_forward_kl(logits, ids, lp, student="topk")
    assert abs(kl.item()) < 1e-6
    kl.backward()
    assert abs(logits.grad[0, 2].item()) < 1e-6  # no gradient outside the teacher's top-K
    full = torch.log(torch.tensor([[0.0625, 0.0375, 0.9]])).requires_grad_(True)
    topk_forward_kl(full, ids, lp).backward()  # the paper's form pushes token 2's mass down
    assert full.grad[0, 2].item() > 0.5


def test_topk_forward_kl_rejects_unknown_student_form():
    with pytest.raises(ValueError, match="student must be one of"):
        topk_forward_kl(
            torch.zeros(1, 3), torch.tensor([[0]]), torch.tensor([[0.0]]), student="renorm"
        )


def test_sequence_nll_hand_computed_and_ignore_index():
    logits = torch.tensor([[[0.0, 0.0], [0.0, math.log(3.0)]]])
    labels = torch.tensor([[1, 1]])
    assert math.isclose(
        sequence_nll(logits, labels).item(), math.log(2) + math.log(4 / 3), rel_tol=1e-6
    )
    labels = torch.tensor([[-100, 1]])
    assert math.isclose(sequence_nll(logits, labels).item(), math.log(4 / 3), rel_tol=1e-6)


def _lp(probs):
    return torch.log(torch.tensor(probs))


def test_gate_fires_when_gap_and_confidence_both_pass():
    step, y = stepin_gate(_lp([0.9, 0.05, 0.05]), _lp([0.05, 0.9, 0.05]), tau=2.0, kappa=0.3)
    assert y.item() == 0 and step.item()  # gap = log(0.9/0.05) = 2.89 > 2, conf 0.9 > 0.3


def test_gate_silent_when_gap_too_small():
    step, _ = stepin_gate(_lp([0.9, 0.05, 0.05]), _lp([0.2, 0.7, 0.1]), tau=2.0, kappa=0.3)
    assert not step.item()  # gap = log(0.9/0.2) = 1.5


def test_gate_silent_when_teacher_not_confident():
    step, y = stepin_gate(_lp([0.28, 0.27, 0.45]), _lp([0.98, 0.01, 0.01]), tau=2.0, kappa=0.5)
    assert y.item() == 2 and not step.item()  # gap = log(0.45/0.01) = 3.8 but 0.45 < 0.5


def test_gate_silent_when_neither_passes():
    step, _ = stepin_gate(_lp([0.4, 0.3, 0.3]), _lp([0.3, 0.4, 0.3]), tau=2.0, kappa=0.5)
    assert not step.item()


def test_gate_batched():
    t = _lp([[0.9, 0.05, 0.05], [0.4, 0.3, 0.3]])
    s = _lp([[0.05, 0.9, 0.05], [0.3, 0.4, 0.3]])
    step, y = stepin_gate(t, s, tau=2.0, kappa=0.3)
    assert step.tolist() == [True, False] and y.tolist() == [0, 0]


def test_kl_student_option_reaches_the_edit_and_defaults_to_the_papers():
    from hpse_easyedit import HParamsError, HPSEHyperParams, hpse_edit, restore_weights
    from tiny_models import make_tiny_model_and_tokenizer, tiny_hparams

    assert HPSEHyperParams(model_name="m").kl_student == "full"
    with pytest.raises(HParamsError, match="key 'kl_student' must be one of \\['full', 'topk'\\]"):
        HPSEHyperParams(model_name="m", kl_student="student")
    model, tok = make_tiny_model_and_tokenizer("llama")
    request = [
        {"subject": "AJ Lee", "target_new": "AJ Lee is a wrestler who speaks Russian fluently."}
    ]
    kl = {}
    for form in (None, "full", "topk"):
        res = hpse_edit(
            model,
            tok,
            request,
            tiny_hparams(rounds=1, inner_steps=1, **({"kl_student": form} if form else {})),
        )
        kl[form] = res.rounds[0][
            "kl"
        ]  # the first step's KL, on the same unedited rollout for every form
        model = restore_weights(res.model, res.weights_copy)
    # renormalising the student over the top-K drops -log(its top-K mass) >= 0 at every position
    assert kl[None] == kl["full"] and 0.0 <= kl["topk"] < kl["full"]
