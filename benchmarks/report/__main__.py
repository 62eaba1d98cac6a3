"""``python -m benchmarks report RUN [RUN ...] [--html FILE]``: the paper-layout table, or the HTML
report."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Sequence

from hpse_easyedit.cli import OneLineParser, run_cli
from hpse_easyedit.errors import UsageError, check_positive

from . import judge_note, paper_table


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; a bad input is one ``error: ...`` line on stderr and exit code 2
    (``--debug``: traceback)."""
    return run_cli(_main, argv, extra=(ValueError, OSError))


def _main(argv: Sequence[str]) -> int:
    parser = OneLineParser(
        prog="python -m benchmarks report",
        description="The paper-layout table of benchmark runs, or with --html one self-contained "
        "HTML report: the table with intervals and paired differences, the step-in plot, every "
        "case with its answers side by side, verdicts, filters, and each round's rollout with the "
        "teacher's tokens highlighted.",
    )
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="run directories (--out of a benchmark run); the first is "
        "the baseline the others are compared with",
    )
    parser.add_argument(
        "--html", metavar="FILE", help="write the HTML report here (replaced if it exists)"
    )
    parser.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="NAME",
        help="label of each RUN, in order (repeat; default: "
        "the run's own --label, else its directory name)",
    )
    parser.add_argument(
        "--data",
        metavar="DIR",
        help="data directory the runs used, for the questions and expected answers "
        "(default: $HPSE_DATA_DIR or ../shared/data)",
    )
    parser.add_argument(
        "--data-file",
        metavar="FILE",
        help="the runs' data file, relative to --data (default: the benchmark's default file, "
        "akew/MQuAKE-CF.json or unkebench/final_data_v2.json)",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="NAME_OR_DIR",
        help="decode rollouts with this tokenizer (default: "
        "each run's hparams model_name; ids if none loads)",
    )
    parser.add_argument(
        "--no-rollouts",
        action="store_true",
        help="leave the stored rollouts out of the HTML report",
    )
    parser.add_argument(
        "--resamples",
        type=int,
        default=10000,
        help="bootstrap resamples for the intervals (default 10000)",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show a traceback on errors (or set HPSE_DEBUG=1)"
    )
    args = parser.parse_args(argv)
    for run in args.runs:
        if not (Path(run) / "config.json").is_file():
            raise UsageError(
                f"RUN {run}: no config.json there; pass a "
                "directory written by a benchmark run (its --out)"
            )
    if len(args.label) > len(args.runs):
        raise UsageError(
            f"--label given {len(args.label)} times for "
            f"{len(args.runs)} runs; give at most one per RUN"
        )
    check_positive("--resamples", args.resamples, what="bootstrap resamples")
    if args.html and Path(args.html).is_dir():
        raise UsageError(
            f"--html {args.html} is a directory; give a file name such as "
            f"{Path(args.html) / 'report.html'}"
        )
    if args.data and not Path(args.data).is_dir():
        raise UsageError(
            f"--data {args.data}: no such directory; pass the data directory the runs used"
        )
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.html:
        from .html import write_html_report

        out = write_html_report(
            args.runs,
            args.html,
            labels=args.label,
            data_dir=args.data,
            data_file=args.data_file,
            resamples=args.resamples,
            tokenizer=args.tokenizer,
            rollouts=not args.no_rollouts,
        )
        print(
            f"wrote {out} ({out.stat().st_size / 1e6:.1f} "
            f"MB); open it in a browser: file://{out.resolve()}"
        )
        return 0
    from .html import read_run

    runs = [
        read_run(r, args.label[i] if i < len(args.label) else None) for i, r in enumerate(args.runs)
    ]
    summaries = [r.summary or {} for r in runs]
    missing = [str(r.path) for r in runs if r.summary is None]
    if missing:
        raise UsageError(
            f"{', '.join(missing)}: no summary.json yet (the run has not finished); finish it, or "
            "use --html, which reports the cases there are"
        )
    print(
        paper_table([(r.label, {r.benchmark: s}) for r, s in zip(runs, summaries)])
        + judge_note(summaries),
        end="",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
