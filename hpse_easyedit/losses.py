"""HPSE's training signals as pure tensor functions (no model, no trainer in sight).

- ``topk_forward_kl``: KL(pi* || pi_theta) per position, with the teacher restricted to its top-K
  tokens and renormalised; the student term is the full-vocabulary log-probability of those tokens
  (the paper's form). ``student="topk"`` renormalises the student over the same K tokens as well:
  NOT the paper's form, a weaker regulariser with zero gradient outside the teacher's top-K
  (hparams ``kl_student: topk``).
- ``sequence_nll``: summed negative log-likelihood of labelled tokens (the passage anchor).
- ``stepin_gate``: the paper's step-in rule (Eq. stepin).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__ = [
    "KL_STUDENT_FORMS",
    "StepIn",
    "renormalise_topk",
    "sequence_nll",
    "stepin_decision",
    "stepin_gate",
    "topk_forward_kl",
]

# The student side of the top-K KL: "full" = the paper's (full-vocabulary log-probabilities of the
# teacher's top-K tokens); "topk" = renormalised over those K tokens too (not the paper's).
KL_STUDENT_FORMS = ("full", "topk")


def renormalise_topk(topk_logprobs: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of the teacher restricted to its top-K tokens, renormalised to sum to
    one."""
    topk_logprobs = topk_logprobs.float()
    return topk_logprobs - torch.logsumexp(topk_logprobs, dim=-1, keepdim=True)


def topk_forward_kl(
    student_logits: torch.Tensor,
    teacher_topk_ids: torch.Tensor,
    teacher_topk_logprobs: torch.Tensor,
    mask: torch.Tensor | None = None,
    student: str = "full",
) -> torch.Tensor:
    """Summed forward KL from the renormalised teacher top-K to the student.

    Args:
        student_logits: ``[..., V]`` student logits at the rollout positions.
        teacher_topk_ids: ``[..., K]`` the teacher's top-K token ids at the same positions.
        teacher_topk_logprobs: ``[..., K]`` the teacher's log-probabilities of those ids (any
            normalisation).
        mask: ``[...]`` 1 for positions that count, 0 for padding.
        student: ``"full"`` (the paper's): ``log pi_theta(k)`` over the full vocabulary; ``"topk"``
            (not the paper's): the student's log-probabilities renormalised over the teacher's top-K
            as well, so the student's mass outside them neither counts nor gets a gradient.

    Returns:
        A scalar: ``sum_t sum_k p*_k (log p*_k - log pi_theta(k))``.
    """
    if student not in KL_STUDENT_FORMS:
        raise ValueError(f"student must be one of {list(KL_STUDENT_FORMS)}, got {student!r}")
    log_p = renormalise_topk(teacher_topk_logprobs)
    log_q = F.log_softmax(student_logits.float(), dim=-1).gather(-1, teacher_topk_ids.long())
    if student == "topk":
        log_q = renormalise_topk(log_q)
    per_position = (log_p.exp() * (log_p - log_q)).sum(-1)
    if mask is not None:
        per_position = per_position * mask.to(per_position.dtype)
    return per_position.sum()


def sequence_nll(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100
) -> torch.Tensor:
    """Summed NLL of ``labels`` under ``logits`` (already aligned: ``logits[..., t, :]`` predicts
    ``labels[..., t]``)."""
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        labels.reshape(-1),
        ignore_index=ignore_index,
        reduction="sum",
    )


class StepIn(NamedTuple):
    """The step-in decision at one position (or a batch of positions), with the margin it
    compared."""

    step_in: torch.Tensor  # bool: the teacher's token is emitted
    y_star: torch.Tensor  # the teacher's argmax ids
    gap: torch.Tensor  # log pi*(y*) - log pi_theta(y*), the margin compared with tau


def stepin_decision(
    teacher_logprobs: torch.Tensor, student_logprobs: torch.Tensor, tau: float, kappa: float
) -> StepIn:
    """The step-in decision: the teacher steps in when ``log pi*(y*) - log pi_theta(y*) > tau`` and
    ``pi*(y*) > kappa``, with ``y* = argmax pi*``. Inputs are full-vocabulary log-probabilities
    ``[..., V]``."""
    top_logprob, y_star = teacher_logprobs.max(dim=-1)
    gap = top_logprob - student_logprobs.gather(-1, y_star.unsqueeze(-1)).squeeze(-1)
    step_in = (gap > tau) & (top_logprob.exp() > kappa)
    return StepIn(step_in, y_star, gap)


def stepin_gate(
    teacher_logprobs: torch.Tensor, student_logprobs: torch.Tensor, tau: float, kappa: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(step_in, y_star)`` of ``stepin_decision``: a bool tensor and the teacher's argmax ids,
    shaped ``[...]``."""
    decision = stepin_decision(teacher_logprobs, student_logprobs, tau, kappa)
    return decision.step_in, decision.y_star
