"""The memory planner's batched plan (``hpse_easyedit.planner.plan_cases``) against the real
engine's measured peak, for B cases at once.

For each ``cases_per_pass`` setting and each B, the first B MQuAKE-uns cases are edited by the real
``hpse_edit_cases`` on the real model (the embedded SmolLM2 by default) under ``LiveBytes``, which
counts every tensor the edit creates on this machine and frees, as ``max_memory_allocated`` does on
a GPU; then the same cases' prompts (their real token counts) are planned on the meta device. The
table gives the edit's peak, measured and planned, and the memory per extra case, ``(peak(B) -
peak(1)) / (B - 1)``, both ways. The plan decodes rollouts to ``max_new_tokens``; the real rollouts'
lengths are in the JSON (a rollout that stops early trains on fewer rows than planned).

    OMP_NUM_THREADS=1 python -m benchmarks plan-check --cases-at-once 1 4 8 --per-pass 1 all \\
        --set rounds=1 --set inner_steps=2 --set max_new_tokens=32 \\
        --out docs/perf/plan-cases-smollm2.json

``--backbones FILE...`` measures nothing: it tabulates the planner's figures
(``plan_cases_at_once``: one case's peak, the memory per extra case, the largest B per card) for
those hparams files, LoRA and FT-M, on the MQuAKE-uns and UnKEBench workloads (docs/GPU.md's
table):

    python -m benchmarks plan-check --backbones hparams/HPSE/*.yaml \\
        --out docs/perf/plan-cases-backbones.json
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from hpse_easyedit.cli import OneLineParser
from hpse_easyedit.executors import EXECUTORS

from ..markdown import md_table

__all__ = ["check_plan", "main", "table"]

REPO = Path(__file__).resolve().parents[2]
#: the phases of the edit itself (the planner's ``answers`` phase is the runner's, after the edit)
EDIT_PHASES = ("weights", "trainable_state", "rollout", "training")
GIB = 2**30


def _edit_peak(plan: dict) -> int:
    return max(plan["phase_bytes"][p] for p in EDIT_PHASES)


def check_plan(
    hparams: str,
    sizes: Sequence[int],
    per_pass: Sequence[str],
    overrides: Sequence[str] = (),
    data_dir: str | None = None,
) -> dict:
    """Measured and planned edit peaks for every ``cases_per_pass`` in ``per_pass`` ('all': B)
    and every B in ``sizes``, in this process (``LiveBytes`` counts only what each edit creates)."""
    import torch

    from hpse_easyedit.batched import hpse_edit_cases
    from hpse_easyedit.editor import edit_prompts
    from hpse_easyedit.methods import load_hparams, method_for_file
    from hpse_easyedit.planner import LiveBytes, Workload, plan_cases

    from ..tasks.datasets import load_mquake_uns

    hp = load_hparams(hparams, list(overrides))
    model, tok = method_for_file(hparams).load_model(hp)
    rows = load_mquake_uns(data_dir, limit=max(sizes))
    requests = [[dict(r) for r in rows[i]["requests"]] for i in range(max(sizes))]
    prompts = [edit_prompts(model, tok, reqs, hp) for reqs in requests]
    workload = Workload(
        "mquake-uns: the cases' own prompts",
        requests=len(prompts[0]),
        passage_tokens=max(len(p.passage_ids) for case in prompts for p in case),
        max_new_tokens=hp.max_new_tokens,
    )
    runs, done = [], {}
    for setting in per_pass:
        for b in sizes:
            k = b if setting == "all" else min(int(setting), b)
            if (k, b) in done:  # the same edit (B = 1 under every setting): measured once
                runs.append({**done[k, b], "cases_per_pass": setting})
                continue
            run_hp = hp.with_overrides({"cases_per_pass": k})
            with LiveBytes([*model.parameters(), *model.buffers()]) as mem:
                t0 = time.perf_counter()
                edits = hpse_edit_cases(model, tok, requests[:b], run_hp)
                seconds = time.perf_counter() - t0
            lengths = [len(ro) for e in edits for rr in e.rollouts if rr for ro in rr]
            measured = mem.peak
            del edits
            plan = plan_cases(run_hp, workload, b, prompts=prompts[:b])
            planned = _edit_peak(plan)
            runs.append(
                {
                    "cases_per_pass": setting,
                    "cases": b,
                    "measured_bytes": measured,
                    "planned_bytes": planned,
                    "planned_phases_bytes": {p: plan["phase_bytes"][p] for p in EDIT_PHASES},
                    "error": round(planned / measured - 1, 4),
                    "rollout_tokens": {
                        "mean": round(sum(lengths) / len(lengths), 2),
                        "max": max(lengths),
                        "min": min(lengths),
                        "planned": hp.max_new_tokens,
                    },
                    "edit_seconds": round(seconds, 1),
                }
            )
            done[k, b] = runs[-1]
            print(
                f"cases_per_pass {setting}, B = {b}: measured {measured / GIB:.3f} GiB, planned "
                f"{planned / GIB:.3f} GiB ({100 * (planned / measured - 1):+.1f}%)",
                file=sys.stderr,
            )
    report: dict[str, Any] = {
        "hparams": hparams,
        "overrides": list(overrides),
        "model_name": hp.model_name,
        "executor": hp.executor,
        "dtype": hp.dtype,
        "rounds": hp.rounds,
        "inner_steps": hp.inner_steps,
        "max_new_tokens": hp.max_new_tokens,
        "static_decode": hp.static_decode,
        "measured_with": "hpse_easyedit.planner.LiveBytes around hpse_edit_cases (every tensor "
        "the edit creates; the model's weights counted from the start)",
        "planned_with": "hpse_easyedit.planner.plan_cases on the meta device, the cases' own "
        "prompts; the edit's phases (weights, trainable_state, rollout, training)",
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "load_average_end": list(os.getloadavg()),
        },
        "runs": runs,
    }
    report["per_extra_case"] = _per_case(runs)
    report["max_abs_error"] = max(abs(r["error"]) for r in runs)
    return report


def plan_backbones(
    files: Sequence[str], executors: Sequence[str], benchmarks: Sequence[str]
) -> dict:
    """The planner's batched figures (``plan_cases_at_once``, meta device, nothing measured) for
    each hparams file, executor and benchmark workload: one case's peak, the memory per extra case
    and the largest B per card."""
    from hpse_easyedit import HPSEHyperParams
    from hpse_easyedit.planner import CARDS_GIB, WORKLOADS, plan_cases_at_once

    rows = []
    for f in files:
        for executor in executors:
            hp = HPSEHyperParams.from_hparams(f).with_overrides({"executor": executor})
            for benchmark in benchmarks:
                t0 = time.perf_counter()
                plan = plan_cases_at_once(hp, WORKLOADS[benchmark])
                rows.append(
                    {
                        "hparams": f,
                        **{k: plan[k] for k in ("model_name", "executor", "dtype", "benchmark")},
                        **{k: plan[k] for k in ("cases_per_pass", "solo_peak_gib")},
                        **{k: plan[k] for k in ("per_case_gib", "largest_cases", "planned")},
                        "plan_seconds": round(time.perf_counter() - t0, 1),
                    }
                )
                print(f"{f} {executor} {benchmark}: planned", file=sys.stderr)
    return {"cards_gib": list(CARDS_GIB), "backbones": rows}


def backbones_table(report: dict) -> str:
    """``plan_backbones``' figures as a Markdown table."""
    cards = report["cards_gib"]
    head = ["model", "executor", "benchmark", "one case GiB", "per extra case GiB"]
    head += [f"largest B, {c} GB" for c in cards]
    body = [
        [
            f"{r['model_name']} ({r['dtype']})",
            r["executor"],
            r["benchmark"],
            f"{r['solo_peak_gib']:.2f}",
            f"{r['per_case_gib']:.3f}",
            *(r["largest_cases"][str(c)] for c in cards),
        ]
        for r in report["backbones"]
    ]
    return "\n".join(md_table(head, body, "l" * len(head)))


def _per_case(runs: list[dict]) -> dict:
    """Per setting and B > 1: ``(peak(B) - peak(1)) / (B - 1)``, measured and planned."""
    out: dict[str, dict] = {}
    for r in runs:
        solo = next(
            (s for s in runs if s["cases"] == 1 and s["cases_per_pass"] == r["cases_per_pass"]),
            None,
        )
        if solo is None or r["cases"] == 1:
            continue
        measured = (r["measured_bytes"] - solo["measured_bytes"]) / (r["cases"] - 1)
        planned = (r["planned_bytes"] - solo["planned_bytes"]) / (r["cases"] - 1)
        out.setdefault(str(r["cases_per_pass"]), {})[str(r["cases"])] = {
            "measured_bytes": round(measured),
            "planned_bytes": round(planned),
            "error": round(planned / measured - 1, 4) if measured else None,
        }
    return out


def table(report: dict) -> str:
    """The report as a Markdown table."""
    body = []
    for r in report["runs"]:
        extra = report["per_extra_case"].get(str(r["cases_per_pass"]), {}).get(str(r["cases"]))
        per_case = (
            f"{extra['measured_bytes'] / GIB:.3f} / {extra['planned_bytes'] / GIB:.3f}"
            if extra
            else ""
        )
        ro = r["rollout_tokens"]
        body.append(
            [
                r["cases_per_pass"],
                r["cases"],
                f"{r['measured_bytes'] / GIB:.3f}",
                f"{r['planned_bytes'] / GIB:.3f}",
                f"{100 * r['error']:+.1f}%",
                per_case,
                f"{ro['mean']:.1f}, {ro['planned']}",
            ]
        )
    head = ["cases_per_pass", "B", "measured GiB", "planned GiB", "error"]
    head += ["per extra case measured / planned GiB", "rollout tokens (mean, planned)"]
    return "\n".join(md_table(head, body, "lllllll"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks plan-check", description=__doc__)
    parser.add_argument(
        "--hparams", default=str(REPO / "hparams" / "HPSE" / "smollm2-135m.yaml"), help="HPSE YAML"
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--cases-at-once", type=int, nargs="+", default=[1, 4, 8], metavar="B")
    parser.add_argument(
        "--per-pass",
        nargs="+",
        default=["1", "all"],
        metavar="K",
        help="cases_per_pass settings to check: a number, or 'all' (every case in one pass, as "
        "'auto' on a GPU); default 1 (CPU's 'auto') and all",
    )
    parser.add_argument("--data", help="data directory (default: the benchmarks' one)")
    parser.add_argument(
        "--backbones",
        nargs="+",
        metavar="YAML",
        help="instead of measuring: the planner's figures for these hparams files (e.g. "
        "hparams/HPSE/*.yaml), LoRA and FT-M, on the MQuAKE-uns and UnKEBench workloads",
    )
    parser.add_argument("--out", help="write the JSON report here (refuses an existing file)")
    args = parser.parse_args(argv)
    if args.out and Path(args.out).exists():
        parser.error(f"--out {args.out} exists; choose a new file")
    if any(b < 1 for b in args.cases_at_once):
        parser.error(f"--cases-at-once must be >= 1, got {args.cases_at_once}")
    bad = [k for k in args.per_pass if k != "all" and not (k.isdigit() and int(k) >= 1)]
    if bad:
        parser.error(f"--per-pass takes numbers >= 1 or 'all', got {bad}")
    missing = [f for f in args.backbones or () if not Path(f).is_file()]
    if missing:
        parser.error(f"--backbones {missing[0]}: no such file")
    if args.backbones:
        report = plan_backbones(args.backbones, tuple(EXECUTORS), ("mquake", "unkebench"))
        text = backbones_table(report)
    else:
        report = check_plan(args.hparams, args.cases_at_once, args.per_pass, args.set, args.data)
        text = table(report)
    report["command"] = " ".join(
        ["python", "-m", "benchmarks", "plan-check", *(argv or sys.argv[1:])]
    )
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
