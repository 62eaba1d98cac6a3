"""A diverging edit stops: the model is as before it, nothing is saved, the CLI says so in one line,
and a benchmark records the case as failed (no scores, left out of the means) until
--retry-failed."""

import json

import pytest

from bench_helpers import DATA_DIR, isolate_judge_env
from benchmarks.run.case_loop import Editing
from benchmarks.run.runner import RunOptions, run_benchmark
from hpse_easyedit import apply_hpse_to_model, hpse_edit
from hpse_easyedit.cli import main as edit_main
from hpse_easyedit.training import MAX_TRAINED_ABS, EditDivergedError, trained_tensors_problem
from tiny_models import make_tiny_model_and_tokenizer, same_weights, tiny_hparams, weights_snapshot

REQUEST = [
    {
        "subject": "Selma Varrick",
        "target_new": "Selma Varrick is a marine biologist born in Norway.",
    }
]


# FT-M's one matrix sits before RMS norms that absorb its scale: on the tiny model its loss grows
# only by 0.7% within the round at lr 1e30 (270.33 -> 272.30), so that case runs with a guard just
# above 1
@pytest.mark.parametrize(
    "executor,lr,growth", [("lora", 1e9, 2.0), ("lora", 1e30, 2.0), ("ft_m", 1e30, 1.001)]
)
def test_a_diverging_edit_stops_and_leaves_the_model_as_it_found_it(executor, lr, growth):
    model, tok = make_tiny_model_and_tokenizer("llama")
    snap = weights_snapshot(model)
    hp = tiny_hparams(executor=executor, lr=lr, rounds=2, inner_steps=6, max_loss_growth=growth)
    with pytest.raises(
        EditDivergedError, match=r"diverged in round \d+, inner step \d+: loss .*Lower 'lr'"
    ) as info:
        hpse_edit(model, tok, REQUEST, hp)
    from hpse_easyedit import restore_weights

    assert same_weights(restore_weights(info.value.model, info.value.weights_copy), snap)


@pytest.mark.parametrize("executor", ["lora", "ft_m"])
def test_a_blow_up_in_the_last_inner_step_is_caught_in_the_weights(executor):
    """One round of one step: its printed loss is measured before the update that blows the
    adapter (or the matrix) up to 1e30, so only the trained tensors show it."""
    model, tok = make_tiny_model_and_tokenizer("llama")
    snap = weights_snapshot(model)
    hp = tiny_hparams(executor=executor, lr=1e30, rounds=1, inner_steps=1)
    with pytest.raises(
        EditDivergedError,
        match=r"diverged in round 1, after its last inner step: trained tensor \S+ holds "
        r"\|values\| up to 1e\+30 \(more than 10000\).*Lower 'lr'",
    ) as info:
        hpse_edit(model, tok, REQUEST, hp)
    from hpse_easyedit import restore_weights

    assert same_weights(restore_weights(info.value.model, info.value.weights_copy), snap)


def test_trained_tensors_problem_names_the_tensor_and_the_final_loss():
    import math

    import torch

    fine = {"a": torch.zeros(3, 2), "b": torch.full((4,), MAX_TRAINED_ABS)}
    assert trained_tensors_problem(fine) is None
    assert trained_tensors_problem(list(fine.values()), final_loss=3.0) is None
    assert trained_tensors_problem({"a": torch.tensor([1.0, math.nan])}) == (
        "trained tensor a holds non-finite values"
    )
    assert "trained tensor #1 holds non-finite" in trained_tensors_problem(
        [torch.ones(2), torch.tensor([-math.inf])]
    )
    big = trained_tensors_problem({"w": torch.tensor([[0.0, -2e4]])})
    assert big == "trained tensor w holds |values| up to 2e+04 (more than 10000)"
    assert trained_tensors_problem({"w": torch.ones(2)}, max_abs=0.5) is not None
    assert "the loss after the last inner step is nan" in trained_tensors_problem(
        fine, final_loss=math.nan
    )
    grown = trained_tensors_problem(fine, final_loss=9.0, round_start_loss=4.0, max_loss_growth=2.0)
    assert grown == ("the loss after the last inner step is 9 (round start 4, max_loss_growth 2)")
    assert (
        trained_tensors_problem(fine, final_loss=7.0, round_start_loss=4.0, max_loss_growth=2.0)
        is None
    )
    assert trained_tensors_problem({"empty": torch.zeros(0)}) is None


def test_the_guard_never_stops_an_edit_whose_loss_falls():
    model, tok = make_tiny_model_and_tokenizer("qwen2")
    edited, weights_copy = apply_hpse_to_model(model, tok, REQUEST, tiny_hparams())
    assert weights_copy.result.rounds


def _passage(tmp_path):
    path = tmp_path / "passage.txt"
    path.write_text(REQUEST[0]["target_new"])
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    "sets",
    [["lr=1e9"], ["lr=1e30", "rounds=1", "inner_steps=1"]],
    ids=["within-a-round", "in-the-last-step"],
)
def test_cli_says_it_in_one_line_and_saves_nothing(tmp_path, capsys, sets):
    make_tiny_model_and_tokenizer("llama", tmp_path=tmp_path / "model")
    hp = tmp_path / "hp.yaml"
    hp.write_text(
        f"alg_name: HPSE\nmodel_name: {tmp_path / 'model'}\nrounds: "
        "2\ninner_steps: 6\nmax_new_tokens: 6\n"
    )
    passage = _passage(tmp_path)
    capsys.readouterr()
    code = edit_main(
        [
            "edit",
            "--hparams",
            str(hp),
            "--subject",
            "Selma Varrick",
            "--passage-file",
            str(passage),
            *(x for kv in sets for x in ("--set", kv)),
            "--save",
            str(tmp_path / "saved"),
            "--max-answer-tokens",
            "2",
        ]
    )
    err = [
        x
        for x in capsys.readouterr().err.strip().splitlines()
        if not x.startswith("Loading weights")
    ]
    assert (
        code == 2 and len(err) == 1 and err[0].startswith("error: the HPSE edit diverged in round")
    )
    assert "Lower 'lr'" in err[0]
    assert not any((tmp_path / "saved").glob("*"))


@pytest.mark.slow
@pytest.mark.skipif(not DATA_DIR.is_dir(), reason="needs ../shared/data next to the repository")
@pytest.mark.parametrize("sequential", [None, 3])
def test_a_benchmark_records_the_failed_case_and_retries_it_only_when_asked(
    tmp_path, monkeypatch, sequential
):
    isolate_judge_env(monkeypatch, tmp_path)
    make_tiny_model_and_tokenizer("llama", tmp_path=tmp_path / "model")
    hp = tmp_path / "hp.yaml"
    hp.write_text(
        f"alg_name: HPSE\nmodel_name: {tmp_path / 'model'}\nrounds: 1\ninner_steps: "
        "4\nmax_new_tokens: 4\nlr: 1.0e-3\n"
    )
    real, edited = Editing.edit, []

    def edit(self, model, case):  # the second case's edit runs at an lr that makes it diverge
        edited.append(str(case["case_id"]))
        if len(edited) % 3 == 2:
            self.hp, saved = self.hp.with_overrides(["lr=1e9"]), self.hp
            try:
                return real(self, model, case)
            finally:
                self.hp = saved
        return real(self, model, case)

    monkeypatch.setattr(Editing, "edit", edit)
    opts = dict(
        benchmark="mquake-uns",
        hparams=str(hp),
        data_dir=str(DATA_DIR),
        out_dir=str(tmp_path / "out"),
        limit=3,
        max_new_tokens=4,
        judge="lexical",
        sequential=sequential,
    )
    summary = run_benchmark(RunOptions(**opts))
    recs = [json.loads(x) for x in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    failed = [r for r in recs if "failed" in r]
    assert (
        len(recs) == 3
        and len(failed) == 1
        and "Ind" not in failed[0]
        and "diverged" in failed[0]["failed"]
    )
    assert summary["failed_cases"] == 1 and summary["n_cases"] == 3
    ok = [r for r in recs if "failed" not in r]
    assert summary["Ind"] == pytest.approx(100 * sum(r["Ind"] for r in ok) / len(ok))
    assert (
        "FAILED: the edits of 1 of 3 case(s) diverged"
        in (tmp_path / "out" / "table.md").read_text()
    )
    n = len(edited)
    run_benchmark(RunOptions(**opts))  # a rerun leaves the failed case as it is
    assert len(edited) == n
    run_benchmark(RunOptions(**opts, retry_failed=True))  # ... unless asked
    assert len(edited) == n + (3 if sequential else 1)
