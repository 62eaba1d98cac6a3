"""The benchmark run's stages, each alone: the run directory, the scorer, the summary, the options a
task declares, and the write-aside helper a full disk falls back to. No model is loaded here."""

import argparse
import json
from pathlib import Path

import pytest

from benchmarks.records.store import ConfigPolicy, ResultFile
from benchmarks.run.cli import add_run_arguments
from benchmarks.run.distributed import ProcessContext
from benchmarks.run.options import RunOptions
from benchmarks.run.run_dir import RunDirectory, units
from benchmarks.run.scorer import Scorer
from benchmarks.run.summary import RunSummary
from benchmarks.tasks import TASKS
from benchmarks.tasks.judge import JudgeSettings
from benchmarks.tasks.llm.client import JudgeRefusedError
from hpse_easyedit.atomic import write_aside
from hpse_easyedit.errors import UsageError

MQ, UK = TASKS["mquake-uns"], TASKS["unkebench"]


def test_units_are_single_cases_or_blocks_of_t():
    assert units(3, None) == [[0], [1], [2]]
    assert units(5, 2) == [[0, 1], [2, 3], [4]]


def test_the_run_directory_records_its_config_and_redoes_an_unfinished_block(tmp_path):
    ids = ["a", "b", "c", "d"]
    blocks = units(len(ids), 2)
    first = RunDirectory(tmp_path, ProcessContext(), ConfigPolicy())
    assert first.open({"x": 1}, ids, blocks, sequential=True, retry_failed=False) == set()
    assert json.loads((tmp_path / "config.json").read_text()) == {"x": 1}
    first.results.append(
        [{"case_id": "a", "block": 0}, {"case_id": "b", "block": 0}, {"case_id": "c", "block": 1}]
    )
    again = RunDirectory(tmp_path, ProcessContext(), ConfigPolicy())
    assert again.open({"x": 1}, ids, blocks, sequential=True, retry_failed=False) == {
        "a",
        "b",
    }  # c's block is redone
    assert set(ResultFile(tmp_path / "results.jsonl").records) == {"a", "b"}
    assert again.sequence is not None and again.recorded_hparams({"lr": 1}) == {
        "lr": 1
    }  # config.json has none


def test_retry_failed_forgets_only_the_failed_cases(tmp_path):
    d = RunDirectory(tmp_path, ProcessContext(), ConfigPolicy())
    d.open({}, ["a", "b"], units(2, None), sequential=False, retry_failed=False)
    d.results.append([{"case_id": "a"}, {"case_id": "b", "failed": "diverged"}])
    again = RunDirectory(tmp_path, ProcessContext(), ConfigPolicy())
    assert again.open({}, ["a", "b"], units(2, None), sequential=False, retry_failed=True) == {"a"}


class _RefusingJudge:
    name = "refusing"

    def factscore(self, answer, passage, subject):
        raise JudgeRefusedError("model not found")

    def close(self):
        pass


def _unke_case():
    return {
        "case_id": "7",
        "passage": "Ada Lovelace wrote the first program.",
        "subject": "Ada Lovelace",
        "question": "Who is Ada?",
        "para_question": "Tell me about Ada.",
        "sub_questions": ["What did she write?"],
        "sub_answers": ["the first program"],
    }


def test_a_refused_judge_keeps_the_answers_unjudged_and_stops_once_the_case_is_written(tmp_path):
    scorer = Scorer(UK, "lexical", JudgeSettings(), tmp_path)
    scorer.judge = _RefusingJudge()
    rec = scorer.score(
        _unke_case(), ["Ada wrote a program.", "Ada was a writer.", "the first program"]
    )
    assert rec["Jnt"] is None and rec["Dmp"] is None and rec["unjudged"] == ["Jnt", "Dmp"]
    assert (
        rec["answers"]["sub_questions"] == ["the first program"]
        and "model not found" in rec["judge_error"]
    )
    with pytest.raises(JudgeRefusedError):
        scorer.stop_if_refused()


def test_a_task_without_a_judge_has_no_judge_and_its_scores_need_none(tmp_path):
    scorer = Scorer(MQ, "lexical", JudgeSettings(), tmp_path)
    assert scorer.judge is None and scorer.client is None
    case = {
        "case_id": "1",
        "single_hop_questions": ["q1"],
        "single_hop_answers": [["Paris"]],
        "multi_hop_questions": ["m1"],
        "multi_hop_answers": ["Paris"],
    }
    rec = scorer.score(case, ["It is Paris.", "Paris"])
    assert (
        rec["Ind"] == 1.0 and rec["Cmp"] == 1.0 and MQ.answers_of(rec) == ["It is Paris.", "Paris"]
    )


def test_the_summary_leaves_failed_cases_out_of_the_means(tmp_path):
    summary = RunSummary(
        MQ, tmp_path, label="row", method="LoRA", judge=None, sequential=None, checkpoints=None
    )
    records = [
        {"case_id": "1", "Ind": 1.0, "Cmp": 0.0, "edit_seconds": 2.0, "rounds": []},
        {"case_id": "2", "failed": "diverged", "edit_seconds": 4.0, "rounds": []},
    ]
    out = summary.build(None, records, {"lr": 1})
    assert (
        out["Ind"] == 100.0
        and out["Cmp"] == 0.0
        and out["failed_cases"] == 1
        and out["n_cases"] == 2
    )
    assert (
        out["edit_seconds_mean"] == 3.0 and out["hparams"] == {"lr": 1} and "MMLU_before" not in out
    )
    summary.write(out)
    assert "FAILED: the edits of 1 of 2 case(s)" in (tmp_path / "table.md").read_text()


def test_each_task_owns_its_options():
    assert RunOptions(benchmark="mquake-uns", hparams="x.yaml").task_options == {}
    uk = RunOptions(benchmark="unkebench", hparams="x.yaml", mmlu_n=0)
    assert uk.task_options["mmlu_n"] == 0 and uk.task_options["subjects"] == "auto"
    with pytest.raises(UsageError, match="'mmlu_n' is no option of this run"):
        RunOptions(benchmark="mquake-uns", hparams="x.yaml", mmlu_n=0)
    with pytest.raises(UsageError, match="'nope' is no option of this run"):
        RunOptions(benchmark="unkebench", hparams="x.yaml", nope=1)
    mq, uk = argparse.ArgumentParser(), argparse.ArgumentParser()
    add_run_arguments(mq, "mquake-uns")
    add_run_arguments(uk, "unkebench")
    assert "--mmlu-n" not in mq.format_help() and "--subjects" not in mq.format_help()
    assert "--mmlu-n" in uk.format_help() and "--mquake-file" not in uk.format_help()


def test_write_aside_writes_whole_into_a_new_temporary_file_or_directory():
    path = write_aside(lambda p: p.write_text("kept\n"), "hpse-test-", suffix=".jsonl")
    assert (
        path.read_text() == "kept\n"
        and path.name.startswith("hpse-test-")
        and path.suffix == ".jsonl"
    )
    path.unlink()
    folder = write_aside(lambda p: (p / "a.txt").write_text("x"), "hpse-test-", directory=True)
    assert folder.is_dir() and (folder / "a.txt").read_text() == "x"
    (folder / "a.txt").unlink()
    folder.rmdir()


def test_write_aside_says_none_when_nothing_can_hold_it(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))

    def full(path):
        raise OSError(28, "No space left on device")

    prefix = f"hpse-test-{tmp_path.name}-"
    try:
        assert write_aside(full, prefix) is None
    finally:
        for root in (tmp_path, Path("/dev/shm")):
            for left in root.glob(prefix + "*"):
                left.unlink()
