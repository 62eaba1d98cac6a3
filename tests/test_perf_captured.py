"""``benchmarks.perf.captured``: the kernel calls read from inductor's generated code, and the
benchmark end to end on SmolLM2's architecture (its graphs traced by dynamo's eager backend here,
so only the eager count and the ops outside the graphs are real)."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.perf import captured as perf_captured
from hpse_easyedit import captured


@pytest.mark.slow
def test_kernel_calls_reads_inductors_generated_code():
    """One product handed to the library and one fused kernel for the pointwise rest, forward; in
    the backward, the products of the two gradients and the fused rest."""
    from torch._inductor.utils import run_and_get_code

    def f(x, w):
        return (torch.relu(x @ w) * 2 + 1).sum()

    x = torch.randn(8, 16, requires_grad=True)
    w = torch.randn(16, 4, requires_grad=True)
    _, codes = run_and_get_code(lambda: torch.compile(f, fullgraph=True)(x, w).backward())
    forward, backward = (perf_captured.kernel_calls(code) for code in codes)
    assert forward["library"] == 1 and forward["fused"] >= 1 and forward["aten"] == 0
    assert backward["library"] == 2 and backward["fused"] >= 1


@pytest.mark.slow
def test_the_benchmark_counts_both_steps_and_writes_its_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(captured, "BACKEND", "eager")
    monkeypatch.setattr(captured, "_COMPILED", {})
    out = tmp_path / "captured.json"
    args = ["--hparams", "hparams/HPSE/smollm2-135m.yaml", "--lengths", "4", "8", "6"]
    assert perf_captured.main([*args, "--vocab", "256", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    eager = figures["runs"]["eager"]
    assert [r["layers"] for r in eager] == [1, 2] and eager[1]["kernels"] > eager[0]["kernels"]
    assert figures["figures"]["eager"]["at_depth"] == (
        figures["figures"]["eager"]["rest"] + 30 * figures["figures"]["eager"]["per_layer"]
    )
    for run in figures["runs"]["captured"]:
        assert run["graphs"] == [] and run["outside_graphs"] > 0  # traced, no inductor code
    assert "kernels at 30 layers" in capsys.readouterr().out
