"""Two runs over the same cases, compared case by case: the difference of each metric with its spread.

With 20 or 100 cases a difference of a few points between two tables can be noise. This reads the
results files of two run directories (``runs/A`` and ``runs/B``, any number of processes each),
keeps the cases both have, and reports per metric: the two means, the mean paired difference B - A
with a 95% bootstrap confidence interval (cases resampled with replacement, the same resample for
both runs), and how many cases B won, tied and lost. ``Avg`` is the per-case mean of the task's
metrics (MQuAKE-uns: Ind and Cmp; UnKEBench: Jnt, Dmp, Div), as in the paper's tables. For
MQuAKE-uns it adds ``AnsDiv``, a diagnostic outside the paper: 1 - SelfBLEU-4 among all answers of a
case, which exposes an editor that answers every question by reciting the passage. Also for
MQuAKE-uns, "composition given the hops": in how many cases a run answered every single-hop question
(Ind = 1), and in how many of those it also answered the multi-hop question (Cmp). An editor whose
facts are retrievable one by one but cannot be chained shows a low second number.

    python -m benchmarks paired runs/mq20-lora runs/mq20-hpse --out runs/mq20-paired.json
    # + case studies:
    python -m benchmarks paired runs/mq20-lora runs/mq20-hpse --show 3 --data ../shared/data

With more than two runs (the baseline first), it prints one row per run on the cases ALL of them
finished, each with its Avg difference from the baseline (interval, wins / ties / losses):

    python -m benchmarks paired runs/mq-lora runs/mq-hpse runs/mq-hpse-nonll \\
        --label LoRA --label HPSE --label "w/o NLL"

``--cases ID,ID,...`` keeps only those cases (e.g. the MQuAKE-uns cases with two or more edits).
``--whole-word-aliases N`` (MQuAKE-uns) rescores the stored answers with a stricter check than the
official one: aliases of at most N characters must occur as whole words, so Germany's alias "de" no
longer counts inside "despite". A diagnostic for editors that recite long passages; the paper's
numbers use the official check (the default).

``--recitation`` (needs ``--data``) adds recitation diagnostics beside the official table, never in
its place: every stored answer rescored (a) cut to its first sentence and (b) cut to its first 32
tokens (``--recitation-tokens``) of the runs' model tokenizer (``hparams.model_name`` of the runs'
config, loaded offline through ``hpse_easyedit``'s model cache; when it cannot be loaded, words and
punctuation marks are counted instead and the table says so), and the share of each official score
that survives. MQuAKE-uns: Ind and Cmp by the check in use. UnKEBench: Div always; Jnt and Dmp only
for runs judged by the offline lexical judge, which is rerun on the cut answers; Jnt/Dmp from an LLM
judge cannot be recomputed offline, so those runs get Div alone. No model time: only stored answers
are read.
"""  # noqa: E501

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from hpse_easyedit.cli import OneLineParser  # argparse errors: one line

from ..markdown import md_table
from ..records.store import write_new_json
from ..tasks.task import TASKS
from .case_studies import case_studies
from .recitation import CUTS, model_token_spans, recitation_report, recitation_table
from .runs import (
    ANSWER_DIVERSITY,
    METRICS,
    add_reading_arguments,
    load_cases,
    load_run,
    record_values,
    run_model_name,
    scoring_note,
)
from .stats import (
    average,
    bootstrap_ci,
    hierarchical_bootstrap_ci,
    sequence_differences,
    sequence_note,
)

# the names before ``stats``, ``runs``, ``recitation`` and ``case_studies`` were split off this
# module, still importable from it for one release
__all__ = [
    "ANSWER_DIVERSITY",
    "CUTS",
    "METRICS",
    "add_reading_arguments",
    "bootstrap_ci",
    "case_studies",
    "hierarchical_bootstrap_ci",
    "load_cases",
    "load_run",
    "model_token_spans",
    "multi_report",
    "multi_table",
    "paired_report",
    "paired_table",
    "recitation_report",
    "recitation_table",
    "run_model_name",
    "sequence_differences",
    "sequence_note",
]


def _composition_line(label: str, comp: Mapping[str, int]) -> str:
    k, n = comp["composed"], comp["all_hops"]
    share = f" ({100 * k / n:.0f}%)" if n else ""
    return (
        f"{label}: every single hop answered in {n} of {comp['cases']} cases; "
        f"the multi-hop question too in {k} of those {n}{share}"
    )


def paired_report(
    dir_a: str | Path,
    dir_b: str | Path,
    *,
    resamples: int = 10000,
    seed: int = 0,
    runs: tuple[tuple[str, dict], tuple[str, dict]] | None = None,
) -> dict:
    """Per-metric paired comparison of run B against run A on the cases both finished (values in
    percent).

    ``runs``: the two directories' ``load_run`` results when the caller already has them.
    """
    (bench_a, recs_a), (bench_b, recs_b) = runs or (load_run(dir_a), load_run(dir_b))
    if bench_a != bench_b:
        raise ValueError(
            f"{dir_a} is a {bench_a} run but {dir_b} is a "
            f"{bench_b} run; compare runs of one benchmark"
        )
    common = sorted(set(recs_a) & set(recs_b), key=lambda c: (len(c), c))
    if not common:
        raise ValueError(f"{dir_a} and {dir_b} have no finished case in common")
    metrics = METRICS[bench_a]
    a = [record_values(recs_a[c], metrics) for c in common]
    b = [record_values(recs_b[c], metrics) for c in common]
    out: dict[str, Any] = {
        "benchmark": bench_a,
        "a": str(dir_a),
        "b": str(dir_b),
        "n_cases": len(common),
        "only_in_a": len(recs_a) - len(common),
        "only_in_b": len(recs_b) - len(common),
        "cases": common,
        "metrics": {},
    }
    from ..tasks.metrics import stepin_rate_by_round

    out["stepin_rate_by_round"] = {
        "a": stepin_rate_by_round([recs_a[c] for c in common]),
        "b": stepin_rate_by_round([recs_b[c] for c in common]),
    }
    task = TASKS[bench_a]
    comp_a, comp_b = (
        task.composition([recs_a[c] for c in common]),
        task.composition([recs_b[c] for c in common]),
    )
    if comp_a is not None:
        out["composition_given_hops"] = {"a": comp_a, "b": comp_b}
    extra = [ANSWER_DIVERSITY] if all(ANSWER_DIVERSITY in v for v in (*a, *b)) else []
    sequences = _sequences(recs_a, recs_b, common)
    for m in (*metrics, "Avg", *extra):
        xa, xb = [100 * v[m] for v in a], [100 * v[m] for v in b]
        diff = [y - x for x, y in zip(xa, xb)]
        lo, hi = bootstrap_ci(diff, resamples=resamples, seed=seed)
        out["metrics"][m] = {
            "a": average(xa),
            "b": average(xb),
            "diff": average(diff),
            "diff_ci95": [lo, hi],
            "a_ci95": list(bootstrap_ci(xa, resamples=resamples, seed=seed)),
            "b_ci95": list(bootstrap_ci(xb, resamples=resamples, seed=seed)),
            "b_wins": sum(d > 1e-9 for d in diff),
            "ties": sum(abs(d) <= 1e-9 for d in diff),
            "b_losses": sum(d < -1e-9 for d in diff),
        }
        if m == "Avg" and sequences:
            out["metrics"][m]["sequences"] = (
                sequence_differences(diff, sequences, resamples=resamples, seed=seed)
                if sequences != "differ"
                else "differ"
            )
    return out


def _sequences(
    recs_a: Mapping[str, Mapping], recs_b: Mapping[str, Mapping], common: Sequence[str]
) -> list[Any] | str | None:
    """The sequence (``block``) each common case was edited in, where a run edited them in
    sequences (continual editing): run A's, else run B's; "differ" when both did, in other
    sequences; None when neither did (single editing)."""
    cut = [
        [recs[c].get("block") for c in common]
        for recs in (recs_a, recs_b)
        if all(recs[c].get("block") is not None for c in common)
    ]
    if not cut:
        return None
    return cut[0] if all(c == cut[0] for c in cut) else "differ"


def _sequence_line(avg: Mapping[str, Any], label: str) -> str | None:
    """The line under a table on an Avg difference's sequences (None: single editing)."""
    seq = avg.get("sequences")
    if not seq:
        return None
    if seq == "differ":
        return (
            f"{label}: the two runs edited these cases in different sequences; no interval over "
            "sequences applies"
        )
    return f"{label}: {sequence_note(seq)}"


def paired_table(report: Mapping[str, Any], label_a: str = "A", label_b: str = "B") -> str:
    """Markdown: one row per metric, means with 95% intervals, the paired difference and
    win/tie/loss."""
    lines = [
        f"{report['benchmark']}, {report['n_cases']} cases "
        f"in both runs (A = {report['a']}, B = {report['b']})" + scoring_note(report),
        "",
    ]
    head = ["metric", label_a, label_b, f"{label_b} - {label_a} (95% CI)"]
    lines += md_table(
        [*head, f"{label_b} wins / ties / losses"],
        (
            [
                m,
                f"{r['a']:.1f} [{r['a_ci95'][0]:.1f}, {r['a_ci95'][1]:.1f}]",
                f"{r['b']:.1f} [{r['b_ci95'][0]:.1f}, {r['b_ci95'][1]:.1f}]",
                f"{r['diff']:+.1f} [{r['diff_ci95'][0]:+.1f}, {r['diff_ci95'][1]:+.1f}]",
                f"{r['b_wins']} / {r['ties']} / {r['b_losses']}",
            ]
            for m, r in report["metrics"].items()
        ),
        "lrrrr",
    )
    if ANSWER_DIVERSITY in report["metrics"]:
        lines.append(
            f"\n{ANSWER_DIVERSITY} is a diagnostic, not a paper metric: 1 - SelfBLEU-4 among all "
            "answers of a case (near 0 when every question "
            "is answered by reciting the same passage)."
        )
    seq = _sequence_line(report["metrics"]["Avg"], f"Avg, {label_b} - {label_a}")
    if seq:
        lines.append("\nContinual editing, the cases' sequences: " + seq)
    for key, label in (("a", label_a), ("b", label_b)):
        rates = report.get("stepin_rate_by_round", {}).get(key) or []
        if any(r is not None for r in rates):
            lines.append(
                f"\n{label}: step-in rate by round "
                + ", ".join("-" if r is None else f"{100 * r:.1f}%" for r in rates)
            )
    comp = report.get("composition_given_hops")
    if comp:
        lines.append("\nComposition given the hops:")
        lines += [
            f"- {_composition_line(label, comp[key])}"
            for key, label in (("a", label_a), ("b", label_b))
        ]
    return "\n".join(lines) + "\n"


def multi_report(
    dirs: Sequence[str | Path],
    *,
    resamples: int = 10000,
    seed: int = 0,
    loaded: Sequence[tuple[str, dict]] | None = None,
) -> dict:
    """Every run against the first (the baseline) on the cases ALL runs finished: one
    ``paired_report`` each.

    ``loaded``: the directories' ``load_run`` results when the caller already has them.
    """
    if len(dirs) < 2:
        raise ValueError(
            "give at least two run directories: the baseline first, then the runs compared with it"
        )
    loaded = list(loaded) if loaded is not None else [load_run(d) for d in dirs]
    benches = {b for b, _ in loaded}
    if len(benches) > 1:
        raise ValueError(
            f"the runs mix benchmarks ({', '.join(sorted(benches))}); compare runs of one benchmark"
        )
    common = set.intersection(*(set(recs) for _, recs in loaded))
    if not common:
        raise ValueError(f"the runs {', '.join(map(str, dirs))} have no finished case in common")
    kept = [(b, {c: recs[c] for c in common}) for b, recs in loaded]
    pairs = [
        paired_report(dirs[0], d, resamples=resamples, seed=seed, runs=(kept[0], k))
        for d, k in zip(dirs[1:], kept[1:])
    ]
    return {
        "benchmark": loaded[0][0],
        "runs": [str(d) for d in dirs],
        "n_cases": len(common),
        "not_in_all": {str(d): len(recs) - len(common) for d, (_, recs) in zip(dirs, loaded)},
        "pairs": pairs,
    }


def multi_table(report: Mapping[str, Any], labels: Sequence[str]) -> str:
    """Markdown: one row per run (means with 95% intervals) and its Avg difference from the first
    run."""
    pairs = report["pairs"]
    metrics = [m for m in pairs[0]["metrics"] if all(m in p["metrics"] for p in pairs)]
    base = labels[0]
    lines = [
        f"{report['benchmark']}, {report['n_cases']} cases finished by all {len(labels)} runs"
        + scoring_note(report),
        "",
    ]

    def cell(r: Mapping[str, Any], side: str) -> str:
        lo, hi = r[f"{side}_ci95"]
        return f"{r[side]:.1f} [{lo:.1f}, {hi:.1f}]"

    body = [[base, *(cell(pairs[0]["metrics"][m], "a") for m in metrics), "", ""]]
    for label, p in zip(labels[1:], pairs):
        avg = p["metrics"]["Avg"]
        body.append(
            [
                label,
                *(cell(p["metrics"][m], "b") for m in metrics),
                f"{avg['diff']:+.1f} [{avg['diff_ci95'][0]:+.1f}, {avg['diff_ci95'][1]:+.1f}]",
                f"{avg['b_wins']} / {avg['ties']} / {avg['b_losses']}",
            ]
        )
    head = ["run", *metrics, f"Avg - {base} (95% CI)", f"wins / ties / losses vs {base}"]
    lines += md_table(head, body, "l" + "r" * (len(metrics) + 2))
    seqs = [
        _sequence_line(p["metrics"]["Avg"], f"{label} - {base}")
        for label, p in zip(labels[1:], pairs)
    ]
    if any(seqs):
        lines += ["", "Continual editing, the cases' sequences (Avg):"]
        lines += [f"- {line}" for line in seqs if line]
    rates = [(base, pairs[0]["stepin_rate_by_round"]["a"])] + [
        (label, p["stepin_rate_by_round"]["b"]) for label, p in zip(labels[1:], pairs)
    ]
    shown = [(label, r) for label, r in rates if any(x is not None for x in r or [])]
    if shown:
        lines.append("")
    for label, r in shown:
        lines.append(
            f"- {label}: step-in rate by round "
            + ", ".join("-" if x is None else f"{100 * x:.1f}%" for x in r)
        )
    if "composition_given_hops" in pairs[0]:
        comps = [(base, pairs[0]["composition_given_hops"]["a"])] + [
            (label, p["composition_given_hops"]["b"]) for label, p in zip(labels[1:], pairs)
        ]
        lines += ["", "Composition given the hops:"] + [
            f"- {_composition_line(label, c)}" for label, c in comps
        ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ recitation diagnostics


def _rescored(
    loaded: list[tuple[str, dict]], data_dir: str | None, whole_word_max: int
) -> list[tuple[str, dict]]:
    """``loaded`` with every record rescored by its task's ``rescore(..., whole_word_max=...)``
    against the data under ``data_dir``; only tasks that ``rescores_aliases`` (MQuAKE-uns) have
    aliases to rescore."""
    from ..tasks.datasets import DataError, default_data_dir

    if any(not TASKS[bench].rescores_aliases for bench, _ in loaded):
        able = [t for t in TASKS.values() if t.rescores_aliases]
        raise ValueError(
            f"--whole-word-aliases rescores {' / '.join(t.title for t in able)} answers; these "
            f"runs are not all {' / '.join(t.name for t in able)} runs"
        )
    task = TASKS[loaded[0][0]]
    try:
        cases = {str(c["case_id"]): c for c in task.load_cases(data_dir or default_data_dir())}
    except DataError as err:
        raise ValueError(
            f"--whole-word-aliases needs the {task.title} data the runs used: {err}"
        ) from None
    return [
        (bench, task.rescore(recs, cases, whole_word_max=whole_word_max)) for bench, recs in loaded
    ]


def _recitation(args: argparse.Namespace, loaded: Sequence[tuple[str, dict]]) -> dict:
    benchmark = loaded[0][0]
    cases = load_cases(benchmark, args.data, "--recitation")
    spans, kind = model_token_spans(run_model_name(args.runs))
    return recitation_report(
        args.runs,
        loaded,
        cases,
        tokens=args.recitation_tokens,
        token_spans=spans,
        token_kind=kind,
        whole_word_max=args.whole_word_aliases,
        resamples=args.resamples,
    )


def _parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m benchmarks paired", description=__doc__.split("\n")[0])
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="run directories: the baseline first (e.g. "
        "runs/mq-lora), then one or more runs compared with it",
    )
    parser.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="NAME",
        help="row/column label of each RUN, in order (repeat; default: the directory names)",
    )
    parser.add_argument(
        "--label-a", help="with two runs: label of the first (same as the first --label)"
    )
    parser.add_argument("--label-b", help="with two runs: label of the second")
    add_reading_arguments(parser)
    parser.add_argument(
        "--out", help="also write the report as JSON here (refuses to overwrite an existing file)"
    )
    parser.add_argument(
        "--plot",
        metavar="PNG",
        help="also plot every run's mean step-in rate per round (common cases)",
    )
    parser.add_argument(
        "--show",
        type=int,
        default=0,
        metavar="N",
        help="two runs only: also print the N cases where they "
        "differ most: questions, expected and both answers",
    )
    parser.add_argument(
        "--before",
        metavar="RUN",
        help="with --show: a third run (e.g. the UNEDITED "
        "reference) whose answers form the first column",
    )
    parser.add_argument(
        "--before-label", default="before", help="column label of --before (default: before)"
    )
    parser.add_argument(
        "--data",
        help="data directory the runs used, for --show and --whole-word-aliases "
        "(default: $HPSE_DATA_DIR or ../shared/data)",
    )
    parser.add_argument(
        "--cases",
        type=lambda v: [c.strip() for c in v.split(",") if c.strip()],
        metavar="ID,ID,...",
        help="compare on these case ids only (those every run finished), e.g. the MQuAKE-uns "
        "cases with two or more edits",
    )
    parser.add_argument(
        "--whole-word-aliases",
        type=int,
        default=0,
        metavar="N",
        help="MQuAKE-uns: rescore the stored answers so that aliases of at most N characters must "
        "match as whole words (3 stops 'de' matching inside 'despite'); a diagnostic, default 0 = "
        "the official substring check",
    )
    parser.add_argument(
        "--recitation",
        action="store_true",
        help="also print the recitation diagnostics: every stored answer rescored cut to its "
        "first sentence and to its first --recitation-tokens tokens, with the share of each "
        "official score kept (needs --data; no model time)",
    )
    parser.add_argument(
        "--recitation-tokens",
        type=int,
        default=32,
        metavar="N",
        help="with --recitation: the token cut (default 32 tokens of the runs' model tokenizer)",
    )
    return parser


def _checked_labels(parser: OneLineParser, args: Any) -> list[str]:
    """The label of each run; a combination of options that does not fit is a one-line error."""
    if args.recitation_tokens < 1:
        parser.error(f"--recitation-tokens {args.recitation_tokens}: give a number of tokens >= 1")
    if len(args.runs) < 2:
        parser.error("give at least two run directories (the baseline first)")
    labels = list(args.label) or [Path(r).name for r in args.runs]
    if len(args.runs) == 2:
        labels = [
            args.label_a or labels[0],
            args.label_b or (labels[1] if len(labels) > 1 else Path(args.runs[1]).name),
        ]
    elif args.label_a or args.label_b:
        parser.error("--label-a/--label-b are for two runs; with more, give one --label per run")
    if len(labels) != len(args.runs):
        parser.error(f"{len(labels)} --label for {len(args.runs)} runs; give one per run or none")
    if args.before and not args.show:
        parser.error("--before adds a column to the --show case studies; pass --show N too")
    if args.show and len(args.runs) > 2:
        parser.error(
            "--show compares two runs; pass the two runs whose answers you want side by side"
        )
    if args.out and Path(args.out).exists():
        parser.error(f"--out {args.out} exists; choose a new file")
    if args.whole_word_aliases < 0:
        parser.error(
            f"--whole-word-aliases {args.whole_word_aliases}: "
            "give a length >= 0 (0 = the official check)"
        )
    return labels


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    labels = _checked_labels(parser, args)
    try:
        loaded = [load_run(r) for r in args.runs]
        if args.cases is not None:
            if not args.cases:
                raise ValueError(
                    "--cases names no case id; give comma-separated ids, e.g. --cases 6,24,68"
                )
            wanted = set(args.cases)
            loaded = [
                (bench, {c: rec for c, rec in recs.items() if c in wanted})
                for bench, recs in loaded
            ]
        if args.whole_word_aliases:
            loaded = _rescored(loaded, args.data, args.whole_word_aliases)
        if len(args.runs) == 2:
            runs = (loaded[0], loaded[1])
            report = paired_report(args.runs[0], args.runs[1], resamples=args.resamples, runs=runs)
            report["whole_word_aliases"] = args.whole_word_aliases
            series = {
                labels[0]: report["stepin_rate_by_round"]["a"],
                labels[1]: report["stepin_rate_by_round"]["b"],
            }
            print(paired_table(report, *labels), end="")
        else:
            report = multi_report(args.runs, resamples=args.resamples, loaded=loaded)
            report["whole_word_aliases"] = args.whole_word_aliases
            series = {labels[0]: report["pairs"][0]["stepin_rate_by_round"]["a"]}
            series.update(
                {lab: p["stepin_rate_by_round"]["b"] for lab, p in zip(labels[1:], report["pairs"])}
            )
            print(multi_table(report, labels), end="")
        if args.recitation:
            report["recitation"] = _recitation(args, loaded)
            print("\n" + recitation_table(report["recitation"], labels), end="")
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.plot:
        from .plots import plot_stepin_rates

        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        plot_stepin_rates(
            series,
            args.plot,
            title=f"Step-in rate per round, {report['benchmark']}, {report['n_cases']} cases",
        )
        print(f"wrote {args.plot}")
    if args.show:
        from ..tasks.datasets import DataError, default_data_dir

        try:
            before = (args.before_label, load_run(args.before)[1]) if args.before else None
            print(
                "\n"
                + case_studies(
                    report,
                    args.data or default_data_dir(),
                    args.show,
                    label_a=labels[0],
                    label_b=labels[1],
                    records=(runs[0][1], runs[1][1]),
                    before=before,
                )
            )
        except (DataError, FileNotFoundError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    if args.out:
        write_new_json(args.out, report)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
