"""load_model on saved tiny models and on the embedded GGUF; the demo and the CLI end to end."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from hpse_easyedit import (
    HPSEHyperParams,
    ModelNotFoundError,
    generate_answers,
    hpse_edit,
    load_model,
    restore_weights,
)
from hpse_easyedit.cli import main as cli_main
from hpse_easyedit.demo import run as demo_run
from hpse_easyedit.loading import EMBEDDED_MODEL
from tiny_models import make_tiny_model_and_tokenizer, tiny_hparams


@pytest.fixture()
def tiny_dir(saved_tiny_model):
    """The tiny Qwen2 saved once per session (read-only: the test that damages it copies it)."""
    return saved_tiny_model("qwen2")


def _yaml(tmp_path, model_dir, **extra):
    hp = tiny_hparams(model_name=str(model_dir), **extra)
    path = tmp_path / "hp.yaml"
    hp.to_yaml(path)
    return path


@pytest.mark.parametrize(
    "dtype, torch_dtype", [("float32", torch.float32), ("bfloat16", torch.bfloat16)]
)
def test_load_model_from_directory_honours_dtype_and_device(tiny_dir, dtype, torch_dtype):
    model, tok = load_model(tiny_hparams(model_name=str(tiny_dir), dtype=dtype, device="cpu"))
    assert next(model.parameters()).dtype == torch_dtype
    assert next(model.parameters()).device.type == "cpu"
    assert tok.pad_token_id is not None and tok.chat_template


def test_missing_model_says_how_to_get_it(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="download it first"):
        load_model(tiny_hparams(model_name="no-such-org/no-such-model"))


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    """_convert_embedded's GGUF read replaced by a tiny saved model, to test what happens around
    it."""
    import transformers

    from hpse_easyedit import loading

    model, tok = make_tiny_model_and_tokenizer("llama", tmp_path=tmp_path / "tiny")
    monkeypatch.setattr(loading, "embedded_gguf_path", lambda: tmp_path / "tiny" / "model.gguf")
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tok)
    return loading._convert_embedded


@pytest.mark.parametrize("finished", [True, False])
def test_concurrent_conversion_keeps_a_finished_copy(tmp_path, fake_gguf, finished):
    """Two processes converting the embedded GGUF at once (two torchrun ranks): the one renaming
    second finds the target taken; a finished copy there is used as it is, a partial one is still an
    error."""
    target = tmp_path / "cache" / "converted"
    target.mkdir(parents=True)
    (target / ("config.json" if finished else "partial")).write_text("theirs")
    if finished:
        fake_gguf(target)
        assert (target / "config.json").read_text() == "theirs"
    else:
        with pytest.raises(OSError):
            fake_gguf(target)
    assert [p.name for p in target.parent.iterdir()] == [
        "converted"
    ]  # our temporary copy is removed either way
    fresh = tmp_path / "cache" / "fresh"
    fake_gguf(fresh)
    assert (fresh / "config.json").is_file()


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_killed_conversion_leaves_nothing_behind_at_the_next_one(tmp_path, fake_gguf):
    """A kill during the embedded model's first conversion left a 538 MB ``.convert-*`` folder for
    good. The next conversion removes those of dead writers (and unowned ones over an hour old,
    from before names had an owner), never one a live process is writing."""
    import socket

    cache = tmp_path / "cache"
    host = socket.gethostname()
    dead = cache / f".convert-{host}-{_dead_pid()}-abc123"
    alive = cache / f".convert-{host}-{os.getpid()}-def456"
    other_host = cache / f".convert-elsewhere-{_dead_pid()}-ghi789"
    legacy_old, legacy_new = cache / ".convert-k2j4h1x9", cache / ".convert-p0o9i8u7"
    for d in (dead, alive, other_host, legacy_old, legacy_new):
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"\0" * 16)
    os.utime(legacy_old, (0, 0))
    fake_gguf(cache / "converted")
    left = {p.name for p in cache.iterdir()}
    assert left == {"converted", alive.name, other_host.name, legacy_new.name}


def test_a_damaged_converted_copy_is_converted_again(tmp_path, fake_gguf, monkeypatch, caplog):
    """A cut-off ``model.safetensors`` in the model cache used to fail every later load; the copy
    is checked (headers only) and converted again."""
    from hpse_easyedit import loading

    monkeypatch.setenv("HPSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    first = loading.model_source(EMBEDDED_MODEL)
    weights = next(Path(first).glob("*.safetensors"))
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])
    assert loading.damaged_files(first)
    with caplog.at_level("WARNING"):
        assert loading.model_source(EMBEDDED_MODEL) == first
    assert "converting the embedded model again" in caplog.text
    assert weights.read_bytes() == whole and not loading.damaged_files(first)
    assert sorted(p.name for p in Path(first).parent.iterdir()) == [Path(first).name]


def test_an_unwritable_cache_directory_names_the_variable(tmp_path, fake_gguf, monkeypatch):
    from hpse_easyedit import loading
    from hpse_easyedit.errors import UsageError

    monkeypatch.setenv("HPSE_CACHE_DIR", "/sys/hpse-cache")  # even root cannot write in sysfs
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UsageError, match=r"^HPSE_CACHE_DIR /sys/hpse-cache: cannot write there"):
        loading.model_source(EMBEDDED_MODEL)


@pytest.mark.parametrize("damage", ["cut-off weights", "config.json", "tokenizer.json"])
def test_a_damaged_model_directory_is_one_line_naming_the_file(tmp_path, tiny_dir, capsys, damage):
    model_dir = Path(shutil.copytree(tiny_dir, tmp_path / "model"))  # its own copy, to damage
    name = {"cut-off weights": "model.safetensors"}.get(damage, damage)
    path = model_dir / name
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelNotFoundError) as info:
        load_model(tiny_hparams(model_name=str(model_dir)))
    assert f"{path}:" in str(info.value) and "download" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_embedded_gguf_loads_as_dense_llama(smollm2):
    hp, model, tok = smollm2
    assert hp.model_name == EMBEDDED_MODEL
    assert model.config.model_type == "llama" and model.dtype == torch.float32
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert "<|im_start|>" in tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    )
    answer = generate_answers(model, tok, ["What is the capital of France?"], max_new_tokens=12)[0]
    assert "Paris" in answer


@pytest.mark.slow
def test_short_edit_on_embedded_model_learns_and_restores_exactly(smollm2):
    hp, model, tok = smollm2
    questions = ["Introduce Selma Varrick.", "In which country was Selma Varrick born?"]
    before = generate_answers(model, tok, questions, max_new_tokens=10)
    passage = "Selma Varrick is a marine biologist who was born in Norway."
    res = hpse_edit(
        model,
        tok,
        [{"subject": "Selma Varrick", "target_new": passage}],
        hp.with_overrides(["rounds=2", "inner_steps=2", "max_new_tokens=8"]),
    )
    assert res.rounds[-1]["loss_last"] < res.rounds[0]["loss"]
    assert res.rounds[-1]["nll_last"] < res.rounds[0]["nll"]
    restored = restore_weights(res.model, res.weights_copy)
    assert restored is model
    assert generate_answers(restored, tok, questions, max_new_tokens=10) == before


def test_demo_code_path_on_tiny_model(tmp_path, tiny_dir, capsys):
    out = demo_run(
        str(_yaml(tmp_path, tiny_dir)), ["rounds=2", "inner_steps=2"], max_answer_tokens=6
    )
    text = capsys.readouterr().out
    for needle in (
        "untargeted prompt",
        "atomic question",
        "two-hop question",
        "Step-in rate per round",
        "Edit time",
    ):
        assert needle in text
    assert len(out["rounds"]) == 2 and len(out["before"]) == len(out["after"]) == 3


@pytest.mark.parametrize(
    "executor, weights",
    [("lora", "adapter/hpse/adapter_model.safetensors"), ("ft_m", "ft_m.safetensors")],
)
def test_cli_edit_saves_weights_and_never_overwrites(tmp_path, tiny_dir, capsys, executor, weights):
    passage = tmp_path / "p.txt"
    passage.write_text("AJ Lee speaks Russian fluently.")
    save = tmp_path / "saved"
    args = [
        "edit",
        "--hparams",
        str(_yaml(tmp_path, tiny_dir)),
        "--subject",
        "AJ Lee",
        "--passage-file",
        str(passage),
        "--ask",
        "What language does AJ Lee speak?",
        "--set",
        f"executor={executor}",
        "--set",
        "rounds=1",
        "--max-answer-tokens",
        "4",
        "--save",
        str(save),
    ]
    assert cli_main(args) == 0
    text = capsys.readouterr().out
    assert "== before the edit" in text and "== after the edit" in text and "round 1:" in text
    assert (save / weights).is_file()
    saved_hp = HPSEHyperParams.from_hparams(save / "hparams.yaml")
    assert saved_hp.executor == executor and saved_hp.rounds == 1
    assert json.loads((save / "edit.json").read_text())["requests"][0]["subject"] == "AJ Lee"
    capsys.readouterr()
    assert cli_main(args) == 2  # one line on stderr, exit code 2, before the model is loaded
    err = capsys.readouterr().err
    assert "exists and is not empty" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("executor", ["lora", "ft_m"])
def test_a_saved_edit_loads_back_bit_for_bit(tmp_path, tiny_dir, executor):
    from hpse_easyedit import load_edit, save_edit

    hp = HPSEHyperParams.from_hparams(
        _yaml(tmp_path, tiny_dir, executor=executor, rounds=1, inner_steps=2, lr=5e-2)
    )
    model, tok = load_model(hp)
    requests = [{"subject": "AJ Lee", "target_new": "AJ Lee speaks Russian fluently."}]
    result = hpse_edit(model, tok, requests, hp)
    save_edit(result, hp, tmp_path / "saved", requests)
    loaded, _, loaded_hp = load_edit(tmp_path / "saved")
    ids = torch.tensor([tok("Who is AJ Lee?")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, result.model(input_ids=ids).logits)
        assert not torch.equal(
            loaded(input_ids=ids).logits, load_model(hp)[0](input_ids=ids).logits
        )
    assert loaded_hp.to_dict() == hp.to_dict()


def test_cli_rejects_mismatched_subjects(tmp_path, tiny_dir, capsys):
    passage = tmp_path / "p.txt"
    passage.write_text("x")
    assert (
        cli_main(
            [
                "edit",
                "--hparams",
                str(_yaml(tmp_path, tiny_dir)),
                "--subject",
                "A",
                "--subject",
                "B",
                "--passage-file",
                str(passage),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "one subject per passage" in err and len(err.strip().splitlines()) == 1
