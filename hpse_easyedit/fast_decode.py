"""The rollout's decode matmuls on CPU, computed as ``W @ x^T`` (the ``fast_decode`` hparams switch).

A rollout token is one forward of 1-2 rows (batched rollout: student and teacher). ``nn.Linear`` computes
``x @ W^T``; on this project's CPU build (torch 2.13.0, MKL) that product at 2 rows runs far below the
memory bandwidth its weight needs (it repacks the weight on every call), while ``W @ x^T``, the same
product with the weight as the left operand, streams the weight once. Measured on SmolLM2-135M, one
thread, weights too large for the cache (docs/PERFORMANCE.md): a batch-2 decode step's matmuls fall from
about 114 to 56 ms. The products are summed in another order, so logits differ from ``F.linear``'s in the
last bits (teacher top-K log-probabilities within 5e-5 on SmolLM2); greedy tokens and step-ins were the
same in every comparison made. ``fast_decode: false`` gives the ``F.linear`` path bit for bit.

Only frozen float32 CPU weights are switched (the base model's projections and its output head): the
trainable tensors (LoRA adapters, the FT-M matrix) keep ``F.linear``, and so does every call with
autograd on or with more than ``MAX_ROWS`` rows (prompt prefill, training).
"""

from __future__ import annotations

import contextlib
import types
from typing import Iterator

import torch
import torch.nn.functional as F

__all__ = ["MAX_ROWS", "few_row_linears"]

#: at most this many rows (batch x new tokens) take the ``W @ x^T`` path: the rollout's 1-2 rows. At 4-8 rows
#: (measured, 1 thread, cold weights) it no longer pays for the layers' own projections (0.5-1.5x of ``x @ W^T``).
MAX_ROWS = 2


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``nn.Linear.forward`` with ``W @ x^T`` for a no-grad call of at most ``MAX_ROWS`` rows."""
    if torch.is_grad_enabled() or x.numel() > MAX_ROWS * x.shape[-1] or x.dtype != self.weight.dtype:
        return F.linear(x, self.weight, self.bias)
    out = torch.mm(self.weight, x.reshape(-1, x.shape[-1]).t()).t()
    if self.bias is not None:
        out = out + self.bias
    return out.contiguous().view(*x.shape[:-1], self.weight.shape[0])


def _slot(module: torch.nn.Module) -> str | None:
    """Which attribute of ``module`` to switch: its ``forward``, or under accelerate's dispatch hooks (``device_map``)
    the ``_old_forward`` the hook calls; None for a module this path leaves alone."""
    w = getattr(module, "weight", None)
    if not (type(module) is torch.nn.Linear and isinstance(w, torch.Tensor) and not w.requires_grad
            and w.device.type == "cpu" and w.dtype == torch.float32):
        return None
    own = vars(module)
    if "forward" not in own:
        return "forward"
    if hasattr(module, "_hf_hook") and "_old_forward" in own:
        return "_old_forward"
    return None  # someone else's forward: left as it is


@contextlib.contextmanager
def few_row_linears(model: torch.nn.Module, enabled: bool = True) -> Iterator[int]:
    """Inside: the frozen float32 CPU ``nn.Linear`` layers of ``model`` compute few-row no-grad calls as
    ``W @ x^T`` (an instance attribute, put back on exit; nothing global changes). Yields how many layers
    were switched (0 when ``enabled`` is false, on GPU, or in half precision)."""
    switched = []
    for m in model.modules() if enabled else ():
        slot = _slot(m)
        if slot is not None:
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
