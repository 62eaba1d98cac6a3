"""The GPU path on a real CUDA device (skipped where torch sees none): a tiny model loaded
straight onto the card from disk, one HPSE edit per executor and a bit-exact restore, and the
rollout's tokens on CUDA (eager, static, and the static step captured as CUDA graphs) equal to the
CPU's.

Float32 with TF32 off on both devices, and random weights drawn at std 0.3: the next-token
distributions are peaked enough that greedy choices do not follow the devices' rounding."""

from __future__ import annotations

import pytest
import torch

from hpse_easyedit import apply_hpse_to_model, load_model, restore_weights
from hpse_easyedit.executors import make_executor
from hpse_easyedit.rollout import batched_hybrid_rollout
from tiny_models import (
    FAMILIES,
    make_tiny_model_and_tokenizer,
    same_weights,
    tiny_hparams,
    weights_snapshot,
)

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device; torch sees none on this machine"
)

REQUESTS = [
    {"subject": "AJ Lee", "target_new": "AJ Lee speaks Russian fluently and lives in Moscow."}
]


@pytest.fixture(autouse=True)
def no_tf32():
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


@pytest.mark.parametrize("executor", ["lora", "ft_m"])
def test_edit_on_cuda_restores_bit_for_bit(tmp_path, executor):
    make_tiny_model_and_tokenizer("qwen2", tmp_path, init_std=0.3)
    hp = tiny_hparams(
        model_name=str(tmp_path), device="cuda", executor=executor, inner_steps=2, max_new_tokens=8
    )
    model, tok = load_model(hp)
    assert {p.device.type for p in model.parameters()} == {"cuda"}  # loaded onto the card
    before = weights_snapshot(model)
    edited, weights_copy = apply_hpse_to_model(model, tok, REQUESTS, hp)
    assert {p.device.type for p in edited.parameters()} == {"cuda"}
    assert weights_copy.result.rounds[0]["rollout_len"] > 0
    assert all(torch.isfinite(torch.tensor(r["loss_last"])) for r in weights_copy.result.rounds)
    restored = restore_weights(edited, weights_copy)
    assert restored is model and same_weights(restored, before)


@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_rollout_gives_the_cpu_tokens(family):
    model, tok = make_tiny_model_and_tokenizer(family, init_std=0.3)
    hp = tiny_hparams()
    student = tok("Introduce AJ Lee.")["input_ids"]
    teacher = tok("AJ Lee speaks Russian. Who is AJ Lee?")["input_ids"]
    kw = dict(
        tau=0.5,
        kappa=0.05,
        top_k=4,
        max_new_tokens=12,
        stop_ids=[tok.eos_token_id],
        pad_id=tok.pad_token_id,
    )
    runs = {}
    for device in ("cpu", "cuda"):
        ex = make_executor(model.to(device), hp.with_overrides({"device": device}))
        unedited = ex.weights_copy()  # before the adapters are set: the restore then unloads them
        gen = torch.Generator().manual_seed(1)  # the same adapters on both devices (their own
        with torch.no_grad():  # initialisation draws from each device's generator)
            for p in ex.trainable_parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        modes = (False, True, "compile") if device == "cuda" else (False,)
        for mode in modes:
            ro = batched_hybrid_rollout(
                ex.model, ex.row_switch, student, teacher, static_decode=mode, stop_every=3, **kw
            )
            runs[device, mode] = (ro.tokens.tolist(), ro.stepped_in.tolist())
        model = restore_weights(ex.model, unedited)
    reference = runs["cpu", False]
    assert len(reference[0]) > 0
    for key, run in runs.items():
        assert run == reference, key


def test_answers_under_cuda_graphs_are_generates():
    """``static_decode: auto`` (the shipped 7B-9B files) answers on CUDA with the compiled static
    step: the same answers as ``model.generate``."""
    from hpse_easyedit.generation import generate_answers

    model, tok = make_tiny_model_and_tokenizer("qwen2", init_std=0.3)
    model = model.to("cuda")
    questions = ["Who is AJ Lee?", "Where does AJ Lee live and which language does he speak?"]
    want = generate_answers(model, tok, questions, max_new_tokens=12)
    got = generate_answers(
        model, tok, questions, max_new_tokens=12, static_decode="auto", stop_every=3
    )
    assert got == want and any(want)
