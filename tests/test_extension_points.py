"""docs/ARCHITECTURE.md's "Where new things go", followed to the letter: a toy task, a toy judge
and a toy executor, each one class plus one registration in the documented place, run end to end
through the command line a user runs; validation, the CLI's choices and the factories follow the
registries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import pytest
from datasets import Dataset

from benchmarks import tasks as tasks_module
from benchmarks.run.cli import cli_main
from benchmarks.tasks import Option, Task, data_path
from benchmarks.tasks import judge as judge_module
from benchmarks.tasks.judge import FactScoreResult, Judge, register_judge
from hpse_easyedit.executors import EXECUTORS
from hpse_easyedit.executors.lora import LoRAExecutor
from tiny_models import make_tiny_model_and_tokenizer

CASES = [
    {"case_id": str(i), "subject": s, "passage": p, "question": q}
    for i, (s, p, q) in enumerate(
        [
            ("AJ Lee", "AJ Lee is a wrestler who lives in Moscow.", "Where does AJ Lee live?"),
            ("The Firm", "The Firm is a novel by John Grisham.", "Who wrote The Firm?"),
        ],
        1,
    )
]


class EchoTask(Task):
    """One question per passage; 'Hit': the judge's FActScore of the answer against the passage."""

    name = "echo"
    title = "Echo"
    data_file = "echo.json"
    default_max_new_tokens = 4
    metrics = ("Hit",)
    table_columns = (("Hit", "Hit"),)
    needs_judge = True
    data_option = Option(
        "data_file", "--echo-file", None, metavar="FILE", help="Echo file, relative to --data"
    )
    options = (
        Option(
            "echo_upper",
            "--echo-upper",
            False,
            type=lambda v: v == "yes",
            help="shout the questions",
        ),
    )

    def load(
        self, data_dir: Path, opts: Any, client: Any, cache_dir: Path, template: str
    ) -> tuple[Any, list[Path]]:
        path = data_path(data_dir, opts.data_file or self.data_file)
        cases = json.loads(path.read_text())[: opts.limit]
        for c in cases:
            c["requests"] = [
                {
                    "subject": c["subject"],
                    "target_new": c["passage"],
                    "prompt": template.format(subject=c["subject"]),
                }
            ]
            c["upper"] = opts.task_options["echo_upper"]
        return Dataset.from_list(cases), [path]

    def questions(self, case: Mapping[str, Any]) -> list[str]:
        return [case["question"].upper() if case["upper"] else case["question"]]

    def score(self, case: Mapping[str, Any], answers: Sequence[str], judge: Judge | None) -> dict:
        return {
            "answers": {"question": answers[0]},
            "Hit": judge.factscore(answers[0], case["passage"], case["subject"]).score,
        }

    def answers_of(self, record: Mapping[str, Any]) -> list[str]:
        return [record["answers"]["question"]]


class NonEmptyJudge(Judge):
    """Supports an answer when it says anything at all."""

    name = "non-empty"

    def factscore(self, answer: str, passage: str, subject: str) -> FactScoreResult:
        return FactScoreResult(
            facts=[answer], supported=[bool(answer.strip())], score=float(bool(answer.strip()))
        )


class CountingLoRA(LoRAExecutor):
    """LoRA that counts the edits it made."""

    made = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        type(self).made += 1


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(tasks_module.TASKS, "echo", EchoTask())
    monkeypatch.setitem(EXECUTORS, "counting", CountingLoRA)
    CountingLoRA.made = 0
    judges, kinds = dict(judge_module.JUDGES), list(judge_module.JUDGE_KINDS)
    register_judge("non-empty", lambda settings: NonEmptyJudge())
    yield
    # in place: the command line and the factory hold these very objects
    judge_module.JUDGES.clear()
    judge_module.JUDGES.update(judges)
    judge_module.JUDGE_KINDS[:] = kinds


def test_a_toy_task_judge_and_executor_run_through_the_command_line(registered, tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "echo.json").write_text(json.dumps(CASES))
    make_tiny_model_and_tokenizer("llama", tmp_path=tmp_path / "model")
    hparams = tmp_path / "hpse.yaml"
    hparams.write_text(
        f"alg_name: HPSE\nmodel_name: {tmp_path / 'model'}\nrounds: 1\ninner_steps: 1\n"
        "max_new_tokens: 3\nexecutor: counting\n"
    )
    args = [
        "--hparams",
        str(hparams),
        "--data",
        str(data),
        "--judge",
        "non-empty",
        "--echo-upper",
        "yes",
        "--out",
        str(tmp_path / "run"),
        "--log-level",
        "WARNING",
    ]
    assert cli_main("echo", args) == 0
    records = [json.loads(x) for x in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert sorted(r["case_id"] for r in records) == ["1", "2"] and all(
        r["Hit"] in (0.0, 1.0) for r in records
    )
    assert CountingLoRA.made == 2  # the toy executor made both edits
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (
        summary["n_cases"] == 2
        and summary["judge"] == "non-empty"
        and summary["editor"] == "counting + HPSE"
    )
    assert 0.0 <= summary["Hit"] <= 100.0
    # the task's own option and the registered judge are on its command line; another task's are not
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli_main("echo", ["--help"])
    help_text = capsys.readouterr().out
    assert "--echo-upper" in help_text and "non-empty" in help_text and "--mmlu-n" not in help_text


def test_the_registries_drive_validation(registered, tmp_path, capsys, caplog):
    hparams = tmp_path / "hpse.yaml"
    hparams.write_text(f"alg_name: HPSE\nmodel_name: {tmp_path}\nexecutor: nowhere\n")
    (tmp_path / "echo.json").write_text(json.dumps(CASES))
    assert (
        cli_main(
            "echo",
            [
                "--hparams",
                str(hparams),
                "--data",
                str(tmp_path),
                "--judge",
                "non-empty",
                "--out",
                str(tmp_path / "run"),
            ],
        )
        == 2
    )
    err = (
        capsys.readouterr().err + caplog.text
    )  # the one line: printed, or through the run's log handler
    assert "executor" in err and "'counting'" in err and "'nowhere'" in err
