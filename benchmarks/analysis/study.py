"""Every table of docs/RESULTS.md regenerated from the run directories committed under docs/study/.

A table in RESULTS.md that rests on runs sits between two HTML comments, which markdown does not
show:

    <!-- study: paired unkebench-78-100/uk-lora unkebench-78-100/uk-hpse --label LoRA --label "LoRA + HPSE" -->
    ... the command's output, verbatim ...
    <!-- /study -->

The marker names the tool and its arguments: ``paired`` (``python -m benchmarks paired``),
``continual`` (``python -m benchmarks continual``: continual-editing pairs), ``variants``
(``python -m benchmarks variants``: variants of one method against a reference), ``runs`` (per run:
cases, MMLU before and after the measured edits, median edit seconds; ``runs DIR ... [--label
NAME ...]``) or ``unke`` (``python -m benchmarks unke-metrics``: UnKE's own BLEU and ROUGE per
UnKEBench run). A run directory is written relative to the study root (``docs/study``).
This module runs every marker's command on the committed files (no model time) and prints the
results; ``--check`` compares them with what RESULTS.md holds and exits 1 on the first disagreement,
naming the marker's line and the line that differs. It also checks the prose: every decimal number
written outside the blocks, code and HTML comments must be a number of some block, and so must every
whole percentage and every "N wins, M losses", so a figure whose runs are not committed cannot stay
in the text. Settings written as code (``lr 5e-4`` in backticks) are not results and are not
checked; nor are other integers (counts of records), which the prose should copy from the tables.
``--write`` replaces every block with the regenerated text, so adding a rerun to RESULTS.md is one
marker and an empty block plus ``--write``.

``--check`` also recomputes every ``summary.json`` under the study root from its run directory's
files (``benchmarks.analysis.summaries.rebuild``: the runner's own summary code, and UnKE's metrics as
``benchmarks.analysis.unke_metrics --write`` adds them) and names each file and field that differs; which
keys are recomputed and which are provenance (``label``, ``out_dir``) is
``benchmarks.run.summary``'s docstring. ``--write-summaries`` rewrites each such summary (and its
``table.md``, where the directory has one) from its records, as the runner does at the end of a
run, keeping its provenance.

    python -m benchmarks study docs/study          # print every table
    python -m benchmarks study docs/study --check  # exit 1 when RESULTS.md or a summary.json disagrees with the runs
    python -m benchmarks study docs/study --write  # rewrite the blocks of RESULTS.md from the runs
    python -m benchmarks study docs/study --write-summaries  # rewrite each stale summary.json from its records
"""  # noqa: E501

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from hpse_easyedit.cli import OneLineParser, run_cli
from hpse_easyedit.errors import UsageError

from ..markdown import md_table

__all__ = [
    "Block",
    "StudyError",
    "check",
    "find_blocks",
    "generate",
    "prose_numbers",
    "runs_table",
    "summary_problems",
    "table_numbers",
    "write",
    "write_summaries",
]

_BLOCK_RE = re.compile(
    r"^<!-- study: (?P<command>.+?) -->\n(?P<body>.*?)^<!-- /study -->$", re.S | re.M
)
_MARKER_RE = re.compile(r"^<!-- study:", re.M)
_NUMBER_RE = re.compile(r"(?<![\w.])[+-]?\d+\.\d+(?![\w.]*\d)")
# Results in the prose: decimal numbers, whole percentages ("51%") and win/loss counts ("13 wins, 10
# losses").
_RESULT_RE = re.compile(
    r"(?<![\w.])(?:[+-]?\d+\.\d+(?![\w.]*\d)|\d+(?=%)|(?P<wins>\d+) "
    r"wins?(?:,| /) (?P<losses>\d+) loss(?:es)?\b)"
)
TOOLS = ("paired", "continual", "variants", "runs", "unke")


class StudyError(ValueError):
    """A marker or the study root is unusable; the message names the file, the line and the fix."""


@dataclass
class Block:
    """One marked table of RESULTS.md: its marker's 1-based line, the command and the text it
    holds."""

    line: int
    command: str
    body: str
    start: int
    end: int


def find_blocks(text: str, source: str = "RESULTS.md") -> list[Block]:
    """Every ``<!-- study: ... -->`` block of ``text``; a marker without its closing ``<!-- /study
    -->`` is an error."""
    blocks = [
        Block(
            text.count("\n", 0, m.start()) + 1,
            m.group("command").strip(),
            m.group("body"),
            m.start("body"),
            m.end("body"),
        )
        for m in _BLOCK_RE.finditer(text)
    ]
    opened = [text.count("\n", 0, m.start()) + 1 for m in _MARKER_RE.finditer(text)]
    unclosed = sorted(set(opened) - {b.line for b in blocks})
    if unclosed:
        raise StudyError(
            f"{source}:{unclosed[0]}: a '<!-- study: ... -->' marker without its '<!-- /study "
            "-->' line; close the block"
        )
    return blocks


def _answer_list(record: Mapping[str, Any]) -> list[str]:
    """Every answer of a results record, in a fixed order (its ``answers`` mapping's keys in sorted
    order)."""
    answers = record.get("answers") or {}
    if isinstance(answers, Mapping):
        return [
            a
            for key in sorted(answers)
            for a in (answers[key] if isinstance(answers[key], list) else [answers[key]])
        ]
    return list(answers)


def runs_table(argv: Sequence[str]) -> int:
    """The ``runs`` tool: one row per run directory with what its files record besides the
    scores."""
    import statistics

    from .runs import load_run

    parser = argparse.ArgumentParser(prog="runs")
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--label", action="append", default=[])
    parser.add_argument(
        "--changed-from",
        metavar="RUN",
        help="a column counting, over the cases both runs have, the answers that differ from RUN's "
        "(e.g. the unedited run: did an edit change the model's answers at all?)",
    )
    args = parser.parse_args(argv)
    labels = args.label or [Path(r).name for r in args.runs]
    if len(labels) != len(args.runs):
        print(
            f"error: {len(labels)} --label for {len(args.runs)} runs; give one per run or none",
            file=sys.stderr,
        )
        return 2
    loaded = []
    for run in args.runs:
        try:
            loaded.append(load_run(run)[1])
        except (FileNotFoundError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    reference = None
    if args.changed_from:
        try:
            reference = load_run(args.changed_from)[1]
        except (FileNotFoundError, ValueError) as err:
            print(f"error: --changed-from: {err}", file=sys.stderr)
            return 2
    # runs of EasyEdit's baselines record the seconds inside EasyEdit's own algorithm: then a column
    # says which share of the edit time that is (the rest is this project's integration)
    split = any("algorithm_seconds" in r for recs in loaded for r in recs.values())
    head = [
        "run",
        "cases",
        "MMLU before any edit",
        "MMLU after the measured edits (edit number: score)",
        "median edit seconds",
        *(["share in EasyEdit's algorithm"] if split else []),
        *([f"answers changed vs {Path(args.changed_from).name}"] if reference is not None else []),
    ]
    body = []
    for label, run, recs in zip(labels, args.runs, loaded):
        before = Path(run) / "mmlu_before.json"
        mmlu = (
            f"{json.loads(before.read_text(encoding='utf-8'))['MMLU_before']:.1f}"
            if before.is_file()
            else "-"
        )
        ordered = sorted(
            recs.values(), key=lambda r: r.get("index", 0)
        )  # index: the case's place in the run
        # continual editing measures MMLU once per block, after its last edit; each record of the
        # block carries it
        measured = [
            (i, r)
            for i, r in enumerate(ordered)
            if r.get("MMLU_after") is not None
            and (
                r.get("block") is None
                or i + 1 == len(ordered)
                or ordered[i + 1].get("block") != r["block"]
            )
        ]
        after = ", ".join(f"{r.get('index', i) + 1}: {r['MMLU_after']:.0f}" for i, r in measured)
        seconds = [float(r.get("edit_seconds") or 0.0) for r in ordered]
        median = (
            f"{statistics.median(seconds):.0f}" if any(seconds) else "-"
        )  # a reference row edits nothing
        row = [label, len(recs), mmlu, after or "-", median]
        if split:
            inside = [r for r in ordered if "algorithm_seconds" in r]
            total = sum(float(r["edit_seconds"]) for r in inside)
            row.append(
                f"{100 * sum(r['algorithm_seconds'] for r in inside) / total:.0f}%"
                if inside and total
                else "-"
            )
        if reference is not None:
            pairs = [
                (a, b)
                for c in sorted(set(recs) & set(reference))
                for a, b in zip(_answer_list(recs[c]), _answer_list(reference[c]))
            ]
            row.append(f"{sum(a != b for a, b in pairs)} of {len(pairs)}")
        body.append(row)
    print("\n".join(md_table(head, body, "lrrlr" + "r" * (len(head) - 5))))
    return 0


def _argv(command: str, root: Path, line: str) -> list[str]:
    try:
        tool, *args = shlex.split(command)
    except ValueError as err:
        raise StudyError(
            f"{line}: the marker's command does not parse ({err}); fix its quoting"
        ) from None
    if tool not in TOOLS:
        raise StudyError(f"{line}: unknown tool {tool!r} in the marker; use one of {list(TOOLS)}")
    # a run directory is named relative to the study root
    from ..records.sequence import split_checkpoint

    def located(arg: str) -> str:  # a run directory, or DIR@N (a run at one of its checkpoints)
        run_dir, _ = split_checkpoint(root / arg)
        return str(root / arg) if not arg.startswith("-") and run_dir.is_dir() else arg

    return [tool] + [located(a) for a in args]


def generate(
    blocks: Sequence[Block],
    root: str | Path,
    *,
    data: str | None = None,
    source: str = "RESULTS.md",
) -> list[str]:
    """Each block's text regenerated by its command on the runs under ``root`` (paths shown relative
    to it)."""
    from .continual import main as continual_main
    from .paired import main as paired_main
    from .unke_metrics import main as unke_main
    from .variants import main as variants_main

    root = Path(root)
    if not root.is_dir():
        raise StudyError(
            f"{root}: no such study directory; pass the "
            "directory that holds the committed runs (docs/study)"
        )
    out = []
    for b in blocks:
        where = f"{source}:{b.line}"
        tool, *argv = _argv(b.command, root, where)
        if tool in ("paired", "continual", "unke") and data and "--data" not in argv:
            argv += ["--data", data]
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                rc = {
                    "paired": paired_main,
                    "continual": continual_main,
                    "variants": variants_main,
                    "runs": runs_table,
                    "unke": unke_main,
                }[tool](argv)
            except SystemExit as exc:  # argparse rejected the marker's arguments
                rc = exc.code if isinstance(exc.code, int) else 2
        if rc != 0:
            said = (stderr.getvalue().strip().splitlines() or ["(no message)"])[-1]
            raise StudyError(
                f"{where}: the marker's command failed ({said}); "
                f"run directories are named relative to {root}"
            )
        out.append(stdout.getvalue().replace(f"{root}/", ""))
    return out


def prose_numbers(text: str) -> list[tuple[int, str]]:
    """(line, result) of every decimal number, whole percentage and "N wins, M losses" outside study
    blocks, fenced code, code spans, link targets and HTML comments."""
    masked = _BLOCK_RE.sub(lambda m: "\n" * m.group().count("\n"), text)
    masked = re.sub(
        r"^```.*?^```", lambda m: "\n" * m.group().count("\n"), masked, flags=re.S | re.M
    )
    masked = re.sub(r"<!--.*?-->", lambda m: "\n" * m.group().count("\n"), masked, flags=re.S)
    masked = re.sub(r"`[^`\n]*`", "", masked)
    masked = re.sub(r"\]\([^)]*\)", "]", masked)  # link targets (file names) are not results
    return [(masked.count("\n", 0, m.start()) + 1, m.group()) for m in _RESULT_RE.finditer(masked)]


def table_numbers(generated: Sequence[str]) -> set[float]:
    """Every decimal number and whole percentage the regenerated blocks hold: what prose may
    quote."""
    tables = "\n".join(generated)
    return {float(n) for n in _NUMBER_RE.findall(tables)} | {
        float(n) for n in re.findall(r"(?<![\w.])(\d+)%", tables)
    }


def check(
    text: str, blocks: Sequence[Block], generated: Sequence[str], source: str = "RESULTS.md"
) -> list[str]:
    """Disagreements between RESULTS.md and the regenerated blocks, one line each (empty: they
    agree)."""
    problems = []
    for b, new in zip(blocks, generated):
        if b.body == new:
            continue
        old_lines, new_lines = b.body.splitlines(), new.splitlines()
        i = next(
            (k for k, (x, y) in enumerate(zip(old_lines, new_lines)) if x != y),
            min(len(old_lines), len(new_lines)),
        )
        have = old_lines[i] if i < len(old_lines) else "(end of block)"
        want = new_lines[i] if i < len(new_lines) else "(end of block)"
        problems.append(
            f"{source}:{b.line + 1 + i}: the block of the marker on line {b.line} says {have!r}; "
            f"the committed runs give {want!r}"
        )
    tables = "\n".join(generated)
    known = table_numbers(generated)
    for line, number in prose_numbers(text):
        counts = _RESULT_RE.fullmatch(number)
        if counts and counts.group(
            "wins"
        ):  # a "wins / ties / losses" cell with these wins and losses
            found = re.search(
                rf"(?<!\d){counts.group('wins')} / \d+ / {counts.group('losses')}(?!\d)", tables
            )
        else:
            found = float(number.rstrip("%")) in known
        if not found:
            problems.append(
                f"{source}:{line}: {number} is in no table regenerated from the committed runs; "
                "take it from a study block or remove it"
            )
    return problems


def write(text: str, blocks: Sequence[Block], generated: Sequence[str]) -> str:
    """``text`` with every block's body replaced by its regenerated text."""
    for b, new in sorted(zip(blocks, generated), key=lambda x: -x[0].start):
        text = text[: b.start] + new + text[b.end :]
    return text


def _summaries(root: Path, data: str | None) -> Iterator[tuple[Path, dict, Any]]:
    """(summary.json, stored summary, UnKEBench cases or None) of every finished run under
    ``root``, the data loaded once, where an UnKEBench run needs it."""
    from .runs import load_cases

    found = sorted(root.rglob("summary.json"))
    cases = None
    for path in found:
        config = path.parent / "config.json"
        if cases is None and config.is_file():
            if json.loads(config.read_text(encoding="utf-8")).get("benchmark") == "unkebench":
                try:
                    cases = load_cases("unkebench", data, "recomputing UnKE's metrics of a summary")
                except ValueError as err:
                    raise StudyError(str(err)) from None
        yield path, json.loads(path.read_text(encoding="utf-8")), cases


def _rebuilt(path: Path, stored: dict, cases: Any, **unke: Any) -> tuple[Any, dict]:
    from ..records.store import IncompleteRunError
    from .summaries import rebuild

    try:
        return rebuild(path.parent, stored, unke_cases=cases, **unke)
    except (FileNotFoundError, IncompleteRunError, KeyError, ValueError) as err:
        raise StudyError(f"{path}: cannot recompute it from its run directory ({err})") from None


def summary_problems(root: str | Path, data: str | None = None) -> tuple[list[str], int]:
    """(one line per field of a ``summary.json`` under ``root`` that its records do not give, how
    many summaries were checked); each line names the file, the field and the fix."""
    from .summaries import summary_differences

    root = Path(root)
    problems, n = [], 0
    for path, stored, cases in _summaries(root, data):
        n += 1
        _, rebuilt = _rebuilt(path, stored, cases)
        problems += [
            f"{path}: {d}; `python -m benchmarks study {root} --write-summaries` rewrites it from "
            "its records"
            for d in summary_differences(stored, rebuilt)
        ]
    return problems, n


def write_summaries(root: str | Path, data: str | None = None) -> list[Path]:
    """Rewrite every ``summary.json`` under ``root`` that its records disagree with (and its
    ``table.md``, where the directory has one) from those records, keeping its provenance; the
    files rewritten."""
    from ..tasks.unke_scores import load_encoder
    from .summaries import summary_differences

    encoder, reason = None, ""
    written = []
    for path, stored, cases in _summaries(Path(root), data):
        if cases is not None and encoder is None and not reason:  # as unke_metrics --write loads it
            encoder, reason = load_encoder()
        summary, rebuilt = _rebuilt(path, stored, cases, encoder=encoder, bert_reason=reason)
        if summary_differences(stored, rebuilt):
            summary.write(rebuilt, table=(path.parent / "table.md").is_file())
            written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; a bad input is one ``error: ...`` line on stderr and exit code 2
    (``--debug``: traceback)."""
    return run_cli(_main, argv, extra=(StudyError,))


def _main(argv: Sequence[str]) -> int:
    parser = OneLineParser(prog="python -m benchmarks study", description=__doc__.split("\n")[0])
    parser.add_argument(
        "root", metavar="STUDY_DIR", help="the directory of committed run directories (docs/study)"
    )
    parser.add_argument(
        "--results",
        metavar="MD",
        help="the results document (default: RESULTS.md next to STUDY_DIR)",
    )
    parser.add_argument(
        "--data",
        help="data directory the runs used, for the rescored tables "
        "(default: $HPSE_DATA_DIR or ../shared/data)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a number of the document disagrees with the runs",
    )
    mode.add_argument(
        "--write", action="store_true", help="rewrite the document's blocks from the runs"
    )
    mode.add_argument(
        "--write-summaries",
        action="store_true",
        help="rewrite each summary.json under STUDY_DIR that its records disagree with (and its "
        "table.md, where there is one) from those records, as the runner does, keeping its "
        "label and out_dir",
    )
    args = parser.parse_args(argv)
    if args.write_summaries:
        if not Path(args.root).is_dir():
            raise StudyError(f"{args.root}: no such study directory; pass docs/study")
        written = write_summaries(args.root, args.data)
        for path in written:
            print(f"rewrote {path} from its records")
        print(f"{len(written)} summary.json file(s) rewritten under {args.root}")
        return 0
    results = Path(args.results) if args.results else Path(args.root).parent / "RESULTS.md"
    if not results.is_file():
        raise UsageError(f"{results}: no such file; pass the results document with --results")
    text = results.read_text(encoding="utf-8")
    blocks = find_blocks(text, str(results))
    if not blocks:
        raise StudyError(
            f"{results}: no '<!-- study: ... -->' block; mark each table that rests on runs"
        )
    generated = generate(blocks, args.root, data=args.data, source=str(results))
    if args.write:
        results.write_text(write(text, blocks, generated), encoding="utf-8")
        print(f"wrote {len(blocks)} block(s) of {results}")
        return 0
    if args.check:
        stale, n_summaries = summary_problems(args.root, args.data)
        problems = stale + check(text, blocks, generated, str(results))
        for p in problems:
            print(p, file=sys.stderr)
        if problems:
            return 1
        print(
            f"{results}: {len(blocks)} table block(s) and every result in the prose agree with "
            f"{args.root}, and its {n_summaries} summary.json file(s) with their records"
        )
        return 0
    for b, new in zip(blocks, generated):
        print(f"<!-- study: {b.command} -->  ({results}:{b.line})\n{new}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
