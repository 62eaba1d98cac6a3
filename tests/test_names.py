"""Names that say what they are: run labels and the editor column from what ran, --max-answer-tokens
(the old --max-new-tokens a deprecated alias), and the per-round loss line of a one-step round."""

import json
import logging

import pytest

from bench_helpers import DATA_DIR, isolate_judge_env
from benchmarks.run.cli import cli_main
from benchmarks.run.methods import method_label
from hpse_easyedit import hpse_edit
from tiny_models import make_tiny_model_and_tokenizer, tiny_hparams


@pytest.mark.parametrize(
    "name,hp,label",
    [
        ("HPSE", {"executor": "lora", "kl_weight": 0.0}, "LoRA"),
        ("HPSE", {"executor": "lora", "kl_weight": 1.0}, "LoRA + HPSE"),
        ("HPSE", {"executor": "ft_m", "kl_weight": 0.0}, "FT-M"),
        ("HPSE", {"executor": "ft_m", "kl_weight": 1.0}, "FT-M + HPSE"),
        ("COIN", {"executor": "lora"}, "COIN*"),
        ("MEMIT", {}, "MEMIT"),
    ],
)
def test_the_method_is_named_by_what_runs(name, hp, label):
    assert method_label(name, hp) == label


@pytest.mark.skipif(not DATA_DIR.is_dir(), reason="needs ../shared/data next to the repository")
def test_a_plain_lora_run_is_labelled_lora_and_the_old_answer_flag_still_works(
    tmp_path, monkeypatch, caplog
):
    isolate_judge_env(monkeypatch, tmp_path)
    make_tiny_model_and_tokenizer("llama", tmp_path=tmp_path / "model")
    hp = tmp_path / "tiny.yaml"
    hp.write_text(
        f"alg_name: HPSE\nmodel_name: {tmp_path / 'model'}\nrounds: "
        "1\ninner_steps: 1\nmax_new_tokens: 4\n"
    )
    base = ["--hparams", str(hp), "--data", str(DATA_DIR), "--limit", "1", "--set", "kl_weight=0"]
    assert (
        cli_main("mquake-uns", [*base, "--max-answer-tokens", "3", "--out", str(tmp_path / "new")])
        == 0
    )
    summary = json.loads((tmp_path / "new" / "summary.json").read_text())
    assert summary["label"] == "LoRA (tiny) kl_weight=0" and summary["editor"] == "LoRA"
    assert json.loads((tmp_path / "new" / "config.json").read_text())["max_new_tokens"] == 3
    with caplog.at_level(logging.WARNING):
        assert (
            cli_main("mquake-uns", [*base, "--max-new-tokens", "3", "--out", str(tmp_path / "old")])
            == 0
        )
    assert "--max-new-tokens is deprecated" in caplog.text
    assert json.loads((tmp_path / "old" / "config.json").read_text())["max_new_tokens"] == 3


def test_a_one_step_round_does_not_read_as_nothing_learned(caplog):
    model, tok = make_tiny_model_and_tokenizer("llama")
    with caplog.at_level(logging.INFO, logger="hpse_easyedit.training"):
        hpse_edit(
            model,
            tok,
            [{"subject": "Selma", "target_new": "Selma was born in Norway."}],
            tiny_hparams(rounds=1, inner_steps=1),
        )
    assert (
        "(one inner step)" in caplog.text
        and " -> " not in caplog.text.split("loss")[-1].split(",")[0]
    )


@pytest.mark.parametrize(
    "field,value,fragment",
    [
        ("max_length", 4096, "key 'max_length' is 4096 but tiny reads at most 2048 tokens"),
        ("top_k", 100000, "key 'top_k' is 100000 but tiny has a vocabulary of"),
    ],
)
def test_fields_are_checked_against_the_model_before_any_edit(field, value, fragment):
    from hpse_easyedit.hparams import HParamsError
    from hpse_easyedit.loading import check_against_model

    model, _ = make_tiny_model_and_tokenizer("llama")
    with pytest.raises(HParamsError, match=fragment):
        check_against_model(model, tiny_hparams(**{field: value}))


def test_a_model_name_that_is_not_a_model_is_one_line(tmp_path):
    from hpse_easyedit.loading import ModelNotFoundError, load_model

    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ModelNotFoundError, match="is a directory but not a model"):
        load_model(tiny_hparams(model_name=str(tmp_path)))
    with pytest.raises(ModelNotFoundError, match="is a file, not a model"):
        load_model(tiny_hparams(model_name=str(tmp_path / "notes.txt")))
