"""Several methods (hparams files plus overrides) over the same cases: one side-by-side table and a
plot.

Each (method, benchmark) pair is an ordinary resumable run in ``OUT/<benchmark>/<label>/``, so an
interrupted comparison resumes, and adding a method later reruns nothing that is done. Beside the
paper-layout table (``compare.md``), ``paired.md`` holds, per benchmark, every row's means with 95%
bootstrap intervals and its paired Avg difference from the reference row (``--reference``, default
the first ``--method``) on the cases all rows finished
(``benchmarks.analysis.paired.multi_report``), and the mean wall time of an edit per row. Under
``accelerate launch --num_processes N`` every process walks the same (method, benchmark) list and
runs its share of each; the main process writes the table, the JSON and the plot.
"""

from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path
from typing import Sequence

from hpse_easyedit.cli import OneLineParser, run_cli

from ..markdown import md_table
from ..records.store import write_json_atomic
from ..run.cli import (
    add_run_arguments,
    benchmark_errors,
    configure_logging,
    is_main_process,
    options_from_args,
)
from ..run.runner import RunOptions, failed_note, run_benchmark, unjudged_note
from ..run.tables import judge_note, paper_table
from ..tasks.task import TASKS
from .paired import multi_report, multi_table
from .plots import plot_stepin_rates

__all__ = [
    "compare_main",
    "fold_set_options",
    "overrides_for",
    "paired_tables",
    "parse_method",
    "preflight",
    "seconds_table",
]

log = logging.getLogger(__name__)

BENCHMARKS = tuple(TASKS)


def parse_method(spec: Sequence[str]) -> tuple[str, str, list[str]]:
    """``LABEL FILE [KEY=VALUE | BENCHMARK:KEY=VALUE ...]`` -> (label, hparams file, overrides).

    An override prefixed with a benchmark name applies to that benchmark's run only, e.g. the
    paper's rollout length ``unkebench:max_new_tokens=128`` next to 96 for MQuAKE-uns.
    """
    if len(spec) < 2:
        raise argparse.ArgumentTypeError(
            f"--method {' '.join(spec)}: expected LABEL FILE [KEY=VALUE ...], e.g. --method LoRA "
            "hparams/HPSE/x.yaml kl_weight=0"
        )
    label, path, *overrides = spec
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise argparse.ArgumentTypeError(
            f"--method {label}: overrides must be KEY=VALUE, got {bad}"
        )
    scoped = [
        o for o in overrides if ":" in o.split("=", 1)[0] and o.split(":", 1)[0] not in BENCHMARKS
    ]
    if scoped:
        raise argparse.ArgumentTypeError(
            f"--method {label}: {scoped[0]!r} names no benchmark; a scoped override is "
            f"BENCHMARK:KEY=VALUE with BENCHMARK one of {list(BENCHMARKS)}"
        )
    return label, path, overrides


def overrides_for(overrides: Sequence[str], benchmark: str) -> list[str]:
    """The overrides of one benchmark's run: the plain ones and those scoped to ``benchmark``
    (prefix removed)."""
    out = []
    for o in overrides:
        key = o.split("=", 1)[0]
        if ":" not in key:
            out.append(o)
        elif key.split(":", 1)[0] == benchmark:
            out.append(o.split(":", 1)[1])
    return out


def _slug(label: str) -> str:
    """The run directory name of a label: one path component, never ``.`` or ``..`` (which would
    put a row's run in the comparison's own directory) nor hidden."""
    return re.sub(r"[^\w.+-]+", "_", label).strip("_").lstrip(".") or "method"


def fold_set_options(argv: Sequence[str]) -> list[str]:
    """``--set KEY=VALUE`` (repeatable, as the runners take it) in the form ``--method`` reads:
    after a ``--method`` it joins that method's overrides; before the first ``--method`` it applies
    to every method (ahead of each method's own, which win). ``--method LABEL FILE KEY=VALUE``
    keeps working."""
    out: list = []
    shared: list[str] = []
    current: list[str] | None = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if (arg == "--set" and i + 1 < len(argv)) or arg.startswith("--set="):
            value = arg[len("--set=") :] if arg.startswith("--set=") else argv[i + 1]
            i += 1 if arg.startswith("--set=") else 2
            (shared if current is None else current).append(value)
            continue
        out.append(arg)
        i += 1
        if arg == "--method":
            current = []
            while i < len(argv) and not argv[i].startswith("-"):
                current.append(argv[i])
                i += 1
            out.append(current)
    flat: list[str] = []
    for item in out:
        if isinstance(item, list):
            flat += item[:2] + (shared if len(item) >= 2 else []) + item[2:]
        else:
            flat.append(item)
    return flat


def preflight(runs: Sequence[RunOptions]) -> None:
    """Check every method of a comparison before its first row runs: each hparams file (with its
    overrides) is valid, EasyEdit is importable for the methods that run EasyEdit's code, and what a
    method needs on this machine is there (its registry ``preflight``: MEMIT's and AlphaEdit's
    covariance statistics present or computable offline). Raises the user error of the first that is
    not."""
    from ..run.methods import method_for_file

    checked: set[tuple[str, tuple[str, ...]]] = set()
    for opts in runs:
        key = (opts.hparams, tuple(opts.overrides))
        if key in checked:
            continue
        checked.add(key)
        method = method_for_file(opts.hparams)
        if method.needs_easyedit:
            from hpse_easyedit.integrations.easyedit_import import import_easyedit

            import_easyedit()
        hparams = method.load_hparams(opts.hparams, opts.overrides)
        if method.preflight is not None:
            method.preflight(hparams)


def seconds_table(rows: Sequence[tuple[str, dict]], benchmarks: Sequence[str]) -> str:
    """Markdown: the mean wall time of one edit per row and benchmark (``edit_seconds_mean`` of its
    summary).

    Under ``--sequential T`` an 'edit' is one case's edit inside its sequence; the reference rows
    (unedited, in-context) edit nothing and show 0. For methods that run EasyEdit's own algorithm
    the cell adds the share of that time spent inside EasyEdit's function
    (``algorithm_seconds_mean``); the rest is what this project's integration adds.
    """
    body = []
    for label, summaries in rows:
        cells = []
        for b in benchmarks:
            summary = summaries.get(b) or {}
            value, inside = summary.get("edit_seconds_mean"), summary.get("algorithm_seconds_mean")
            cell = "-" if value is None else f"{value:.1f}"
            if value and inside is not None:
                cell += f" ({100 * inside / value:.0f}% in EasyEdit's algorithm)"
            cells.append(cell)
        body.append([label, *cells])
    head = ["method", *(f"s/edit ({b})" for b in benchmarks)]
    return "\n".join(md_table(head, body, "l" + "r" * len(benchmarks))) + "\n"


def paired_tables(
    out: Path,
    labels: Sequence[str],
    reference: str,
    benchmarks: Sequence[str],
    *,
    resamples: int = 10000,
) -> tuple[str, dict]:
    """Per benchmark, every row against ``reference`` on the cases all rows finished: markdown and
    the reports.

    A benchmark where some row has no finished case (or only one row ran) gets a line saying so
    instead.
    """
    order = [reference] + [label for label in labels if label != reference]
    parts, reports = [], {}
    if len(order) < 2:  # one method: nothing to pair it with
        return "", reports
    for bench in benchmarks:
        dirs = [out / bench / _slug(label) for label in order]
        try:
            report = multi_report(dirs, resamples=resamples)
        except (ValueError, FileNotFoundError) as err:
            parts.append(
                f"{bench}: no paired comparison with {reference} ({' '.join(str(err).split())}).\n"
            )
            continue
        reports[bench] = report
        parts.append(multi_table(report, order))
    return "\n".join(parts), reports


def _compare(argv: Sequence[str], prog: str | None = None) -> int:
    parser = OneLineParser(
        prog=prog,
        description="Run several hparams files (with overrides) over the same cases; print one "
        "table in the paper's layout and plot the step-in rate per round.",
    )
    parser.add_argument(
        "--method",
        nargs="+",
        action="append",
        required=True,
        metavar="ARG",
        help="LABEL FILE [KEY=VALUE ...]; repeat for each method, e.g. "
        "--method LoRA hparams/HPSE/x.yaml --set kl_weight=0 --method HPSE hparams/HPSE/x.yaml; "
        "BENCHMARK:KEY=VALUE applies to one benchmark only (unkebench:max_new_tokens=128)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an hparams field, repeatable: after a --method, of that method (as "
        "KEY=VALUE after its FILE); before the first --method, of every method",
    )
    parser.add_argument(
        "--benchmark",
        nargs="+",
        default=list(BENCHMARKS),
        choices=BENCHMARKS,
        help="benchmarks to run (default both)",
    )
    parser.add_argument(
        "--out",
        default="runs/compare",
        metavar="DIR",
        help="output directory (default runs/compare)",
    )
    parser.add_argument(
        "--reference",
        metavar="LABEL",
        help="the row every other row is paired with (Avg difference, 95%% interval, "
        "wins/ties/losses); default the first --method",
    )
    parser.add_argument(
        "--resamples",
        type=int,
        default=10000,
        metavar="N",
        help="bootstrap resamples of the intervals (default 10000)",
    )
    add_run_arguments(parser, None)
    args = parser.parse_args(fold_set_options(argv))
    configure_logging(args.log_level)
    try:
        methods = [parse_method(m) for m in args.method]
    except argparse.ArgumentTypeError as err:
        parser.error(str(err))
    if args.cases and len(args.benchmark) > 1:
        parser.error(
            "--cases names case ids of one benchmark; pass "
            + " or ".join(f"--benchmark {b}" for b in sorted(BENCHMARKS))
            + " with it"
        )
    labels = [m[0] for m in methods]
    if len(set(map(_slug, labels))) != len(labels):
        parser.error(f"method labels must be distinct, got {labels}")
    reference = labels[0] if args.reference is None else args.reference
    if reference not in labels:
        parser.error(
            f"--reference {reference!r}: no --method has that label; choose one of {labels}"
        )
    if args.resamples < 1:
        parser.error(f"--resamples {args.resamples}: must be >= 1")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        parser.error(f"--out {out}: is a file, not a directory; give a directory path")
    runs = [
        (
            label,
            bench,
            options_from_args(
                args,
                bench,
                path,
                overrides_for(overrides, bench),
                str(out / bench / _slug(label)),
                label,
            ),
        )
        for label, path, overrides in methods
        for bench in args.benchmark
    ]
    preflight([opts for _, _, opts in runs])
    rows, series, everything = [], {}, {}
    for label, _, _ in methods:
        summaries = {}
        for bench, opts in [(b, o) for lab, b, o in runs if lab == label]:
            summaries[bench] = run_benchmark(opts)
            series[f"{label} ({bench})" if len(args.benchmark) > 1 else label] = summaries[bench][
                "stepin_rate_by_round"
            ]
        rows.append((label, summaries))
        everything[label] = summaries
    if not is_main_process():
        return 0
    every = [s for _, ss in rows for s in ss.values()]
    table = paper_table(rows) + judge_note(every) + unjudged_note(every) + failed_note(every)
    paired, reports = paired_tables(
        out, labels, reference, args.benchmark, resamples=args.resamples
    )
    details = (
        "Wall time per edit (mean over the row's cases):\n\n"
        + seconds_table(rows, args.benchmark)
        + (f"\nPaired with {reference}, per benchmark:\n\n" + paired if paired else "")
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(table, encoding="utf-8")
    (out / "paired.md").write_text(details, encoding="utf-8")
    write_json_atomic(out / "compare.json", everything)
    write_json_atomic(out / "paired.json", {"reference": reference, "benchmarks": reports})
    plot_stepin_rates(series, out / "stepin_by_round.png")
    print(table + "\n" + details, end="")
    print(
        f"\ntables: {out / 'compare.md'} (paper layout), {out / 'paired.md'} (times, intervals, "
        f"paired with {reference}); step-in plot: {out / 'stepin_by_round.png'}"
    )
    return 1 if any(s.get("unjudged_cases") for s in every) else 0


def compare_main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """``run_compare.py``: every method is checked first (``preflight``), then each row runs; a bad
    input is one logged line and exit code 2 before any edit; exit code 1 when some UnKEBench cases
    are still unjudged."""
    return run_cli(lambda args: _compare(args, prog), argv, extra=benchmark_errors(), logger=log)
