"""The batched engine's GPU figures on CPU (``benchmarks.perf.gpu_batched``,
``benchmarks.perf.gpu_path
--batched``): the kernel counts of B cases at once run through the engine's own code on the meta
device, a decode step's kernels are shared by the cases (per case they fall with B), the fused Adam
launch rule, the H100 roofline of one case's edit, and the options' checks. A tiny Qwen2
architecture (``model_name`` pointing at its config.json) stands in for the 7B widths, whose counts
take minutes here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.perf import batched as perf_batched
from benchmarks.perf import gpu_batched, gpu_path
from benchmarks.perf import measure as perf_measure
from hpse_easyedit import HPSEHyperParams
from tiny_models import make_config, make_tiny_model_and_tokenizer, make_tokenizer, tiny_hparams

# the slow tier (`make test`, not `make test-fast`): op counts and timings at real widths
pytestmark = pytest.mark.slow

HPSE = Path(__file__).resolve().parents[1] / "hparams" / "HPSE"


@pytest.fixture(scope="module")
def hparams(tmp_path_factory):
    """``qwen2.5-7b.yaml`` (LoRA, bfloat16, its budget) on a 4-layer tiny Qwen2 architecture."""
    where = tmp_path_factory.mktemp("tiny-qwen2")
    make_config("qwen2", make_tokenizer("qwen2"), layers=4).save_pretrained(where)
    return HPSEHyperParams.from_hparams(HPSE / "qwen2.5-7b.yaml").with_overrides(
        {"model_name": str(where), "ftm_layer": 1}
    )


@pytest.fixture(scope="module")
def counts(hparams):
    return {b: gpu_batched.batched_counts(hparams, b, rollout=16) for b in (None, 1, 2)}


def test_counts_run_for_one_and_two_cases_and_kernels_per_case_fall(counts):
    one, two = counts[1], counts[2]
    assert one["cases"] == 1 and two["cases"] == 2 and one["layers"] == two["layers"] == 4
    for c in (one, two):
        assert c["decode_step_ops"] > 0 and c["inner_step_ops"] > 0
        assert c["decode_step_flops"] > 0 and c["inner_step_flops"] > 0
        assert c["decode_step_host_reads"] == pytest.approx(1 / 8)  # the stop test every 8 tokens
    # one decode step serves both cases: its kernels hardly grow, so per case they about halve
    assert two["decode_step_ops"] <= 1.05 * one["decode_step_ops"]
    assert two["kernels_per_case_per_token"] < 0.55 * one["kernels_per_case_per_token"]
    assert two["kernels_per_case_per_inner_step"] < one["kernels_per_case_per_inner_step"]
    # the arithmetic is each case's own: FLOPs and trainable tensors scale with the cases
    assert two["inner_step_flops"] == pytest.approx(2 * one["inner_step_flops"], rel=0.01)
    assert two["trainable_numel"] == 2 * one["trainable_numel"]


def test_solo_edit_counted_beside_the_batched_engine(counts):
    solo = counts[None]
    assert solo["engine"].startswith("solo") and solo["cases"] == 1
    assert solo["decode_step_ops"] > 0 and solo["inner_step_ops"] > 0
    assert solo["inner_step_flops"] == pytest.approx(counts[1]["inner_step_flops"], rel=0.01)


def test_fused_adam_launch_rule():
    small = [torch.empty(8, device="meta")]
    # the step counters' _foreach_add_ (110 tensors a launch) + _fused_adam_ (36 a launch)
    assert gpu_batched.fused_adam_kernels(small * 36) == 1 + 1
    assert gpu_batched.fused_adam_kernels(small * 37) == 1 + 2
    assert gpu_batched.fused_adam_kernels(small * 111) == 2 + 4
    # a tensor of more chunks than a launch's 320 blocks needs a second launch
    big = [torch.empty(321 * gpu_batched.CHUNK, device="meta")]
    assert gpu_batched.fused_adam_kernels(big) == 1 + 2


def test_roofline_of_one_case_falls_with_cases(hparams, counts):
    calib = gpu_batched.calibration()
    assert 1e-6 < calib["host_seconds_per_kernel"] < 1e-4
    roof = {b: gpu_batched.case_edit_roofline(hparams, counts[b], calib, 16) for b in (1, 2)}
    for r in roof.values():
        assert r["seconds"] == pytest.approx(sum(r["parts"].values()))
        assert 0 < r["seconds_graphed_decode"] < r["seconds"]
    assert roof[2]["seconds"] < roof[1]["seconds"]
    # the decode reads the weights once for both cases (each case's adapters and cache its own)
    assert roof[1]["decode_step_bytes"] < roof[2]["decode_step_bytes"]
    assert roof[2]["decode_step_bytes"] < 2 * roof[1]["decode_step_bytes"]
    assert roof[2]["parts"]["rollouts_floor"] < roof[1]["parts"]["rollouts_floor"]


def test_batched_decode_step_has_no_graph_break(hparams):
    assert gpu_path.static_step_graph_breaks(hparams, cases=2) == 0


def test_batched_counts_refuse_ftm(hparams):
    with pytest.raises(ValueError, match="executor: lora"):
        gpu_batched.batched_counts(hparams.with_overrides({"executor": "ft_m"}), 1)


@pytest.mark.parametrize(
    "argv",
    [
        ["--batched", "0"],
        ["--batched", "2", "--device", "cuda"],
        ["--batched", "2", "--layers", "2"],
        ["--repeats", "0"],
        ["--out", "EXISTING"],  # a file of an earlier run is not overwritten
    ],
)
def test_gpu_path_batched_options_checked(argv, tmp_path):
    earlier = tmp_path / "gpu.json"
    earlier.write_text("{}")
    with pytest.raises(SystemExit) as exit_:
        gpu_path.main([str(earlier) if a == "EXISTING" else a for a in argv])
    assert exit_.value.code == 2
    assert earlier.read_text() == "{}"


@pytest.mark.parametrize(
    "argv",
    [
        ["--tokenizer", "somewhere"],
        ["--layers", "2"],
        ["--passage", "no/such/file.txt"],
        ["--cases", "2", "--cases-at-once", "1", "4"],
    ],
)
def test_perf_batched_source_options_checked(argv, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        perf_batched.main(argv + ["--out", str(tmp_path / "out.json")])
    assert exit_.value.code == 2


def test_perf_batched_child_edits_a_random_config_with_one_passage_per_case(monkeypatch, tmp_path):
    """The child builds the model through ``perf_measure._load`` with the random-config options
    (here a tiny model stands in for the 7B) and edits one request with the passage per case."""
    model, tok = make_tiny_model_and_tokenizer("qwen2")
    hp = tiny_hparams(rounds=1, inner_steps=1, max_new_tokens=3)
    seen = []

    def load(hparams, overrides, random_config, tokenizer, layers):
        seen.append((hparams, list(overrides), random_config, tokenizer, layers))
        return hp, model, tok

    monkeypatch.setattr(perf_measure, "_load", load)
    passage = tmp_path / "passage.txt"
    passage.write_text("Selma Varrick is a marine biologist who mapped the Kelvin Trench.\n")
    source = {"random_config": "qwen2.5-7b", "tokenizer": None, "layers": 1}
    source["passage"] = str(passage)
    out = perf_batched._child("qwen2.5-7b.yaml", ["rounds=1"], 2, None, source)
    assert seen == [("qwen2.5-7b.yaml", ["rounds=1"], "qwen2.5-7b", None, 1)]
    assert out["cases"] == out["cases_at_once"] == 2 and out["failed"] == 0
    assert out["rollout_tokens"] > 0
    # --cases 3 at B = 2: the same three cases, two at a time (a batch of 2, then one of 1)
    three = perf_batched._child("qwen2.5-7b.yaml", ["rounds=1"], 2, None, source, total=3)
    assert three["cases"] == 3 and three["cases_at_once"] == 2 and three["failed"] == 0
    assert three["rollout_tokens"] > out["rollout_tokens"]


def test_perf_batched_hands_the_source_options_to_each_child(monkeypatch):
    commands = []

    class Done:
        returncode, stderr = 0, ""

        def __init__(self, cases):
            self.stdout = json.dumps(
                {
                    "cases": cases,
                    "seconds": 2.0,
                    "rollout_seconds": 1.0,
                    "peak_bytes": 10,
                    "memory": "rss",
                }
            )

    def run(cmd, **_):
        commands.append(cmd)
        flag = "--cases" if "--cases" in cmd else "--child"  # the child's cases: N, else B
        return Done(int(cmd[cmd.index(flag) + 1]))

    monkeypatch.setattr(perf_batched.subprocess, "run", run)
    source = {"random_config": "qwen2.5-7b", "tokenizer": None, "layers": None, "passage": "p.txt"}
    report = perf_batched.measure_batched("f.yaml", [1, 2], source=source)
    assert [c[c.index("--child") + 1] for c in commands] == ["1", "2"]
    for cmd in commands:
        assert cmd[cmd.index("--random-config") + 1] == "qwen2.5-7b"
        assert cmd[cmd.index("--passage") + 1] == "p.txt"
        assert "--tokenizer" not in cmd and "--layers" not in cmd and "--cases" not in cmd
    assert report["cases_per_hour"] == {"1": 1800.0, "2": 3600.0}
    # --cases 4: every B edits the same four cases; cases per hour count them
    commands.clear()
    report = perf_batched.measure_batched("f.yaml", [1, 2], source=source, cases=4)
    assert all(c[c.index("--cases") + 1] == "4" for c in commands) and len(commands) == 2
    assert report["cases_per_hour"] == {"1": 7200.0, "2": 7200.0}
