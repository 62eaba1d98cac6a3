"""The rollout's decode matmuls on CPU, computed as ``W @ x^T`` (the ``fast_decode`` hparams
switch).

A rollout token is one forward of 1-2 rows (batched rollout: student and teacher). ``nn.Linear``
computes ``x @ W^T``; on this project's CPU build (torch 2.13.0, MKL) that product at 2 rows runs
far below the memory bandwidth its weight needs (it repacks the weight on every call), while ``W @
x^T``, the same product with the weight as the left operand, streams the weight once. Measured on
SmolLM2-135M, one thread, weights too large for the cache (docs/PERFORMANCE.md): a batch-2 decode
step's matmuls fall from about 114 to 56 ms. The products are summed in another order, so logits
differ from ``F.linear``'s in the last bits (teacher top-K log-probabilities within 5e-5 on
SmolLM2); greedy tokens and step-ins were the same in every comparison made. ``fast_decode: false``
gives the ``F.linear`` path bit for bit.

Which product is faster depends on the CPU and its BLAS: ``W @ x^T`` was 1.77x faster per rollout on
the earlier development VM, but 0.62x (slower) on the current 2-core host, where ``F.linear`` at 2
rows already streams the weight. ``fast_decode: auto`` (the default) therefore times both products
once per process over the model's own switchable weights (``pays_off``) and switches only where ``W
@ x^T`` is at least ``AUTO_MARGIN`` times faster.

Only frozen float32 CPU weights are switched (the base model's projections and its output head): the
trainable tensors (LoRA adapters, the FT-M matrix) keep ``F.linear``, and so does every call with
autograd on or with more than ``MAX_ROWS`` rows (prompt prefill, training).
"""

from __future__ import annotations

import contextlib
import time
import types
from typing import Iterator

import torch
import torch.nn.functional as F

__all__ = ["AUTO_MARGIN", "MAX_ROWS", "few_row_linears", "pays_off"]

#: at most this many rows (batch x new tokens) take the ``W @ x^T`` path: the rollout's 1-2 rows. At
#: 4-8 rows (measured, 1 thread, cold weights) it no longer pays for the layers' own projections
#: (0.5-1.5x of ``x @ W^T``).
MAX_ROWS = 2


#: ``auto`` switches only where ``W @ x^T`` takes at most 1 / AUTO_MARGIN of ``F.linear``'s time, so
#: a host where the two are close keeps the ``F.linear`` path (and its bits) rather than flipping
#: with timing noise.
AUTO_MARGIN = 1.15

_AUTO_CHOICE: dict = {}  # (threads, shapes of the switchable weights) -> bool, once per process


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``nn.Linear.forward`` with ``W @ x^T`` for a no-grad call of at most ``MAX_ROWS`` rows."""
    if (
        torch.is_grad_enabled()
        or x.numel() > MAX_ROWS * x.shape[-1]
        or x.dtype != self.weight.dtype
    ):
        return F.linear(x, self.weight, self.bias)
    out = torch.mm(self.weight, x.reshape(-1, x.shape[-1]).t()).t()
    if self.bias is not None:
        out = out + self.bias
    return out.contiguous().view(*x.shape[:-1], self.weight.shape[0])


def _slot(module: torch.nn.Module) -> str | None:
    """Which attribute of ``module`` to switch: its ``forward``, or under accelerate's dispatch
    hooks (``device_map``) the ``_old_forward`` the hook calls; None for a module this path leaves
    alone."""
    w = getattr(module, "weight", None)
    if not (
        type(module) is torch.nn.Linear
        and isinstance(w, torch.Tensor)
        and not w.requires_grad
        and w.device.type == "cpu"
        and w.dtype == torch.float32
    ):
        return None
    own = vars(module)
    if "forward" not in own:
        return "forward"
    if hasattr(module, "_hf_hook") and "_old_forward" in own:
        return "_old_forward"
    return None  # someone else's forward: left as it is


def pays_off(model: torch.nn.Module) -> bool:
    """Whether ``W @ x^T`` beats ``F.linear`` by ``AUTO_MARGIN`` on this machine, for ``model``'s
    switchable weights at ``MAX_ROWS`` rows: one sweep over all of them each way (as a decode step
    reads them, so the weights come from memory, not the cache), best of 3 interleaved; decided once
    per process for a set of weight shapes."""
    return _pays_off([m.weight for m in model.modules() if _slot(m) is not None])


def _pays_off(weights: list[torch.Tensor]) -> bool:
    if not weights:
        return False
    key = (torch.get_num_threads(), tuple(tuple(w.shape) for w in weights))
    if key not in _AUTO_CHOICE:
        xs = {w.shape[1]: torch.randn(MAX_ROWS, w.shape[1]) for w in weights}
        products = {
            "linear": lambda w, x: F.linear(x, w),
            "w_xt": lambda w, x: torch.mm(w, x.t()).t().contiguous(),
        }
        best = dict.fromkeys(products, float("inf"))
        with torch.no_grad():
            for _ in range(3):
                for name, product in products.items():
                    t0 = time.perf_counter()
                    for w in weights:
                        product(w, xs[w.shape[1]])
                    best[name] = min(best[name], time.perf_counter() - t0)
        _AUTO_CHOICE[key] = best["w_xt"] * AUTO_MARGIN <= best["linear"]
    return _AUTO_CHOICE[key]


@contextlib.contextmanager
def few_row_linears(model: torch.nn.Module, enabled: bool | str = True) -> Iterator[int]:
    """Inside: the frozen float32 CPU ``nn.Linear`` layers of ``model`` compute few-row no-grad
    calls as ``W @ x^T`` (an instance attribute, put back on exit; nothing global changes).
    ``enabled="auto"``: only where ``pays_off(model)``. Yields how many layers were switched (0 when
    not enabled, on GPU, or in half precision)."""
    slots = (
        [(m, slot) for m in model.modules() if (slot := _slot(m)) is not None] if enabled else []
    )
    if enabled == "auto" and not _pays_off([m.weight for m, _ in slots]):
        slots = []
    switched = []
    for m, slot in slots:
        switched.append((m, slot, vars(m).get(slot)))
        setattr(m, slot, types.MethodType(_forward, m))
    try:
        yield len(switched)
    finally:
        for m, slot, before in switched:
            if before is None:
                delattr(m, slot)
            else:
                setattr(m, slot, before)
