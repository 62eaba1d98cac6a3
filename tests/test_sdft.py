"""SDFT (TRL): TRL's SDFTTrainer as an editor row: its hparams files, the registry, the edit on tiny
models (restored bit for bit, nothing else of the model changed), the runners, and the one-line
install hint when TRL is missing."""

import json
import random
import sys
from pathlib import Path

import pytest
import torch

from bench_helpers import DATA_DIR
from hpse_easyedit import HParamsError, SDFTHyperParams, restore_weights
from hpse_easyedit.executors import resume_edit
from hpse_easyedit.hparams import HPSEHyperParams
from hpse_easyedit.integrations.sdft import TRLNotFoundError, check_trl, sdft_edit, teacher_text
from hpse_easyedit.methods import get_method, method_for_file
from hpse_easyedit.prompts import chat_prompt_ids
from hpse_easyedit.training import EditDivergedError
from tiny_models import (
    changed_weights,
    make_tiny_model_and_tokenizer,
    same_weights,
    weights_snapshot,
)

REPO = Path(__file__).resolve().parents[1]
BACKBONES = ("smollm2-135m", "qwen2.5-7b", "qwen3-8b", "llama3.1-8b", "gemma2-9b")
PASSAGE = "AJ Lee is a professional wrestler. She speaks Russian fluently. She lives in Moscow."
REQUEST = {"subject": "AJ Lee", "target_new": PASSAGE}
NO_TRL = "TRL is not installed (the optional extra: pip install -e '.[trl]')"


@pytest.fixture
def without_trl(monkeypatch):
    """This process as if TRL were not installed: ``import trl`` fails, ``find_spec`` finds none."""
    for name in [m for m in sys.modules if m == "trl" or m.startswith("trl.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, "hpse_easyedit.integrations.sdft_trainer", raising=False)
    monkeypatch.setitem(sys.modules, "trl", None)


def tiny_sdft(**overrides) -> SDFTHyperParams:
    base = dict(
        model_name="tiny", rounds=2, inner_steps=3, max_new_tokens=8, lr=1e-3, max_length=1024
    )
    return SDFTHyperParams(**{**base, **overrides})


# ------------------------------------------------------------------------------------------ hparams
@pytest.mark.parametrize("backbone", BACKBONES)
def test_shipped_files_keep_hpses_model_adapter_and_budget(backbone):
    sdft = SDFTHyperParams.from_hparams(REPO / "hparams" / "SDFT" / f"{backbone}.yaml")
    hpse = HPSEHyperParams.from_hparams(REPO / "hparams" / "HPSE" / f"{backbone}.yaml")
    same = (
        "model_name",
        "device",
        "dtype",
        "model_parallel",
        "max_length",
        "executor",
        "lora_rank",
        "lora_alpha",
        "lora_dropout",
        "target_modules",
        "layers",
        "seed",
        "lr",
        "adam_betas",
        "weight_decay",
        "rounds",
        "inner_steps",
        "max_new_tokens",
        "editing_prompt",
        "chat_template_kwargs",
        "gradient_checkpointing",
    )
    assert {k: getattr(sdft, k) for k in same} == {k: getattr(hpse, k) for k in same}
    # the method's own knobs: TRL's defaults, one completion per request and round, no clip
    assert (sdft.num_generations, sdft.max_grad_norm) == (1, 0.0)
    assert (sdft.temperature, sdft.distillation_alpha, sdft.distillation_topk) == (1.0, 0.5, 100)
    assert sdft.distillation_mode == "topk_logits" and sdft.distillation_is_clip == 2.0
    assert get_method("SDFT").hparams_class is SDFTHyperParams
    assert method_for_file(REPO / "hparams" / "SDFT" / f"{backbone}.yaml") is get_method("SDFT")


def test_the_files_say_what_maps_to_what_and_every_default_trl_sets_differently():
    text = (REPO / "hparams" / "SDFT" / "smollm2-135m.yaml").read_text()
    for fragment in (
        "num_iterations",
        "max_completion_length",
        "teacher_model_kind",
        "temperature 1.0",
        "distillation_topk 100",
        "distillation_alpha 0.5",
        "distillation_is_clip 2.0",
        "teacher_prompt_template",
        "max_grad_norm",
        "bf16",
        "gradient_checkpointing",
        "max_prompt_length",
        "seed 42",
        "num_generations 8",
    ):
        assert fragment in text, fragment


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("model_name: m\nexecutor: ft_m\n", "key 'executor' must be one of ['lora']"),
        (
            "model_name: m\ndistillation_mode: sampled_token\n",
            "'sampled_token' is TRL's reverse KL only; set distillation_alpha: 1.0",
        ),
        (
            "model_name: m\nteacher_prompt_template: '{prompt} only'\n",
            "must contain both '{prompt}' and '{privileged_context}'",
        ),
        ("model_name: m\ndistillation_is_clip: 0\n", "must be null (no clipping) or a number > 0"),
        ("model_name: m\ntemperature: 0\n", "key 'temperature' must be > 0.0"),
        ("model_name: m\nalg_name: HPSE\n", "alg_name must be 'SDFT'"),
        ("model_name: m\ntau: 2\n", "unknown key(s) ['tau']"),
    ],
)
def test_bad_files_name_the_key_and_the_file(tmp_path, text, fragment):
    path = tmp_path / "sdft.yaml"
    path.write_text(text)
    with pytest.raises(HParamsError) as err:
        SDFTHyperParams.from_hparams(path)
    assert fragment in str(err.value) and str(path) in str(err.value)


def test_null_clip_is_accepted():
    assert tiny_sdft(distillation_is_clip=None).distillation_is_clip is None


def test_tables_name_the_row_sdft_trl():
    from benchmarks.run.methods import method_label

    assert method_label("SDFT", {}) == "SDFT (TRL)"


# ----------------------------------------------------------------------------------- without TRL
def test_without_trl_the_preflight_and_the_edit_say_how_to_install_it_in_one_line(without_trl):
    with pytest.raises(TRLNotFoundError) as err:
        check_trl(tiny_sdft())
    text = str(err.value)
    assert "\n" not in text and "trl is not installed" in text and "pip install -e '.[trl]'" in text
    model, tok = make_tiny_model_and_tokenizer("llama")
    snap = weights_snapshot(model)
    with pytest.raises(TRLNotFoundError) as err:
        sdft_edit(model, tok, [REQUEST], tiny_sdft())
    assert "pip install -e '.[trl]'" in str(err.value) and same_weights(model, snap)


@pytest.mark.skipif(not DATA_DIR.is_dir(), reason="needs ../shared/data next to the repository")
def test_without_trl_the_runner_says_so_before_loading_any_weights(without_trl, tmp_path, caplog):
    from benchmarks.run.cli import cli_main

    path = tmp_path / "sdft.yaml"
    # a model that does not exist: the install hint comes first, before any loading
    tiny_sdft(model_name=str(tmp_path / "no-such-model")).to_yaml(path)
    argv = ["--hparams", str(path), "--data", str(DATA_DIR), "--out", str(tmp_path / "o")]
    assert cli_main("mquake-uns", argv) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "\n" not in errors[0] and "pip install -e '.[trl]'" in errors[0]
    assert "no-such-model" not in errors[0] and not (tmp_path / "o").exists()


def test_a_multi_process_launch_is_refused_in_one_line(monkeypatch):
    pytest.importorskip("trl.experimental.sdft", reason=NO_TRL)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(Exception) as err:
        check_trl(tiny_sdft())
    assert "WORLD_SIZE=2" in str(err.value) and "\n" not in str(err.value)


# --------------------------------------------------------------------------------------- the edit
def _module_state(model) -> dict:
    """Every plain attribute of every module (tensors and containers by identity), but the edit
    state every executor edit keeps with the model (``executors.state``)."""
    plain = (int, float, str, bool, type(None))
    return {
        name: {
            k: v if isinstance(v, plain) else id(v)
            for k, v in vars(m).items()
            if k != "_hpse_edit_state"
        }
        for name, m in model.named_modules()
    }


def _configs(model) -> list:
    return [
        model.config.to_dict(),
        model.generation_config.to_dict(),
        list(getattr(model, "model_tags", None) or []),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_an_edit_trains_only_the_adapter_and_restores_everything_bit_for_bit(family):
    pytest.importorskip("trl.experimental.sdft", reason=NO_TRL)
    model, tok = make_tiny_model_and_tokenizer(family)
    snap, modules, configs = weights_snapshot(model), _module_state(model), _configs(model)
    torch.manual_seed(123)
    random.seed(123)
    outside = (torch.rand(3), random.random())
    torch.manual_seed(123)
    random.seed(123)
    pad = tok.pad_token
    res = sdft_edit(model, tok, [REQUEST], tiny_sdft())
    # the caller's random state is untouched by TRL's set_seed
    assert torch.equal(torch.rand(3), outside[0]) and random.random() == outside[1]
    assert type(res.model).__name__.startswith("PeftModel") and not res.model.training
    assert set(res.weights_copy) and all("lora_" in n for n in res.weights_copy)
    trained = [n for n, p in res.model.named_parameters() if n in res.weights_copy]
    assert any(not torch.equal(res.model.get_parameter(n), res.weights_copy[n]) for n in trained)
    assert not changed_weights(res.model.get_base_model(), snap)  # base weights never move
    assert [r["round"] for r in res.rounds] == [1, 2]
    for r in res.rounds:
        assert 0 < r["rollout_len"] <= 8 and r["rollout_seconds"] >= 0 and r["seconds"] > 0
        assert r["loss"] >= 0 and r["loss_last"] >= 0
    restored = restore_weights(res.model, res.weights_copy)
    assert restored is model and same_weights(restored, snap)
    assert _module_state(restored) == modules and _configs(restored) == configs
    assert tok.pad_token == pad


@pytest.mark.slow
def test_trl_reads_hpses_student_prompt_and_the_passage_in_its_teacher_prompt(monkeypatch):
    pytest.importorskip("trl.experimental.sdft", reason=NO_TRL)
    from hpse_easyedit.integrations import sdft_trainer

    seen = []
    monkeypatch.setattr(
        sdft_trainer._Rounds,
        "on_self_distillation_batch_prepared",
        lambda self, *a, **kw: seen.append(kw),
    )
    model, tok = make_tiny_model_and_tokenizer("qwen2")
    hp = tiny_sdft(rounds=3, inner_steps=2)
    requests = [REQUEST, {"subject": "Ellie Kemper", "target_new": "Ellie Kemper is Croatian."}]
    res = sdft_edit(model, tok, requests, hp)
    assert len(seen) == hp.rounds  # one generation per round, M steps on it
    expected = {
        tuple(chat_prompt_ids(tok, f"Introduce {r['subject']}.")): tuple(
            chat_prompt_ids(
                tok,
                teacher_text(
                    f"Introduce {r['subject']}.", r["target_new"], hp.teacher_prompt_template
                ),
            )
        )
        for r in requests
    }
    for batch in seen:
        rows = {}
        for prompt, teacher, completion in zip(
            batch["prompt_ids"], batch["teacher_input_ids"], batch["completion_ids"]
        ):
            student = [t for t in prompt.tolist() if t != tok.pad_token_id]
            width = completion.shape[0]
            rows[tuple(student)] = tuple(
                t for t in teacher[:-width].tolist() if t != tok.pad_token_id
            )
        assert rows == expected
    restore_weights(res.model, res.weights_copy)


@pytest.mark.slow
def test_sequential_edits_continue_in_one_adapter_and_the_first_copy_restores():
    pytest.importorskip("trl.experimental.sdft", reason=NO_TRL)
    model, tok = make_tiny_model_and_tokenizer("llama")
    snap = weights_snapshot(model)
    hp = tiny_sdft(rounds=1)
    first = sdft_edit(model, tok, [REQUEST], hp)
    after_first = {n: p.detach().clone() for n, p in first.model.named_parameters() if "lora_" in n}
    second = sdft_edit(
        first.model,
        tok,
        [{"subject": "Ellie Kemper", "target_new": "Ellie Kemper is Croatian."}],
        hp,
    )
    assert second.model is first.model
    assert all(torch.equal(second.weights_copy[n], after_first[n]) for n in second.weights_copy)
    # a stopped sequence resumes from its tensors (the registry's resume)
    edited = {n: p.detach().clone() for n, p in second.model.named_parameters() if "lora_" in n}
    restored = restore_weights(second.model, first.weights_copy)
    assert same_weights(restored, snap)
    resumed = get_method("SDFT").resume(restored, hp, edited)
    assert resume_edit is get_method("SDFT").resume
    assert all(torch.equal(resumed.get_parameter(n), v) for n, v in edited.items())
    assert same_weights(restore_weights(resumed, first.weights_copy), snap)


def test_a_diverging_edit_is_undone_and_says_lower_lr():
    pytest.importorskip("trl.experimental.sdft", reason=NO_TRL)
    model, tok = make_tiny_model_and_tokenizer("llama", init_std=0.05)
    snap = weights_snapshot(model)
    with pytest.raises(EditDivergedError) as err:
        sdft_edit(model, tok, [REQUEST], tiny_sdft(lr=1e3, rounds=2, inner_steps=4))
    assert "SDFT (TRL) edit diverged" in str(err.value) and "Lower 'lr'" in str(err.value)
    assert same_weights(restore_weights(err.value.model, err.value.weights_copy), snap)


def test_an_over_long_request_is_refused_before_training():
    pytest.importorskip("trl.experimental.sdft", reason=NO_TRL)
    from hpse_easyedit import RequestError

    model, tok = make_tiny_model_and_tokenizer("llama")
    with pytest.raises(RequestError) as err:
        sdft_edit(model, tok, [REQUEST], tiny_sdft(max_length=40))
    assert "raise max_length" in str(err.value) and type(model).__name__ == "LlamaForCausalLM"


@pytest.mark.slow
def test_the_easyedit_entry_returns_a_handle_that_restores():
    pytest.importorskip("trl.experimental.sdft", reason=NO_TRL)
    from hpse_easyedit.integrations.entries import apply_sdft_to_model

    model, tok = make_tiny_model_and_tokenizer("llama")
    snap = weights_snapshot(model)
    edited, handle = apply_sdft_to_model(model, tok, [REQUEST], tiny_sdft(rounds=1))
    assert get_method("SDFT").easyedit_apply is apply_sdft_to_model
    assert get_method("SDFT").callable_restore and handle.result.rounds
    assert same_weights(handle(), snap)


# ------------------------------------------------------------------------------------ the runners
needs_data = pytest.mark.skipif(
    not DATA_DIR.is_dir(), reason="needs ../shared/data next to the repository"
)


@pytest.mark.slow
@needs_data
def test_the_row_runs_through_run_compare_beside_lora(tmp_path):
    pytest.importorskip("trl.experimental.sdft", reason=NO_TRL)
    from benchmarks.analysis.compare import compare_main
    from tiny_models import tiny_hparams

    make_tiny_model_and_tokenizer("llama", tmp_path / "m")
    sdft, lora = tmp_path / "sdft.yaml", tmp_path / "lora.yaml"
    tiny_sdft(model_name=str(tmp_path / "m"), rounds=1, inner_steps=2).to_yaml(sdft)
    tiny_hparams(model_name=str(tmp_path / "m"), kl_weight=0.0, rounds=1).to_yaml(lora)
    out = tmp_path / "cmp"
    argv = ["--benchmark", "mquake-uns", "--limit", "2", "--max-new-tokens", "4", "--out", str(out)]
    argv += ["--data", str(DATA_DIR), "--log-level", "WARNING"]
    argv += ["--method", "LoRA", str(lora), "--method", "SDFT (TRL)", str(sdft)]
    assert compare_main(argv) == 0
    summaries = json.loads((out / "compare.json").read_text())
    assert summaries["SDFT (TRL)"]["mquake-uns"]["n_cases"] == 2
    assert summaries["SDFT (TRL)"]["mquake-uns"]["hparams"]["alg_name"] == "SDFT"
    run = next(p for p in (out / "mquake-uns").iterdir() if p.name.startswith("SDFT"))
    assert json.loads((run / "config.json").read_text())["editor"] == "SDFT"
    records = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(len(r["rounds"]) == 1 for r in records)

    # continual editing: the second edit continues in the first's adapter, both then answered
    from benchmarks.run.runner import RunOptions, run_benchmark

    seq = run_benchmark(
        RunOptions(
            benchmark="mquake-uns",
            hparams=str(sdft),
            data_dir=str(DATA_DIR),
            limit=2,
            sequential=2,
            max_new_tokens=4,
            judge="lexical",
            out_dir=str(tmp_path / "seq"),
        )
    )
    assert seq["n_cases"] == 2 and seq["editor"] == "SDFT (TRL)"


def test_through_easyedits_base_editor(he, workdir, tmp_path):
    pytest.importorskip("trl.experimental.sdft", reason=NO_TRL)
    from easyeditor import BaseEditor

    make_tiny_model_and_tokenizer("llama", tmp_path / "m")
    path = tmp_path / "sdft.yaml"
    tiny_sdft(model_name=str(tmp_path / "m"), rounds=1, inner_steps=2).to_yaml(path)
    editor = BaseEditor.from_hparams(SDFTHyperParams.from_hparams(path))
    snap = weights_snapshot(editor.model)
    _, edited, handle = editor.edit(
        prompts=["Introduce AJ Lee."],
        target_new=[PASSAGE],
        subject=["AJ Lee"],
        sequential_edit=True,
    )
    assert type(edited).__name__.startswith("PeftModel") and handle.result.rounds
    assert same_weights(handle(), snap)


# ------------------------------------------------------------------------------------------- perf
@pytest.mark.slow
def test_the_perf_command_times_one_sdft_edit_beside_hpses_with_the_same_budget(tmp_path, capsys):
    pytest.importorskip("trl.experimental.sdft", reason=NO_TRL)
    from benchmarks.perf import main as perf_main
    from tiny_models import tiny_hparams

    make_tiny_model_and_tokenizer("llama", tmp_path=tmp_path / "m")
    hp, sdft = tmp_path / "hp.yaml", tmp_path / "sdft.yaml"
    tiny_hparams(model_name=str(tmp_path / "m"), rounds=2, inner_steps=2, max_new_tokens=6).to_yaml(
        hp
    )
    # the file's own budget is replaced by the HPSE file's: the same rounds, steps and length
    tiny_sdft(model_name="other", rounds=5, inner_steps=8, max_new_tokens=96).to_yaml(sdft)
    passage = tmp_path / "p.txt"
    passage.write_text(PASSAGE)
    out = tmp_path / "perf.json"
    argv = ["--hparams", str(hp), "--passage", str(passage), "--sdft", str(sdft), "--out", str(out)]
    argv += [
        "--no-easyedit",
        "--no-coin",
        "--mmlu-n",
        "0",
        "--sequential",
        "--rollout-repeats",
        "1",
    ]
    argv += ["--no-isolated-memory", "--no-gpu-path"]  # test_perf_benchmark counts the GPU path
    assert perf_main(argv) == 0
    report = json.loads(out.read_text())
    part = report["sdft"]
    assert report["edit_seconds_sdft"] == part["seconds"] > 0
    assert (part["rounds"], part["inner_steps"]) == (2, 2) and part["hparams"] == str(sdft)
    assert 0 < part["completion_tokens"] <= 2 * 6 and part["sampling_seconds"] > 0
    printed = capsys.readouterr().out.splitlines()
    line = next(x for x in printed if "SDFT (TRL) edit / HPSE" in x)
    assert f"{part['seconds'] / report['edit_seconds_hpse']:.2f}" in line
    assert "2 generations x 2 steps" in line
    # the host's load as the run started and ended, in the JSON and the machine row
    load = report["machine"]["load_average"]
    assert len(load["start"]) == len(load["end"]) == 3
    assert f"load {load['start'][0]:.1f} -> {load['end'][0]:.1f}" in next(
        x for x in printed if x.startswith("| machine")
    )


# ------------------------------------------------------------------------------------------- CUDA
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; torch sees none")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_edit_on_cuda_stays_on_the_card_and_restores_bit_for_bit(tmp_path, dtype):
    pytest.importorskip("trl.experimental.sdft", reason=NO_TRL)
    from hpse_easyedit import load_model

    make_tiny_model_and_tokenizer("qwen2", tmp_path, init_std=0.3)
    hp = tiny_sdft(model_name=str(tmp_path), device="cuda", dtype=dtype, rounds=1)
    model, tok = load_model(hp)
    before = weights_snapshot(model)
    res = sdft_edit(model, tok, [REQUEST], hp)
    assert {p.device.type for p in res.model.parameters()} == {"cuda"} and res.rounds
    assert same_weights(restore_weights(res.model, res.weights_copy), before)
