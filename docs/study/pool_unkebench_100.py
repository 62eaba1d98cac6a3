#!/usr/bin/env python
"""The "All 100 records" UnKEBench tables of docs/RESULTS.md: records 1-77 pooled with records 78-100.

Records 1-77 survive only as the summary numbers in RESULTS.md (their run directories were lost), so
they are written below; records 78-100 are read from the committed run directories. Means and
win/tie/loss counts are record-weighted sums of the two blocks. The intervals are a normal
approximation: the 77-record block's standard deviation is recovered from its bootstrap interval,
SD ~ (hi - lo) / 3.92 * sqrt(77), and combined with the 23 records' own.

    python docs/study/pool_unkebench_100.py [docs/study/unkebench-78-100]
"""

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

from benchmarks.paired import METRICS, _case_values, load_run  # noqa: E402

N1 = 77  # records 1-77, from RESULTS.md ("Records 1-77" tables)
MEANS_1 = {"Unedited": (9.7, 8.4, 89.4, 35.8), "LoRA": (97.1, 89.4, 17.9, 68.1), "LoRA + HPSE": (88.2, 83.1, 43.1, 71.5)}
OVER_UNEDITED_1 = {"LoRA": (32.3, 30.2, 34.3), "LoRA + HPSE": (35.7, 33.1, 38.0)}  # Avg: mean, lo, hi
HPSE_MINUS_LORA_1 = {  # mean, lo, hi, wins, ties, losses
    "Jnt": (-8.9, -13.1, -5.2, 6, 36, 35), "Dmp": (-6.4, -11.2, -1.6, 15, 28, 34),
    "Div": (25.3, 21.1, 29.4, 70, 0, 7), "Avg": (3.3, 1.0, 5.5, 57, 0, 20)}
COLUMNS = ("Jnt", "Dmp", "Div", "Avg")


def pooled(mean_1: float, lo_1: float, hi_1: float, xs: list[float]) -> tuple[float, float, float]:
    """Pooled mean and normal-approximation 95% interval of block 1 (summary) and block 2 (values xs)."""
    sd_1 = (hi_1 - lo_1) / 3.92 * math.sqrt(N1)
    n2 = len(xs)
    mean_2 = sum(xs) / n2
    n = N1 + n2
    mean = (N1 * mean_1 + n2 * mean_2) / n
    squares = (N1 - 1) * sd_1 ** 2 + N1 * mean_1 ** 2 + sum((x - mean_2) ** 2 for x in xs) + n2 * mean_2 ** 2
    se = math.sqrt((squares - n * mean ** 2) / (n - 1) / n)
    return mean, mean - 1.96 * se, mean + 1.96 * se


def main(root: str) -> None:
    runs = {"Unedited": "uk-unedited", "LoRA": "uk-lora", "LoRA + HPSE": "uk-hpse"}
    recs = {label: load_run(Path(root) / name)[1] for label, name in runs.items()}
    common = sorted(set.intersection(*(set(r) for r in recs.values())), key=lambda c: (len(c), c))
    vals = {label: [_case_values(recs[label][c], METRICS["unkebench"]) for c in common] for label in runs}
    n = N1 + len(common)
    print(f"UnKEBench, {N1} + {len(common)} = {n} records\n")
    print("| run | Jnt | Dmp | Div | Avg | Avg - Unedited (≈95% CI) |\n|---|---:|---:|---:|---:|---:|")
    for label in runs:
        means = [(N1 * MEANS_1[label][i] + sum(100 * v[m] for v in vals[label])) / n for i, m in enumerate(COLUMNS)]
        gain = ""
        if label in OVER_UNEDITED_1:
            xs = [100 * (b["Avg"] - a["Avg"]) for a, b in zip(vals["Unedited"], vals[label])]
            gain = "{:+.1f} [{:+.1f}, {:+.1f}]".format(*pooled(*OVER_UNEDITED_1[label], xs))
        print(f"| {label} | " + " | ".join(f"{x:.1f}" for x in means) + f" | {gain} |")
    print("\n| metric | LoRA + HPSE - LoRA (≈95% CI) | HPSE wins / ties / losses |\n|---|---:|---:|")
    for m, (mean_1, lo_1, hi_1, wins, ties, losses) in HPSE_MINUS_LORA_1.items():
        xs = [100 * (b[m] - a[m]) for a, b in zip(vals["LoRA"], vals["LoRA + HPSE"])]
        wins += sum(x > 1e-9 for x in xs)
        ties += sum(abs(x) <= 1e-9 for x in xs)
        losses += sum(x < -1e-9 for x in xs)
        print("| {} | {:+.1f} [{:+.1f}, {:+.1f}] | {} / {} / {} |".format(m, *pooled(mean_1, lo_1, hi_1, xs), wins, ties, losses))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parent / "unkebench-78-100"))
