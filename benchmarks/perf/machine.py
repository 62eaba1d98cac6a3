"""The machine's floors and meters for ``benchmarks.perf``: memory bandwidth over one decode step's
bytes, dense matmul throughput, the FLOPs of an edit's training, and this process's resident and
peak memory."""

from __future__ import annotations

import os
import resource
import statistics
import time
from typing import Any, Sequence

import torch

__all__ = [
    "MATMUL_OPS",
    "allocator_settings",
    "decode_bytes",
    "linear_params",
    "matmul_gflops",
    "median_seconds",
    "memory_bandwidth_gb_s",
    "peak_rss_bytes",
    "peak_rss_since_reset",
    "reset_peak_rss",
    "rss_bytes",
    "sync",
    "train_flops",
]


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def allocator_settings() -> dict[str, str]:
    """The environment settings that change the C allocator (glibc's ``MALLOC_*`` and tunables, a
    preloaded allocator): the CPU peak-RSS figures move with them (PERFORMANCE.md, peak memory)."""
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith("MALLOC_") or k in ("GLIBC_TUNABLES", "LD_PRELOAD")
    }


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) of this process; False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def peak_rss_since_reset() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return peak_rss_bytes()


def median_seconds(fn: Any, device: torch.device, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def decode_bytes(model: Any) -> int:
    """Bytes of weights one decode step reads: every parameter once (shared tensors once), except an
    input embedding table that is not also the output head (a step reads one row of it)."""
    seen, total = set(), 0
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    tied = out is not None and out.weight.data_ptr() == emb.data_ptr()
    for p in model.parameters():
        if p.data_ptr() in seen or (p.data_ptr() == emb.data_ptr() and not tied):
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size()
    return total


def memory_bandwidth_gb_s(
    nbytes: int, dtype: torch.dtype, device: torch.device, repeats: int = 5
) -> float:
    """GB/s of a matrix-vector product over a weight-sized matrix (capped at 4 GiB): a decode step's
    access pattern."""
    cols = 1024
    nbytes = min(nbytes, 4 * 1024**3)
    rows = max(1, nbytes // (cols * torch.tensor([], dtype=dtype).element_size()))
    weight = torch.randn(
        rows, cols, device=device, dtype=dtype
    )  # drawn in its dtype: no float32 copy beside it
    x = torch.randn(cols, 1, device=device, dtype=dtype)
    seconds = median_seconds(lambda: weight @ x, device, repeats)
    return weight.numel() * weight.element_size() / seconds / 1e9


def matmul_gflops(
    model: Any, dtype: torch.dtype, device: torch.device, tokens: int = 512, repeats: int = 5
) -> float:
    """Dense matmul throughput on the model's own MLP shape: [tokens, hidden] @ [hidden,
    intermediate]."""
    cfg = model.config
    hidden, inter = cfg.hidden_size, getattr(cfg, "intermediate_size", 4 * cfg.hidden_size)
    a = torch.randn(tokens, hidden, device=device).to(dtype)
    b = torch.randn(hidden, inter, device=device).to(dtype)
    seconds = median_seconds(lambda: a @ b, device, repeats)
    return 2 * tokens * hidden * inter / seconds / 1e9


def linear_params(model: Any) -> tuple[int, int, int]:
    """(decoder-layer linear weights, output-head weights, number of layers) of a causal LM."""
    head = model.get_output_embeddings().weight.numel()
    layer_linear = sum(
        m.weight.numel()
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and ".layers." in n and "lora_" not in n
    )
    return layer_linear, head, model.config.num_hidden_layers


def train_flops(
    model: Any, hp: Any, batches: Sequence[tuple[int, int]], adapter_params: int
) -> float:
    """Matmul FLOPs of the inner steps: per step and per batch of ``rows x width`` tokens, the
    forward (2 FLOPs per weight per token, plus causal attention) and the backward's input gradients
    (the same again; the frozen base needs no weight gradients) and the trainable tensors' weight
    gradients."""
    layer_linear, head, layers = linear_params(model)
    cfg = model.config
    attn_width = cfg.num_attention_heads * (
        getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    )
    if hp.executor == "ft_m":  # input gradients stop at the FT-M layer
        grad_layers = layers - hp.ftm_layer
        trainable = model.get_submodule(hp.ftm_module_template.format(hp.ftm_layer)).weight.numel()
    else:
        grad_layers, trainable = layers, adapter_params
    total = 0.0
    for rows, width in batches:
        tokens = rows * width
        attn = 2 * rows * width * width * attn_width  # QK^T and AV, causal half
        forward = 2 * tokens * (layer_linear + head + adapter_params) + attn * layers
        backward = (
            2 * tokens * (layer_linear * grad_layers / layers + head + adapter_params)
            + attn * grad_layers
            + 2 * tokens * trainable
        )
        total += forward + backward
    return total


MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
