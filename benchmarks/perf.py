"""What an HPSE edit costs next to its floors, measured side by side in one run.

Reports, for one hparams file and model:
  - rollout ratio: hybrid rollout time / the student's own greedy ``generate()`` of the same length;
  - edit-time ratio: HPSE edit / the NLL-only edit (``kl_weight: 0``) with the same rounds and steps;
  - memory ratio: peak memory of the HPSE edit / of the NLL-only edit (CUDA peak allocated on a GPU;
    on a CPU peak RSS of a fresh child process per edit, model load included);
  - teacher forward tokens per edit and teacher passes during inner steps (must be 0);
  - memory after 1, 10, 50, 100 sequential edits (must stay flat).
It prints a table and writes JSON.

Examples::

    python -m benchmarks.perf --hparams hparams/HPSE/smollm2-135m.yaml --out runs/perf/cpu.json
    # on a GPU, a random-weight model with the real Qwen2.5-7B-Instruct configuration:
    python -m benchmarks.perf --hparams hparams/HPSE/qwen2.5-7b.yaml --random-config qwen2.5-7b --out runs/perf/h100.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PASSAGE = REPO / "hpse_easyedit" / "demo_passage.txt"

# Architectures of the paper's backbones, for random-weight timing runs without a hub.
RANDOM_CONFIGS: dict[str, tuple[str, dict]] = {
    "qwen2.5-7b": ("qwen2", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                 num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                                 max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                                 tie_word_embeddings=False)),
    "llama3.1-8b": ("llama", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                  num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                  max_position_embeddings=131072, rope_theta=5e5, rms_norm_eps=1e-5,
                                  tie_word_embeddings=False)),
}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _load(hparams_path: str, overrides: Sequence[str], random_config: str | None):
    from hpse_easyedit import HPSEHyperParams, load_model

    hp = HPSEHyperParams.from_hparams(hparams_path).with_overrides(list(overrides))
    if random_config is None:
        return hp, *load_model(hp)
    from transformers import AutoConfig, AutoModelForCausalLM

    from hpse_easyedit.loading import EMBEDDED_MODEL

    model_type, kwargs = RANDOM_CONFIGS[random_config]
    # The tokenizer only has to produce ids below the vocabulary size: take the embedded model's.
    _, tok = load_model(hp.with_overrides({"model_name": EMBEDDED_MODEL, "device": "cpu", "dtype": "float32",
                                           "model_parallel": False}))
    config = AutoConfig.for_model(model_type, **kwargs)
    device = f"cuda:{hp.device}" if isinstance(hp.device, int) else hp.device
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=hp.torch_dtype)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.eval()
    return hp, model, tok


def _requests(passage: str) -> list[dict]:
    return [{"subject": "Selma Varrick", "target_new": passage}]


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) of this process; False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _peak_rss_since_reset() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return _peak_rss_bytes()


def _rollout_vs_generate(model: Any, tok: Any, hp: Any, prompts: Any, repeats: int) -> tuple[dict, Any]:
    """Time the hybrid rollout and the student's own greedy generate() of the same length; restore after."""
    from hpse_easyedit import restore_weights
    from hpse_easyedit.executors import make_executor
    from hpse_easyedit.rollout import batched_hybrid_rollout, hybrid_rollout, input_device

    executor = make_executor(model, hp)
    weights_copy = executor.weights_copy()
    student = executor.model
    device = input_device(student)
    gate = dict(tau=hp.tau, kappa=hp.kappa, top_k=hp.top_k, max_new_tokens=hp.max_new_tokens, stop_ids=[])
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0

    def rollout() -> Any:
        if hp.batched_rollout:
            return batched_hybrid_rollout(student, executor.row_switch, prompts.student_ids, prompts.teacher_ids,
                                          pad_id=pad, **gate)
        return hybrid_rollout(student, student, prompts.student_ids, prompts.teacher_ids,
                              teacher_context=executor.teacher_context, **gate)

    def generate() -> None:
        ids = torch.tensor([prompts.student_ids], device=device)
        student.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=hp.max_new_tokens,
                         min_new_tokens=hp.max_new_tokens, do_sample=False, pad_token_id=pad,
                         temperature=None, top_p=None, top_k=None)

    rollout(), generate()  # warm-up
    t_roll, t_gen = [], []
    for _ in range(repeats):
        _sync(device); t0 = time.perf_counter(); ro = rollout(); _sync(device); t_roll.append(time.perf_counter() - t0)
        _sync(device); t0 = time.perf_counter(); generate(); _sync(device); t_gen.append(time.perf_counter() - t0)
    result = {"tokens": len(ro), "seconds": statistics.median(t_roll), "generate_seconds": statistics.median(t_gen),
              "ratio": statistics.median(t_roll) / statistics.median(t_gen),
              "tokens_per_s": len(ro) / statistics.median(t_roll),
              "seconds_each": t_roll, "generate_seconds_each": t_gen}
    return result, restore_weights(student, weights_copy)


def measure(args: argparse.Namespace) -> dict:
    from hpse_easyedit import hpse_edit, restore_weights
    from hpse_easyedit.editor import edit_prompts
    from hpse_easyedit.rollout import input_device

    passage = Path(args.passage).read_text(encoding="utf-8").strip()
    hp, model, tok = _load(args.hparams, args.set, args.random_config)
    device = input_device(model)
    on_gpu = device.type == "cuda"
    hp_nll = hp.with_overrides(["kl_weight=0"])
    report: dict[str, Any] = {
        "hparams": args.hparams, "overrides": list(args.set), "random_config": args.random_config,
        "model_name": hp.model_name, "dtype": hp.dtype, "executor": hp.executor,
        "rounds": hp.rounds, "inner_steps": hp.inner_steps, "max_new_tokens": hp.max_new_tokens,
        "batched_rollout": hp.batched_rollout, "device": str(device),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "gpu": torch.cuda.get_device_name(device) if on_gpu else None, "torch": torch.__version__},
        "n_params": sum(p.numel() for p in model.parameters()),
    }

    # 1. rollout vs the student's own greedy generate() of the same length (fresh adapter / matrix).
    prompts = edit_prompts(model, tok, _requests(passage), hp)[0]
    report["rollout"], model = _rollout_vs_generate(model, tok, hp, prompts, args.rollout_repeats)

    # 2-4. HPSE edit vs NLL-only edit: time (in process), peak memory, teacher traffic.
    timings: dict[str, list[float]] = {"hpse": [], "nll_only": []}
    peaks: dict[str, float] = {}
    can_reset = on_gpu or _reset_peak_rss()
    # Warm-up: one cut-down edit first, so neither timed edit pays the process's first-touch costs
    # (allocator growth, page faults, kernel selection); unwarmed first runs measured up to 1.7x slower.
    warm = hpse_edit(model, tok, _requests(passage), hp.with_overrides(["rounds=1", "inner_steps=1", "max_new_tokens=8"]))
    model = restore_weights(warm.model, warm.weights_copy)
    del warm
    for _ in range(args.repeats):
        for name, params in (("hpse", hp), ("nll_only", hp_nll)):
            gc.collect()
            if on_gpu:
                torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
            elif can_reset:
                _reset_peak_rss()
                base = _rss_bytes()
            _sync(device); t0 = time.perf_counter()
            res = hpse_edit(model, tok, _requests(passage), params)
            _sync(device); timings[name].append(time.perf_counter() - t0)
            if on_gpu or can_reset:
                peak = torch.cuda.max_memory_allocated(device) if on_gpu else _peak_rss_since_reset()
                peaks[name] = max(peaks.get(name, 0), peak - base)
                peaks[name + "_total"] = max(peaks.get(name + "_total", 0), peak)
            if name == "hpse":
                report["teacher_forward_tokens_per_edit"] = res.teacher_forward_tokens
                report["inner_step_teacher_passes"] = res.inner_step_teacher_passes
                report["stepin_rate_by_round"] = [r["stepin_rate"] for r in res.rounds]
                report["hpse_rollout_seconds"] = sum(r.get("rollout_seconds", 0.0) for r in res.rounds)
                report["hpse_rollout_tokens"] = sum(r.get("rollout_len", 0.0) for r in res.rounds)
            model = restore_weights(res.model, res.weights_copy)
            del res
    report["edit"] = {"hpse_seconds": statistics.median(timings["hpse"]),
                      "nll_only_seconds": statistics.median(timings["nll_only"]),
                      "ratio": statistics.median(timings["hpse"]) / statistics.median(timings["nll_only"])}
    if on_gpu or can_reset:
        kind = "CUDA peak allocated" if on_gpu else "peak RSS (VmHWM reset before each edit)"
        report["memory"] = {"kind": f"{kind} during the edit, model included (bytes); *_extra = above the loaded model",
                            "hpse": peaks["hpse_total"], "nll_only": peaks["nll_only_total"],
                            "hpse_extra": peaks["hpse"], "nll_only_extra": peaks["nll_only"],
                            "ratio": peaks["hpse_total"] / peaks["nll_only_total"]}

    # 5. memory after N sequential edits (cut-down edits: growth, not training, is what is measured).
    if args.sequential:
        seq_hp = hp.with_overrides(list(args.sequential_set))
        counts = sorted(set(args.sequential))
        mem: dict[int, int] = {}
        edited, first_copy = model, None
        for i in range(1, counts[-1] + 1):
            res = hpse_edit(edited, tok, [{"subject": f"Subject {i}", "target_new": passage}], seq_hp)
            edited = res.model
            first_copy = first_copy if first_copy is not None else res.weights_copy
            del res
            if i in counts:
                gc.collect()
                mem[i] = torch.cuda.memory_allocated(device) if on_gpu else _rss_bytes()
        model = restore_weights(edited, first_copy)
        report["sequential"] = {"kind": "CUDA allocated" if on_gpu else "RSS", "overrides": list(args.sequential_set),
                                "bytes_after": {str(k): v for k, v in mem.items()},
                                "growth_vs_first": mem[counts[-1]] / mem[counts[0]] - 1.0}
    return report


def table(report: dict) -> str:
    gib = 1024 ** 3
    rows = [
        ("machine", f"{report['device']}, {report['machine']['gpu'] or str(report['machine']['cpus']) + ' CPUs'}, "
                    f"torch {report['machine']['torch']}, {report['machine']['torch_threads']} threads"),
        ("model", f"{report['random_config'] or report['model_name']} ({report['n_params'] / 1e6:.0f}M, {report['dtype']}), "
                  f"executor {report['executor']}, R={report['rounds']} M={report['inner_steps']}"),
        ("rollout / generate()", f"{report['rollout']['ratio']:.2f}  ({report['rollout']['seconds']:.2f} s vs "
                                 f"{report['rollout']['generate_seconds']:.2f} s, {report['rollout']['tokens']} tokens, "
                                 f"{report['rollout']['tokens_per_s']:.1f} tok/s)"),
        ("HPSE edit / NLL-only edit", f"{report['edit']['ratio']:.2f}  ({report['edit']['hpse_seconds']:.1f} s vs "
                                      f"{report['edit']['nll_only_seconds']:.1f} s)"),
    ]
    if "hpse_rollout_seconds" in report:
        rows.append(("  of which HPSE rollouts", f"{report['hpse_rollout_seconds']:.1f} s for "
                                                 f"{report['hpse_rollout_tokens']:.0f} tokens over {report['rounds']} rounds"))
    if "memory" in report:
        m = report["memory"]
        rows.append(("memory HPSE / NLL-only", f"{m['ratio']:.3f}  ({m['hpse'] / gib:.3f} GiB vs {m['nll_only'] / gib:.3f} GiB; "
                                               f"above the model: {m['hpse_extra'] / gib:.3f} vs {m['nll_only_extra'] / gib:.3f} GiB)"))
    rows.append(("teacher forward tokens / edit", str(report["teacher_forward_tokens_per_edit"])))
    rows.append(("teacher passes in inner steps", str(report["inner_step_teacher_passes"])))
    if "sequential" in report:
        s = report["sequential"]
        after = ", ".join(f"{k}: {v / gib:.3f} GiB" for k, v in s["bytes_after"].items())
        rows.append((f"{s['kind']} after N sequential edits", f"{after} (growth {100 * s['growth_vs_first']:+.1f}%)"))
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"| {k:<{width}} | {v} |" for k, v in rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.perf", description=__doc__.split("\n")[0])
    parser.add_argument("--hparams", default=str(REPO / "hparams" / "HPSE" / "smollm2-135m.yaml"), help="HPSE YAML")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="hparams override; repeatable")
    parser.add_argument("--random-config", choices=sorted(RANDOM_CONFIGS),
                        help="build a random-weight model of this real architecture (GPU timing without a hub)")
    parser.add_argument("--passage", default=str(DEFAULT_PASSAGE), help="passage file to inject (default: the demo's)")
    parser.add_argument("--repeats", type=int, default=1, help="timed repetitions of each edit (median reported)")
    parser.add_argument("--rollout-repeats", type=int, default=3,
                        help="timed repetitions of the rollout and of generate(), interleaved (median reported)")
    parser.add_argument("--sequential", type=int, nargs="*", default=[1, 10, 50, 100],
                        help="report memory after these numbers of sequential edits (empty to skip)")
    parser.add_argument("--sequential-set", nargs="*", default=["rounds=1", "inner_steps=1", "max_new_tokens=8"],
                        help="overrides for the sequential-memory edits (default: cut down; memory growth is measured)")
    parser.add_argument("--out", help="write the JSON report here (refuses to overwrite an existing file)")
    args = parser.parse_args(argv)
    if args.out and Path(args.out).exists():
        parser.error(f"--out {args.out} exists; choose a new file")
    report = measure(args)
    report["command"] = " ".join([os.path.basename(sys.executable), "-m", "benchmarks.perf", *(argv or sys.argv[1:])])
    print(table(report))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from hpse_easyedit.cli import run_cli  # bad input: one line on stderr, exit 2 (--debug: traceback)

    from .runner import benchmark_errors

    sys.exit(run_cli(main, extra=benchmark_errors()))
