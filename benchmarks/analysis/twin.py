"""Two runs of the same configuration made two ways (e.g. one case at a time and
``--cases-at-once``), compared record by record: how many cases have identical rollouts (every
round's token ids, and the first round's alone), identical step-ins and identical answers, where the
first difference of each differing case sits, and the paired Avg difference with its 95% interval
(which must contain 0 when the two ways compute the same edits up to float rounding).

    python -m benchmarks twin docs/study/mquake-uns/mq-hpse docs/study/mquake-uns/mq-hpse-b4 \\
        --limit 20
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from hpse_easyedit.cli import OneLineParser

from ..markdown import md_table
from .runs import METRICS, load_run
from .stats import bootstrap_ci

__all__ = ["main", "twin_report", "twin_table"]


def _round_ids(rec: Mapping[str, Any]) -> list[list[list[int]]]:
    """Each round's rollout token ids per request (empty where a round drew none)."""
    return [[ro["ids"] for ro in rnd] if rnd else [] for rnd in rec.get("rollouts") or []]


def _first_difference(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """The first index where ``a`` and ``b`` differ (their common length if one is a prefix)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _rollout_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict | None:
    """Where two records' rollouts first differ: round, request and token position."""
    for r, (ra, rb) in enumerate(zip(_round_ids(a), _round_ids(b))):
        for q, (ia, ib) in enumerate(zip(ra, rb)):
            at = _first_difference(ia, ib)
            if at is not None:
                return {"round": r + 1, "request": q, "token": at}
    return None


def twin_report(run_a: str | Path, run_b: str | Path, limit: int | None = None) -> dict:
    """The comparison of the cases both runs finished (the first ``limit`` of run A's order); Avg
    is the mean of the benchmark's metrics, as in ``benchmarks.analysis.paired``."""
    benchmark, recs_a = load_run(run_a)
    _, recs_b = load_run(run_b)
    metrics = METRICS[benchmark]
    ids = [cid for cid in recs_a if cid in recs_b][:limit]
    same_rollouts = same_first = same_stepins = same_answers = 0
    differences, diffs = {}, []
    for cid in ids:
        a, b = recs_a[cid], recs_b[cid]
        where = _rollout_difference(a, b)
        same_rollouts += where is None
        same_first += bool(_round_ids(a)[:1] == _round_ids(b)[:1])
        steps_a = [[ro.get("stepin") for ro in rnd or []] for rnd in a.get("rollouts") or []]
        steps_b = [[ro.get("stepin") for ro in rnd or []] for rnd in b.get("rollouts") or []]
        same_stepins += steps_a == steps_b
        same_answers += a.get("answers") == b.get("answers")
        if where is not None or a.get("answers") != b.get("answers"):
            differences[cid] = {
                "rollouts": where,
                "answers_equal": a.get("answers") == b.get("answers"),
            }
        values = [m for m in metrics if a.get(m) is not None and b.get(m) is not None]
        if values:
            avg_a = sum(a[m] for m in values) / len(values)
            avg_b = sum(b[m] for m in values) / len(values)
            diffs.append(100 * (avg_b - avg_a))
    low, high = bootstrap_ci(diffs) if diffs else (None, None)
    return {
        "run_a": str(run_a),
        "run_b": str(run_b),
        "cases": len(ids),
        "identical_rollouts": same_rollouts,
        "identical_first_round_rollouts": same_first,
        "identical_stepins": same_stepins,
        "identical_answers": same_answers,
        "avg_difference": sum(diffs) / len(diffs) if diffs else None,
        "avg_difference_ci95": [low, high],
        "differences": differences,
    }


def twin_table(report: Mapping[str, Any]) -> str:
    n = report["cases"]
    low, high = report["avg_difference_ci95"]
    lines = [
        f"{report['run_b']} against {report['run_a']}, {n} cases both finished",
        "",
        *md_table(
            ["identical", "cases"],
            [
                ["rollouts, every round", f"{report['identical_rollouts']} / {n}"],
                ["rollouts, first round", f"{report['identical_first_round_rollouts']} / {n}"],
                ["step-ins", f"{report['identical_stepins']} / {n}"],
                ["answers", f"{report['identical_answers']} / {n}"],
            ],
            "ll",
        ),
    ]
    if report["avg_difference"] is not None:
        lines.append(
            f"\nAvg difference (B - A): {report['avg_difference']:+.1f} [{low:+.1f}, {high:+.1f}]"
        )
    for cid, d in report["differences"].items():
        where = d["rollouts"]
        at = (
            f"rollouts first differ in round {where['round']}, request {where['request']}, token "
            f"{where['token']}"
            if where
            else "rollouts identical"
        )
        lines.append(f"- case {cid}: {at}; answers {'equal' if d['answers_equal'] else 'differ'}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks twin", description=__doc__)
    parser.add_argument("run_a", help="the reference run directory (e.g. one case at a time)")
    parser.add_argument("run_b", help="the run made the other way (e.g. --cases-at-once)")
    parser.add_argument("--limit", type=int, help="only the first N cases of run A's order")
    parser.add_argument("--out", help="write the JSON report here")
    args = parser.parse_args(argv)
    report = twin_report(args.run_a, args.run_b, args.limit)
    print(twin_table(report))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
