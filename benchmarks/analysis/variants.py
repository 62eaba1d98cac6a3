"""Variants of one method on the same cases, each against a reference: the paper's sensitivity table
(one row per value of a step-in gate) and its continual ablation (``w/o HP`` beside ``Ours``).

Reads finished run directories (no model time), each given with its label; ``DIR@N`` is a
``--checkpoints`` run after N edits of each sequence:

    python -m benchmarks variants --column tau --reference 2 \\
        --run 0.5 runs/uk-tau0.5 --run 1 runs/uk-tau1 --run 2 runs/uk-hpse --run 4 runs/uk-tau4

Prints one markdown table, a row per run in the order given: the task's metrics and Avg over all
cases, each run's paired difference in Avg from the reference run (per case, 95% bootstrap interval
of the mean) and its step-in rate per round (the share of rollout tokens where the teacher stepped
in, averaged over the cases; ``-`` for a run without rollouts). Where the runs are
``--sequential``, the table also gives T, the number of sequences and the Avg of each sequence.
The runs must be at one T; single-editing runs are compared on the cases they all hold (the line
above the table says how many each run holds), sequences must hold the same cases. ``--first N``
reads every run's first N cases in data order only (for sequences a multiple of T), e.g. the
sequences that every variant ran when some have gone on to more.
"""

from __future__ import annotations

import sys
from typing import Mapping, Sequence

from hpse_easyedit.cli import OneLineParser, run_cli
from hpse_easyedit.errors import UsageError, check_positive

from ..markdown import md_table
from ..tasks.task import TASKS
from .runs import add_reading_arguments

__all__ = ["main", "variant_rows", "variants_table"]


def variant_rows(
    runs: Sequence[tuple[str, str]],
    reference: str,
    *,
    resamples: int = 10000,
    seed: int = 0,
    first: int | None = None,
) -> list[dict]:
    """One dict per ``(label, run directory)``: its label, T, sequences, cases, metrics, Avg, Avg
    per sequence, step-in rate per round and, but for the reference, its paired Avg difference from
    the reference with the interval. ``first``: each run's first N cases in data order only (None:
    all of them)."""
    from ..tasks.metrics import stepin_rate_by_round
    from .continual import _case_avg, _first, _run, check_whole_sequences, run_row
    from .stats import bootstrap_ci

    labels = [label for label, _ in runs]
    if len(set(labels)) != len(labels):
        raise UsageError(f"--run labels {labels} repeat; give each run its own label")
    if reference not in labels:
        raise UsageError(f"--reference {reference!r} is none of the --run labels {labels}")
    loaded = [(label, path, *_run(path)) for label, path in runs]
    held = {label: len(recs) for label, _, _, _, recs in loaded}
    if first is not None:
        for _, path, _, t, recs in loaded:
            check_whole_sequences(first, t, path)
            if len(recs) < first:
                raise UsageError(
                    f"--first {first}: {path} holds {len(recs)} cases; finish it on at least "
                    f"--limit {first}"
                )
        loaded = [(label, path, b, t, _first(recs, first)) for label, path, b, t, recs in loaded]
    _, ref_path, benchmark, T, ref_recs = next(r for r in loaded if r[0] == reference)
    common = set(ref_recs)
    for _, path, bench, t, recs in loaded:
        if (bench, t) != (benchmark, T):
            raise UsageError(
                f"{path} ({bench}, T={t}) and the reference {ref_path} ({benchmark}, T={T}) "
                "differ; one table is one benchmark at one T"
            )
        if T > 1 and set(recs) != set(ref_recs):  # a sequence is compared whole
            raise UsageError(
                f"{path} and the reference {ref_path} hold different cases ({len(recs)} vs "
                f"{len(ref_recs)}); run every variant on the same --limit"
            )
        common &= set(recs)
    if not common:
        raise UsageError(f"the runs have no finished case in common with {ref_path}")
    task = TASKS[benchmark]
    ids = sorted(common, key=lambda c: ref_recs[c].get("index", 0))
    rows = []
    for label, _, _, _, recs in loaded:
        row = {
            **run_row(task, label, T, recs, ids),
            "held": held[label],
            "stepin": stepin_rate_by_round([recs[c] for c in ids]),
            "reference": label == reference,
        }
        if label != reference:
            diff = [_case_avg(task, recs[c]) - _case_avg(task, ref_recs[c]) for c in ids]
            row["diff"] = sum(diff) / len(diff)
            row["diff_ci"] = list(bootstrap_ci(diff, resamples=resamples, seed=seed))
        rows.append(row)
    return rows


def variants_table(rows: Sequence[Mapping], column: str = "run") -> str:
    """The rows as one markdown table; the reference's label carries a dagger, as in the paper."""
    from .continual import _interval

    metrics = TASKS[rows[0]["benchmark"]].metrics
    sequential = rows[0]["T"] > 1
    head = [
        column,
        *(["T", "sequences"] if sequential else []),
        "cases",
        *metrics,
        "Avg",
        *(["Avg per sequence"] if sequential else []),
        "paired Δ Avg vs † [95% CI]",
        "step-in rate by round (%)",
    ]
    numeric = 2 * sequential + 1 + len(metrics) + 1  # T, sequences, cases, metrics, Avg
    align = "l" + "r" * numeric + "l" * (len(head) - 1 - numeric)
    held = ", ".join(f"{r['label']} {r['held']}" for r in rows if r["held"] != r["cases"])
    lines = [
        f"{rows[0]['benchmark']}, {rows[0]['cases']} cases in every run"
        + (f" (of them the runs hold: {held})" if held else ""),
        "",
    ]
    body = []
    for r in rows:
        rates = r["stepin"] if any(v is not None for v in r["stepin"]) else []
        stepin = ", ".join("-" if v is None else f"{100 * v:.1f}" for v in rates) or "-"
        cells = [
            f"{r['label']} †" if r["reference"] else r["label"],
            *([str(r["T"]), str(r["sequences"])] if sequential else []),
            str(r["cases"]),
            *(f"{r[m]:.1f}" for m in metrics),
            f"{r['Avg']:.1f}",
            *([", ".join(f"{v:.1f}" for v in r["per_sequence"])] if sequential else []),
            _interval(r["diff"], r["diff_ci"]) if "diff" in r else "(reference)",
            stepin,
        ]
        body.append(cells)
    lines += md_table(head, body, align)
    lines.append(
        "\n† the reference: each paired difference is a row's Avg minus its Avg, per case."
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(_main, sys.argv[1:] if argv is None else argv)


def _main(argv: Sequence[str]) -> int:
    parser = OneLineParser(
        prog="python -m benchmarks variants", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--run",
        nargs=2,
        action="append",
        default=[],
        metavar=("LABEL", "DIR"),
        help="a row: its label and its run directory (DIR@N: a run's checkpoint after N edits of "
        "each sequence); repeat, in the table's order",
    )
    parser.add_argument(
        "--reference", required=True, help="the label of the run every row is compared with"
    )
    parser.add_argument(
        "--column", default="run", help="the heading of the label column (default: run)"
    )
    parser.add_argument(
        "--first",
        type=int,
        metavar="N",
        help="read every run's first N cases in data order only (for sequences a multiple of T); "
        "default: all the cases the runs hold",
    )
    add_reading_arguments(parser)
    args = parser.parse_args(argv)
    check_positive("--resamples", args.resamples)
    check_positive("--first", args.first)
    if len(args.run) < 2:
        raise UsageError(f"{len(args.run)} --run; give at least two, one of them the --reference")
    try:
        rows = variant_rows(
            [tuple(r) for r in args.run],
            args.reference,
            resamples=args.resamples,
            first=args.first,
        )
    except ValueError as err:  # a run directory that is not what the tool reads
        raise UsageError(str(err)) from None
    print(variants_table(rows, args.column))
    return 0


if __name__ == "__main__":
    sys.exit(main())
