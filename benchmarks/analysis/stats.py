"""The statistics of the comparisons: the mean of paired differences with a bootstrap interval
that resamples cases (``bootstrap_ci``), or sequences and then cases within them
(``hierarchical_bootstrap_ci``: the cases of one continual sequence share one edited model), and
the difference in each sequence (``sequence_differences``, ``sequence_note``)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

__all__ = [
    "average",
    "bootstrap_ci",
    "hierarchical_bootstrap_ci",
    "sequence_differences",
    "sequence_note",
]


def average(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def bootstrap_ci(
    values: Sequence[float], *, resamples: int = 10000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values``: the ``(1 - level) / 2`` and ``(1 +
    level) / 2`` percentiles (``np.percentile``) of ``resamples`` means of ``len(values)`` values
    drawn with replacement by ``np.random.default_rng(seed)``.

    A vectorised numpy bootstrap rather than ``scipy.stats.bootstrap``, which refuses a sample of
    one value (a paired report over one common case has one).
    """
    if not len(values):
        raise ValueError("no values")
    x = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)
    lo, hi = np.percentile(means, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return float(lo), float(hi)


def hierarchical_bootstrap_ci(
    groups: Sequence[Sequence[float]],
    *,
    resamples: int = 10000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of values that come in groups: the sequences of
    continual editing, whose cases share one edited model and so are not independent of each other.

    Each resample draws ``len(groups)`` groups with replacement, then within each drawn group as
    many values as it holds, with replacement, and takes the mean of all the values drawn (two
    stages, so the interval holds the spread between groups as well as within them); percentiles as
    in ``bootstrap_ci``. One group leaves no spread between groups to draw from: ``ValueError``.
    """
    arrays = [np.asarray(g, dtype=float) for g in groups]
    if any(not len(a) for a in arrays):
        raise ValueError("an empty group")
    if len(arrays) < 2:
        raise ValueError(
            f"{len(arrays)} group(s): no interval between groups exists; resample the cases instead"
        )
    rng = np.random.default_rng(seed)
    chosen = rng.integers(0, len(arrays), size=(resamples, len(arrays)))
    sums = np.zeros(chosen.shape)
    sizes = np.array([len(a) for a in arrays])[chosen]
    for k, a in enumerate(arrays):  # the second stage: each drawn group's values, redrawn
        where = chosen == k
        sums[where] = a[rng.integers(0, len(a), size=(int(where.sum()), len(a)))].sum(axis=1)
    means = sums.sum(axis=1) / sizes.sum(axis=1)
    lo, hi = np.percentile(means, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return float(lo), float(hi)


def sequence_differences(
    diffs: Sequence[float], sequences: Sequence[Any], *, resamples: int = 10000, seed: int = 0
) -> dict[str, Any]:
    """Per-case differences ``diffs`` grouped by the sequence each case was edited in
    (``sequences``, one label per case): their mean, the mean difference of each sequence in the
    order they first appear (``per_sequence``), and ``hierarchical_bootstrap_ci`` of the mean over
    sequences, then cases (``ci95``; None for one sequence: no interval between sequences)."""
    groups: dict[Any, list[float]] = {}
    for d, seq in zip(diffs, sequences):
        groups.setdefault(seq, []).append(d)
    values = list(groups.values())
    return {
        "mean": average(list(diffs)),
        "per_sequence": [average(v) for v in values],
        "ci95": list(hierarchical_bootstrap_ci(values, resamples=resamples, seed=seed))
        if len(values) > 1
        else None,
    }


def sequence_note(seq: Mapping[str, Any], what: str = "Avg difference") -> str:
    """One line on ``sequence_differences``: each sequence's difference and the interval over
    sequences, or that one sequence has none."""
    per = ", ".join(f"{d:+.1f}" for d in seq["per_sequence"])
    if seq["ci95"] is None:
        return (
            f"one sequence ({what} {per}): no between-sequence interval exists; the interval "
            "above resamples its cases"
        )
    lo, hi = seq["ci95"]
    return (
        f"{len(seq['per_sequence'])} sequences, {what} per sequence {per}; sequences, then cases "
        f"within them, resampled: {seq['mean']:+.1f} [{lo:+.1f}, {hi:+.1f}]"
    )
