"""The input gradient of a half-precision linear on the CPU, in the two gradient layouts, measured.

A linear's backward multiplies its output gradient ``g`` (rows x out) by its weight ``W`` (out x
in). On a CPU without native half-precision matrix units (AVX2), torch's bfloat16/float16 ``mm``
takes a scalar path when ``g`` is row-major and a fast one when ``g`` is column-major; the edit's
inner steps therefore hand every CPU half-precision linear a column-major gradient
(``hpse_easyedit.training.cpu_half_backward``). This times both layouts (and the forward
``x @ W.T`` for scale) at 7B widths and prints a table; ``--out`` writes the figures as JSON.

    OMP_NUM_THREADS=1 python -m benchmarks perf-half-backward --rows 8 40 --out runs/perf/half.json
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Sequence

import torch

from hpse_easyedit.cli import OneLineParser

from ..markdown import md_table

__all__ = ["main", "measure"]

#: (out, in) of Qwen2.5-7B's MLP up projection and its attention output projection
SHAPES = ((18944, 3584), (3584, 3584))


def _seconds(fn, repeat: int) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def measure(rows: int, out: int, inp: int, dtype: torch.dtype, repeat: int = 2) -> dict:
    """Seconds of ``g @ W`` with ``g`` row-major and column-major, and of the forward, for one
    shape; the two gradients' values are compared too (``max_abs_diff``)."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(out, inp, generator=gen).to(dtype)
    g = torch.randn(rows, out, generator=gen).to(dtype)
    x = torch.randn(rows, inp, generator=gen).to(dtype)
    g_col = g.t().contiguous().t()
    return {
        "rows": rows,
        "out": out,
        "in": inp,
        "dtype": str(dtype).removeprefix("torch."),
        "grad_row_major_s": _seconds(lambda: g @ w, repeat),
        "grad_column_major_s": _seconds(lambda: g_col @ w, repeat),
        "forward_s": _seconds(lambda: torch.nn.functional.linear(x, w), repeat),
        "max_abs_diff": float(((g @ w).float() - (g_col @ w).float()).abs().max()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m benchmarks perf-half-backward",
        description="Time a half-precision linear's input gradient on the CPU in both layouts.",
    )
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 40], help="gradient rows")
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    parser.add_argument("--repeat", type=int, default=2, help="timed repetitions per figure")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    results = [measure(r, out, inp, dtype, args.repeat) for r in args.rows for out, inp in SHAPES]
    head = ["rows", "W (out x in)", "g @ W, g row-major", "g column-major", "ratio", "forward"]
    rows = [
        [
            m["rows"],
            f"{m['out']} x {m['in']}",
            f"{m['grad_row_major_s'] * 1e3:.1f} ms",
            f"{m['grad_column_major_s'] * 1e3:.1f} ms",
            f"{m['grad_row_major_s'] / m['grad_column_major_s']:.1f}x",
            f"{m['forward_s'] * 1e3:.1f} ms",
        ]
        for m in results
    ]
    print("\n".join(md_table(head, rows, "rlrrrr")))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        host = {
            "machine": platform.machine(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        }
        args.out.write_text(json.dumps({"host": host, "results": results}, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
