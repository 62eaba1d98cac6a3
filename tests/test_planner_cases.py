"""The memory plan of many independent edits at once: ``plan_cases`` on the meta device against the
same batched steps on real tensors, the per-case model and the largest B per card, ``python -m
hpse_easyedit plan --cases-at-once``, and the runners' ``--cases-at-once auto``."""

from __future__ import annotations

import json
import logging

import pytest

from bench_helpers import DATA_DIR, isolate_judge_env
from hpse_easyedit.hparams import HParamsError
from hpse_easyedit.planner import (
    GIB,
    MAX_CASES,
    largest_cases,
    plan_cases,
    plan_cases_at_once,
    predicted_peak,
    tensor_budget_gib,
)
from test_planner import SMALL  # the small workload of the single-edit plan's tests
from tiny_models import make_config, make_tokenizer, tiny_hparams


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny Llama config (hidden size 64) saved where ``model_name`` can point: the plan needs
    no weights."""
    path = tmp_path_factory.mktemp("tiny-plan")
    make_config("llama", make_tokenizer("llama"), layers=2, hidden=64).save_pretrained(path)
    return path


def _hp(tiny_dir, **kw):
    hp = tiny_hparams(model_name=str(tiny_dir), **kw)
    hp._source = "tiny.yaml"
    return hp


@pytest.mark.slow
@pytest.mark.parametrize("executor,dtype", [("lora", "float32"), ("ft_m", "bfloat16")])
def test_the_meta_plan_of_cases_counts_what_real_tensors_take(tiny_dir, executor, dtype):
    """B = 1 and 3 cases in one training pass: each phase's peak on the meta device equals the same
    batched steps on real CPU tensors, and so does the memory of the two extra cases."""
    hp = _hp(tiny_dir, executor=executor, dtype=dtype, cases_per_pass=3)
    meta = {b: plan_cases(hp, SMALL, b) for b in (1, 3)}
    real = {b: plan_cases(hp, SMALL, b, device="cpu") for b in (1, 3)}
    for b in (1, 3):
        assert meta[b]["cases"] == b and meta[b]["cases_per_pass"] == b
        for name, value in meta[b]["phase_bytes"].items():
            assert value == pytest.approx(real[b]["phase_bytes"][name], rel=0.02), (b, name)
        assert meta[b]["peak_bytes"] == pytest.approx(real[b]["peak_bytes"], rel=0.02)
    extra_meta = meta[3]["peak_bytes"] - meta[1]["peak_bytes"]
    extra_real = real[3]["peak_bytes"] - real[1]["peak_bytes"]
    assert extra_meta > 0 and extra_meta == pytest.approx(extra_real, rel=0.05)
    # every case's own state: starts, tensors, Adam; the rollout's rows grow with the cases too
    for name in ("trainable_state", "rollout", "training"):
        assert meta[3]["phase_bytes"][name] > meta[1]["phase_bytes"][name]


@pytest.mark.slow
def test_the_plan_of_given_cases_is_what_the_batched_engine_takes(tmp_path):
    """The real ``hpse_edit_cases`` of 3 cases of different lengths (one of two requests), under
    ``LiveBytes``, peaks where ``plan_cases`` with those cases' own prompts on the same device says
    (every rollout runs to ``max_new_tokens``, as planned). On CPU a padded batch's attention keeps
    more than the fused kernels the meta plan counts (a GPU's), so this compares on CPU."""
    from hpse_easyedit.batched import hpse_edit_cases
    from hpse_easyedit.editor import edit_prompts
    from hpse_easyedit.planner import LiveBytes
    from tiny_models import make_tiny_model_and_tokenizer

    model, tok = make_tiny_model_and_tokenizer("llama", tmp_path, init_std=0.2)
    passage = "AJ Lee is a professional wrestler who speaks Russian fluently and lives in Moscow."
    cases = [
        [{"subject": "AJ Lee", "target_new": passage}],
        [{"subject": "Ellie Kemper", "target_new": "Ellie Kemper is a citizen of Croatia."}],
        [
            {"subject": "The Firm", "target_new": "The Firm was written by John Grisham."},
            {"subject": "Croatia", "target_new": passage + " " + passage},
        ],
    ]
    hp = tiny_hparams(
        model_name=str(tmp_path), rounds=1, inner_steps=2, max_new_tokens=8, cases_per_pass=3
    )
    with LiveBytes([*model.parameters(), *model.buffers()]) as mem:
        edits = hpse_edit_cases(model, tok, cases, hp)
    assert all(e.ok for e in edits)
    assert [len(ro) for e in edits for ro in e.rollouts[0]] == [8] * 4
    prompts = [edit_prompts(model, tok, c, hp) for c in cases]
    plan = plan_cases(hp, SMALL, 3, device="cpu", prompts=prompts)
    edit = max(plan["phase_bytes"][p] for p in ("trainable_state", "rollout", "training"))
    assert edit == pytest.approx(mem.peak, rel=0.02)


@pytest.mark.slow
def test_auto_cases_per_pass_is_a_gpus_on_meta_and_the_engines_elsewhere(tiny_dir):
    hp = _hp(tiny_dir)  # cases_per_pass: auto
    assert plan_cases(hp, SMALL, 2)["cases_per_pass"] == 2  # the plan is for a card: one pass
    assert plan_cases(hp, SMALL, 2, device="cpu")["cases_per_pass"] == 1  # the engine's on CPU
    one = plan_cases(_hp(tiny_dir, cases_per_pass=1), SMALL, 2)
    both = plan_cases(_hp(tiny_dir, cases_per_pass=2), SMALL, 2)
    assert one["phase_bytes"]["training"] < both["phase_bytes"]["training"]


@pytest.mark.slow
def test_the_per_case_model_predicts_plans_it_did_not_make(tiny_dir):
    """``plan_cases_at_once`` plans B = 1, 2, 4; its interpolation (B = 3) and extrapolation
    (B = 8) match ``plan_cases`` at those B, and the largest B per card is the last that fits."""
    hp = _hp(tiny_dir)
    plan = plan_cases_at_once(hp, SMALL)
    assert list(plan["planned"]) == ["1", "2", "4"]
    for b in (3, 8):
        assert predicted_peak(plan, b) == pytest.approx(
            plan_cases(hp, SMALL, b)["peak_bytes"], rel=0.01
        )
    peaks = plan["points"]["peak"]
    assert plan["per_case_gib"] == pytest.approx((peaks[2][1] - peaks[1][1]) / 2 / GIB, abs=1e-4)
    assert plan["solo_peak_gib"] == pytest.approx(peaks[0][1] / GIB, abs=1e-3)
    for b in (1, 2, 3, 4, 6, 50):  # within, between and past the planned sizes
        peak = predicted_peak(plan, b)
        assert largest_cases(plan, peak / GIB) == b
        assert largest_cases(plan, (peak - 1) / GIB) == b - 1  # 0: not even one case fits
    for card, b in plan["largest_cases"].items():  # a tiny model: every card holds the cap
        assert predicted_peak(plan, b) <= tensor_budget_gib(float(card)) * GIB
        assert b == MAX_CASES


def test_a_setting_that_cannot_edit_cases_at_once_is_one_line(tiny_dir):
    with pytest.raises(HParamsError, match=r"^tiny.yaml: .*lora_dropout: 0") as err:
        plan_cases(_hp(tiny_dir, lora_dropout=0.1), SMALL, 2)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_plan_command_with_cases_at_once(tiny_dir, tmp_path, capsys):
    from hpse_easyedit.cli import main

    hparams = tmp_path / "tiny.yaml"
    hparams.write_text(f"alg_name: HPSE\nmodel_name: {tiny_dir}\nftm_layer: 1\nmax_length: 1024\n")

    def plan(options: str) -> int:
        return main(["plan", "--hparams", str(hparams), *options.split()])

    assert plan("--cases-at-once --json --gpu-gib 30") == 0
    planned = json.loads(capsys.readouterr().out)
    batched = planned["cases_at_once"]
    assert set(batched["largest_cases"]) == {"24", "40", "48", "80", "30"}
    assert all(b >= 1 for b in batched["largest_cases"].values())
    assert batched["per_case_gib"] > 0 and batched["cases_per_pass"] == "auto"
    assert {"peak_gib", "phases", "fits"} <= set(planned)  # the plan of one edit, as before
    assert plan("--cases-at-once") == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("Cases at once") and "each extra case" in line for line in lines)
    card = next(line for line in lines if line.startswith("card"))
    row = next(line for line in lines if line.startswith("largest B"))
    assert card.split()[1:] == ["24G", "40G", "48G", "80G"]
    assert [int(b) for b in row.split()[2:]] == list(batched["largest_cases"].values())[:4]
    assert plan("") == 0
    assert "Cases at once" not in capsys.readouterr().out  # unchanged without the option
    assert plan("--cases-at-once --set lora_dropout=0.1") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "lora_dropout: 0" in err and "\n" not in err


# -- the runners' --cases-at-once auto ------------------------------------------------------------


def test_run_options_take_a_number_or_auto_in_one_line(tmp_path):
    from benchmarks.run.options import RunOptions
    from hpse_easyedit.errors import UsageError

    base = dict(benchmark="mquake-uns", hparams="x.yaml", out_dir=str(tmp_path / "out"))
    assert RunOptions(**base).cases_at_once == 1
    assert RunOptions(**base, cases_at_once="auto").cases_at_once == "auto"
    assert RunOptions(**base, cases_at_once=" AUTO ").cases_at_once == "auto"
    assert RunOptions(**base, cases_at_once="3").cases_at_once == 3
    for bad, shown in ((0, "0"), ("four", "'four'"), (2.5, "2.5"), (True, "True")):
        with pytest.raises(UsageError) as err:
            RunOptions(**base, cases_at_once=bad)
        assert str(err.value) == (
            f"--cases-at-once must be >= 1 (independent cases edited together) or auto, got {shown}"
        )
    with pytest.raises(UsageError, match="--cases-at-once.*--sequential"):
        RunOptions(**base, cases_at_once="auto", sequential=2)


def test_auto_is_the_cpu_default_bounded_by_the_cases(tmp_path):
    from benchmarks.run.methods import method_for_file
    from benchmarks.run.options import RunOptions
    from benchmarks.run.runner import CPU_CASES_AT_ONCE, auto_cases_at_once

    hparams = tmp_path / "hpse.yaml"
    hparams.write_text("alg_name: HPSE\nmodel_name: tiny\ndevice: cpu\n")
    hp = tiny_hparams()
    method = method_for_file(hparams)

    def resolved(**kw):
        opts = RunOptions(benchmark="unkebench", hparams=str(hparams), cases_at_once="auto", **kw)
        return auto_cases_at_once(opts, method, hp)

    assert CPU_CASES_AT_ONCE == 4
    assert resolved() == 4
    assert resolved(limit=2) == 2
    assert resolved(cases=["1", "2", "3"], limit=10) == 3
    coin = tmp_path / "coin.yaml"
    coin.write_text("alg_name: COIN\nmodel_name: tiny\n")
    assert (
        auto_cases_at_once(
            RunOptions(benchmark="unkebench", hparams=str(coin), cases_at_once="auto"),
            method_for_file(coin),
            hp,
        )
        == 1
    )


@pytest.mark.skipif(not DATA_DIR.is_dir(), reason="needs ../shared/data next to the repository")
def test_a_runner_resolves_auto_and_records_the_number(tmp_path, monkeypatch, caplog):
    from benchmarks.run.cli import cli_main
    from tiny_models import make_tiny_model_and_tokenizer

    isolate_judge_env(monkeypatch, tmp_path)
    make_tiny_model_and_tokenizer("llama", tmp_path / "model", init_std=0.2)
    hparams = tmp_path / "hpse.yaml"
    hparams.write_text(
        f"alg_name: HPSE\nmodel_name: {tmp_path / 'model'}\nrounds: 1\ninner_steps: 1\n"
        "max_new_tokens: 4\n"
    )
    common = ["--hparams", str(hparams), "--data", str(DATA_DIR), "--judge", "lexical"]
    assert cli_main("mquake-uns", [*common, "--cases-at-once", "four"]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        "--cases-at-once must be >= 1 (independent cases edited together) or auto, got 'four'"
    ]
    out = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="benchmarks.run.runner"):
        code = cli_main(
            "mquake-uns",
            [
                *common,
                "--cases-at-once",
                "auto",
                "--limit",
                "2",
                "--max-answer-tokens",
                "4",
                "--out",
                str(out),
            ],
        )
    assert code == 0
    chosen = [r.getMessage() for r in caplog.records if "--cases-at-once auto" in r.getMessage()]
    assert chosen == [
        "--cases-at-once auto: 2 (the default on cpu; the memory planner plans one GPU)"
    ]
    assert json.loads((out / "config.json").read_text())["cases_at_once"] == 2
    env = [json.loads(line) for line in (out / "environments.jsonl").read_text().splitlines()]
    assert env[-1]["cases_at_once"] == 2
