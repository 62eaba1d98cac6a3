"""benchmarks/perf.py end to end on a tiny model: every figure present, teacher never runs in inner steps."""

import json

import pytest

from benchmarks.perf import main as perf_main
from tiny_models import make_tiny_model_and_tokenizer, tiny_hparams


def test_perf_report_on_tiny_model(tmp_path, capsys):
    make_tiny_model_and_tokenizer("llama", tmp_path=tmp_path / "m")
    hp_path = tmp_path / "hp.yaml"
    tiny_hparams(model_name=str(tmp_path / "m")).to_yaml(hp_path)
    passage = tmp_path / "p.txt"
    passage.write_text("AJ Lee speaks Russian fluently and lives in Moscow.")
    out = tmp_path / "perf.json"
    args = ["--hparams", str(hp_path), "--passage", str(passage), "--sequential", "1", "3", "--out", str(out)]
    assert perf_main(args) == 0
    report = json.loads(out.read_text())
    assert report["inner_step_teacher_passes"] == 0
    assert report["teacher_forward_tokens_per_edit"] > 0
    assert report["rollout"]["ratio"] > 0 and report["edit"]["ratio"] > 0
    assert len(report["rollout"]["seconds_each"]) == 3  # --rollout-repeats default, median reported
    assert 0 < report["hpse_rollout_seconds"] < report["edit"]["hpse_seconds"]
    assert set(report["sequential"]["bytes_after"]) == {"1", "3"}
    assert "memory" in report and report["memory"]["ratio"] > 0
    text = capsys.readouterr().out
    assert "rollout / generate()" in text and "HPSE edit / NLL-only edit" in text and "of which HPSE rollouts" in text
    with pytest.raises(SystemExit):
        perf_main(args)  # never overwrites a report
