"""Two runs over the same cases, compared case by case: the difference of each metric with its spread.

With 20 or 100 cases a difference of a few points between two tables can be noise. This reads the
results files of two run directories (``runs/A`` and ``runs/B``, any number of processes each),
keeps the cases both have, and reports per metric: the two means, the mean paired difference B - A
with a 95% bootstrap confidence interval (cases resampled with replacement, the same resample for
both runs), and how many cases B won, tied and lost. ``Avg`` is the per-case mean of the task's
metrics (MQuAKE-uns: Ind and Cmp; UnKEBench: Jnt, Dmp, Div), as in the paper's tables.

    python -m benchmarks.paired runs/mq20-lora runs/mq20-hpse --out runs/mq20-paired.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from .store import read_results, result_files

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
    records: dict[str, dict] = {}
    for path in result_files(run_dir):
        for cid, rec in read_results(path).items():
            if cid in records:
                raise ValueError(f"{run_dir}: case {cid} recorded twice ({path.name}); repair the run first")
            records[cid] = rec
    return benchmark, records


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


def _case_values(rec: Mapping[str, Any], metrics: Sequence[str]) -> dict[str, float]:
    vals = {m: float(rec[m]) for m in metrics}
    vals["Avg"] = _mean([vals[m] for m in metrics])
    return vals


def paired_report(dir_a: str | Path, dir_b: str | Path, *, resamples: int = 10000, seed: int = 0) -> dict:
    """Per-metric paired comparison of run B against run A on the cases both finished (values in percent)."""
    bench_a, recs_a = load_run(dir_a)
    bench_b, recs_b = load_run(dir_b)
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
                           "metrics": {}}
    for m in (*metrics, "Avg"):
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
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.paired", description=__doc__.split("\n")[0])
    parser.add_argument("run_a", help="baseline run directory (e.g. runs/mq20-lora)")
    parser.add_argument("run_b", help="run directory compared against it (e.g. runs/mq20-hpse)")
    parser.add_argument("--label-a", default="A", help="column label of run_a")
    parser.add_argument("--label-b", default="B", help="column label of run_b")
    parser.add_argument("--resamples", type=int, default=10000, help="bootstrap resamples (default 10000)")
    parser.add_argument("--out", help="also write the report as JSON here (refuses to overwrite an existing file)")
    args = parser.parse_args(argv)
    if args.out and Path(args.out).exists():
        parser.error(f"--out {args.out} exists; choose a new file")
    try:
        report = paired_report(args.run_a, args.run_b, resamples=args.resamples)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(paired_table(report, args.label_a, args.label_b), end="")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1), encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
