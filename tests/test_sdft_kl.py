"""Our top-K KL (``losses.topk_forward_kl``) against TRL's SDFT loss
(``trl.experimental.sdft.loss_utils.compute_topk_self_distillation_loss``) on random logits.

The two agree where they compute the same thing and differ, as docs/ARCHITECTURE.md ("The top-K KL
and TRL's") says, where they do not:

- TRL's support is the STUDENT's top-k tokens at each position, both distributions renormalised
  over them, and its ``distillation_alpha`` mixes forward (0) and reverse (1) KL. Ours takes the
  support from its caller (HPSE: the TEACHER's top-K, cached by the rollout), renormalises the
  teacher over it, and computes forward KL(teacher || student) only, the student's side either
  renormalised too (``student="topk"``, hparams ``kl_student: topk``) or its full-vocabulary
  log-probabilities (``"full"``, the paper's and the default). Our code has no option that picks
  the student's support; handed the student's top-k ids, the ``topk`` form IS TRL's alpha = 0 loss.
- On the teacher's support, ``full`` = ``topk`` - log(student's mass on the support), so where the
  two supports coincide our default is TRL's alpha = 0 loss plus that term; where they differ, TRL's
  loss cannot see teacher mass outside the student's top-k.
"""

import pytest
import torch
import torch.nn.functional as F

from hpse_easyedit.losses import topk_forward_kl

loss_utils = pytest.importorskip(
    "trl.experimental.sdft.loss_utils",
    reason="TRL is not installed (the optional extra: pip install -e '.[trl]')",
)
trl_topk = loss_utils.compute_topk_self_distillation_loss

V, K = 64, 8


def _logits(seed: int, shape=(3, 5, V), scale: float = 3.0) -> torch.Tensor:
    """Random logits, peaked enough that a top-K of V holds most of the mass."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def _trl(student: torch.Tensor, teacher: torch.Tensor, alpha: float = 0.0) -> torch.Tensor:
    """TRL's per-position loss, renormalised top-k (no tail bucket)."""
    return trl_topk(
        student,
        teacher,
        distillation_topk=K,
        distillation_alpha=alpha,
        distillation_add_tail=False,
    )


def _on_support(
    student: torch.Tensor, teacher: torch.Tensor, ids: torch.Tensor, form: str
) -> torch.Tensor:
    """Ours per position, with the support ``ids`` and the teacher's log-probabilities there."""
    teacher_lp = F.log_softmax(teacher, dim=-1).gather(-1, ids)
    flat = [
        topk_forward_kl(s, i, t, student=form)
        for s, i, t in zip(
            student.reshape(-1, V), ids.reshape(-1, ids.shape[-1]), teacher_lp.reshape(-1, K)
        )
    ]
    return torch.stack(flat).reshape(student.shape[:-1])


@pytest.mark.parametrize("seed", range(5))
def test_ours_on_the_students_support_equals_trls_forward_kl(seed):
    student, teacher = _logits(2 * seed), _logits(2 * seed + 1)
    students_top = student.topk(K, dim=-1).indices
    ours = _on_support(student, teacher, students_top, "topk")
    theirs = _trl(student, teacher, alpha=0.0)
    assert theirs.shape == ours.shape == student.shape[:-1]
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    # the summed form the edit trains on: the same total
    total = topk_forward_kl(
        student,
        students_top,
        F.log_softmax(teacher, dim=-1).gather(-1, students_top),
        student="topk",
    )
    torch.testing.assert_close(total, theirs.sum(), rtol=1e-5, atol=1e-5)


def test_trls_alpha_1_is_the_reverse_kl_ours_does_not_compute():
    student, teacher = _logits(10), _logits(11)
    ids = student.topk(K, dim=-1).indices
    forward = _on_support(student, teacher, ids, "topk")
    s = F.log_softmax(student.gather(-1, ids), dim=-1)
    t = F.log_softmax(teacher.gather(-1, ids), dim=-1)
    reverse = (s.exp() * (s - t)).sum(-1)
    torch.testing.assert_close(_trl(student, teacher, alpha=1.0), reverse, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(reverse, forward, rtol=1e-2)
    # TRL's default, alpha 0.5, is neither
    mixed = _trl(student, teacher, alpha=0.5)
    assert not torch.allclose(mixed, forward, rtol=1e-2) and not torch.allclose(
        mixed, reverse, rtol=1e-2
    )


def test_our_default_on_the_teachers_support_adds_minus_log_the_students_mass_there():
    student, teacher = _logits(20), _logits(21)
    teachers_top = teacher.topk(K, dim=-1).indices
    full = _on_support(student, teacher, teachers_top, "full")
    topk = _on_support(student, teacher, teachers_top, "topk")
    mass = F.softmax(student, dim=-1).gather(-1, teachers_top).sum(-1)
    torch.testing.assert_close(full, topk - mass.log(), rtol=1e-5, atol=1e-5)
    assert bool((full > topk).all())


def test_where_both_supports_coincide_our_default_is_trls_plus_that_term():
    gen = torch.Generator().manual_seed(30)
    student = torch.randn(4, V, generator=gen)
    # the teacher ranks the same K tokens first as the student, in another order
    top = student.topk(K, dim=-1).indices
    teacher = torch.randn(4, V, generator=gen) - 20.0
    teacher.scatter_(-1, top, torch.randn(4, K, generator=gen) * 2.0)
    assert torch.equal(teacher.topk(K, dim=-1).indices.sort(-1).values, top.sort(-1).values)
    teachers_top = teacher.topk(K, dim=-1).indices
    mass = F.softmax(student, dim=-1).gather(-1, teachers_top).sum(-1)
    theirs = _trl(student, teacher, alpha=0.0)
    torch.testing.assert_close(
        _on_support(student, teacher, teachers_top, "topk"), theirs, rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(
        _on_support(student, teacher, teachers_top, "full"),
        theirs - mass.log(),
        rtol=1e-5,
        atol=1e-5,
    )


def test_trls_loss_cannot_see_teacher_mass_outside_the_students_top_k_ours_can():
    """The teacher is sure of a token the student ranks last: TRL's student-support loss is the
    same as if the teacher had never preferred it, ours (teacher's support) is large and trains
    the student towards it."""
    gen = torch.Generator().manual_seed(40)
    student = torch.randn(1, V, generator=gen)
    outsider = int(student.argmin())
    agreeing = student.clone()
    sure = student.clone()
    sure[0, outsider] = 30.0  # nearly all the teacher's mass on the student's least likely token
    assert outsider not in student.topk(K, dim=-1).indices
    torch.testing.assert_close(_trl(student, sure), _trl(student, agreeing))
    assert float(_trl(student, agreeing)) < 1e-6
    logits = student.clone().requires_grad_(True)
    teachers_top = sure.topk(K, dim=-1).indices
    ours = topk_forward_kl(
        logits, teachers_top, F.log_softmax(sure, dim=-1).gather(-1, teachers_top)
    )
    # about -log pi_theta(that token): the student's surprise at the teacher's answer
    surprise = -float(F.log_softmax(student, dim=-1)[0, outsider])
    assert surprise > 5.0 and abs(float(ours.detach()) - surprise) < 1e-2
    ours.backward()
    assert float(logits.grad[0, outsider]) < -0.9  # raise the teacher's token


def test_gradients_outside_the_support_trl_none_ours_topk_none_ours_default_all():
    student, teacher = _logits(50, shape=(2, V)), _logits(51, shape=(2, V))
    s_trl = student.clone().requires_grad_(True)
    _trl(s_trl, teacher).sum().backward()
    inside = torch.zeros_like(student, dtype=torch.bool).scatter_(
        -1, student.topk(K, dim=-1).indices, True
    )
    # zero outside up to rounding (the full log-normaliser cancels in the renormalisation)
    assert float(s_trl.grad[~inside].abs().max()) < 1e-7 < float(s_trl.grad[inside].abs().max())
    teachers_top = teacher.topk(K, dim=-1).indices
    outside = ~torch.zeros_like(student, dtype=torch.bool).scatter_(-1, teachers_top, True)
    for form, expect_zero in (("topk", True), ("full", False)):
        s_ours = student.clone().requires_grad_(True)
        topk_forward_kl(
            s_ours,
            teachers_top,
            F.log_softmax(teacher, dim=-1).gather(-1, teachers_top),
            student=form,
        ).backward()
        assert (float(s_ours.grad[outside].abs().max()) < 1e-7) is expect_zero
