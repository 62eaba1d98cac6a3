"""What ``python -m benchmarks perf`` measures: one model and hparams file, its rollout against
``generate()``, the HPSE edit against the NLL-only edit (time, peak memory, teacher traffic, the
FLOP floor), one inner step profiled, COIN*, SDFT (TRL), memory after sequential edits, one MMLU
pass, EasyEdit's own LoRA editor, and the GPU path without a GPU. The figures go into one JSON
report (``benchmarks.perf.tables`` turns it into the table)."""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from hpse_easyedit.model_calls import input_device

from .machine import (
    MATMUL_OPS,
    allocator_settings,
    decode_bytes,
    matmul_gflops,
    median_seconds,
    memory_bandwidth_gb_s,
    peak_rss_since_reset,
    reset_peak_rss,
    rss_bytes,
    sync,
    train_flops,
)

__all__ = ["DEFAULT_PASSAGE", "REPO", "isolated_edit_peak", "measure"]

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PASSAGE = REPO / "hpse_easyedit" / "demo_passage.txt"
# EasyEdit's shipped LoRA values for Llama (its hparams/LoRA/llama-7b.yaml), as plain LoRA; see the
# file.
EASYEDIT_LORA_HPARAMS = Path(__file__).resolve().parent / "easyedit_lora.yaml"


def _greedy_fixed_length(model: Any, ids: torch.Tensor, hp: Any, pad: int) -> None:
    """``model.generate``'s greedy decode of exactly ``hp.max_new_tokens`` tokens after ``ids``
    (the timed baseline the rollout is compared with)."""
    model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=hp.max_new_tokens,
        min_new_tokens=hp.max_new_tokens,
        do_sample=False,
        pad_token_id=pad,
        temperature=None,
        top_p=None,
        top_k=None,
    )


def _load(
    hparams_path: str,
    overrides: Sequence[str],
    random_config: str | None,
    tokenizer: str | None = None,
    layers: int | None = None,
):
    from hpse_easyedit import HPSEHyperParams, load_model

    hp = HPSEHyperParams.from_hparams(hparams_path).with_overrides(list(overrides))
    if random_config is None:
        return hp, *load_model(hp)
    from transformers import AutoModelForCausalLM

    from hpse_easyedit.loading import DTYPE_KEYWORD, EMBEDDED_MODEL, resolve_device
    from hpse_easyedit.planner import backbone_config, shipped_backbones

    # The tokenizer only has to produce ids below the vocabulary size: the embedded model's, or the
    # one saved in ``tokenizer`` (a machine without the embedded model, e.g. a lent GPU).
    if tokenizer is not None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer)
    else:
        _, tok = load_model(
            hp.with_overrides(
                {
                    "model_name": EMBEDDED_MODEL,
                    "device": "cpu",
                    "dtype": "float32",
                    "model_parallel": False,
                }
            )
        )
    # the published architecture, shipped; ``layers`` cuts it (a dry run)
    config = backbone_config(shipped_backbones()[random_config], layers)
    if hp.attn_implementation != "auto":
        config._attn_implementation = hp.attn_implementation
    with torch.device(resolve_device(hp.device)):
        model = AutoModelForCausalLM.from_config(config, **{DTYPE_KEYWORD: hp.torch_dtype})
    model.generation_config.eos_token_id = tok.eos_token_id
    model.eval()
    return hp, model, tok


def _requests(passage: str) -> list[dict]:
    return [{"subject": "Selma Varrick", "target_new": passage}]


# The cut-down edit run before any timed or measured one, so that none pays the process's
# first-touch costs (allocator growth, page faults, kernel selection); unwarmed first runs measured
# up to 1.7x slower.
WARM_UP = ("rounds=1", "inner_steps=1", "max_new_tokens=8")


def _warm_up(model, tok, hp, passage: str):
    from hpse_easyedit import hpse_edit, restore_weights

    warm = hpse_edit(model, tok, _requests(passage), hp.with_overrides(list(WARM_UP)))
    return restore_weights(warm.model, warm.weights_copy)


def isolated_edit_peak(
    hparams_path: str, overrides: Sequence[str], extra: Sequence[str], passage: str
) -> dict[str, int]:
    """Peak RSS of one edit in this (fresh) process: the model loaded, the warm-up edit of the run's
    file (``overrides`` applied), the kernel's peak mark reset, then the edit with ``extra`` applied
    on top. Run in a spawned process per edit, so the edits compared start from the same history and
    neither inherits the other's heap."""
    from hpse_easyedit import hpse_edit

    hp, model, tok = _load(hparams_path, overrides, None)
    model = _warm_up(model, tok, hp, passage)
    gc.collect()
    reset_peak_rss()
    # the base from the counter the peak is read from (VmHWM just after its reset): statm's RSS and
    # VmHWM are updated apart, so statm could stand above a later VmHWM by a few pages
    base = peak_rss_since_reset()
    hpse_edit(model, tok, _requests(passage), hp.with_overrides(list(extra)))
    return {"peak": peak_rss_since_reset(), "base": base}


def _isolated_memory(args: argparse.Namespace, passage: str) -> dict[str, Any]:
    """The HPSE edit's and the NLL-only edit's peak RSS, each in a fresh process
    (``isolated_edit_peak``).

    In one process the second edit starts from the heap the first one (and the rollout and
    ``generate()`` timings before them) left behind, and how much of it the C allocator keeps
    depends on the allocator: the in-process ratio measured 1.141 under glibc's defaults, 1.055 with
    ``MALLOC_MMAP_THRESHOLD_`` fixed and 1.001 under tcmalloc, which keeps the HPSE edit's pages for
    the NLL-only edit (PERFORMANCE.md).
    """
    import multiprocessing

    ctx = multiprocessing.get_context(
        "spawn"
    )  # a fresh interpreter: no heap, threads or caches inherited
    peaks = {}
    for name, extra in (("hpse", []), ("nll_only", ["kl_weight=0"])):
        with ctx.Pool(1) as pool:
            peaks[name] = pool.apply(
                isolated_edit_peak, (args.hparams, list(args.set), extra, passage)
            )
    return {
        "kind": "peak RSS of the edit in a fresh process "
        "(model loaded, warm-up edit, mark reset), bytes",
        "hpse": peaks["hpse"]["peak"],
        "nll_only": peaks["nll_only"]["peak"],
        "hpse_extra": peaks["hpse"]["peak"] - peaks["hpse"]["base"],
        "nll_only_extra": peaks["nll_only"]["peak"] - peaks["nll_only"]["base"],
        "ratio": peaks["hpse"]["peak"] / peaks["nll_only"]["peak"],
    }


def _rollout_vs_generate(
    model: Any, tok: Any, hp: Any, prompts: Any, repeats: int
) -> tuple[dict, Any]:
    """Time the hybrid rollout and the student's own greedy generate() of the same length; restore
    after."""
    from hpse_easyedit import restore_weights
    from hpse_easyedit.executors import make_executor
    from hpse_easyedit.fast_decode import pays_off
    from hpse_easyedit.model_calls import input_device
    from hpse_easyedit.rollout import draw_rollout

    executor = make_executor(model, hp)
    weights_copy = executor.weights_copy()
    student = executor.model
    device = input_device(student)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0

    def rollout(
        hparams: Any = hp,
    ) -> Any:  # no stop tokens: every rollout runs max_new_tokens, as generate() does
        return draw_rollout(executor, prompts, hparams, stop_ids=[], pad_id=pad)

    # the same rollout without the fast decode path (F.linear), interleaved, when the fast path is
    # on or auto
    eager_hp = hp.with_overrides(["fast_decode=false"]) if hp.fast_decode is not False else None

    def generate() -> None:
        _greedy_fixed_length(student, torch.tensor([prompts.student_ids], device=device), hp, pad)

    rollout(), generate()  # warm-up
    if eager_hp is not None:
        rollout(eager_hp)
    t_roll, t_gen, t_eager = [], [], []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        ro = rollout()
        sync(device)
        t_roll.append(time.perf_counter() - t0)
        sync(device)
        t0 = time.perf_counter()
        generate()
        sync(device)
        t_gen.append(time.perf_counter() - t0)
        if eager_hp is not None:
            sync(device)
            t0 = time.perf_counter()
            eager = rollout(eager_hp)
            sync(device)
            t_eager.append(time.perf_counter() - t0)
    result = {
        "tokens": len(ro),
        "seconds": statistics.median(t_roll),
        "generate_seconds": statistics.median(t_gen),
        "ratio": statistics.median(t_roll) / statistics.median(t_gen),
        "tokens_per_s": len(ro) / statistics.median(t_roll),
        "seconds_each": t_roll,
        "generate_seconds_each": t_gen,
        "fast_decode": hp.fast_decode,
        # what the switch resolved to on this machine ("auto": pays_off's timing of both products)
        "fast_decode_resolved": pays_off(student) if hp.fast_decode == "auto" else hp.fast_decode,
    }
    if t_eager:  # what fast_decode buys, and what it changes
        result.update(
            {
                "eager_seconds": statistics.median(t_eager),
                "eager_seconds_each": t_eager,
                "fast_decode_speedup": statistics.median(t_eager) / statistics.median(t_roll),
                "fast_decode_same_tokens": bool(
                    torch.equal(ro.tokens, eager.tokens)
                    and torch.equal(ro.stepped_in, eager.stepped_in)
                ),
                "fast_decode_max_logprob_difference": float(
                    (ro.teacher_topk_logprobs - eager.teacher_topk_logprobs).abs().max()
                ),
            }
        )
    return result, restore_weights(student, weights_copy)


def _generate_speed(model: Any, tok: Any, prompts: Any, hp: Any, repeats: int) -> dict:
    """Greedy ``generate()`` of the unedited model on the editing prompt, ``max_new_tokens`` forced:
    the decode that ``generate_answers`` runs for one question."""
    device = input_device(model)
    ids = torch.tensor([prompts.student_ids], device=device)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0

    def generate() -> None:
        _greedy_fixed_length(model, ids, hp, pad)

    seconds = median_seconds(generate, device, repeats)
    return {
        "tokens": hp.max_new_tokens,
        "seconds": seconds,
        "tokens_per_s": hp.max_new_tokens / seconds,
    }


def _mmlu(model: Any, tok: Any, args: argparse.Namespace) -> dict:
    """One MMLU pass over the locality subset, shared-prefix path vs whole prompts (same
    questions)."""
    from ..tasks.datasets import DataError, load_mmlu_subset
    from ..tasks.mmlu import letter_scores

    try:
        items = load_mmlu_subset(args.mmlu_data, n=args.mmlu_n, shots=5, seed=0)
    except (DataError, OSError) as exc:
        return {"skipped": f"no MMLU data ({exc}); pass --mmlu-data DIR"}
    if args.mmlu_subjects:  # whole subjects, so each keeps the questions it shares a prefix with
        keep = sorted({it.subject for it in items})[: args.mmlu_subjects]
        items = [it for it in items if it.subject in keep]
    device = input_device(model)
    timed = {}
    for name, share in (("shared_prefix", True), ("whole_prompts", False)):
        sync(device)
        t0 = time.perf_counter()
        scores = letter_scores(model, tok, items, args.mmlu_batch_size, share_prefix=share)
        sync(device)
        timed[name] = (
            time.perf_counter() - t0,
            [max(range(4), key=lambda j: s[j]) for s in scores],
            scores,
        )
    diff = max(
        abs(a - b)
        for x, y in zip(timed["shared_prefix"][2], timed["whole_prompts"][2])
        for a, b in zip(x, y)
    )
    return {
        "questions": len(items),
        "subjects": len({it.subject for it in items}),
        "batch_size": args.mmlu_batch_size,
        "seconds": timed["shared_prefix"][0],
        "seconds_before": timed["whole_prompts"][0],
        "speedup": timed["whole_prompts"][0] / timed["shared_prefix"][0],
        "identical_predictions": timed["shared_prefix"][1] == timed["whole_prompts"][1],
        "max_abs_logit_difference": diff,
    }


def _easyedit_lora(model: Any, tok: Any, hp: Any, passage: str, steps: int | None) -> dict:
    """EasyEdit's own LoRA editor (its algorithm, called directly) on a copy of the model, same
    passage."""
    import yaml

    from hpse_easyedit.integrations.easyedit_lora import easyedit_lora_editor

    try:
        edit = easyedit_lora_editor()
    except Exception as exc:  # EasyEdit absent or broken: the key stays null
        return {
            "skipped": f"EasyEdit not importable ({type(exc).__name__}); "
            "set EASYEDIT_SRC to its source"
        }
    config = yaml.safe_load(EASYEDIT_LORA_HPARAMS.read_text())
    config.update(model_name=hp.model_name, device=str(input_device(model)))
    if steps is not None:
        config["num_steps"] = steps
    request = {
        "prompt": hp.editing_prompt.format(subject=_requests(passage)[0]["subject"]),
        "target_new": passage,
        "subject": _requests(passage)[0]["subject"],
    }
    work = copy.deepcopy(model)
    device = input_device(work)
    try:
        with (
            open(os.devnull, "w") as sink,
            contextlib.redirect_stdout(sink),
        ):  # it prints every step's loss
            sync(device)
            t0 = time.perf_counter()
            edit(work, tok, [request], config)
            sync(device)
            seconds = time.perf_counter() - t0
    except Exception as exc:  # its failure must not lose the figures measured before it
        return {"skipped": f"EasyEdit's LoRA editor failed: {type(exc).__name__}: {exc}"}
    finally:
        del work
    gc.collect()
    return {
        "seconds": seconds,
        "hparams": str(EASYEDIT_LORA_HPARAMS.relative_to(REPO)),
        "num_steps": config["num_steps"],
        "rank": config["rank"],
        "target_modules": config["target_modules"],
    }


def measure(args: argparse.Namespace) -> dict:
    from hpse_easyedit import hpse_edit, restore_weights
    from hpse_easyedit.editor import edit_prompts

    passage = Path(args.passage).read_text(encoding="utf-8").strip()
    hp, model, tok = _load(args.hparams, args.set, args.random_config, args.tokenizer, args.layers)
    device = input_device(model)
    on_gpu = device.type == "cuda"
    hp_nll = hp.with_overrides(["kl_weight=0"])
    report: dict[str, Any] = {
        "hparams": args.hparams,
        "overrides": list(args.set),
        "random_config": args.random_config,
        "layers": getattr(model.config, "num_hidden_layers", None),
        "model_name": hp.model_name,
        "dtype": hp.dtype,
        "executor": hp.executor,
        "rounds": hp.rounds,
        "inner_steps": hp.inner_steps,
        "max_new_tokens": hp.max_new_tokens,
        "batched_rollout": hp.batched_rollout,
        "fast_decode": hp.fast_decode,
        "device": str(device),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(device) if on_gpu else None,
            "torch": torch.__version__,
            "allocator": allocator_settings(),
            # the host's 1/5/15-minute load averages as the run started and ended (other processes
            # sharing the CPUs slow every timing here)
            "load_average": {"start": list(os.getloadavg())},
        },
        "n_params": sum(p.numel() for p in model.parameters()),
    }

    # 0. the machine's floors, in this run: bandwidth over the decode step's bytes, dense matmul
    #    throughput.
    step_bytes = decode_bytes(model)
    bandwidth = memory_bandwidth_gb_s(step_bytes, hp.torch_dtype, device)
    report["floors"] = {
        "decode_bytes_per_step": step_bytes,
        "memory_bandwidth_gb_s": bandwidth,
        "memory_floor_tok_s": bandwidth * 1e9 / step_bytes,
        "matmul_gflops": matmul_gflops(model, hp.torch_dtype, device),
    }

    # 1. rollout vs the student's own greedy generate() of the same length (fresh adapter / matrix).
    prompts = edit_prompts(model, tok, _requests(passage), hp)[0]
    report["rollout"], model = _rollout_vs_generate(model, tok, hp, prompts, args.rollout_repeats)
    report["generate"] = _generate_speed(model, tok, prompts, hp, args.rollout_repeats)

    # 2-4. HPSE edit vs NLL-only edit: time (in process), peak memory, teacher traffic.
    timings: dict[str, list[float]] = {"hpse": [], "nll_only": []}
    peaks: dict[str, float] = {}
    can_reset = on_gpu or reset_peak_rss()
    model = _warm_up(model, tok, hp, passage)
    for _ in range(args.repeats):
        for name, params in (("hpse", hp), ("nll_only", hp_nll)):
            gc.collect()
            if on_gpu:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
            elif can_reset:
                reset_peak_rss()
                base = rss_bytes()
            sync(device)
            t0 = time.perf_counter()
            res = hpse_edit(model, tok, _requests(passage), params)
            sync(device)
            timings[name].append(time.perf_counter() - t0)
            if on_gpu:
                peaks["reserved"] = max(
                    peaks.get("reserved", 0), torch.cuda.max_memory_reserved(device)
                )
            if on_gpu or can_reset:
                peak = torch.cuda.max_memory_allocated(device) if on_gpu else peak_rss_since_reset()
                peaks[name] = max(peaks.get(name, 0), peak - base)
                peaks[name + "_total"] = max(peaks.get(name + "_total", 0), peak)
            if name == "hpse":
                _record_hpse_edit(report, res, hp, prompts)
            model = restore_weights(res.model, res.weights_copy)
            del res
    report["train"]["seconds"] = statistics.median(report["train"]["seconds"])
    report["train"]["flop_floor_seconds"] = report["train"]["flops"] / (
        report["floors"]["matmul_gflops"] * 1e9
    )
    report["train"]["ratio"] = report["train"]["seconds"] / report["train"]["flop_floor_seconds"]
    report["edit"] = {
        "hpse_seconds": statistics.median(timings["hpse"]),
        "nll_only_seconds": statistics.median(timings["nll_only"]),
        "ratio": statistics.median(timings["hpse"]) / statistics.median(timings["nll_only"]),
    }
    if on_gpu or can_reset:
        kind = "CUDA peak allocated" if on_gpu else "peak RSS (VmHWM reset before each edit)"
        report["memory"] = {
            "kind": f"{kind} during the edit, model included "
            "(bytes); *_extra = above the loaded model",
            "hpse": peaks["hpse_total"],
            "nll_only": peaks["nll_only_total"],
            "hpse_extra": peaks["hpse"],
            "nll_only_extra": peaks["nll_only"],
            "ratio": peaks["hpse_total"] / peaks["nll_only_total"],
        }
        # what the card holds: the allocator's reserved peak, plus the context and libraries beside
        # it
        if on_gpu:
            free, total = torch.cuda.mem_get_info(device)
            report["memory"]["reserved"] = peaks["reserved"]
            report["memory"]["context"] = total - free - torch.cuda.memory_reserved(device)
        if not on_gpu and args.random_config is None and args.isolated_memory:
            report["memory"]["isolated"] = _isolated_memory(args, passage)

    # 4a. where one inner step's time goes (profiled, so not part of the timings above).
    report["train"]["profile"], model = _step_profile(
        model, tok, hp, passage, report["floors"]["matmul_gflops"]
    )

    # 4b. COIN* on the same passage, with the same Adam-step budget as the HPSE edit (R x M steps).
    report["coin"], model = _coin(model, tok, hp, passage, args)

    # 4c. SDFT (TRL): TRL's SDFTTrainer on the same passage, adapter and budget (R generations x M).
    report["sdft"], model = _sdft(model, tok, hp, passage, args)

    # 5. memory after N sequential edits (cut-down edits: growth, not training, is what is
    #    measured).
    if args.sequential:
        model, report["sequential"] = _sequential_memory(model, tok, hp, passage, args, device)

    # 6. one MMLU pass (the locality check of UnKEBench), new path vs the whole-prompt path.
    report["mmlu"] = _mmlu(model, tok, args) if args.mmlu_n else {"skipped": "--mmlu-n 0"}
    # 7. EasyEdit's own LoRA editor, same model and passage (last: it leaves gradient checkpointing
    #    on its copy).
    report["easyedit_lora"] = (
        _easyedit_lora(model, tok, hp, passage, args.easyedit_lora_steps)
        if not args.no_easyedit
        else {"skipped": "--no-easyedit"}
    )
    # 8. the GPU path without a GPU: kernels and host syncs per decoded token at the backbone of
    # --decode-hparams, graph breaks of the static decode step, the planner against this model's
    # measured CPU edit (SmolLM2).
    if args.no_gpu_path:
        report["gpu_path"] = {"skipped": "--no-gpu-path"}
    else:
        report["gpu_path"], model = _gpu_path(model, tok, hp, passage, args, on_gpu)
    report["machine"]["load_average"]["end"] = list(os.getloadavg())
    return report


def _record_hpse_edit(report: dict, res: Any, hp: Any, prompts: Any) -> None:
    """Into ``report``: the HPSE edit's training seconds (appended, one per repeat) and FLOPs, its
    teacher traffic, step-in rates and rollout time."""
    adapters = sum(v.numel() for v in res.weights_copy.values()) if hp.executor == "lora" else 0
    widths = [(1, len(prompts.student_ids) + round(r["rollout_len"])) for r in res.rounds]
    batches = (
        [(1, len(prompts.student_ids) + len(prompts.passage_ids))] * hp.rounds * hp.inner_steps
    )
    batches += [b for b in widths for _ in range(hp.inner_steps)]
    train = sum(r["seconds"] - r["rollout_seconds"] for r in res.rounds)
    flops = train_flops(res.model, hp, batches, adapters)
    report.setdefault("train", {"seconds": [], "flops": flops})["seconds"].append(train)
    report["teacher_forward_tokens_per_edit"] = res.teacher_forward_tokens
    report["inner_step_teacher_passes"] = res.inner_step_teacher_passes
    report["stepin_rate_by_round"] = [r["stepin_rate"] for r in res.rounds]
    report["hpse_rollout_seconds"] = sum(r.get("rollout_seconds", 0.0) for r in res.rounds)
    report["hpse_rollout_tokens"] = sum(r.get("rollout_len", 0.0) for r in res.rounds)


def _sequential_memory(
    model: Any, tok: Any, hp: Any, passage: str, args: argparse.Namespace, device: Any
) -> tuple[Any, dict]:
    """Memory after ``args.sequential`` edits made one after another (cut down by
    ``args.sequential_set``), then the model restored; CUDA allocated on a GPU, RSS on a CPU."""
    from hpse_easyedit import hpse_edit, restore_weights

    on_gpu = device.type == "cuda"
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
            mem[i] = torch.cuda.memory_allocated(device) if on_gpu else rss_bytes()
    model = restore_weights(edited, first_copy)
    return model, {
        "kind": "CUDA allocated" if on_gpu else "RSS",
        "overrides": list(args.sequential_set),
        "bytes_after": {str(k): v for k, v in mem.items()},
        "growth_vs_first": mem[counts[-1]] / mem[counts[0]] - 1.0,
    }


def _gpu_path(
    model: Any, tok: Any, hp: Any, passage: str, args: argparse.Namespace, on_gpu: bool
) -> tuple[dict, Any]:
    from hpse_easyedit import HPSEHyperParams
    from hpse_easyedit.loading import EMBEDDED_MODEL

    from .gpu_path import decode_counts, planner_check, static_step_graph_breaks

    decode_hp = HPSEHyperParams.from_hparams(args.decode_hparams)
    out: dict[str, Any] = {
        "decode_hparams": args.decode_hparams,
        "dynamic": decode_counts(decode_hp, static=False),
        "static": decode_counts(decode_hp, static=True),
        "static_graph_breaks": static_step_graph_breaks(decode_hp),
    }
    if hp.model_name == EMBEDDED_MODEL and not on_gpu:
        check = planner_check(model, tok, hp, passage)
        model = check.pop("model")
        out["planner_smollm2"] = check
    return out, model


class _ProfiledStep:
    """An ``Objective`` that runs another one unchanged and profiles its inner step number ``at``
    (1-based; the first pays the process's first-touch costs): the forwards and backwards of every
    loss group, not the Adam step after them. ``train_edit`` drives it."""

    def __init__(self, inner: Any, profiler: Any, at: int = 2) -> None:
        self.inner, self.profiler, self.at, self.calls = inner, profiler, at, 0
        self.name, self.terms = inner.name, inner.terms

    def start_round(self, student: Any) -> dict:
        return self.inner.start_round(student)

    def step(self, student: Any) -> Any:
        self.calls += 1
        if self.calls != self.at:
            yield from self.inner.step(student)
            return
        self.profiler.start()
        try:
            yield from self.inner.step(student)
        finally:
            self.profiler.stop()

    def describe_round(self, stats: dict) -> str:
        return self.inner.describe_round(stats)


def _step_profile(
    model: Any, tok: Any, hp: Any, passage: str, matmul_gflops: float, top: int = 8
) -> tuple[dict, Any]:
    """Where one HPSE inner step's time goes (``torch.profiler``, the second step after a
    first-round rollout, the NLL and KL rows both): self time by operator, the matmuls' share of it
    and the rate they ran at against the dense-matmul floor of this run. Timings under the profiler
    run slower than without it; the shares are the point."""
    from torch.profiler import ProfilerActivity, profile

    from hpse_easyedit import restore_weights
    from hpse_easyedit.editor import HPSEObjective, edit_prompts
    from hpse_easyedit.executors import make_executor
    from hpse_easyedit.prompts import stop_token_ids
    from hpse_easyedit.training import train_edit

    activities = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if input_device(model).type == "cuda" else []
    )
    prof = profile(activities=activities, with_flops=True)
    stop_ids = stop_token_ids(model, tok)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else next(iter(stop_ids), 0)
    executor = make_executor(model, hp)
    objective = HPSEObjective(
        executor,
        edit_prompts(model, tok, _requests(passage), hp),
        hp,
        stop_ids=stop_ids,
        pad_id=pad_id,
    )
    res = train_edit(executor, hp, _ProfiledStep(objective, prof, at=2), rounds=1, inner_steps=2)
    model = restore_weights(res.model, res.weights_copy)
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events) / 1e6
    mm = [e for e in events if e.key in MATMUL_OPS]
    mm_seconds = sum(e.self_cpu_time_total for e in mm) / 1e6
    mm_flops = sum(e.flops or 0 for e in mm)
    events.sort(key=lambda e: -e.self_cpu_time_total)
    return {
        "self_seconds": total,
        "matmul_seconds": mm_seconds,
        "matmul_share": mm_seconds / total if total else None,
        "matmul_gflops": mm_flops / mm_seconds / 1e9 if mm_seconds and mm_flops else None,
        "matmul_of_floor": (mm_flops / mm_seconds / 1e9) / matmul_gflops
        if mm_seconds and mm_flops
        else None,
        "top_ops": [
            {"op": e.key, "self_seconds": e.self_cpu_time_total / 1e6, "calls": e.count}
            for e in events[:top]
        ],
    }, model


def _timed_edits(
    model: Any, repeats: int, edit: Callable[[Any], Any]
) -> tuple[list[float], list, Any]:
    """``edit(model)`` (an ``EditResult``) ``repeats`` times, each restored before the next: the
    seconds of each, the last edit's per-round statistics, and the restored model."""
    from hpse_easyedit import restore_weights

    device = input_device(model)
    seconds: list[float] = []
    rounds: list = []
    for _ in range(repeats):
        gc.collect()
        sync(device)
        t0 = time.perf_counter()
        res = edit(model)
        sync(device)
        seconds.append(time.perf_counter() - t0)
        rounds = res.rounds
        model = restore_weights(res.model, res.weights_copy)
        del res
    return seconds, rounds, model


def _coin(
    model: Any, tok: Any, hp: Any, passage: str, args: argparse.Namespace
) -> tuple[dict, Any]:
    """Time a COIN* edit of the same passage on the same model (its file ``hparams/COIN/<the HPSE
    file's name>`` or ``--coin``), with ``steps`` = the HPSE edit's rounds x inner steps; the median
    of ``--repeats``."""
    from hpse_easyedit.coin import COINHyperParams, coin_edit

    if args.no_coin:
        return {"skipped": "--no-coin"}, model
    path = Path(args.coin) if args.coin else REPO / "hparams" / "COIN" / Path(args.hparams).name
    if not path.is_file():
        return {"skipped": f"no COIN* file {path} (pass --coin FILE)"}, model
    chp = COINHyperParams.from_hparams(path).with_overrides(
        {
            "steps": hp.rounds * hp.inner_steps,
            "model_name": hp.model_name,
            "device": hp.device,
            "dtype": hp.dtype,
        }
    )
    seconds, rounds, model = _timed_edits(
        model, args.repeats, lambda m: coin_edit(m, tok, _requests(passage), chp)
    )
    return {
        "seconds": statistics.median(seconds),
        "hparams": str(path.relative_to(REPO) if path.is_relative_to(REPO) else path),
        "steps": chp.steps,
        "chunks": rounds[0].get("chunks"),
    }, model


def _sdft(
    model: Any, tok: Any, hp: Any, passage: str, args: argparse.Namespace
) -> tuple[dict, Any]:
    """Time an SDFT (TRL) edit of the same passage on the same model (its file
    ``hparams/SDFT/<the HPSE file's name>`` or ``--sdft``) with the HPSE edit's budget: its rounds
    (generations), inner steps and rollout length; the median of ``--repeats``. Skipped, saying
    why, without TRL."""
    from hpse_easyedit.integrations.sdft import (
        SDFTHyperParams,
        TRLNotFoundError,
        check_trl,
        sdft_edit,
    )

    if args.no_sdft:
        return {"skipped": "--no-sdft"}, model
    path = Path(args.sdft) if args.sdft else REPO / "hparams" / "SDFT" / Path(args.hparams).name
    if not path.is_file():
        return {"skipped": f"no SDFT file {path} (pass --sdft FILE)"}, model
    try:
        check_trl()
    except TRLNotFoundError as err:
        return {"skipped": str(err)}, model
    budget = ("rounds", "inner_steps", "max_new_tokens", "model_name", "device", "dtype")
    shp = SDFTHyperParams.from_hparams(path).with_overrides({k: getattr(hp, k) for k in budget})
    seconds, rounds, model = _timed_edits(
        model, args.repeats, lambda m: sdft_edit(m, tok, _requests(passage), shp)
    )
    return {
        "seconds": statistics.median(seconds),
        "seconds_each": seconds,
        "hparams": str(path.relative_to(REPO) if path.is_relative_to(REPO) else path),
        "rounds": shp.rounds,
        "inner_steps": shp.inner_steps,
        "completion_tokens": sum(r["rollout_len"] or 0.0 for r in rounds),
        "sampling_seconds": sum(r["rollout_seconds"] for r in rounds),
    }, model
