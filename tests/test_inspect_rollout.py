"""benchmarks.analysis.inspect_rollout: the first-round rollout with its step-ins marked, on a tiny
model."""

import json

import pytest

from bench_helpers import DATA_DIR
from benchmarks.analysis.inspect_rollout import main
from tiny_models import make_tiny_model_and_tokenizer

pytestmark = pytest.mark.skipif(
    not DATA_DIR.is_dir(), reason="needs ../shared/data next to the repository"
)


def _tiny_hparams(tmp_path, max_new_tokens):
    make_tiny_model_and_tokenizer("llama", tmp_path / "model")
    hp = tmp_path / "hpse.yaml"
    hp.write_text(
        f"alg_name: HPSE\nmodel_name: {tmp_path / 'model'}\nmax_new_tokens: {max_new_tokens}\n"
    )
    return hp


def test_gates_that_always_or_never_fire(tmp_path, capsys, gate_always_open):
    hp = _tiny_hparams(tmp_path, 5)
    out = tmp_path / "inspect.json"
    assert (
        main(
            [
                "--hparams",
                str(hp),
                "--data",
                str(DATA_DIR),
                "--limit",
                "2",
                "--print",
                "1",
                "--gates",
                "tau=-1000,kappa=0",
                "--gates",
                "rollout=on_policy",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    always, never = report["settings"]["tau=-1000,kappa=0"], report["settings"]["rollout=on_policy"]
    assert report["n_cases"] == 2 and len(always["cases"]) == 2
    # gap > -1000 and confidence > 0 hold at every position: the teacher writes the whole rollout
    assert always["summary"]["stepins"] == always["summary"]["rollout_tokens"] > 0
    for r in always["cases"][0]["requests"]:
        assert r["marked"].startswith("[[") and r["stepins"] == r["tokens"] == len(r["injected"])
    assert (
        never["summary"]["stepins"] == 0 and "[[" not in never["cases"][0]["requests"][0]["marked"]
    )
    text = capsys.readouterr().out
    assert (
        "## tau=-1000,kappa=0 (tau -1000.0, kappa 0.0)" in text and "## rollout=on_policy" in text
    )
    assert (
        "Introduce " in always["cases"][0]["requests"][0]["student_prompt"]
    )  # the file's editing prompt
    # a group may change the editing prompt: the student is then asked with it
    other = tmp_path / "prompt.json"
    assert (
        main(
            [
                "--hparams",
                str(hp),
                "--data",
                str(DATA_DIR),
                "--limit",
                "1",
                "--print",
                "0",
                "--gates",
                "editing_prompt=List the key facts about {subject}.",
                "--out",
                str(other),
            ]
        )
        == 0
    )
    (setting,) = json.loads(other.read_text())["settings"].values()
    prompt = setting["cases"][0]["requests"][0]["student_prompt"]
    assert "List the key facts about " in prompt and "Introduce" not in prompt
    with pytest.raises(SystemExit):  # never overwrites
        main(["--hparams", str(hp), "--data", str(DATA_DIR), "--out", str(out)])


def test_cases_option_and_words_from_another_requests_passage(tmp_path, capsys, gate_always_open):
    hp = _tiny_hparams(tmp_path, 6)
    out = tmp_path / "two.json"
    # case 6 of MQuAKE-uns edits two facts (Tetris, Mark Burnett): one rollout per request
    assert (
        main(
            [
                "--hparams",
                str(hp),
                "--data",
                str(DATA_DIR),
                "--cases",
                "6",
                "--print",
                "0",
                "--gates",
                "tau=-1000,kappa=0,teacher_facts=all",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    (setting,) = report["settings"].values()
    (case,) = setting["cases"]
    assert report["n_cases"] == 1 and case["case_id"] == "6" and len(case["requests"]) == 2
    for r in case["requests"]:
        for i in r["injected"]:
            # a word from another request's passage is a passage word, and never a function word
            assert not i["only_in_other_passage"] or (i["in_passage"] and i["content_word"])
    s = setting["summary"]
    assert s["content_words_only_in_other_passage"] == sum(
        i["only_in_other_passage"] for r in case["requests"] for i in r["injected"]
    )
    assert "only in another request's passage" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # an id the data does not have
        main(
            [
                "--hparams",
                str(hp),
                "--data",
                str(DATA_DIR),
                "--cases",
                "6,no-such-case",
                "--out",
                str(tmp_path / "x.json"),
            ]
        )
    assert "no case_id no-such-case" in capsys.readouterr().err
