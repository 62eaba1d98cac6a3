"""Cases per hour of many independent edits at once (``hpse_easyedit.batched``), measured.

For each B in ``--cases-at-once`` a fresh process loads the model, edits the first B MQuAKE-uns
development cases in ONE ``hpse_edit_cases`` call (after an untimed warm-up edit) and reports the
edit's wall time split into rollouts and inner steps, and its peak RSS (the kernel's mark reset
after loading) or, on a GPU, the peak allocated memory. With ``--cases N`` every B edits the same
first N cases, B at a time (one call per batch): the cases differ in length, so only then do the
B's compare like with like. Cases per hour at B is ``cases / seconds * 3600``;
``batched_speedup`` is the best B's over B = 1's; the memory per extra case is ``(peak(B) -
peak(1)) / (B - 1)`` beside the solo peak.

    python -m benchmarks perf-batched --cases 16 --cases-at-once 1 4 8 16 \\
        --out runs/perf/batched.json
    # on a GPU: a random-weight model of a real architecture, one request (a passage) per case
    python -m benchmarks perf-batched --hparams hparams/HPSE/qwen2.5-7b.yaml \\
        --random-config qwen2.5-7b --passage hpse_easyedit/demo_passage.txt \\
        --out runs/gpu/batched.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from hpse_easyedit.cli import OneLineParser
from hpse_easyedit.planner import shipped_backbones

from ..markdown import md_table

__all__ = ["batched_report", "main", "measure_batched"]

REPO = Path(__file__).resolve().parents[2]


#: the child's options that say which model and cases it edits (``main``'s flags)
SOURCE_FLAGS = {
    "random_config": "--random-config",
    "tokenizer": "--tokenizer",
    "layers": "--layers",
    "passage": "--passage",
}


def _child(
    hparams: str,
    overrides: Sequence[str],
    cases: int,
    data_dir: str | None,
    source: dict | None = None,
    total: int | None = None,
) -> dict:
    """One B (``cases``) in this process: load, warm up, edit ``total`` cases (default B), B at a
    time; the figures of those edits. ``source`` (``SOURCE_FLAGS``' keys): a random-weight model of
    a shipped architecture instead of the file's model, and one request with a passage file per
    case instead of MQuAKE-uns cases."""
    import torch

    from hpse_easyedit.batched import hpse_edit_cases
    from hpse_easyedit.methods import load_hparams, method_for_file

    from ..tasks.datasets import load_mquake_uns
    from .machine import peak_rss_since_reset, reset_peak_rss, rss_bytes
    from .measure import _load, _requests

    source = source or {}
    total = total or cases
    if source.get("random_config"):
        random = [source.get(k) for k in ("random_config", "tokenizer", "layers")]
        hp, model, tok = _load(hparams, overrides, *random)
    else:
        hp = load_hparams(hparams, list(overrides))
        model, tok = method_for_file(hparams).load_model(hp)
    if source.get("passage"):
        requests = [_requests(Path(source["passage"]).read_text().strip()) for _ in range(total)]
    else:
        rows = load_mquake_uns(data_dir, limit=max(total, 1))
        requests = [[dict(r) for r in rows[i]["requests"]] for i in range(total)]
    gpu = next(model.parameters()).device.type == "cuda"
    # on a GPU the warm-up has the timed edit's shapes (every case, the full rollout length), so
    # that the compiled decode's CUDA graphs are captured before the clock starts
    warm = hp.with_overrides(
        ["rounds=1", "inner_steps=1"] if gpu else ["rounds=1", "inner_steps=1", "max_new_tokens=4"]
    )
    hpse_edit_cases(model, tok, requests[:cases] if gpu else requests[:1], warm)
    base = torch.cuda.memory_allocated() if gpu else rss_bytes()
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    else:
        reset_peak_rss()
    t0, edits, rollout = time.perf_counter(), [], 0.0
    for start in range(0, total, cases):  # B at a time: one call per batch
        batch = hpse_edit_cases(model, tok, requests[start : start + cases], hp)
        edits += batch
        rollout += sum(r["rollout_seconds"] for r in batch[0].rounds)  # the batch's, shared
    if gpu:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() if gpu else peak_rss_since_reset()
    return {
        "cases": total,
        "cases_at_once": cases,
        "seconds": seconds,
        "rollout_seconds": rollout,
        "inner_step_seconds": seconds - rollout,
        "failed": sum(not e.ok for e in edits),
        "rollout_tokens": sum(len(ro) for e in edits for rr in e.rollouts if rr for ro in rr),
        "peak_bytes": peak,
        "base_bytes": base,
        "memory": "cuda_allocated" if gpu else "rss",
        "threads": torch.get_num_threads(),
    }


def measure_batched(
    hparams: str,
    sizes: Sequence[int],
    overrides: Sequence[str] = (),
    data_dir: str | None = None,
    source: dict | None = None,
    cases: int | None = None,
) -> dict:
    """Each B of ``sizes`` in its own process (clean peak memory); the figures of each. ``source``:
    as ``_child`` takes it; ``cases``: the same first ``cases`` cases at every B (B at a time)
    instead of the first B."""
    runs = {}
    for b in sizes:
        cmd = [sys.executable, "-m", "benchmarks.perf.batched", "--child", str(b)]
        cmd += ["--hparams", hparams] + [f"--set={o}" for o in overrides]
        if cases:
            cmd += ["--cases", str(cases)]
        if data_dir:
            cmd += ["--data", data_dir]
        for key, value in (source or {}).items():
            if value is not None:
                cmd += [SOURCE_FLAGS[key], str(value)]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=os.environ.copy())
        if out.returncode != 0:
            raise RuntimeError(f"cases at once {b}: {out.stderr.strip().splitlines()[-1:]}")
        runs[b] = json.loads(out.stdout.strip().splitlines()[-1])
        n = runs[b]["cases"]
        print(
            f"B = {b}: {n} cases in {runs[b]['seconds']:.1f} s "
            f"({n / runs[b]['seconds'] * 3600:.0f} cases/h)",
            file=sys.stderr,
        )
    return batched_report(runs)


def batched_report(runs: dict) -> dict:
    """The JSON keys of ``benchmarks.perf``: ``cases_per_hour``, ``batched_speedup``,
    ``batched_peak_rss`` (or ``batched_peak_cuda``), per-extra-case memory, and each run."""
    cph = {b: r["cases"] / r["seconds"] * 3600 for b, r in runs.items()}
    key = (
        "batched_peak_rss" if next(iter(runs.values()))["memory"] == "rss" else "batched_peak_cuda"
    )
    report: dict[str, Any] = {
        "cases_per_hour": {str(b): round(v, 1) for b, v in cph.items()},
        key: {str(b): r["peak_bytes"] for b, r in runs.items()},
        "batched_runs": {str(b): r for b, r in runs.items()},
    }
    if 1 in cph and len(cph) > 1:
        best = max((b for b in cph if b > 1), key=cph.get)
        report["batched_speedup"] = round(cph[best] / cph[1], 3)
        report["batched_best_cases_at_once"] = best
        solo = runs[1]["peak_bytes"]
        extra = {str(b): (r["peak_bytes"] - solo) / (b - 1) for b, r in runs.items() if b > 1}
        report["batched_bytes_per_extra_case"] = {b: round(v) for b, v in extra.items()}
        report["batched_extra_case_share_of_solo_peak"] = {
            b: round(v / solo, 4) for b, v in extra.items()
        }
    return report


def table(report: dict) -> str:
    """The report as a Markdown table."""
    lines = md_table(
        ["B", "cases", "edit s", "rollouts s", "inner steps s", "cases/h", "peak MB"],
        (
            [
                b,
                r["cases"],
                f"{r['seconds']:.1f}",
                f"{r['rollout_seconds']:.1f}",
                f"{r['inner_step_seconds']:.1f}",
                f"{report['cases_per_hour'][b]:.0f}",
                f"{r['peak_bytes'] / 2**20:.0f}",
            ]
            for b, r in report["batched_runs"].items()
        ),
        "lllllll",
    )
    if "batched_speedup" in report:
        lines.append(
            f"\nbest B = {report['batched_best_cases_at_once']}: "
            f"{report['batched_speedup']:.2f}x the cases per hour of B = 1"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks perf-batched", description=__doc__)
    parser.add_argument(
        "--hparams", default=str(REPO / "hparams" / "HPSE" / "smollm2-135m.yaml"), help="HPSE YAML"
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--cases-at-once", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument(
        "--cases",
        type=int,
        metavar="N",
        help="edit the same first N cases at every B, B at a time (one call per batch), so that "
        "every B's cases per hour are of the same cases (default: the first B cases at each B, "
        "one call)",
    )
    parser.add_argument("--data", help="data directory (default: the benchmarks' one)")
    parser.add_argument(
        "--random-config",
        choices=sorted(shipped_backbones()),
        help="edit a random-weight model of this real architecture (its published config, shipped "
        "in hpse_easyedit/backbones/), built on the file's device in its dtype: GPU timing "
        "without a hub",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="with --random-config: a saved tokenizer instead of the embedded model's",
    )
    parser.add_argument(
        "--layers", type=int, help="with --random-config: cut the model to this many layers"
    )
    parser.add_argument(
        "--passage",
        metavar="FILE",
        help="one request per case with this passage (benchmarks.perf's subject) instead of the "
        "first B MQuAKE-uns cases: a machine without the data set",
    )
    parser.add_argument("--out", help="write the JSON report here (refuses an existing file)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    source = {key: getattr(args, key) for key in SOURCE_FLAGS}
    if args.child is not None:
        print(json.dumps(_child(args.hparams, args.set, args.child, args.data, source, args.cases)))
        return 0
    if args.out and Path(args.out).exists():
        parser.error(f"--out {args.out} exists; choose a new file")
    if (args.tokenizer or args.layers) and not args.random_config:
        parser.error("--tokenizer and --layers need --random-config")
    if args.passage and not Path(args.passage).is_file():
        parser.error(f"--passage {args.passage}: no such file")
    if args.cases is not None and args.cases < max(args.cases_at_once):
        parser.error(f"--cases {args.cases} is fewer than the largest --cases-at-once")
    report = measure_batched(
        args.hparams, args.cases_at_once, args.set, args.data, source, args.cases
    )
    report["command"] = " ".join(
        ["python", "-m", "benchmarks", "perf-batched", *(argv or sys.argv[1:])]
    )
    print(table(report))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
