"""``python -m benchmarks perf`` end to end on a tiny model: every figure present, teacher never
runs in inner steps."""

import json

import pytest

from benchmarks.perf import main as perf_main
from tiny_models import make_tiny_model_and_tokenizer, tiny_hparams

# the slow tier (`make test`, not `make test-fast`): the performance benchmark end to end
pytestmark = pytest.mark.slow

KEYS = {
    "rollout_tok_s",
    "generate_tok_s",
    "memory_bandwidth_gb_s",
    "memory_floor_tok_s",
    "matmul_gflops",
    "train_seconds",
    "train_flop_floor_seconds",
    "edit_seconds_hpse",
    "edit_seconds_nll_only",
    "edit_seconds_easyedit_lora",
    "mmlu_seconds",
    "mmlu_seconds_before",
    "peak_rss_ratio",
    "sequential_rss",
    "machine",
    "dtype",
}


def _mmlu_dir(root):
    """Two subjects of a made-up MMLU: two test questions each, two dev shots."""
    for split, rows in (("test", 2), ("dev", 2)):
        (root / "mmlu" / split).mkdir(parents=True, exist_ok=True)
        for subject in ("astronomy", "virology"):
            lines = [
                f"Question {i} about {subject}?,one,two,three,four,{'ABCD'[i % 4]}"
                for i in range(rows)
            ]
            (root / "mmlu" / split / f"{subject}_{split}.csv").write_text("\n".join(lines) + "\n")
    return root


def _fake_batched_runs(hparams, sizes, overrides, data_dir, source, cases):
    """In place of ``measure_batched``'s fresh processes (``tests/test_gpu_batched.py`` runs them):
    the report of made-up runs, and the arguments ``benchmarks perf`` passed."""
    from benchmarks.perf.batched import batched_report

    runs = {
        b: {
            "cases": cases,
            "seconds": 10.0 + 5.0 * b,
            "rollout_seconds": 4.0 + b,
            "inner_step_seconds": 6.0 + 4.0 * b,
            "peak_bytes": (100 + 10 * b) * 2**20,
            "memory": "rss",
        }
        for b in sizes
    }
    report = batched_report(runs)
    report["passed"] = [hparams, list(sizes), list(overrides), data_dir, source, cases]
    return report


def test_perf_report_on_tiny_model(tmp_path, capsys, monkeypatch):
    from benchmarks.perf import editors

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    monkeypatch.setattr(editors, "measure_batched", _fake_batched_runs)
    make_tiny_model_and_tokenizer("llama", tmp_path=tmp_path / "m")
    hp_path = tmp_path / "hp.yaml"
    tiny_hparams(model_name=str(tmp_path / "m")).to_yaml(hp_path)
    passage = tmp_path / "p.txt"
    passage.write_text("AJ Lee speaks Russian fluently and lives in Moscow.")
    out = tmp_path / "perf.json"
    args = [
        "--hparams",
        str(hp_path),
        "--passage",
        str(passage),
        "--sequential",
        "1",
        "3",
        "--out",
        str(out),
        "--mmlu-data",
        str(_mmlu_dir(tmp_path / "data")),
        "--no-easyedit",
        "--decode-hparams",
        "hparams/HPSE/smollm2-135m.yaml",
        "--cases-at-once",
        "1",
        "2",
        "--batched-cases",
        "4",
        "--data",
        str(tmp_path / "data"),
    ]
    assert perf_main(args) == 0
    report = json.loads(out.read_text())
    assert KEYS <= set(report)
    # --cases-at-once: the batched figures in the same report, measured on the same hparams file
    assert report["passed"] == [
        str(hp_path),
        [1, 2],
        [],
        str(tmp_path / "data"),
        {"random_config": None, "tokenizer": None, "layers": None},
        4,
    ]
    assert set(report["cases_per_hour"]) == set(report["batched_peak_rss"]) == {"1", "2"}
    assert report["batched_speedup"] == pytest.approx((4 / 20) / (4 / 15))
    # the GPU path counted without a GPU (meta device): the static decode step is one graph with no
    # host sync
    gpu = report["gpu_path"]
    assert report["decode_ops_per_token"] == gpu["static"]["ops_per_token"] > 0
    assert gpu["static"]["layers"] == 30 and gpu["dynamic"]["host_syncs_per_token"] >= 1
    assert (
        report["decode_graph_breaks"] == 0 and report["decode_host_syncs_per_token"] == 1 / 8
    )  # the stop test
    assert (
        report["planner_error_smollm2"] is None and report["gpu_peak_reserved_gib"] is None
    )  # not SmolLM2, CPU
    assert report["edit_seconds_easyedit_lora"] is None and report["dtype"] == "float32"
    assert (
        report["machine"]["allocator"]["MALLOC_MMAP_THRESHOLD_"] == "131072"
    )  # the RSS figures move with it
    assert report["mmlu"]["questions"] == 4 and report["mmlu"]["identical_predictions"] is True
    assert report["mmlu_seconds"] > 0 and report["mmlu_seconds_before"] > 0
    assert report["memory_floor_tok_s"] == pytest.approx(
        report["memory_bandwidth_gb_s"] * 1e9 / report["floors"]["decode_bytes_per_step"]
    )
    assert 0 < report["train_flop_floor_seconds"] and report["train"]["flops"] > 0
    assert 0 < report["train_seconds"] < report["edit_seconds_hpse"]
    assert report["inner_step_teacher_passes"] == 0
    assert report["teacher_forward_tokens_per_edit"] > 0
    assert report["rollout"]["ratio"] > 0 and report["edit"]["ratio"] > 0
    assert len(report["rollout"]["seconds_each"]) == 3  # --rollout-repeats default, median reported
    # fast_decode (auto by default) is timed against the F.linear path in the same run, with what it
    # changes
    assert report["fast_decode"] == "auto" and len(report["rollout"]["eager_seconds_each"]) == 3
    assert report["rollout"]["fast_decode_resolved"] in (True, False)
    assert (
        report["rollout"]["fast_decode_speedup"] > 0
        and report["rollout"]["fast_decode_same_tokens"] is True
    )
    assert report["rollout"]["fast_decode_max_logprob_difference"] < 1e-4
    assert 0 < report["hpse_rollout_seconds"] < report["edit"]["hpse_seconds"]
    assert set(report["sequential"]["bytes_after"]) == {"1", "3"}
    assert "memory" in report and report["memory"]["ratio"] > 0
    iso = report["memory"][
        "isolated"
    ]  # each edit again in a fresh process, after the same load and warm-up
    assert report["peak_rss_ratio_isolated"] == iso["ratio"] == iso["hpse"] / iso["nll_only"]
    assert 0 <= iso["hpse_extra"] < iso["hpse"] and 0 <= iso["nll_only_extra"] < iso["nll_only"]
    # one inner step profiled: the matmuls' share of its self time, their rate, the heaviest
    # operators
    prof = report["train"]["profile"]
    assert 0 < prof["matmul_share"] <= 1 and 0 < prof["matmul_seconds"] <= prof["self_seconds"]
    assert prof["matmul_gflops"] > 0 and prof["matmul_of_floor"] > 0
    assert prof["top_ops"] and all(
        o["calls"] > 0 and o["self_seconds"] > 0 for o in prof["top_ops"]
    )
    text = capsys.readouterr().out
    assert (
        "decode floor" in text and "training / FLOP floor" in text and "MMLU whole prompts" in text
    )
    assert (
        "rollout / generate()" in text
        and "HPSE edit / NLL-only edit" in text
        and "of which HPSE rollouts" in text
    )
    assert "rollout fast_decode speed-up" in text and "inner step in matmuls" in text
    assert "best B = 2: 0.75x the cases per hour of B = 1" in text
    with pytest.raises(SystemExit):
        perf_main(args)  # never overwrites a report


def test_perf_report_times_coin_on_the_same_passage_with_the_same_step_budget(tmp_path, capsys):
    from hpse_easyedit.coin import COINHyperParams

    make_tiny_model_and_tokenizer("llama", tmp_path=tmp_path / "m")
    hp_path = tmp_path / "hp.yaml"
    tiny_hparams(model_name=str(tmp_path / "m"), rounds=2, inner_steps=2).to_yaml(hp_path)
    coin_path = tmp_path / "coin.yaml"
    COINHyperParams(
        model_name=str(tmp_path / "m"), steps=99, min_chunk_tokens=2, max_length=1024
    ).to_yaml(coin_path)
    passage = tmp_path / "p.txt"
    passage.write_text("AJ Lee is a wrestler. She speaks Russian fluently. She lives in Moscow.")
    out = tmp_path / "perf.json"
    args = [
        "--hparams",
        str(hp_path),
        "--passage",
        str(passage),
        "--sequential",
        "--out",
        str(out),
        "--mmlu-n",
        "0",
        "--no-easyedit",
        "--rollout-repeats",
        "1",
        "--no-isolated-memory",
        "--no-gpu-path",  # test_perf_report_on_tiny_model counts the GPU path
        "--coin",
        str(coin_path),
    ]
    assert perf_main(args) == 0
    report = json.loads(out.read_text())
    assert report["gpu_path"] == {"skipped": "--no-gpu-path"}
    assert report["decode_ops_per_token"] is None and report["decode_graph_breaks"] is None
    assert "isolated" not in report["memory"] and report["peak_rss_ratio_isolated"] is None
    assert report["coin"]["steps"] == 4  # the HPSE edit's rounds x inner steps, not the file's 99
    assert (
        report["coin"]["chunks"] >= 2
        and report["edit_seconds_coin"] == report["coin"]["seconds"] > 0
    )
    assert "COIN* edit / HPSE edit" in capsys.readouterr().out
    assert perf_main(args[:-2] + ["--out", str(tmp_path / "b.json"), "--no-coin"]) == 0
    assert json.loads((tmp_path / "b.json").read_text())["coin"] == {"skipped": "--no-coin"}
