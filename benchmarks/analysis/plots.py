"""The step-in rate per round drawn for several runs (the paper's figure of how often the teacher
steps in as the student learns)."""

from __future__ import annotations

import os
from typing import IO, Mapping, Sequence

__all__ = ["plot_stepin_rates"]


def plot_stepin_rates(
    series: Mapping[str, Sequence[float | None]],
    path: str | os.PathLike | IO[bytes],
    title: str = "",
) -> None:
    """PNG line plot of the mean step-in rate (percent) per round, one line per method (to a path or
    a binary file)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.0, 3.4), dpi=120)
    plotted, without = 0, []
    for label, rates in series.items():
        points = [(r + 1, 100.0 * v) for r, v in enumerate(rates) if v is not None]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
            plotted += 1
        else:
            without.append(label)
    ax.set_xlabel("round")
    ax.set_ylabel("step-in rate (%)")
    ax.set_title(title or "Teacher step-in rate per round")
    ax.grid(alpha=0.3)
    if plotted:
        ax.legend(fontsize=8)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylim(bottom=0)
    if without:
        ax.text(
            0.5,
            0.5 if not plotted else 0.02,
            "no rollouts (no step-in rate): " + ", ".join(without),
            ha="center",
            va="center" if not plotted else "bottom",
            fontsize=7,
            transform=ax.transAxes,
        )
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
