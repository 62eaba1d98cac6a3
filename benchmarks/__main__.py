"""``python -m benchmarks COMMAND [ARGS]``: every command of the benchmark wing behind one entry
point. ``python -m benchmarks`` lists them; ``python -m benchmarks COMMAND --help`` gives one
command's options. Every command reports a bad input as one ``error: ...`` line and exit code 2
(``--debug``: the traceback), and a run stopped by Ctrl-C or a signal as one ``interrupted: ...``
line (``hpse_easyedit.cli.run_cli``).

argparse, as every command's own parser already is (no new dependency, and each command keeps its
options and help exactly): this parser takes the command's name and hands the rest of the line to
that command's parser.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Callable, NamedTuple, Sequence


class Command(NamedTuple):
    module: str  # under ``benchmarks``
    function: str  # ``function(argv) -> exit code``
    summary: str
    wraps_errors: bool = False  # the function already runs itself through ``run_cli``


#: name -> where it lives; in the order ``python -m benchmarks`` lists them
COMMANDS: dict[str, Command] = {
    "run": Command(
        "run.cli",
        "cli_main",
        "run BENCHMARK (mquake-uns, unkebench) with an hparams file's method; resumes",
        True,
    ),
    "compare": Command(
        "analysis.compare",
        "compare_main",
        "run several methods over the same cases and print one table",
        True,
    ),
    "report": Command(
        "report.__main__", "main", "the paper-layout table of runs, or --html one report", True
    ),
    "paired": Command("analysis.paired", "main", "two or more runs compared case by case"),
    "continual": Command(
        "analysis.continual", "main", "continual sequences against single edits", True
    ),
    "variants": Command(
        "analysis.variants", "main", "variants of one method against a reference", True
    ),
    "twin": Command("analysis.twin", "main", "two runs of the same cases made two ways, compared"),
    "unke-metrics": Command(
        "analysis.unke_metrics", "main", "UnKE's own BLEU/ROUGE/BERTScore of UnKEBench runs", True
    ),
    "study": Command(
        "analysis.study",
        "main",
        "RESULTS.md's tables from docs/study: print, --check, --write",
        True,
    ),
    "inspect-rollout": Command(
        "analysis.inspect_rollout", "main", "one case's hybrid rollout, token by token"
    ),
    "perf": Command("perf.editors", "main", "what an edit costs next to its floors"),
    "perf-batched": Command("perf.batched", "main", "cases per hour and memory, B cases at once"),
    "perf-captured": Command(
        "perf.captured", "main", "kernels of the eager and the captured inner step"
    ),
    "perf-half-backward": Command(
        "perf.half_backward", "main", "the CPU half-precision backward against torch's"
    ),
    "gpu-path": Command("perf.gpu_path", "main", "the GPU path rehearsed on random weights"),
    "plan-check": Command("perf.plan_check", "main", "the memory planner against measured peaks"),
}


def _parser() -> argparse.ArgumentParser:
    from hpse_easyedit.cli import OneLineParser

    width = max(map(len, COMMANDS))
    listing = "\n".join(f"  {name:<{width}}  {c.summary}" for name, c in COMMANDS.items())
    parser = OneLineParser(
        prog="python -m benchmarks",
        description=__doc__.split("\n\n")[0],
        epilog=f"commands:\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=list(COMMANDS), metavar="COMMAND")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the command's own arguments")
    return parser


def command_function(name: str) -> Callable[[list[str]], int]:
    """The function that runs command ``name`` on its arguments, errors as one line."""
    command = COMMANDS[name]
    function = getattr(importlib.import_module(f"benchmarks.{command.module}"), command.function)
    if name == "run":
        return lambda argv: _run(function, argv)
    if name == "compare":  # run_compare.py names itself; here the command is named
        return lambda argv: function(argv, prog="python -m benchmarks compare")
    if command.wraps_errors:
        return function
    from hpse_easyedit.cli import run_cli

    from .run.cli import benchmark_errors

    return lambda argv: run_cli(function, argv, extra=benchmark_errors())


def _run(cli_main: Callable[..., int], argv: Sequence[str]) -> int:
    """``run BENCHMARK ARGS``: the benchmark's run command (``benchmarks.run.cli``)."""
    from .tasks import TASKS

    if argv and argv[0] in TASKS:
        return cli_main(argv[0], argv[1:], prog=f"python -m benchmarks run {argv[0]}")
    names = ", ".join(TASKS)
    if argv and argv[0] in ("-h", "--help"):
        print(
            f"usage: python -m benchmarks run BENCHMARK --hparams FILE [options]\n\nBENCHMARK: "
            f"{names}. `python -m benchmarks run BENCHMARK --help` lists the options."
        )
        return 0
    said = f"{argv[0]!r} is not a benchmark" if argv else "no benchmark named"
    print(
        f"error: {said}: name one of {names} first; see python -m benchmarks run --help",
        file=sys.stderr,
    )
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if not argv:  # the commands listed
        parser.print_help()
        return 0
    args = parser.parse_args(argv)
    return command_function(args.command)(list(args.args))


if __name__ == "__main__":
    sys.exit(main())
