"""Enumerations derive from their registries: a new judge is one class plus one register_judge line,
and the option check, --help and make_judge follow."""

import pytest

from benchmarks.run.runner import RunOptions
from benchmarks.tasks.judge import (
    JUDGE_KINDS,
    JUDGES,
    JudgeSettings,
    LexicalJudge,
    make_judge,
    register_judge,
)


class ToyJudge(LexicalJudge):
    name = "toy"


@pytest.fixture
def toy_judge():
    register_judge("toy", lambda settings: ToyJudge())
    yield
    JUDGES.pop("toy")
    JUDGE_KINDS.remove("toy")


def test_a_registered_judge_is_an_option_everywhere(toy_judge, tmp_path):
    import argparse

    from benchmarks.run.cli import add_run_arguments

    assert isinstance(make_judge("toy", JudgeSettings(), warn=False), ToyJudge)
    RunOptions(benchmark="unkebench", hparams="x.yaml", judge="toy", out_dir=str(tmp_path / "o"))
    parser = argparse.ArgumentParser()
    add_run_arguments(parser, "unkebench")
    assert parser.parse_args(["--judge", "toy"]).judge == "toy"
    with pytest.raises(ValueError, match="--judge must be auto, llm, lexical or toy, got 'nope'"):
        RunOptions(benchmark="unkebench", hparams="x.yaml", judge="nope")


def test_the_choice_messages_read_as_before():
    with pytest.raises(ValueError, match="--judge must be auto, llm or lexical, got 'x'"):
        RunOptions(benchmark="unkebench", hparams="x.yaml", judge="x")
    with pytest.raises(
        ValueError, match="--subjects must be auto, file, llm or heuristic, got 'x'"
    ):
        RunOptions(benchmark="unkebench", hparams="x.yaml", subjects="x")
