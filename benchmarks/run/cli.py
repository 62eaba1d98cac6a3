"""The command line of run_hpse_mquake.py, run_hpse_unkebench.py and run_compare.py: options,
logging, errors.

``add_run_arguments`` declares the options a run shares, ``options_from_args`` turns them into
``RunOptions``, ``cli_main`` runs one benchmark and prints its paper-layout table. A bad input is
one line on stderr and exit code 2 before any edit (``hpse_easyedit.cli.run_cli``).
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Sequence

from hpse_easyedit.cli import (
    DEBUG_FLAG,
    DEBUG_HELP,
    OneLineFormatter,
    OneLineParser,
    run_cli,
)
from hpse_easyedit.errors import check_positive

from ..records.sequence import parse_checkpoints
from ..records.store import IncompleteRunError
from ..tasks.judge import JUDGE_KINDS, JudgeSettings
from ..tasks.task import TASKS, Option, Task
from .distributed import DEFAULT_TIMEOUT, LaunchError, current_context
from .runner import RunOptions, failed_note, run_benchmark, unjudged_note
from .tables import judge_note, paper_table

__all__ = [
    "add_run_arguments",
    "add_task_arguments",
    "benchmark_errors",
    "cli_main",
    "configure_logging",
    "is_main_process",
    "options_from_args",
]

log = logging.getLogger(__name__)


def add_run_arguments(parser: argparse.ArgumentParser, benchmark: str | None) -> None:
    """The options shared by run_hpse_mquake.py, run_hpse_unkebench.py and run_compare.py."""
    g = parser.add_argument_group("data and run")
    g.add_argument(
        "--data", metavar="DIR", help="data directory (default: $HPSE_DATA_DIR or ../shared/data)"
    )
    g.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help="first N cases only (a rerun may raise it and resume)",
    )
    g.add_argument(
        "--cases",
        type=lambda v: v.split(","),
        metavar="ID,ID,...",
        help="only the cases with these case_id values, in data order (with --limit: among the "
        "first N); a later run into the same --out may pick others or more; not with --sequential",
    )
    g.add_argument(
        "--sequential",
        type=int,
        metavar="T",
        help="continual editing: T cases edited one after another, then evaluated",
    )
    g.add_argument(
        "--checkpoints",
        type=parse_checkpoints,
        metavar="N,N,...",
        help="with --sequential T: also evaluate the cases edited so far after these many edits "
        "of each sequence, e.g. 10,20,50 with T=100 "
        "(checkpoints.jsonl; summary.json's 'checkpoints')",
    )
    g.add_argument("--batch-size", type=int, default=8, help="generation batch size (default 8)")
    g.add_argument(
        "--cases-at-once",
        default=1,
        metavar="B",
        help="single editing: edit B independent cases together in one batched pass (each its "
        "own adapter or FT-M matrix; each case's result is its solo edit's up to float "
        "rounding); HPSE and the plain LoRA/FT-M rows (default 1: one at a time). 'auto': on a "
        "GPU the most that fit its free memory by the memory planner (python -m hpse_easyedit "
        "plan --cases-at-once), on CPU 4",
    )
    g.add_argument(
        "--sequences-at-once",
        type=int,
        default=1,
        metavar="S",
        help="with --sequential T: run S continual sequences side by side, edit j of each in one "
        "batched pass (each sequence its own state and records, as when run one after another); "
        "HPSE and the plain LoRA/FT-M rows (default 1)",
    )
    g.add_argument(
        "--max-answer-tokens",
        type=int,
        metavar="N",
        help="new tokens per answer (default "
        + ", ".join(f"{t.default_max_new_tokens} {t.title}" for t in TASKS.values())
        + "); the rollout length of an edit is the "
        "hparams' max_new_tokens (--set max_new_tokens=N)",
    )
    g.add_argument(
        "--max-new-tokens", type=int, dest="max_new_tokens_deprecated", help=argparse.SUPPRESS
    )
    g.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="judge answers and generated data (default: $HPSE_CACHE_DIR, else "
        "$XDG_CACHE_HOME/hpse_easyedit, i.e. ~/.cache/hpse_easyedit)",
    )
    g.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="logging level (default INFO)",
    )
    g.add_argument(DEBUG_FLAG, action="store_true", help=DEBUG_HELP)
    g.add_argument(
        "--dist-timeout-hours",
        type=float,
        default=DEFAULT_TIMEOUT.total_seconds() / 3600,
        metavar="H",
        help="under accelerate launch: how long a process that finished its cases waits for the "
        f"others (default {DEFAULT_TIMEOUT.total_seconds() / 3600:.0f})",
    )
    g.add_argument(
        "--retry-failed",
        action="store_true",
        help="edit again the cases whose edits diverged in an earlier run (recorded as failed; in "
        "continual mode their whole sequences)",
    )
    g.add_argument(
        "--no-rollouts",
        action="store_true",
        help="do not keep each round's rollout (token ids, step-in mask) in results.jsonl",
    )
    for (
        task
    ) in TASKS.values():  # each task's own options: all of them for run_compare.py (benchmark None)
        if benchmark in (None, task.name):
            add_task_arguments(parser, task)
    j = parser.add_argument_group("judge (OpenAI-compatible endpoint)")
    j.add_argument(
        "--judge",
        default="auto",
        choices=JUDGE_KINDS,
        help="llm = the endpoint below; lexical = offline "
        "fallback; auto = llm when an endpoint is configured",
    )
    j.add_argument(
        "--judge-base-url", metavar="URL", help="default: $HPSE_JUDGE_BASE_URL or $OPENAI_BASE_URL"
    )
    j.add_argument(
        "--judge-model", metavar="NAME", help="default: $HPSE_JUDGE_MODEL or gemini-2.5-flash"
    )
    j.add_argument(
        "--judge-api-key",
        metavar="KEY",
        help="prefer the environment: $HPSE_JUDGE_API_KEY or $OPENAI_API_KEY (a key on the "
        "command line is visible to other users)",
    )
    j.add_argument(
        "--judge-timeout", type=float, default=120.0, help="seconds per judge request (default 120)"
    )
    j.add_argument(
        "--judge-max-attempts",
        type=int,
        default=6,
        help="most requests per judge question: the openai client's own retries of "
        "timeouts/429/5xx and our re-asks of unparsable answers together (default 6)",
    )


def add_task_arguments(parser: argparse.ArgumentParser, task: Task) -> None:
    """One argument group of the task's data file option and the options it declares
    (``Task.options``)."""
    group = parser.add_argument_group(task.title)
    for o in (task.data_option, *task.options):
        if o.cli:
            group.add_argument(
                o.flag,
                dest=_dest(task, o),
                default=o.default,
                help=o.help,
                metavar=o.metavar,
                **({"type": o.type} if o.type else {}),
                **({"choices": list(o.choices)} if o.choices is not None else {}),
            )


def _dest(task: Task, option: Option) -> str:
    """Where argparse keeps an option's value: its name, but each task's data file under its own
    flag's name (``mquake_file``, ``unke_file``), since run_compare.py offers every task's at
    once."""
    return option.flag.lstrip("-").replace("-", "_") if option is task.data_option else option.name


def options_from_args(
    args: argparse.Namespace,
    benchmark: str,
    hparams: str,
    overrides: Sequence[str],
    out_dir: str | None,
    label: str | None = None,
) -> RunOptions:
    """RunOptions for one benchmark from parsed command-line arguments (its task's own options among
    them)."""
    task = TASKS[benchmark]
    answer_tokens = args.max_answer_tokens
    if args.max_new_tokens_deprecated is not None:  # the old name of --max-answer-tokens
        check_positive("--max-new-tokens", args.max_new_tokens_deprecated, 1, "answer length cap")
        log.warning(
            "--max-new-tokens is deprecated: it caps the answers, so it is --max-answer-tokens "
            "now (the hparams' max_new_tokens is the rollout length)"
        )
        answer_tokens = (
            answer_tokens if answer_tokens is not None else args.max_new_tokens_deprecated
        )
    # every option whose flag's name is its RunOptions field (--limit, --cases, --sequential, ...)
    # goes over as it is; the rest are named or built here
    same_name = {k: v for k, v in vars(args).items() if k in RunOptions.model_fields}
    return RunOptions(
        **{
            **same_name,
            "benchmark": benchmark,
            "hparams": hparams,
            "overrides": list(overrides),
            "data_dir": args.data,
            "out_dir": out_dir,
            "label": label,
            "max_new_tokens": answer_tokens,
            "data_file": vars(args)[_dest(task, task.data_option)],
            "judge_settings": JudgeSettings(
                base_url=args.judge_base_url,
                model=args.judge_model,
                api_key=args.judge_api_key,
                timeout=args.judge_timeout,
                max_attempts=args.judge_max_attempts,
            ),
            "task_options": {o.name: vars(args)[o.name] for o in task.options if o.cli},
            "store_rollouts": not args.no_rollouts,
        }
    )


def configure_logging(level: str) -> None:
    """Log to stderr at ``level``; under a multi-process launch every line names its process."""
    rank, world = os.environ.get("RANK", "0"), os.environ.get("WORLD_SIZE", "1")
    who = f"[{rank}/{world}] " if world.isdigit() and int(world) > 1 else ""
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter(f"%(asctime)s %(levelname)s {who}%(name)s: %(message)s"))
    logging.basicConfig(
        level=getattr(logging, str(level).upper(), logging.INFO), handlers=[handler]
    )
    for noisy in ("httpx", "httpx2", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def benchmark_errors() -> tuple[type[BaseException], ...]:
    """The benchmarks' own exceptions that mean bad input or a bad environment, not a bug."""
    from ..records.store import ConfigMismatchError, ResultsFileError
    from ..tasks.datasets import DataError
    from ..tasks.judge import JudgeError

    return (
        DataError,
        JudgeError,
        ConfigMismatchError,
        IncompleteRunError,
        ResultsFileError,
        LaunchError,
    )


def _cli(benchmark: str, argv: Sequence[str], prog: str | None = None) -> int:
    title = TASKS[benchmark].title
    parser = OneLineParser(
        prog=prog,
        description=f"Edit with the method of an hparams file over {title} and score it as the "
        "HPSE paper does. Rerunning with the same --out resumes. Exit code 0: done; 1: done, but "
        "some cases are still unjudged (rerun to judge them) or their edits diverged (see "
        "--retry-failed); 2: a bad input, reported in one line "
        "before any edit; 130, 143, 129: stopped by Ctrl-C, SIGTERM or SIGHUP (rerun to resume).",
    )
    parser.add_argument(
        "--hparams",
        required=True,
        metavar="FILE",
        help="YAML hparams file; its alg_name picks the editor",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an hparams field, repeatable (e.g. "
        "--set kl_weight=0 for the plain LoRA baseline)",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help=f"output directory (default runs/{benchmark}/<hparams name>[+overrides])",
    )
    parser.add_argument(
        "--label", help="row label in the table (default: hparams name + overrides)"
    )
    add_run_arguments(parser, benchmark)
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    summary = run_benchmark(
        options_from_args(args, benchmark, args.hparams, args.set, args.out, args.label)
    )
    if is_main_process():
        print(
            paper_table([(summary["label"], {benchmark: summary})])
            + judge_note([summary])
            + unjudged_note([summary])
            + failed_note([summary]),
            end="",
        )
        print(
            f"\n{summary['n_cases']} case(s); summary: {Path(summary['out_dir']) / 'summary.json'}"
        )
    return 1 if summary.get("unjudged_cases") or summary.get("failed_cases") else 0


def cli_main(benchmark: str, argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Command line of run_hpse_mquake.py / run_hpse_unkebench.py: run, then print the paper-layout
    table.

    A bad input is one logged line and exit code 2 (``--debug``: the traceback); see
    ``hpse_easyedit.cli.run_cli``.
    """
    return run_cli(
        lambda args: _cli(benchmark, args, prog), argv, extra=benchmark_errors(), logger=log
    )


def is_main_process() -> bool:
    """True unless this is a non-main process of a multi-process launch (which must not print or
    write shared files)."""
    ctx = current_context()
    return ctx is None or ctx.is_main
