"""The UNEDITED and IN_CONTEXT reference rows: no weight moves, and IN_CONTEXT answers every
question of a case (or of a continual-editing block) with exactly that case's passages in the
teacher's system prompt."""

import json
from pathlib import Path

import pytest
import yaml

import hpse_easyedit
from bench_helpers import DATA_DIR, isolate_judge_env
from benchmarks.run.runner import RunOptions, run_benchmark
from benchmarks.tasks.datasets import load_mquake_uns
from hpse_easyedit.generation import generate_answers
from hpse_easyedit.hparams import HParamsError
from hpse_easyedit.prompts import LLAMA_SYSTEM, chat_prompt_ids, privileged_system
from tiny_models import make_tiny_model_and_tokenizer

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(
    not DATA_DIR.is_dir(), reason="needs ../shared/data next to the repository"
)


@pytest.fixture(scope="module")
def tiny_files(tiny_model):
    return {
        f"{alg}.yaml": f"alg_name: {alg}\nmodel_name: {tiny_model}\n"
        for alg in ("UNEDITED", "IN_CONTEXT")
    }


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    isolate_judge_env(monkeypatch, tmp_path)


@pytest.fixture
def systems(monkeypatch):
    """Every ``system`` the runner's answer generation is called with."""
    seen = []

    def spy(model, tok, questions, **kw):
        seen.append((len(questions), kw.get("system")))
        return generate_answers(model, tok, questions, **kw)

    monkeypatch.setattr(hpse_easyedit, "generate_answers", spy)
    return seen


def _run(tiny, tmp_path, alg, **kw):
    opts = dict(
        benchmark="mquake-uns",
        hparams=str(tiny / f"{alg}.yaml"),
        data_dir=str(DATA_DIR),
        out_dir=str(tmp_path / alg),
        limit=3,
        max_new_tokens=4,
        judge="lexical",
    )
    return run_benchmark(RunOptions(**{**opts, **kw}))


def test_unedited_answers_without_a_system_prompt(tiny, tmp_path, systems):
    summary = _run(tiny, tmp_path, "UNEDITED")
    assert summary["editor"] == "UNEDITED" and summary["n_cases"] == 3
    assert [s for _, s in systems] == [None, None, None]
    assert summary["stepin_rate_by_round"] == []


def test_in_context_answers_each_case_under_its_own_passages(tiny, tmp_path, systems):
    summary = _run(tiny, tmp_path, "IN_CONTEXT")
    cases = load_mquake_uns(DATA_DIR, limit=3)
    assert summary["editor"] == "IN_CONTEXT" and len(systems) == 3
    for case, (n_questions, system) in zip(cases, systems):
        passages = [r["target_new"] for r in case["requests"]]
        subjects = ", ".join(dict.fromkeys(r["subject"] for r in case["requests"]))
        # the tiny model is a Llama, so the teacher's Llama wording, with this case's passages and
        # no other
        assert system == LLAMA_SYSTEM.format(subject=subjects, passage="\n\n".join(passages))
        assert n_questions == len(case["single_hop_questions"]) + len(case["multi_hop_questions"])
    assert (
        json.loads((tmp_path / "IN_CONTEXT" / "config.json").read_text())["hparams"]["alg_name"]
        == "IN_CONTEXT"
    )


@pytest.mark.slow
def test_in_context_continual_block_reads_every_passage_of_the_block(tiny, tmp_path, systems):
    _run(tiny, tmp_path, "IN_CONTEXT", limit=2, sequential=2)
    cases = load_mquake_uns(DATA_DIR, limit=2)
    ((_, system),) = systems
    for case in cases:
        assert all(r["target_new"] in system for r in case["requests"])


def test_system_prompt_is_folded_into_the_user_turn_without_a_system_role():
    model, tok = make_tiny_model_and_tokenizer("gemma2")  # its template raises on a system message
    system = privileged_system("default", "AJ Lee", ["AJ Lee speaks Russian."])
    got = generate_answers(model, tok, ["What does AJ Lee speak?"], max_new_tokens=3, system=system)
    rows = chat_prompt_ids(tok, "What does AJ Lee speak?", system, system_role=False)
    assert tok.decode(rows).count("AJ Lee speaks Russian.") == 1
    import torch

    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([rows]),
            max_new_tokens=3,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
        )
    assert got == [tok.decode(out[0, len(rows) :], skip_special_tokens=True).strip()]


def test_reference_hparams_check_the_alg_name(tmp_path):
    from benchmarks.run.methods import get_method
    from benchmarks.run.references import InContextHParams

    bad = tmp_path / "ref.yaml"
    bad.write_text("alg_name: IN_CONTEXT\nmodel_name: m\nteacher_prompt_style: chatty\n")
    with pytest.raises(HParamsError, match="teacher_prompt_style"):
        InContextHParams.from_hparams(bad)
    shipped = sorted((REPO / "hparams" / "REFERENCE").glob("*.yaml"))
    assert len(shipped) == 2
    for path in shipped:
        alg = yaml.safe_load(path.read_text())["alg_name"]
        assert get_method(alg).hparams_class.from_hparams(path).alg_name == alg
