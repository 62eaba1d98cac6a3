"""Continual editing, as the paper reports it: each executor without and with HPSE at each sequence
length T.

Reads finished run directories of ``--sequential T`` runs (no model time) given as pairs, the
executor alone then the same executor with HPSE, at the same T on the same cases (a single-editing
run is T = 1, the reference the paper's figure starts from; ``DIR@N`` is a ``--checkpoints`` run
after N edits of each sequence, so one T = 100 pair with checkpoints 10,20,50 gives four T):

    python -m benchmarks continual runs/mq-seq10-lora runs/mq-seq10-hpse \\
        runs/mq-seq20-lora runs/mq-seq20-hpse --name LoRA --png docs/img/continual.png

Prints one markdown table: per run its T, sequences, cases, the task's metrics and Avg over all
cases, Avg of each sequence (the spread between sequences), and for a +HPSE row its paired
difference in Avg from the executor alone with two 95% bootstrap intervals of the mean: one that
resamples cases as if independent, and one that resamples sequences, then cases within them
(``benchmarks.analysis.paired.hierarchical_bootstrap_ci``: the cases of one sequence share one
edited model), beside the difference in each sequence; with one sequence no interval between
sequences exists and the table says so. ``--unke`` (UnKEBench) adds UnKE's own judge-free metrics
beside the judge's, with their paired differences. ``--png`` draws the paper's layout: per metric
and T, the executor's bar filled and the +HPSE bar outlined over it. ``--first N`` (one per pair, or
``all``) reports a pair on its runs' first N cases only, e.g. the single-editing runs on the cases
of the sequences after they have gone on to more cases.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Callable, Mapping, Sequence

from hpse_easyedit.cli import OneLineParser, run_cli
from hpse_easyedit.errors import UsageError, check_positive

from ..markdown import md_table
from ..tasks.task import TASKS
from .recitation import CUTS
from .runs import add_reading_arguments

__all__ = [
    "UNKE_COLUMNS",
    "check_whole_sequences",
    "continual_rows",
    "continual_table",
    "main",
    "plot_continual",
    "run_row",
]

#: UnKE's own judge-free metrics in the table and the figure with ``--unke`` (``benchmarks.
#: unke_scores``): (column, group, metric) in percent
UNKE_COLUMNS = (
    ("Ori BLEU", "Original", "BLEU SCORE"),
    ("Ori R-L", "Original", "ROUGE-L"),
    ("Sub R-L", "Sub", "ROUGE-L"),
)
UNKE_NOTE = (
    "Ori BLEU, Ori R-L, Sub R-L: UnKE's own metrics, judge-free "
    "(benchmarks.analysis.unke_metrics): the answer to the original question against the whole "
    "passage by nltk's BLEU over characters and by ROUGE-L recall, and each sub-question's answer "
    "against its gold sub-answer by ROUGE-L recall."
)


def _run(path: str) -> tuple[str, int, dict[str, dict]]:
    """(benchmark, T, {case_id: record}) of a run directory, or of ``DIR@N``: the run's checkpoint
    after N edits of each sequence (``--checkpoints``), which is T = N."""
    from ..records.sequence import split_checkpoint
    from .runs import load_run

    run_dir, checkpoint = split_checkpoint(path)
    benchmark, recs = load_run(path)
    if checkpoint is not None:
        return benchmark, checkpoint, recs
    config = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    return benchmark, int(config.get("sequential") or 1), recs  # a single-editing run is T = 1


def _case_avg(task, rec: Mapping) -> float:
    return 100.0 * sum(float(rec[m]) for m in task.metrics) / len(task.metrics)


def _first(recs: dict[str, dict], n: int | None) -> dict[str, dict]:
    """The run's first ``n`` cases in data order (all of them when ``n`` is None)."""
    if n is None:
        return recs
    return dict(sorted(recs.items(), key=lambda kv: kv[1].get("index", 0))[:n])


def check_whole_sequences(n: int, T: int, path: str) -> None:
    """``UsageError`` unless ``--first n`` keeps whole sequences of ``T`` cases of the run at
    ``path`` (``continual`` and ``variants``)."""
    if n % T:
        raise UsageError(
            f"--first {n} cuts a sequence of {T} cases of {path}; give a multiple of {T}"
        )


def _per_sequence_metrics(task, records: Sequence[Mapping], T: int) -> dict[str, list[float]]:
    """Each metric (and Avg) of each sequence: the records in data order, ``T`` to a sequence."""
    summaries = [task.summarize(records[i : i + T]) for i in range(0, len(records), T)]
    return {m: [s[m] for s in summaries] for m in [*task.metrics, "Avg"]}


def run_row(task, label: str, T: int, recs: Mapping[str, Mapping], ids: Sequence[str]) -> dict:
    """One run's row on the cases ``ids`` (in data order, ``T`` to a sequence): its label, T,
    sequences, cases, the task's metrics and Avg, the Avg of each sequence and each metric of each
    sequence."""
    records = [recs[c] for c in ids]
    summary = task.summarize(records)
    per_sequence = _per_sequence_metrics(task, records, T)
    return {
        "label": label,
        "benchmark": task.name,
        "T": T,
        "sequences": len(per_sequence["Avg"]),
        "cases": len(ids),
        **{m: summary[m] for m in task.metrics},
        "Avg": summary["Avg"],
        "per_sequence": per_sequence["Avg"],
        "per_sequence_metrics": per_sequence,
    }


def continual_rows(
    pairs: Sequence[tuple[str, str]],
    names: Sequence[str],
    *,
    resamples: int = 10000,
    seed: int = 0,
    first: Sequence[int | None] | None = None,
    recitation: Callable[[Sequence[str], list[tuple[str, dict]]], dict] | None = None,
    per_metric: bool = False,
    unke: Callable[[str, tuple[str, dict]], dict[str, dict]] | None = None,
) -> list[dict]:
    """One dict per run of each (executor alone, executor + HPSE) pair: its label, T, sequences,
    cases, metrics, Avg per sequence and, for the +HPSE run, the paired Avg difference with its
    interval.

    ``first``: per pair, report only its runs' first N cases in data order (None: all of them), e.g.
    the single-editing runs on the cases of the sequences when they have gone on to more cases.
    ``recitation``: ``(run dirs, [(benchmark, records), ...]) ->
    benchmarks.analysis.paired.recitation_report``; with it the +HPSE row also holds its paired
    difference with every answer cut (``cut_diffs``: cut -> Avg_diff). ``per_metric``: the +HPSE row
    also holds the paired difference of each metric (``metric_diffs``: metric -> (mean, interval)).
    ``unke``: ``(run dir, (benchmark, records)) -> {case id:
    benchmarks.tasks.unke_scores.case_metrics}``; with it every row also holds UnKE's
    ``UNKE_COLUMNS`` (overall and per sequence) and the +HPSE row their paired differences
    (``unke_diffs``: column -> (mean, interval))."""
    from .stats import bootstrap_ci, sequence_differences

    rows = []
    for (base, hpse), name, n in zip(pairs, names, first or [None] * len(pairs)):
        (b_bench, b_T, b_recs), (h_bench, h_T, h_recs) = _run(base), _run(hpse)
        if (b_bench, b_T) != (h_bench, h_T):
            raise UsageError(
                f"{base} ({b_bench}, T={b_T}) and {hpse} ({h_bench}, T={h_T}) differ; a pair is "
                "one benchmark at one T"
            )
        if n is not None:
            check_whole_sequences(n, b_T, base)
            if min(len(b_recs), len(h_recs)) < n:
                raise UsageError(
                    f"--first {n}: {base} holds {len(b_recs)} cases and {hpse} {len(h_recs)}; "
                    f"finish both runs on at least --limit {n}"
                )
            b_recs, h_recs = _first(b_recs, n), _first(h_recs, n)
        if set(b_recs) != set(h_recs):
            raise UsageError(
                f"{base} and {hpse} hold different cases ({len(b_recs)} vs {len(h_recs)}); "
                "finish both runs on the same --limit"
            )
        task = TASKS[b_bench]
        ids = sorted(b_recs, key=lambda c: b_recs[c].get("index", 0))
        judge_free = (
            [_unke_values(unke(d, (b_bench, r)), ids) for d, r in ((base, b_recs), (hpse, h_recs))]
            if unke is not None
            else None
        )
        for label, recs in ((name, b_recs), (f"{name} + HPSE", h_recs)):
            row = {**run_row(task, label, b_T, recs, ids), "hpse": recs is h_recs}
            if judge_free is not None:
                values = judge_free[recs is h_recs]
                for col, v in values.items():
                    row[col] = sum(v) / len(v)
                    row["per_sequence_metrics"][col] = [
                        sum(v[i : i + b_T]) / len(v[i : i + b_T]) for i in range(0, len(v), b_T)
                    ]
                if recs is h_recs:
                    row["unke_diffs"] = {
                        col: _paired(
                            [h - b for h, b in zip(values[col], judge_free[0][col])],
                            resamples,
                            seed,
                        )
                        for col in values
                    }
            if recs is h_recs:
                diff = [_case_avg(task, h_recs[c]) - _case_avg(task, b_recs[c]) for c in ids]
                row["diff"] = sum(diff) / len(diff)
                row["diff_ci"] = list(bootstrap_ci(diff, resamples=resamples, seed=seed))
                if b_T > 1:  # the cases of one sequence share one edited model
                    row["diff_sequences"] = sequence_differences(
                        diff, [i // b_T for i in range(len(ids))], resamples=resamples, seed=seed
                    )
                if per_metric:
                    row["metric_diffs"] = {
                        m: _paired(
                            [100.0 * (float(h_recs[c][m]) - float(b_recs[c][m])) for c in ids],
                            resamples,
                            seed,
                        )
                        for m in task.metrics
                    }
                if recitation is not None:
                    report = recitation([base, hpse], [(b_bench, b_recs), (h_bench, h_recs)])
                    row["cut_diffs"] = {
                        cut: rows_[1]["Avg_diff"]
                        for cut, rows_ in report["cuts"].items()
                        if cut != CUTS[0] and "Avg_diff" in rows_[1]
                    }
            rows.append(row)
    return rows


def _unke_values(per_case: Mapping[str, Mapping], ids: Sequence[str]) -> dict[str, list[float]]:
    """Each of ``UNKE_COLUMNS`` of the cases ``ids``, in order, in percent."""
    return {
        col: [100.0 * per_case[c][group][metric] for c in ids]
        for col, group, metric in UNKE_COLUMNS
    }


def _paired(diff: Sequence[float], resamples: int, seed: int) -> tuple[float, list[float]]:
    from .stats import bootstrap_ci

    return sum(diff) / len(diff), list(bootstrap_ci(diff, resamples=resamples, seed=seed))


def _interval(mean: float, ci: Sequence[float]) -> str:
    return f"{mean:+.1f} [{ci[0]:+.1f}, {ci[1]:+.1f}]"


def continual_table(rows: Sequence[Mapping]) -> str:
    """The markdown table of ``continual_rows`` (and the notes under it)."""
    metrics = TASKS[rows[0]["benchmark"]].metrics
    cuts = list(dict.fromkeys(c for r in rows for c in r.get("cut_diffs", {})))
    per_metric = [m for m in metrics if any(m in r.get("metric_diffs", {}) for r in rows)]
    judge_free = [c for c, _, _ in UNKE_COLUMNS if all(c in r for r in rows)]
    head = [
        "method",
        "T",
        "sequences",
        "cases",
        *metrics,
        "Avg",
        *judge_free,
        "Avg per sequence",
        "paired Δ Avg vs executor [95% CI]",
        "Δ Avg per sequence",
        "Δ Avg, sequences then cases resampled [95% CI]",
        *(f"paired Δ {m} [95% CI]" for m in per_metric),
        *(f"paired Δ {c} [95% CI]" for c in judge_free),
        *(f"Δ Avg, answers cut to {c}" for c in cuts),
    ]
    body = []
    for r in rows:
        diff = _interval(r["diff"], r["diff_ci"]) if "diff" in r else ""
        per_sequence = (
            ", ".join(f"{v:.1f}" for v in r["per_sequence"]) if r["T"] > 1 else "(single editing)"
        )
        cut_cells = [
            _interval(d["diff"], d["ci95"]) if d else ""
            for d in (r.get("cut_diffs", {}).get(c) for c in cuts)
        ]
        cells = [
            r["label"],
            str(r["T"]),
            str(r["sequences"]),
            str(r["cases"]),
            *(f"{r[m]:.1f}" for m in metrics),
            f"{r['Avg']:.1f}",
            *(f"{r[c]:.1f}" for c in judge_free),
            per_sequence,
            diff,
            *_sequence_cells(r),
            *(
                _interval(*r["metric_diffs"][m]) if m in r.get("metric_diffs", {}) else ""
                for m in per_metric
            ),
            *(
                _interval(*r["unke_diffs"][c]) if c in r.get("unke_diffs", {}) else ""
                for c in judge_free
            ),
            *cut_cells,
        ]
        body.append(cells)
    align = (
        "lrrr"
        + "r" * (len(metrics) + 1 + len(judge_free))
        + "llll"
        + "l" * (len(per_metric) + len(judge_free) + len(cuts))
    )
    lines = md_table(head, body, align)
    if any("diff_sequences" in r for r in rows):
        lines += [
            "",
            "Two intervals for each + HPSE row: the paired one resamples cases as if independent; "
            "the other resamples sequences, then cases within them (the cases of a sequence share "
            "one edited model)."
            + (
                " With one sequence no between-sequence interval exists: the paired interval is "
                "over that sequence's cases only."
                if any(
                    r.get("diff_sequences") and r["diff_sequences"]["ci95"] is None for r in rows
                )
                else ""
            ),
        ]
    if judge_free:
        lines += ["", UNKE_NOTE]
    return "\n".join(lines)


def _sequence_cells(row: Mapping) -> list[str]:
    """A + HPSE row's Avg difference per sequence and its interval over sequences, then cases."""
    if "diff" not in row:
        return ["", ""]
    seq = row.get("diff_sequences")
    if seq is None:
        return ["(single editing)", "(single editing)"]
    per = ", ".join(f"{d:+.1f}" for d in seq["per_sequence"])
    if seq["ci95"] is None:
        return [per, "none: one sequence"]
    return [per, _interval(row["diff"], seq["ci95"])]


def plot_continual(rows: Sequence[Mapping], path: str | os.PathLike) -> None:
    """The paper's bar chart: per metric (one panel each, UnKE's judge-free ``UNKE_COLUMNS`` after
    the task's where the rows hold them) and T, the executor's bar filled, +HPSE outlined; where a
    T has several sequences, a whisker spans their range of the metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    judge_free = [c for c, _, _ in UNKE_COLUMNS if all(c in r for r in rows)]
    metrics = [*TASKS[rows[0]["benchmark"]].metrics, "Avg", *judge_free]
    executors = list(dict.fromkeys(r["label"] for r in rows if not r["hpse"]))
    Ts = sorted({r["T"] for r in rows})
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    # the judge's panels on the first line, UnKE's judge-free ones on a second
    lines = [metrics[: len(metrics) - len(judge_free)], judge_free] if judge_free else [metrics]
    cols = max(len(line) for line in lines)
    fig, axes = plt.subplots(
        len(lines), cols, figsize=(3.2 * cols, 3.0 * len(lines)), squeeze=False
    )
    for i, line in enumerate(lines):
        for ax in axes[i][len(line) :]:
            ax.set_visible(False)
    width = 0.5 / max(len(executors), 1)
    for ax, metric in [(axes[i][j], m) for i, line in enumerate(lines) for j, m in enumerate(line)]:
        labelled: set[str] = set()  # each executor's legend entry once, at its first bar
        for e, name in enumerate(executors):
            for t, T in enumerate(Ts):
                x = t + (e - (len(executors) - 1) / 2) * width
                base = next((r for r in rows if r["label"] == name and r["T"] == T), None)
                hpse = next(
                    (r for r in rows if r["label"] == f"{name} + HPSE" and r["T"] == T), None
                )
                if base is not None:
                    ax.bar(
                        x,
                        base[metric],
                        width * 0.9,
                        color=colours[e % len(colours)],
                        alpha=0.8,
                        label=name if name not in labelled else None,
                    )
                if hpse is not None:
                    ax.bar(
                        x,
                        hpse[metric],
                        width * 0.9,
                        fill=False,
                        edgecolor=colours[e % len(colours)],
                        linewidth=2,
                        label=f"{name} + HPSE" if f"{name} + HPSE" not in labelled else None,
                    )
                labelled |= {r["label"] for r in (base, hpse) if r is not None}
                for row, dx in ((base, -0.15), (hpse, 0.15)):  # the sequences' range, where several
                    spread = (row or {}).get("per_sequence_metrics", {}).get(metric, [])
                    if row is not None and row["T"] > 1 and len(spread) > 1:
                        ax.errorbar(
                            x + dx * width,
                            row[metric],
                            yerr=[[row[metric] - min(spread)], [max(spread) - row[metric]]],
                            fmt="none",
                            ecolor="black" if row is base else colours[e % len(colours)],
                            capsize=2,
                            linewidth=1,
                        )
        ax.set_xticks(range(len(Ts)), [str(T) for T in Ts])
        ax.set_xlabel("T (1: single editing)")
        ax.set_xlim(-0.6, len(Ts) - 0.4)
        ax.set_title(f"{metric} (UnKE, judge-free)" if metric in judge_free else metric)
        ax.set_ylim(0, 100)
    for row in axes:
        row[0].set_ylabel("score (%)")
    axes[0][len(lines[0]) - 1].legend(fontsize=8, loc="upper right")
    fig.suptitle(
        f"Continual editing, {TASKS[rows[0]['benchmark']].title}: executor filled, + HPSE "
        "outlined; whiskers: the range of the sequences where T has several",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _recitation(args) -> Callable[[Sequence[str], list[tuple[str, dict]]], dict]:
    """The recitation report of ``benchmarks.analysis.paired`` for one pair, the data and tokenizer
    loaded once."""
    from .recitation import model_token_spans, recitation_report
    from .runs import load_cases, run_model_name

    loaded: dict[str, dict] = {}
    spans, kind = model_token_spans(run_model_name(args.runs))

    def report(dirs: Sequence[str], runs: list[tuple[str, dict]]) -> dict:
        benchmark = runs[0][0]
        if benchmark not in loaded:
            loaded[benchmark] = load_cases(benchmark, args.data, "--recitation")
        return recitation_report(
            dirs,
            runs,
            loaded[benchmark],
            tokens=args.recitation_tokens,
            token_spans=spans,
            token_kind=kind,
            resamples=args.resamples,
        )

    return report


def _unke(args) -> Callable[[str, tuple[str, dict]], dict[str, dict]]:
    """UnKE's metrics of each case of a loaded run, the UnKEBench data loaded once."""
    from .runs import load_cases
    from .unke_metrics import case_values

    cases = load_cases("unkebench", args.data, "--unke")
    return lambda run_dir, run: case_values(run_dir, run, cases)


def _parse_first(value: str) -> int | None:
    if value == "all":
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"--first {value!r}: give a positive number of cases or 'all'")
    return n


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(_main, sys.argv[1:] if argv is None else argv)


def _main(argv: Sequence[str]) -> int:
    parser = OneLineParser(
        prog="python -m benchmarks continual", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="run directories in pairs: the executor alone, then the same executor with HPSE "
        "(same T, cases); DIR@N is a run's checkpoint "
        "after N edits of each sequence (--checkpoints)",
    )
    parser.add_argument(
        "--name",
        action="append",
        default=[],
        help="the executor of each pair, in order (default: LoRA for every pair)",
    )
    parser.add_argument(
        "--first",
        action="append",
        default=[],
        metavar="N|all",
        help="per pair, in order: report only its runs' first N cases in data order (a multiple of "
        "its T), or all of them (default: all, for every pair)",
    )
    parser.add_argument(
        "--recitation",
        action="store_true",
        help="add each +HPSE row's paired difference with every answer cut to its first sentence "
        "and to its first --recitation-tokens tokens (benchmarks.analysis.paired --recitation; "
        "reads --data and the runs' tokenizer)",
    )
    parser.add_argument(
        "--recitation-tokens",
        type=int,
        default=32,
        metavar="N",
        help="with --recitation: the token cut (default 32)",
    )
    parser.add_argument(
        "--unke",
        action="store_true",
        help="UnKEBench: add UnKE's own judge-free metrics (Ori BLEU, Ori R-L, Sub R-L, from the "
        "stored answers and --data) beside the judge's, each +HPSE row's paired difference in "
        "them, and their panels to --png",
    )
    parser.add_argument(
        "--data",
        help="with --recitation or --unke: the data directory the runs used "
        "(default: $HPSE_DATA_DIR or ../shared/data)",
    )
    parser.add_argument(
        "--per-metric",
        action="store_true",
        help="add each +HPSE row's paired difference in every metric, with its interval",
    )
    parser.add_argument("--png", metavar="FILE", help="write the bar chart here")
    add_reading_arguments(parser)
    args = parser.parse_args(argv)
    check_positive("--resamples", args.resamples)
    if len(args.runs) % 2:
        raise UsageError(
            f"{len(args.runs)} run directories; give them "
            "in pairs (executor alone, executor + HPSE)"
        )
    pairs = list(zip(args.runs[::2], args.runs[1::2]))
    names = args.name or ["LoRA"] * len(pairs)
    if len(names) != len(pairs):
        raise UsageError(f"{len(names)} --name for {len(pairs)} pairs; give one per pair or none")
    if args.first and len(args.first) != len(pairs):
        raise UsageError(
            f"{len(args.first)} --first for {len(pairs)} "
            "pairs; give one per pair (N or all) or none"
        )
    first = [_parse_first(v) for v in args.first] if args.first else None
    check_positive("--recitation-tokens", args.recitation_tokens)
    # a run directory or the data that is not what the tool reads: one line, like
    # benchmarks.analysis.paired
    try:
        recitation = _recitation(args) if args.recitation else None
        rows = continual_rows(
            pairs,
            names,
            resamples=args.resamples,
            first=first,
            recitation=recitation,
            per_metric=args.per_metric,
            unke=_unke(args) if args.unke else None,
        )
    except ValueError as err:
        raise UsageError(str(err)) from None
    if len({r["benchmark"] for r in rows}) > 1:
        raise UsageError("the runs mix benchmarks; one table is one benchmark")
    print(continual_table(rows))
    if args.png:
        plot_continual(rows, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
