"""UnKE's own metrics (``benchmarks.tasks.unke_scores``) for UnKEBench run directories, from their
stored answers and the benchmark data: no model time.

    python -m benchmarks unke-metrics RUN [RUN ...] [--label NAME ...]   # a table of the runs
    python -m benchmarks unke-metrics docs/study --write   # add them to every UnKEBench run in it

The printed table (also the ``unke`` tool of ``benchmarks.analysis.study``) holds BLEU and ROUGE in
percent, never the MiniLM cosine, so that it reads the same on every machine. ``--write`` adds the
key ``unke_metrics`` to each run's ``summary.json`` (nothing else in it changes; ``results*.jsonl``
are only read), with ``Bert Score`` where the MiniLM is on the machine, and a section to its
``table.md`` (replacing the one an earlier ``--write`` added).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from hpse_easyedit.cli import OneLineParser, run_cli
from hpse_easyedit.errors import UsageError

from ..run.summary import write_run
from ..run.tables import metrics_table
from ..tasks.unke_scores import (
    KEY,
    Encoder,
    case_metrics,
    load_encoder,
    summarize_metrics,
)

__all__ = ["case_values", "main", "metrics_table", "run_metrics", "write_run"]

log = logging.getLogger(__name__)


def run_metrics(
    run_dir: str | Path,
    cases: Mapping[str, Mapping[str, Any]],
    encoder: Encoder | None = None,
    bert_reason: str = "",
) -> dict:
    """``summarize_metrics`` of an UnKEBench run directory (finished or not), from its records'
    stored answers and the passages and gold sub-answers of ``cases`` (case id -> loaded case)."""
    from .runs import load_run

    per_case = case_values(run_dir, load_run(run_dir), cases, encoder)
    return summarize_metrics(list(per_case.values()), bert_reason=bert_reason)


def case_values(
    run_dir: str | Path,
    run: tuple[str, Mapping[str, Mapping[str, Any]]],
    cases: Mapping[str, Mapping[str, Any]],
    encoder: Encoder | None = None,
) -> dict[str, dict]:
    """{case id: ``case_metrics``} of a loaded run (``benchmarks.analysis.paired.load_run``:
    benchmark, records) in data order, from its stored answers and ``cases``; ``run_dir`` names it
    in errors."""
    benchmark, recs = run
    if benchmark != "unkebench":
        raise ValueError(f"{run_dir}: a {benchmark} run; UnKE's metrics are UnKEBench's")
    per_case = {}
    for cid, rec in sorted(recs.items(), key=lambda kv: kv[1].get("index", 0)):
        case = cases.get(cid)
        if case is None:
            raise ValueError(
                f"{run_dir}: case {cid} is not in the UnKEBench data given; "
                "pass the --data the run used"
            )
        answers = rec.get("answers") or {}
        missing = [k for k in ("question", "para_question", "sub_questions") if k not in answers]
        if missing:
            raise ValueError(f"{run_dir}: case {cid} keeps no answer to {', '.join(missing)}")
        per_case[cid] = case_metrics(case["passage"], case["sub_answers"], answers, encoder)
    return per_case


def _unkebench_runs(paths: Sequence[str]) -> list[Path | str]:
    """The UnKEBench run directories among ``paths`` and below them (those with a config.json);
    ``DIR@N`` (a run at its checkpoint after N edits) is kept as given."""
    from ..records.sequence import split_checkpoint

    found: list[Path | str] = []
    for given in paths:
        p, checkpoint = split_checkpoint(given)
        if not p.is_dir():
            raise UsageError(f"{p}: no such directory")
        if checkpoint is not None:
            found.append(given)
            continue
        own = p / "config.json"
        configs = [own] if own.is_file() else sorted(p.rglob("config.json"))
        found += [
            c.parent
            for c in configs
            if json.loads(c.read_text(encoding="utf-8")).get("benchmark") == "unkebench"
        ]
    if not found:
        raise UsageError(f"no UnKEBench run directory in {', '.join(paths)}")
    return found


def _answer_cap(run: Path | str) -> int | None:
    from ..records.sequence import split_checkpoint

    config = split_checkpoint(run)[0] / "config.json"
    return json.loads(config.read_text(encoding="utf-8")).get("max_new_tokens")


def _checkpoints(run: Path | str) -> list[str]:
    """The checkpoints a finished run's summary.json holds (none for a run without them)."""
    summary = Path(run) / "summary.json"
    if isinstance(run, str) or not summary.is_file():
        return []
    return list(json.loads(summary.read_text(encoding="utf-8")).get("checkpoints") or {})


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; a bad input is one ``error: ...`` line on stderr and exit code 2."""
    return run_cli(_main, argv)


def _main(argv: Sequence[str]) -> int:
    parser = OneLineParser(
        prog="python -m benchmarks unke-metrics", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="UnKEBench run directories, or directories to search for them (docs/study)",
    )
    parser.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="NAME",
        help="row label of each run, in order (repeat; default: the directory names)",
    )
    parser.add_argument(
        "--data", help="data directory the runs used (default: $HPSE_DATA_DIR or ../shared/data)"
    )
    parser.add_argument(
        "--write",
        action="store_true",
        help="add the metrics to each run's summary.json and table.md (Bert "
        "Score where the MiniLM is on the machine) instead of printing a "
        "table",
    )
    args = parser.parse_args(argv)
    runs = _unkebench_runs(args.runs)
    if args.label and len(args.label) != len(runs):
        raise UsageError(
            f"{len(args.label)} --label for {len(runs)} runs; give one per run or none"
        )
    from .runs import load_cases

    cases = load_cases("unkebench", args.data, "UnKE's metrics")
    # the printed table never has Bert Score, so that it reads the same on every machine
    encoder, reason = load_encoder() if args.write else (None, "")
    if args.write:
        return _write(runs, args.runs, cases, encoder, reason)
    rows = []
    for run in runs:
        try:
            rows.append(run_metrics(run, cases, encoder, reason))
        except (FileNotFoundError, ValueError) as err:
            raise UsageError(str(err)) from None
    labels = args.label or [run.name if isinstance(run, Path) else run for run in runs]
    print(metrics_table(list(zip(labels, rows)), [_answer_cap(run) for run in runs]), end="")
    return 0


def _write(
    runs: Sequence[Path | str],
    given: Sequence[str],
    cases: Mapping[str, Mapping[str, Any]],
    encoder: Encoder | None,
    reason: str,
) -> int:
    """``--write``: the metrics into each finished run's summary.json and table.md, its
    checkpoints' too; a run found below a given directory that has not finished is skipped."""
    written = 0
    for run in runs:
        if isinstance(run, str):
            raise UsageError(f"--write {run}: give the run directory; it writes every checkpoint")
        if not (run / "summary.json").is_file():
            if str(run) in given:
                raise UsageError(f"{run}: no summary.json yet (the run has not finished)")
            log.info("%s: not finished, skipped", run)
            continue
        try:
            metrics = run_metrics(run, cases, encoder, reason)
            at = {c: run_metrics(f"{run}@{c}", cases, encoder, reason) for c in _checkpoints(run)}
        except (FileNotFoundError, ValueError) as err:
            raise UsageError(str(err)) from None
        write_run(run, metrics, at)
        log.info("%s: %s added", run, KEY)
        written += 1
    print(
        f"added {KEY} to {written} UnKEBench run(s)"
        + (f" (no Bert Score: {reason})" if reason else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
