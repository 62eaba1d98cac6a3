"""Greedy-token comparisons of two decodes that hold on every host.

Two decode paths (eager and static, CPU and CUDA) of one model agree in their log-probabilities only
up to rounding. In bfloat16 a random model's top two log-probabilities can lie within that rounding
of each other, and which token wins such a tie depends on the host's matmul kernels: a test that
compares greedy tokens position by position then passes on one host and fails on another. The
comparison here is exact where the greedy choice is determined and numeric where it is not:

- at every position the two runs reached through the same tokens, their log-probabilities agree
  within the rounding of the model's dtype (``rounding``; a check the token comparison alone never
  made);
- their decisions (the token, and e.g. whether the teacher stepped in) are equal, unless the
  reference run's decision there is within that rounding of flipping, a tie: there the runs may
  part, and the comparison ends, since their continuations no longer share a prefix.

A decode path whose log-probabilities are off by more than rounding fails the first check; one that
decides wrongly from right log-probabilities fails the second at the first position that is not a
tie.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator, Sequence

import torch

#: how far two decode paths' log-probabilities may lie apart, in spacings of the model's dtype at
#: the size of its largest logit (``rounding``). Two paths whose kernels sum in another order round
#: differently in every layer; measured between the eager and the static decode of the 2-layer
#: 7B-9B rehearsal models in bfloat16 (24 tokens each, tests/test_gpu_rehearsal.py, one x86-64 CPU):
#: at most 1.5 spacings (Qwen2.5-7B: 0.19 at a log-prob range of 20, spacing 0.125), 1.2
#: (Llama-3.1-8B), 0.13 (Gemma-2-9B); 3 leaves room for another host's kernels.
ULPS = 3


def rounding(logprobs: torch.Tensor, dtype: torch.dtype, ulps: float = ULPS) -> float:
    """``ulps`` spacings of ``dtype`` at the size of the largest logit behind ``logprobs``
    (``[..., V]``): the tolerance of two decode paths' log-probabilities, and how close to flipping
    a greedy choice must be to count as a tie within rounding. That size is taken as the log-probs'
    range over the vocabulary (max - min, the largest over the leading rows), a bound on it: the
    logits of a causal LM's head straddle zero."""
    lp = logprobs.float()
    spread = float((lp.amax(-1) - lp.amin(-1)).max())
    return ulps * torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(max(spread, 1e-30)))


def top_two_margin(logprobs: torch.Tensor) -> float:
    """How far a plain greedy choice is from flipping: the smallest change of every log-probability
    that can swap the argmax, half the gap between the top two (``logprobs``: ``[..., V]``; the
    smallest over the leading rows)."""
    top = logprobs.float().topk(2, dim=-1).values
    return float((top[..., 0] - top[..., 1]).min()) / 2


def hybrid_margin(tau: float, kappa: float) -> Callable[[torch.Tensor], float]:
    """The margin of the hybrid rollout's decision (``losses.stepin_decision``) from the student's
    and teacher's log-probabilities ``[2, R, V]`` of one position (``recorded_rollouts``): the
    smallest, over the R requests, of the teacher's top-two margin (its ``y*``), the step-in gate's
    distance from ``tau`` (``gap`` is a difference of two log-probabilities: half of it) and from
    ``kappa``, and, in a row where the teacher did not step in, the student's top-two margin (its
    greedy token)."""
    log_kappa = math.log(kappa) if kappa > 0 else -math.inf

    def margin(logprobs: torch.Tensor) -> float:
        student, teacher = logprobs.float()  # [R, V] each
        t_top, s_top = teacher.topk(2, dim=-1).values, student.topk(2, dim=-1).values
        gap = t_top[:, 0] - student.gather(-1, teacher.argmax(-1, keepdim=True))[:, 0]
        stepped = (gap > tau) & (t_top[:, 0].exp() > kappa)
        student_margin = (s_top[:, 0] - s_top[:, 1]) / 2
        parts = torch.stack(
            [
                (t_top[:, 0] - t_top[:, 1]) / 2,
                (gap - tau).abs() / 2,
                (t_top[:, 0] - log_kappa).abs(),
                torch.where(stepped, torch.full_like(student_margin, math.inf), student_margin),
            ]
        )
        return float(parts.min())

    return margin


def assert_same_greedy(
    reference: Sequence,
    other: Sequence,
    reference_logprobs: Sequence[torch.Tensor],
    other_logprobs: Sequence[torch.Tensor],
    *,
    dtype: torch.dtype,
    margin: Callable[[torch.Tensor], float] = top_two_margin,
    ulps: float = ULPS,
) -> int:
    """Assert that ``other`` decodes as ``reference`` does, up to ties within rounding.

    ``reference``/``other``: each run's decision per position (a token, or a tuple such as (token,
    stepped in)). ``*_logprobs``: the log-probabilities each run decided position ``n`` from (one
    tensor per position, at least as many as decisions). ``margin``: how far a decision is from
    flipping, from the reference's log-probabilities of a position (``top_two_margin`` for a plain
    greedy decode). ``dtype``: the model's; the tolerance at a position is ``rounding`` of the
    reference's log-probs there. Returns the number of positions compared token for token (all of
    them, or up to and including the tie where the runs parted)."""
    for n, want in enumerate(reference):
        assert n < len(other), (
            f"the run ended after {n} positions, the reference after {len(reference)}"
        )
        ref_lp, got_lp = (
            reference_logprobs[n].float(),
            other_logprobs[n].float().to(reference_logprobs[n].device),
        )
        assert ref_lp.shape == got_lp.shape, f"position {n}: log-probs {tuple(got_lp.shape)}"
        atol = rounding(ref_lp, dtype, ulps)
        diff = float((ref_lp - got_lp).abs().max())
        assert diff <= atol, f"position {n}: the log-probs differ by {diff:.4g} (> {atol:.4g})"
        if other[n] != want:
            left = margin(ref_lp)
            assert left <= atol, (
                f"position {n}: {other[n]!r} where the reference has {want!r}, and the reference's "
                f"choice is {left:.4g} from flipping (> {atol:.4g}): not a tie within rounding"
            )
            return n + 1
    assert len(other) == len(reference), (
        f"the run has {len(other)} positions, the reference {len(reference)}, and they agree on "
        "every shared one"
    )
    return len(reference)


def rollout_decisions(rollout: Any) -> list[tuple[int, bool]]:
    """A hybrid rollout's decision per position: (token, whether the teacher stepped in)."""
    return list(zip(rollout.tokens.tolist(), rollout.stepped_in.tolist()))


@contextlib.contextmanager
def recorded_rollouts() -> Iterator[list[list[torch.Tensor]]]:
    """Within the block, the log-probabilities every hybrid rollout decided from: one list per
    rollout driver call (in call order), holding one ``[2, R, V]`` tensor (student, teacher; R
    requests) per recorded position. A static decode also records the positions it decodes past
    its stop before the stop test sees them: use the first ``len(rollout)``."""
    from hpse_easyedit import rollout

    runs: list[list[torch.Tensor]] = []
    index: dict[object, int] = {}  # recorder -> its run (the key keeps the recorder alive)
    record = rollout._Recorder.record

    def recording(self, s_logp: torch.Tensor, t_logp: torch.Tensor) -> torch.Tensor:
        if self not in index:
            index[self] = len(runs)
            runs.append([])
        runs[index[self]].append(torch.stack([s_logp, t_logp]).float().cpu())
        return record(self, s_logp, t_logp)

    rollout._Recorder.record = recording
    try:
        yield runs
    finally:
        rollout._Recorder.record = record
