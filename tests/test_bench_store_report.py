"""The resumable results store, the paper-layout table and the step-in plot."""

import json

import pytest

from benchmarks.records.store import (
    ConfigMismatchError,
    ConfigPolicy,
    IncompleteRunError,
    ResultFile,
    check_run_config,
    merge_results,
    read_results,
    result_files,
    results_name,
)
from benchmarks.report import judge_note, paper_table, plot_stepin_rates
from benchmarks.tasks.metrics import stepin_rate_by_round

CONFIG = {"benchmark": "mquake-uns", "hparams": {"kl_weight": 1.0, "rounds": 5}}


def _runner_store(out_dir, config):
    """What the runner opens for a run directory: config.json checked (and recorded), then its
    results file."""
    check_run_config(out_dir, config)
    return ResultFile(out_dir / results_name())


def test_store_appends_one_line_per_case_and_reloads(tmp_path):
    store = _runner_store(tmp_path, CONFIG)
    store.append([{"case_id": "1", "Ind": 1.0}])
    store.append([{"case_id": 2, "Ind": 0.5}, {"case_id": "3", "Ind": 0.0}])
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert [json.loads(x)["case_id"] for x in lines] == ["1", 2, "3"]
    again = _runner_store(tmp_path, CONFIG)
    assert len(again) == 3 and "2" in again and 2 in again and "4" not in again
    with pytest.raises(ValueError, match="already recorded"):
        again.append([{"case_id": "3"}])
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 3


def test_store_drops_a_torn_last_line(tmp_path, caplog):
    store = _runner_store(tmp_path, CONFIG)
    store.append([{"case_id": "1"}, {"case_id": "2"}])
    with open(tmp_path / "results.jsonl", "a") as fh:
        fh.write('{"case_id": "3", "Ind": 0.')  # killed in the middle of a write
    resumed = _runner_store(tmp_path, CONFIG)
    assert sorted(resumed.records) == ["1", "2"] and "torn last line" in caplog.text
    resumed.append([{"case_id": "3"}])
    assert [
        json.loads(x)["case_id"] for x in (tmp_path / "results.jsonl").read_text().splitlines()
    ] == ["1", "2", "3"]


def test_store_refuses_a_different_config_and_foreign_files(tmp_path):
    _runner_store(tmp_path, CONFIG).append([{"case_id": "1"}])
    changed = {"benchmark": "mquake-uns", "hparams": {"kl_weight": 0.0, "rounds": 5}}
    with pytest.raises(
        ConfigMismatchError, match=r"hparams.kl_weight: 1.0 -> 0.0.*another --out directory"
    ):
        _runner_store(tmp_path, changed)
    assert json.loads((tmp_path / "config.json").read_text()) == CONFIG  # untouched
    assert len(_runner_store(tmp_path, CONFIG)) == 1
    foreign = tmp_path / "other"
    foreign.mkdir()
    (foreign / "results.jsonl").write_text('{"case_id": "x"}\n')
    with pytest.raises(ConfigMismatchError, match="not written by this runner"):
        _runner_store(foreign, CONFIG)
    bad = tmp_path / "bad"
    bad.mkdir()
    _runner_store(bad, CONFIG)
    (bad / "results.jsonl").write_text('{"case_id": "1"}\nnot json\n{"case_id": "2"}\n')
    with pytest.raises(ValueError, match="line 2 is not a JSON record"):
        _runner_store(bad, CONFIG)


def test_store_drop_rewrites_without_the_dropped_records(tmp_path):
    store = _runner_store(tmp_path, CONFIG)
    store.append([{"case_id": str(i), "block": i // 2} for i in range(5)])
    assert store.drop(lambda r: r["block"] != 2) == ["4"]
    assert sorted(_runner_store(tmp_path, CONFIG).records) == ["0", "1", "2", "3"]


def test_config_policy_tolerates_placement_and_new_fields_at_their_default(tmp_path, caplog):
    old = {"benchmark": "mquake-uns", "hparams": {"kl_weight": 1.0, "device": 0}}
    check_run_config(tmp_path, old)
    policy = ConfigPolicy(
        ignored=lambda path: path == ("hparams", "device"),
        new_default=lambda path, value: path == ("hparams", "seed") and value == 0,
    )
    grown = {"benchmark": "mquake-uns", "hparams": {"kl_weight": 1.0, "device": 3, "seed": 0}}
    with pytest.raises(
        ConfigMismatchError, match="hparams.device: 0 -> 3; hparams.seed: '<missing>' -> 0"
    ):
        check_run_config(tmp_path, grown)  # without a policy every difference counts
    check_run_config(tmp_path, grown, write=False, policy=policy)  # a non-main process never writes
    assert json.loads((tmp_path / "config.json").read_text()) == old
    with caplog.at_level("INFO"):
        check_run_config(tmp_path, grown, policy=policy)
    assert json.loads((tmp_path / "config.json").read_text()) == {
        "benchmark": "mquake-uns",
        "hparams": {"kl_weight": 1.0, "device": 0, "seed": 0},
    }  # pinned; device kept
    assert "hparams.seed=0" in caplog.text
    with pytest.raises(
        ConfigMismatchError, match="hparams.seed: 0 -> 1"
    ):  # pinned: a later default change is caught
        check_run_config(
            tmp_path, {**grown, "hparams": {**grown["hparams"], "seed": 1}}, policy=policy
        )
    fresh = tmp_path / "fresh"
    check_run_config(fresh, old)
    with pytest.raises(
        ConfigMismatchError, match="new_field: '<missing>' -> 2"
    ):  # not a field at its default
        check_run_config(fresh, {**old, "new_field": 2}, policy=policy)


def test_results_files_per_process_read_only_reads_and_merge(tmp_path):
    assert results_name() == "results.jsonl" and results_name(3, 8) == "results.rank3-of-8.jsonl"
    with pytest.raises(ValueError, match="rank must be in"):
        results_name(2, 2)
    ResultFile(tmp_path / results_name(1, 2)).append([{"case_id": "b"}])
    ResultFile(tmp_path / results_name(0, 2)).append([{"case_id": "a"}, {"case_id": "x"}])
    ResultFile(tmp_path / "results.jsonl").append([{"case_id": "c"}])
    (tmp_path / "results.rank0-of-2.jsonl.tmp").write_text("not a results file")
    assert [p.name for p in result_files(tmp_path)] == [
        "results.jsonl",
        "results.rank0-of-2.jsonl",
        "results.rank1-of-2.jsonl",
    ]
    with open(tmp_path / "results.rank1-of-2.jsonl", "a") as fh:
        fh.write('{"case_id": "d", "Ind": 0.')  # still being written by its process
    before = (tmp_path / "results.rank1-of-2.jsonl").read_bytes()
    assert list(read_results(tmp_path / "results.rank1-of-2.jsonl")) == ["b"]
    assert (
        tmp_path / "results.rank1-of-2.jsonl"
    ).read_bytes() == before  # a reader never truncates
    merged = merge_results(tmp_path, ["a", "b", "c"])  # "x" is beyond the selection and ignored
    assert sorted(merged) == ["a", "b", "c"]
    with pytest.raises(IncompleteRunError, match="1 of 4 case\\(s\\) have no result \\(first: d"):
        merge_results(tmp_path, ["a", "b", "c", "d"])
    assert sorted(merge_results(tmp_path, ["a", "d"], require_all=False)) == ["a"]
    ResultFile(tmp_path / results_name(2, 3)).append([{"case_id": "a"}])
    with pytest.raises(IncompleteRunError, match="case a is recorded twice"):
        merge_results(tmp_path, ["a"])


def test_paper_table_layout_and_rounding():
    unke = {
        "Jnt": 73.33,
        "Dmp": 58.5,
        "Div": 61.46,
        "Avg": 64.43,
        "MMLU_after": 70.66,
        "judge": "llm:gemini-2.5-flash",
    }
    mq = {"Ind": 83.25, "Cmp": 54.7, "Avg": 68.975}
    table = paper_table(
        [("LoRA + HPSE", {"unkebench": unke, "mquake-uns": mq}), ("FT-M", {"mquake-uns": mq})]
    )
    lines = table.splitlines()
    assert lines[0] == "|  | **UnKEBench** |  |  |  |  | **MQuAKE-uns** |  |  |"
    assert (
        lines[2] == "| **method** | **Jnt** | **Dmp** | **Div** | "
        "**Avg** | **MMLU** | **Ind** | **Cmp** | **Avg** |"
    )
    assert lines[3] == "| LoRA + HPSE | 73.3 | 58.5 | 61.5 | 64.4 | 70.7 | 83.2 | 54.7 | 69.0 |"
    assert lines[4] == "| FT-M | - | - | - | - | - | 83.2 | 54.7 | 69.0 |"
    single = paper_table([("LoRA", {"mquake-uns": mq})]).splitlines()
    assert single == [
        "| method | Ind | Cmp | Avg |",
        "|---|---:|---:|---:|",
        "| LoRA | 83.2 | 54.7 | 69.0 |",
    ]
    assert "NOT the paper's LLM judge" in judge_note([{"judge": "lexical-fallback"}])
    assert judge_note([mq]) == ""


def test_stepin_rate_by_round_means_over_cases_and_skips_missing():
    records = [
        {"rounds": [{"stepin_rate": 0.3}, {"stepin_rate": 0.1}]},
        {"rounds": [{"stepin_rate": 0.1}, {"stepin_rate": None}, {"stepin_rate": 0.0}]},
        {"rounds": []},
    ]
    assert stepin_rate_by_round(records) == pytest.approx([0.2, 0.1, 0.0])
    assert stepin_rate_by_round([{"rounds": [{"stepin_rate": None}]}]) == [None]


def test_stepin_plot_writes_a_png(tmp_path):
    path = tmp_path / "stepin.png"
    plot_stepin_rates({"HPSE": [0.27, 0.05, 0.01], "LoRA": [None, None]}, path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
