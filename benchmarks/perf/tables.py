"""The report of ``python -m benchmarks perf``: the flat headline keys docs/PERFORMANCE.md quotes,
and the table."""

from __future__ import annotations

from ..markdown import md_row
from .machine import MATMUL_OPS

__all__ = ["headline", "table"]


def headline(report: dict) -> dict:
    """The flat keys the issue and docs/PERFORMANCE.md quote (null where a part was skipped)."""
    floors, mem, seq = report["floors"], report.get("memory", {}), report.get("sequential", {})
    gpu = report["gpu_path"]
    return {
        "rollout_tok_s": report["rollout"]["tokens_per_s"],
        "generate_tok_s": report["generate"]["tokens_per_s"],
        "memory_bandwidth_gb_s": floors["memory_bandwidth_gb_s"],
        "memory_floor_tok_s": floors["memory_floor_tok_s"],
        "matmul_gflops": floors["matmul_gflops"],
        "train_seconds": report["train"]["seconds"],
        "train_flop_floor_seconds": report["train"]["flop_floor_seconds"],
        "edit_seconds_hpse": report["edit"]["hpse_seconds"],
        "edit_seconds_nll_only": report["edit"]["nll_only_seconds"],
        "edit_seconds_easyedit_lora": report["easyedit_lora"].get("seconds"),
        "edit_seconds_coin": report["coin"].get("seconds"),
        "edit_seconds_sdft": report.get("sdft", {}).get("seconds"),
        "mmlu_seconds": report["mmlu"].get("seconds"),
        "mmlu_seconds_before": report["mmlu"].get("seconds_before"),
        "peak_rss_ratio": mem.get("ratio"),
        "peak_rss_ratio_isolated": mem.get("isolated", {}).get("ratio"),
        "sequential_rss": seq.get("bytes_after"),
        "machine": report["machine"],
        "dtype": report["dtype"],
        "decode_ops_per_token": gpu.get("static", {}).get("ops_per_token"),
        "decode_graph_breaks": gpu.get("static_graph_breaks"),
        "decode_host_syncs_per_token": gpu.get("static", {}).get("host_syncs_per_token"),
        "planner_error_smollm2": gpu.get("planner_smollm2", {}).get("error"),
        "gpu_peak_reserved_gib": ((mem["reserved"] + mem["context"]) / 1024**3)
        if "reserved" in mem
        else None,
        # on a GPU, the same figures under the names docs/GPU.md quotes (null on a CPU)
        **{
            key: value if report["machine"]["gpu"] else None
            for key, value in (
                ("gpu_rollout_tok_s", report["rollout"]["tokens_per_s"]),
                ("gpu_bandwidth_floor_tok_s", floors["memory_floor_tok_s"]),
                ("gpu_edit_seconds", report["edit"]["hpse_seconds"]),
            )
        },
    }


def table(report: dict) -> str:
    gib = 1024**3
    rows = [
        (
            "machine",
            f"{report['device']}, "
            f"{report['machine']['gpu'] or str(report['machine']['cpus']) + ' CPUs'}, torch "
            f"{report['machine']['torch']}, {report['machine']['torch_threads']} threads"
            + "".join(f", {k}={v}" for k, v in report["machine"].get("allocator", {}).items())
            + _load_text(report["machine"]),
        ),
        (
            "model",
            f"{report['random_config'] or report['model_name']} ({report['n_params'] / 1e6:.0f}M, "
            f"{report['dtype']}), executor {report['executor']}, "
            f"R={report['rounds']} M={report['inner_steps']}",
        ),
        (
            "memory bandwidth / matmul",
            f"{report['floors']['memory_bandwidth_gb_s']:.1f} GB/s, "
            f"{report['floors']['matmul_gflops']:.0f} GFLOPS",
        ),
        (
            "decode floor",
            f"{report['floors']['memory_floor_tok_s']:.1f} tok/s "
            f"({report['floors']['decode_bytes_per_step'] / 1e9:.3f} GB of weights per step)",
        ),
        (
            "rollout tok/s / floor",
            f"{report['rollout_tok_s'] / report['memory_floor_tok_s']:.2f}  "
            f"({report['rollout_tok_s']:.1f} tok/s)",
        ),
        (
            "generate() tok/s / floor",
            f"{report['generate_tok_s'] / report['memory_floor_tok_s']:.2f}  "
            f"({report['generate_tok_s']:.1f} tok/s, unedited model)",
        ),
        (
            "rollout / generate()",
            f"{report['rollout']['ratio']:.2f}  ({report['rollout']['seconds']:.2f} s vs "
            f"{report['rollout']['generate_seconds']:.2f} s, {report['rollout']['tokens']} tokens, "
            f"{report['rollout']['tokens_per_s']:.1f} tok/s)",
        ),
        (
            "rollout fast_decode speed-up",
            (
                f"{report['rollout']['fast_decode_speedup']:.2f}  (fast_decode "
                f"{report['rollout']['fast_decode']} -> W @ x^T "
                f"{report['rollout']['fast_decode_resolved']}; F.linear path "
                f"{report['rollout']['eager_seconds']:.2f} s; same tokens and step-ins: "
                f"{report['rollout']['fast_decode_same_tokens']}, top-K log-probs within "
                f"{report['rollout']['fast_decode_max_logprob_difference']:.1e})"
            )
            if "eager_seconds" in report["rollout"]
            else "n/a (fast_decode off)",
        ),
        (
            "HPSE edit / NLL-only edit",
            f"{report['edit']['ratio']:.2f}  ({report['edit']['hpse_seconds']:.1f} s vs "
            f"{report['edit']['nll_only_seconds']:.1f} s)",
        ),
    ]
    rows.append(
        (
            "training / FLOP floor",
            f"{report['train']['ratio']:.2f}  ({report['train']['seconds']:.1f} s vs "
            f"{report['train']['flop_floor_seconds']:.1f} s, "
            f"{report['train']['flops'] / 1e12:.2f} TFLOP)",
        )
    )
    prof = report["train"].get("profile")
    if prof and prof["matmul_share"] is not None:
        rate = (
            f", at {prof['matmul_gflops']:.0f} GFLOPS ({prof['matmul_of_floor']:.2f} of the floor)"
            if prof["matmul_gflops"]
            else ""
        )
        others = ", ".join([o["op"] for o in prof["top_ops"] if o["op"] not in MATMUL_OPS][:3])
        rows.append(
            (
                "  inner step in matmuls",
                f"{prof['matmul_share']:.2f} of its self time (profiled){rate}; then {others}",
            )
        )
    hpse = report["edit"]["hpse_seconds"]
    for name, part, text in (
        (
            "HPSE edit / EasyEdit LoRA",
            report["easyedit_lora"],
            lambda p: (
                f"{hpse / p['seconds']:.2f}  ({p['seconds']:.1f} s, {p['num_steps']} steps, "
                f"r{p['rank']} on {'/'.join(p['target_modules'])})"
            ),
        ),
        (
            "COIN* edit / HPSE edit",
            report.get("coin", {"skipped": "not measured in this report"}),
            lambda p: (
                f"{p['seconds'] / hpse:.2f}  ({p['seconds']:.1f} s, {p['steps']} steps, "
                f"{p['chunks']} sentence chunks)"
            ),
        ),
        (
            "SDFT (TRL) edit / HPSE edit",
            report.get("sdft", {"skipped": "not measured in this report"}),
            lambda p: (
                f"{p['seconds'] / hpse:.2f}  ({p['seconds']:.1f} s, {p['rounds']} generations x "
                f"{p['inner_steps']} steps, {p['completion_tokens']:.0f} sampled tokens in "
                f"{p['sampling_seconds']:.1f} s)"
            ),
        ),
        (
            "MMLU whole prompts / shared prefix",
            report["mmlu"],
            lambda p: (
                f"{p['speedup']:.2f}  ({p['seconds_before']:.1f} s vs {p['seconds']:.1f} s, "
                f"{p['questions']} questions, {p['subjects']} subjects, "
                f"identical predictions: {p['identical_predictions']})"
            ),
        ),
    ):  # a part that did not run says why
        rows.append((name, f"n/a ({part['skipped']})" if "skipped" in part else text(part)))
    if "hpse_rollout_seconds" in report:
        rows.append(
            (
                "  of which HPSE rollouts",
                f"{report['hpse_rollout_seconds']:.1f} s for "
                f"{report['hpse_rollout_tokens']:.0f} tokens over {report['rounds']} rounds",
            )
        )
    rows += _memory_rows(report)
    rows.append(("teacher forward tokens / edit", str(report["teacher_forward_tokens_per_edit"])))
    rows.append(("teacher passes in inner steps", str(report["inner_step_teacher_passes"])))
    if "sequential" in report:
        s = report["sequential"]
        after = ", ".join(f"{k}: {v / gib:.3f} GiB" for k, v in s["bytes_after"].items())
        rows.append(
            (
                f"{s['kind']} after N sequential edits",
                f"{after} (growth {100 * s['growth_vs_first']:+.1f}%)",
            )
        )
    width = max(len(r[0]) for r in rows)
    return "\n".join(md_row((f"{k:<{width}}", v)) for k, v in rows)


def _load_text(machine: dict) -> str:
    """The host's 1-minute load average as the run started and ended ('' where not recorded)."""
    load = machine.get("load_average") or {}
    if "start" not in load or "end" not in load:
        return ""
    return f", load {load['start'][0]:.1f} -> {load['end'][0]:.1f}"


def _memory_rows(report: dict) -> list[tuple[str, str]]:
    """The table's rows of the edits' peak memory (none where it was not measured)."""
    if "memory" not in report:
        return []
    gib, m, rows = 1024**3, report["memory"], []
    rows.append(
        (
            "memory HPSE / NLL-only",
            f"{m['ratio']:.3f}  ({m['hpse'] / gib:.3f} GiB vs {m['nll_only'] / gib:.3f} GiB; "
            f"above the model: {m['hpse_extra'] / gib:.3f} "
            f"vs {m['nll_only_extra'] / gib:.3f} GiB)",
        )
    )
    if "isolated" in m:
        i = m["isolated"]
        rows.append(
            (
                "  each edit in a fresh process",
                f"{i['ratio']:.3f}  ({i['hpse'] / gib:.3f} GiB vs {i['nll_only'] / gib:.3f} "
                f"GiB; above the warmed-up model: {i['hpse_extra'] / gib:.3f} vs "
                f"{i['nll_only_extra'] / gib:.3f} GiB)",
            )
        )
    return rows
