"""The edit's rollouts as the runner stores them: token ids, the step-in mask and the teacher's
probabilities.

A record's ``rollouts`` holds one entry per round (``None`` for a round without a rollout, e.g.
``kl_weight: 0``), each a list with one dict per request, in the order of the record's ``subjects``:

- ``ids``: the response token ids the rollout emitted (student's or teacher's), as a list of ints;
- ``stepin``: the step-in mask, bit ``t`` set when the teacher wrote token ``t``, packed
  least-significant bit first (``numpy.packbits(..., bitorder="little")``) and written as hex;
- ``teacher_p``: per token, the teacher's probability of the emitted token, quantised to 0..255
  (``round(255 * p)``) and written as hex, two characters per token; 0 when the token is outside the
  teacher's top-K. For a stepped-in token this is ``pi*(y*)``, the number the gate compares with
  ``kappa``;
- ``gap`` (when the rollout recorded it): per token, the gate's margin ``log pi*(y*) - log
  pi_theta(y*)`` (the number it compares with ``tau``), in steps of 1/8 nat as a signed byte
  (clipped to -16..+15.9 nats), written as hex, two characters per token.

Ids rather than decoded text: a round of a 96-token rollout costs about 800 bytes, and the text
is decoded by ``benchmarks.report.html`` with the run's tokenizer when a report is written.

Across records: ``benchmarks.tasks.metrics.stepin_rate_by_round`` (the mean step-in rate per
round) and ``benchmarks.analysis.plots.plot_stepin_rates``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

__all__ = [
    "pack_rollout",
    "pack_rounds",
    "unpack_gaps",
    "unpack_rollout",
]

GAP_STEP = 8  # the stored margin is round(gap * GAP_STEP) as a signed byte


def pack_rollout(
    tokens: Sequence[int],
    stepped_in: Sequence[bool],
    teacher_p: Sequence[float],
    gate_gap: Sequence[float] | None = None,
) -> dict:
    """The stored form of one rollout (see the module docstring)."""
    mask = np.asarray(stepped_in, dtype=bool)
    probs = np.clip(np.rint(np.asarray(teacher_p, dtype=np.float64) * 255), 0, 255).astype(np.uint8)
    if not len(tokens) == len(mask) == len(probs):
        raise ValueError(
            f"rollout parts differ in length: {len(tokens)} ids, "
            f"{len(mask)} mask bits, {len(probs)} probabilities"
        )
    out = {
        "ids": [int(t) for t in tokens],
        "stepin": np.packbits(mask, bitorder="little").tobytes().hex(),
        "teacher_p": probs.tobytes().hex(),
    }
    if gate_gap is not None:
        gaps = np.nan_to_num(
            np.asarray(gate_gap, dtype=np.float64), nan=0.0, posinf=1e9, neginf=-1e9
        )
        if len(gaps) != len(mask):
            raise ValueError(
                f"rollout parts differ in length: {len(tokens)} ids, {len(gaps)} gate margins"
            )
        out["gap"] = np.clip(np.rint(gaps * GAP_STEP), -128, 127).astype(np.int8).tobytes().hex()
    return out


def unpack_gaps(stored: Mapping[str, Any]) -> list[float]:
    """The gate's margin ``log pi*(y*) - log pi_theta(y*)`` per token of a stored rollout ([] when
    not stored)."""
    gaps = np.frombuffer(bytes.fromhex(stored.get("gap", "")), dtype=np.int8)
    if len(gaps) not in (0, len(stored["ids"])):
        raise ValueError(f"stored gate margins: {len(gaps)} for {len(stored['ids'])} token ids")
    return [float(g) / GAP_STEP for g in gaps]


def unpack_rollout(stored: Mapping[str, Any]) -> tuple[list[int], list[bool], list[float]]:
    """(token ids, step-in mask, teacher probability per token) of a stored rollout."""
    ids = [int(t) for t in stored["ids"]]
    bits = np.unpackbits(
        np.frombuffer(bytes.fromhex(stored["stepin"]), dtype=np.uint8), bitorder="little"
    )
    if len(bits) < len(ids) or len(bits) >= len(ids) + 8 or bits[len(ids) :].any():
        raise ValueError(
            f"stored step-in mask of {len(bits)} bits does not fit {len(ids)} token ids"
        )
    probs = np.frombuffer(bytes.fromhex(stored.get("teacher_p", "")), dtype=np.uint8)
    if len(probs) not in (0, len(ids)):
        raise ValueError(f"stored teacher probabilities: {len(probs)} for {len(ids)} token ids")
    return ids, [bool(b) for b in bits[: len(ids)]], [float(p) / 255 for p in probs]


def _teacher_p(rollout: Any) -> list[float]:
    """The teacher's probability of each emitted token (0 where it is outside the teacher's
    top-K)."""
    hit = rollout.teacher_topk_ids == rollout.tokens.unsqueeze(-1)
    return (rollout.teacher_topk_logprobs.float().exp() * hit).sum(-1).tolist()


def pack_rounds(rollouts: Sequence[Sequence[Any] | None] | None) -> list[list[dict] | None] | None:
    """An edit's ``rollouts`` (per round: ``hpse_easyedit.rollout.Rollout`` per request, or None) in
    the stored form.

    None when the editor kept none (methods without rounds, or every round without a rollout).
    """
    if not rollouts or all(r is None for r in rollouts):
        return None

    def pack(ro: Any) -> dict:
        gap = getattr(ro, "gate_gap", None)
        return pack_rollout(
            ro.tokens.tolist(),
            ro.stepped_in.tolist(),
            _teacher_p(ro),
            None if gap is None else gap.float().tolist(),
        )

    return [None if rnd is None else [pack(ro) for ro in rnd] for rnd in rollouts]
