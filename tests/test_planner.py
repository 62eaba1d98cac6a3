"""The GPU memory planner: live-bytes accounting, the shipped backbone configs, the plan of an edit
on the meta device against the same steps on real tensors, the knobs, gradient checkpointing, and
``python -m hpse_easyedit plan``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from hpse_easyedit import HPSEHyperParams
from hpse_easyedit.hparams import HParamsError
from hpse_easyedit.planner import (
    BACKBONE_DIR,
    WORKLOADS,
    LiveBytes,
    Workload,
    backbone_config,
    plan_edit,
)
from tiny_models import make_tiny_model_and_tokenizer, tiny_hparams

HPSE_FILES = sorted(p for p in Path("hparams/HPSE").glob("*.yaml"))
SMALL = Workload(
    "small",
    requests=2,
    passage_tokens=20,
    max_new_tokens=12,
    student_prompt_tokens=9,
    teacher_overhead_tokens=15,
    answer_rows=3,
    question_tokens=10,
    answer_tokens=16,
)


def test_live_bytes_counts_new_storages_once_and_frees_them():
    weight = torch.zeros(100)  # existing: 400 bytes
    with LiveBytes([weight, weight[:10]]) as mem:
        assert mem.live == 400
        a = torch.ones(1000)  # +4000
        view = a.view(10, 100).t()  # a view: nothing new
        b = a * 2  # +4000
        assert mem.live == mem.peak == 8400
        del a, view, b
        mem.mark()
        assert mem.live == 400 and mem.peak == 8400 and mem.phase_peak == 400
        with torch.device("meta"):
            big = torch.empty(2**20, dtype=torch.bfloat16)  # meta: counted, never allocated
        assert mem.live == 400 + 2**21
        assert int(big.sum()) == 1  # a meta value read on the host is 1 (Adam's step count)


@pytest.mark.parametrize(
    "path", [p for p in HPSE_FILES if "smollm2" not in p.name], ids=lambda p: p.name
)
def test_every_shipped_7b_file_has_its_published_backbone_config(path):
    hp = HPSEHyperParams.from_hparams(path)
    config = backbone_config(hp.model_name)
    published = {  # hidden, intermediate, layers, heads, kv heads, vocab, tied, rope theta
        "Qwen/Qwen2.5-7B-Instruct": (3584, 18944, 28, 28, 4, 152064, False, 1e6),
        "Qwen/Qwen3-8B": (4096, 12288, 36, 32, 8, 151936, False, 1e6),
        "meta-llama/Llama-3.1-8B-Instruct": (4096, 14336, 32, 32, 8, 128256, False, 5e5),
        "google/gemma-2-9b-it": (3584, 14336, 42, 16, 8, 256000, True, 1e4),
    }[hp.model_name]
    got = (
        config.hidden_size,
        config.intermediate_size,
        config.num_hidden_layers,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.vocab_size,
        config.tie_word_embeddings,
        config.rope_parameters["rope_theta"],
    )
    assert got == published
    assert backbone_config(hp.model_name, layers=2).num_hidden_layers == 2


def test_unknown_model_is_one_line_naming_the_key():
    hp = tiny_hparams(model_name="nobody/no-such-model")
    with pytest.raises(
        HParamsError, match=r"key 'model_name' is 'nobody/no-such-model'.*config.json"
    ) as err:
        plan_edit(hp, SMALL)
    assert "\n" not in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize(
    "executor,dtype,captured",
    [("lora", "float32", False), ("ft_m", "bfloat16", False), ("lora", "float32", True)],
)
def test_the_meta_plan_counts_what_real_tensors_take(executor, dtype, captured):
    """(With ``compile_training: true`` both plans run the captured step's stacked rows eagerly.)"""
    hp = HPSEHyperParams.from_hparams("hparams/HPSE/smollm2-135m.yaml").with_overrides(
        {"executor": executor, "dtype": dtype, "ftm_layer": 1, "compile_training": captured}
    )
    meta = plan_edit(hp, SMALL, layers=2)
    real = plan_edit(hp, SMALL, layers=2, device="cpu")
    # the CPU kernels make a few different temporaries (a float copy of the attention mask, ...):
    # within 2%
    assert meta["peak_gib"] == pytest.approx(real["peak_gib"], rel=0.02)
    for name, phase in meta["phases"].items():
        assert phase["peak_gib"] == pytest.approx(real["phases"][name]["peak_gib"], rel=0.02)
        assert phase.get("own_gib", 0) == pytest.approx(
            real["phases"][name].get("own_gib", 0), rel=0.05, abs=2e-3
        )
    phases = meta["phases"]
    layer = (
        2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536 + 2 * 576
    )  # q, o; k, v (3 KV heads); MLP; norms
    params = 49152 * 576 + 2 * layer + 576  # tied embedding, 2 layers, final norm
    assert phases["weights"]["peak_gib"] * 2**30 == pytest.approx(
        params * (4 if dtype == "float32" else 2), rel=2e-3
    )
    assert (
        phases["training"]["peak_gib"]
        > phases["trainable_state"]["peak_gib"]
        > phases["weights"]["peak_gib"]
    )


@pytest.mark.slow
def test_the_7b_plan_and_its_knobs():
    from hpse_easyedit.planner import plan_with_knobs

    hp = HPSEHyperParams.from_hparams("hparams/HPSE/qwen2.5-7b.yaml")
    plan = plan_with_knobs(hp, WORKLOADS["mquake"], 3.0, layers=2)
    weights = (2 * 152064 * 3584 + 2 * (2 * 3584 * 3584 + 2 * 512 * 3584 + 3 * 3584 * 18944)) * 2
    assert plan["weights_gib"] == pytest.approx(weights / 2**30, rel=1e-3)
    assert set(plan["phases"]) == {"weights", "trainable_state", "rollout", "training", "answers"}
    assert plan["peak_gib"] == max(p["peak_gib"] for p in plan["phases"].values())
    assert plan["fits"] == {"24": True, "40": True, "48": True, "80": True}
    training = plan["phases"]["training"]
    assert training["peak_gib"] + plan["cuda_overhead_gib"] > 3.0 and "knob" in training
    for tried in plan["knobs"]:
        assert all(p in plan["phases"] for p in tried["makes_fit"])
    six = plan_edit(hp, WORKLOADS["mquake"], layers=6)
    checkpointed = plan_edit(
        hp.with_overrides({"gradient_checkpointing": True}), WORKLOADS["mquake"], layers=6
    )
    assert (
        checkpointed["phases"]["training"]["own_gib"] < 0.8 * six["phases"]["training"]["own_gib"]
    )
    assert checkpointed["phases"]["rollout"] == six["phases"]["rollout"]
    # on a card the file's compile_training: auto captures the step, whose one pass over both
    # terms' stacked rows holds more activations than the eager step's larger pass
    eager = plan_edit(hp.with_overrides({"compile_training": False}), WORKLOADS["mquake"], layers=6)
    assert six["captured_step"] and not eager["captured_step"]
    assert six["phases"]["training"]["own_gib"] > eager["phases"]["training"]["own_gib"]
    assert eager["phases"]["rollout"] == six["phases"]["rollout"]


def test_gradient_checkpointing_trains_the_same_edit():
    from hpse_easyedit import hpse_edit

    requests = [{"subject": "AJ Lee", "target_new": "AJ Lee speaks Russian and lives in Moscow."}]
    weights, peaks = {}, {}
    for checkpointing in (False, True):
        model, tok = make_tiny_model_and_tokenizer("llama", init_std=0.2)
        hp = tiny_hparams(gradient_checkpointing=checkpointing, rounds=1, kl_weight=0)
        with LiveBytes([*model.parameters(), *model.buffers()]) as mem:
            result = hpse_edit(model, tok, requests, hp)
        peaks[checkpointing] = mem.peak
        weights[checkpointing] = {
            n: p.detach().clone() for n, p in result.model.named_parameters() if "lora_" in n
        }
        base = result.model.get_base_model()
        assert not base.is_gradient_checkpointing  # switched off after the steps
        # and transformers' input-grad hook with it: left on, a compiled decode cannot be captured
        assert not base.get_input_embeddings()._forward_hooks
    assert peaks[True] < peaks[False]  # the layers' activations were recomputed, not kept
    assert weights[False].keys() == weights[True].keys()
    for name in weights[False]:
        torch.testing.assert_close(weights[True][name], weights[False][name], rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_plan_command_prints_json_and_a_table(capsys):
    from hpse_easyedit.cli import main

    def plan(options: str) -> int:
        return main(["plan", "--hparams", "hparams/HPSE/qwen3-8b.yaml", *options.split()])

    assert (
        plan("--layers 2 --json --set executor=ft_m --set ftm_layer=1 --benchmark unkebench") == 0
    )
    planned = json.loads(capsys.readouterr().out)
    assert planned["executor"] == "ft_m" and planned["workload"]["max_new_tokens"] == 128
    assert {"peak_gib", "phases", "fits"} <= set(planned)
    assert plan("--layers 2") == 0
    table = capsys.readouterr().out.splitlines()
    header = next(line for line in table if line.startswith("phase"))
    assert header.split()[:6] == ["phase", "GiB", "24G", "40G", "48G", "80G"]
    row = next(line for line in table if line.startswith("training"))
    assert row.split()[2:6] == ["yes"] * 4  # a verdict under every card, no empty column
    for column in ("24G", "80G"):  # each verdict right under its card's header
        end = header.index(column) + len(column)
        assert row[end - 3 : end].strip() == "yes"
    assert plan("--layers 1000") == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: --layers 1000: Qwen/Qwen3-8B has 36 layers; plan it cut to 1 to 36 of them, or "
        "leave --layers out for all"
    )
    assert plan("--gpu-gib 0") == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --gpu-gib must be >= 1 (GiB of the card), got 0.0"
    assert plan("--layers 2 --set executor=ft_m") == 2  # layer 8 of a 2-layer model
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "'ftm_layer'" in err and "\n" not in err


def test_shipped_backbones_are_package_data():
    setup = Path("setup.py").read_text()
    assert "backbones/*.json" in setup
    assert {p.stem for p in BACKBONE_DIR.glob("*.json")} >= {
        "qwen2.5-7b",
        "qwen3-8b",
        "llama3.1-8b",
        "gemma2-9b",
    }


def test_workloads_are_the_documented_lengths():
    assert dataclasses.astuple(WORKLOADS["unkebench"])[:4] == ("unkebench", 1, 157, 128)
    assert dataclasses.astuple(WORKLOADS["mquake"])[:4] == ("mquake", 3, 128, 96)


@pytest.mark.slow
def test_the_card_overhead_reproduces_the_h100_measurement():
    """``card_gib`` (allocator pool and CUDA context around the tensors' peak) gives what the H100
    run held for its edit (docs/perf/gpu-h100-perf.json: reserved peak plus context) within 1%, and
    the plan's ``fits`` compare that figure, not the tensors' peak, with each card."""
    from hpse_easyedit.planner import CARDS_GIB, card_gib

    run = json.loads(
        (Path(__file__).resolve().parents[1] / "docs" / "perf" / "gpu-h100-perf.json").read_text()
    )
    memory = run["memory"]
    held = (memory["reserved"] + memory["context"]) / 2**30
    assert card_gib(memory["hpse"] / 2**30) == pytest.approx(held, rel=0.01)
    hp = HPSEHyperParams.from_hparams("hparams/HPSE/qwen2.5-7b.yaml")
    plan = plan_edit(hp, WORKLOADS["mquake"], layers=2)
    assert plan["card_gib"] == pytest.approx(card_gib(plan["peak_gib"]), abs=1e-3)
    assert plan["fits"] == {str(c): card_gib(plan["peak_gib"]) <= c for c in CARDS_GIB}
