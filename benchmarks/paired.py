"""Two runs over the same cases, compared case by case: the difference of each metric with its spread.

With 20 or 100 cases a difference of a few points between two tables can be noise. This reads the
results files of two run directories (``runs/A`` and ``runs/B``, any number of processes each),
keeps the cases both have, and reports per metric: the two means, the mean paired difference B - A
with a 95% bootstrap confidence interval (cases resampled with replacement, the same resample for
both runs), and how many cases B won, tied and lost. ``Avg`` is the per-case mean of the task's
metrics (MQuAKE-uns: Ind and Cmp; UnKEBench: Jnt, Dmp, Div), as in the paper's tables. For
MQuAKE-uns it adds ``AnsDiv``, a diagnostic outside the paper: 1 - SelfBLEU-4 among all answers of a
case, which exposes an editor that answers every question by reciting the passage.

    python -m benchmarks.paired runs/mq20-lora runs/mq20-hpse --out runs/mq20-paired.json
    python -m benchmarks.paired runs/mq20-lora runs/mq20-hpse --show 3 --data ../shared/data   # + case studies
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from .store import IncompleteRunError, merge_results

__all__ = ["bootstrap_ci", "load_run", "paired_report", "paired_table"]

METRICS = {"mquake-uns": ("Ind", "Cmp"), "unkebench": ("Jnt", "Dmp", "Div")}


def load_run(run_dir: str | Path) -> tuple[str, dict[str, dict]]:
    """(benchmark name, {case_id: record}) of a run directory; clear errors for anything else."""
    run_dir = Path(run_dir)
    config = run_dir / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{run_dir}: no config.json; pass a directory written by a benchmark run (--out DIR)")
    benchmark = json.loads(config.read_text(encoding="utf-8")).get("benchmark")
    if benchmark not in METRICS:
        raise ValueError(f"{config}: 'benchmark' is {benchmark!r}; expected one of {sorted(METRICS)}")
    try:
        return benchmark, merge_results(run_dir, None)
    except IncompleteRunError as err:  # a case recorded twice
        raise ValueError(str(err)) from None


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def bootstrap_ci(values: Sequence[float], *, resamples: int = 10000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values``."""
    if not values:
        raise ValueError("no values")
    rng = random.Random(seed)
    n = len(values)
    means = sorted(_mean([values[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    lo = means[int((1 - level) / 2 * resamples)]
    hi = means[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return lo, hi


# Not a paper metric: 1 - SelfBLEU-4 among ALL of a MQuAKE-uns case's answers. An editor that answers
# every question by reciting the passage scores near 0 here, and can still pass the substring check.
ANSWER_DIVERSITY = "AnsDiv"


def _case_values(rec: Mapping[str, Any], metrics: Sequence[str]) -> dict[str, float]:
    vals = {m: float(rec[m]) for m in metrics}
    vals["Avg"] = _mean([vals[m] for m in metrics])
    answers = rec.get("answers") or {}
    if "single_hop" in answers:
        from .metrics import diversity

        div = diversity([*answers.get("single_hop", []), *answers.get("multi_hop", [])])
        if div is not None:
            vals[ANSWER_DIVERSITY] = div
    return vals


def paired_report(dir_a: str | Path, dir_b: str | Path, *, resamples: int = 10000, seed: int = 0,
                  runs: tuple[tuple[str, dict], tuple[str, dict]] | None = None) -> dict:
    """Per-metric paired comparison of run B against run A on the cases both finished (values in percent).

    ``runs``: the two directories' ``load_run`` results when the caller already has them.
    """
    (bench_a, recs_a), (bench_b, recs_b) = runs or (load_run(dir_a), load_run(dir_b))
    if bench_a != bench_b:
        raise ValueError(f"{dir_a} is a {bench_a} run but {dir_b} is a {bench_b} run; compare runs of one benchmark")
    common = sorted(set(recs_a) & set(recs_b), key=lambda c: (len(c), c))
    if not common:
        raise ValueError(f"{dir_a} and {dir_b} have no finished case in common")
    metrics = METRICS[bench_a]
    a = [_case_values(recs_a[c], metrics) for c in common]
    b = [_case_values(recs_b[c], metrics) for c in common]
    out: dict[str, Any] = {"benchmark": bench_a, "a": str(dir_a), "b": str(dir_b), "n_cases": len(common),
                           "only_in_a": len(recs_a) - len(common), "only_in_b": len(recs_b) - len(common),
                           "cases": common,
                           "metrics": {}}
    from .runner import stepin_rate_by_round

    out["stepin_rate_by_round"] = {"a": stepin_rate_by_round([recs_a[c] for c in common]),
                                   "b": stepin_rate_by_round([recs_b[c] for c in common])}
    extra = [ANSWER_DIVERSITY] if all(ANSWER_DIVERSITY in v for v in (*a, *b)) else []
    for m in (*metrics, "Avg", *extra):
        xa, xb = [100 * v[m] for v in a], [100 * v[m] for v in b]
        diff = [y - x for x, y in zip(xa, xb)]
        lo, hi = bootstrap_ci(diff, resamples=resamples, seed=seed)
        out["metrics"][m] = {
            "a": _mean(xa), "b": _mean(xb), "diff": _mean(diff), "diff_ci95": [lo, hi],
            "a_ci95": list(bootstrap_ci(xa, resamples=resamples, seed=seed)),
            "b_ci95": list(bootstrap_ci(xb, resamples=resamples, seed=seed)),
            "b_wins": sum(d > 1e-9 for d in diff), "ties": sum(abs(d) <= 1e-9 for d in diff),
            "b_losses": sum(d < -1e-9 for d in diff),
        }
    return out


def paired_table(report: Mapping[str, Any], label_a: str = "A", label_b: str = "B") -> str:
    """Markdown: one row per metric, means with 95% intervals, the paired difference and win/tie/loss."""
    lines = [f"{report['benchmark']}, {report['n_cases']} cases in both runs (A = {report['a']}, B = {report['b']})", "",
             f"| metric | {label_a} | {label_b} | {label_b} - {label_a} (95% CI) | {label_b} wins / ties / losses |",
             "|---|---:|---:|---:|---:|"]
    for m, r in report["metrics"].items():
        lines.append(
            f"| {m} | {r['a']:.1f} [{r['a_ci95'][0]:.1f}, {r['a_ci95'][1]:.1f}] | "
            f"{r['b']:.1f} [{r['b_ci95'][0]:.1f}, {r['b_ci95'][1]:.1f}] | "
            f"{r['diff']:+.1f} [{r['diff_ci95'][0]:+.1f}, {r['diff_ci95'][1]:+.1f}] | "
            f"{r['b_wins']} / {r['ties']} / {r['b_losses']} |"
        )
    if ANSWER_DIVERSITY in report["metrics"]:
        lines.append(f"\n{ANSWER_DIVERSITY} is a diagnostic, not a paper metric: 1 - SelfBLEU-4 among all answers of a case "
                     "(near 0 when every question is answered by reciting the same passage).")
    for key, label in (("a", label_a), ("b", label_b)):
        rates = report.get("stepin_rate_by_round", {}).get(key) or []
        if any(r is not None for r in rates):
            lines.append(f"\n{label}: step-in rate by round " + ", ".join("-" if r is None else f"{100 * r:.1f}%" for r in rates))
    return "\n".join(lines) + "\n"


def _qa_rows(benchmark: str, case: Mapping[str, Any], rec_a: Mapping, rec_b: Mapping) -> list[tuple[str, str, str, str]]:
    """(question, expected, answer A, answer B) for every question of one case."""
    ans_a, ans_b = rec_a.get("answers") or {}, rec_b.get("answers") or {}
    if benchmark == "mquake-uns":
        qs = [(q, g, "single_hop", i) for i, (q, g) in enumerate(zip(case["single_hop_questions"], case["single_hop_answers"]))]
        # the multi-hop questions share one answer list: new_answer + new_answer_alias
        qs += [(q, case["multi_hop_answers"], "multi_hop", i) for i, q in enumerate(case["multi_hop_questions"])]
        return [(q, " / ".join(g[:3]), (ans_a.get(k) or [""] * (i + 1))[i], (ans_b.get(k) or [""] * (i + 1))[i])
                for q, g, k, i in qs]
    rows = [(case["question"], "(the passage)", ans_a.get("question", ""), ans_b.get("question", ""))]
    rows += [(q, g, (ans_a.get("sub_questions") or [""] * (i + 1))[i], (ans_b.get("sub_questions") or [""] * (i + 1))[i])
             for i, (q, g) in enumerate(zip(case["sub_questions"], case["sub_answers"]))]
    return rows


def case_studies(report: Mapping[str, Any], data_dir: str | Path, n: int, *, label_a: str = "A", label_b: str = "B",
                 max_chars: int = 240, records: tuple[dict, dict] | None = None) -> str:
    """Markdown for the ``n`` cases where the two runs differ most on Avg (ties broken by case order):
    every question with its expected answer and both runs' answers (cut to ``max_chars``).

    ``records``: both runs' ``{case_id: record}`` when the caller already read them.
    """
    from .datasets import load_mquake_uns, load_unkebench

    benchmark = report["benchmark"]
    recs_a, recs_b = records or (load_run(report["a"])[1], load_run(report["b"])[1])
    metrics = METRICS[benchmark]
    common = sorted(set(recs_a) & set(recs_b), key=lambda c: (len(c), c))
    gap = {c: _case_values(recs_b[c], metrics)["Avg"] - _case_values(recs_a[c], metrics)["Avg"] for c in common}
    chosen = sorted(common, key=lambda c: -abs(gap[c]))[:n]
    if benchmark == "mquake-uns":
        cases = load_mquake_uns(data_dir)
    else:
        cases = load_unkebench(data_dir, subjects="heuristic")
    by_id = {str(c["case_id"]): c for c in cases}

    def cut(text: str) -> str:
        text = " ".join(str(text).split()).replace("|", "/")
        return text if len(text) <= max_chars else text[:max_chars] + " ..."

    out = []
    for cid in chosen:
        case = by_id.get(cid)
        if case is None:
            raise ValueError(f"case {cid} of {report['a']} is not in the {benchmark} data under {data_dir}; pass the "
                             "--data directory the runs used")
        scores = " ".join(f"{m} {100 * recs_a[cid][m]:.0f} -> {100 * recs_b[cid][m]:.0f}" for m in metrics)
        out += [f"#### case {cid} ({label_a} -> {label_b}: {scores})", "",
                f"| question | expected | {label_a} | {label_b} |", "|---|---|---|---|"]
        out += [f"| {cut(q)} | {cut(g)} | {cut(x)} | {cut(y)} |" for q, g, x, y in _qa_rows(benchmark, case, recs_a[cid], recs_b[cid])]
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.paired", description=__doc__.split("\n")[0])
    parser.add_argument("run_a", help="baseline run directory (e.g. runs/mq20-lora)")
    parser.add_argument("run_b", help="run directory compared against it (e.g. runs/mq20-hpse)")
    parser.add_argument("--label-a", default="A", help="column label of run_a")
    parser.add_argument("--label-b", default="B", help="column label of run_b")
    parser.add_argument("--resamples", type=int, default=10000, help="bootstrap resamples (default 10000)")
    parser.add_argument("--out", help="also write the report as JSON here (refuses to overwrite an existing file)")
    parser.add_argument("--plot", metavar="PNG", help="also plot both runs' mean step-in rate per round (common cases)")
    parser.add_argument("--show", type=int, default=0, metavar="N",
                        help="also print the N cases where the runs differ most: questions, expected and both answers")
    parser.add_argument("--data", help="data directory the runs used, for --show (default: $HPSE_DATA_DIR or ../shared/data)")
    args = parser.parse_args(argv)
    if args.out and Path(args.out).exists():
        parser.error(f"--out {args.out} exists; choose a new file")
    try:
        runs = (load_run(args.run_a), load_run(args.run_b))
        report = paired_report(args.run_a, args.run_b, resamples=args.resamples, runs=runs)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(paired_table(report, args.label_a, args.label_b), end="")
    if args.plot:
        from .report import plot_stepin_rates

        series = {args.label_a: report["stepin_rate_by_round"]["a"], args.label_b: report["stepin_rate_by_round"]["b"]}
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        plot_stepin_rates(series, args.plot, title=f"Step-in rate per round, {report['benchmark']}, "
                                                   f"{report['n_cases']} cases")
        print(f"wrote {args.plot}")
    if args.show:
        from .datasets import DataError, default_data_dir

        try:
            print("\n" + case_studies(report, args.data or default_data_dir(), args.show, label_a=args.label_a,
                                      label_b=args.label_b, records=(runs[0][1], runs[1][1])))
        except (DataError, FileNotFoundError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1), encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
