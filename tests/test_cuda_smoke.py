"""The GPU path on a real CUDA device (skipped where torch sees none): a tiny model loaded
straight onto the card from disk, one HPSE edit per executor and a bit-exact restore, and the
rollout's tokens on CUDA (eager, static, and the static step captured as CUDA graphs) equal to the
CPU's.

Float32 with TF32 off on both devices, and random weights drawn at std 0.3: the next-token
distributions are peaked enough that greedy choices do not follow the devices' rounding."""

from __future__ import annotations

import pytest
import torch

from greedy_ties import assert_same_greedy, hybrid_margin, recorded_rollouts, rollout_decisions
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


THREE = [
    {"subject": "AJ Lee", "target_new": "AJ Lee speaks Russian fluently and lives in Moscow."},
    {"subject": "Ellie Kemper", "target_new": "Ellie Kemper is a citizen of Croatia."},
    {"subject": "The Firm", "target_new": "The Firm is a novel written by John Grisham."},
]


def _bf16_on_the_card(tmp_path, **overrides):
    """A tiny Qwen2 saved to ``tmp_path`` and hparams that edit it on the card as the shipped 7B-9B
    files do: bfloat16, the compiled decode, the captured inner step; short edits."""
    make_tiny_model_and_tokenizer("qwen2", tmp_path, init_std=0.3)
    return tiny_hparams(
        model_name=str(tmp_path),
        device="cuda",
        dtype="bfloat16",
        rounds=2,
        inner_steps=2,
        max_new_tokens=8,
        static_decode="compile",
        compile_training=True,
        **overrides,
    )


def _logits(model, tok) -> torch.Tensor:
    ids = tok("Who is AJ Lee?", return_tensors="pt")["input_ids"].to("cuda")
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


@pytest.mark.parametrize("executor", ["lora", "ft_m"])
def test_bf16_edit_on_cuda_moves_the_model_and_restores_bit_for_bit(tmp_path, executor):
    """The shipped 7B-9B path on a card at a tiny size: bfloat16 weights, three requests in one
    edit, the static decode compiled (CUDA graphs), the captured inner step, and then the same
    under gradient checkpointing (where ``auto`` keeps the eager step). Each edit moves the
    logits, the restore gives them back bit for bit, and the compiled rollout's tokens are the
    dynamic decode's on the same card up to a tie within bfloat16's rounding."""
    hp = _bf16_on_the_card(tmp_path, executor=executor)
    model, tok = load_model(hp)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    before, snapshot = _logits(model, tok), weights_snapshot(model)
    checkpointed = hp.with_overrides({"compile_training": "auto", "gradient_checkpointing": True})
    for settings in (hp, checkpointed):
        edited, weights_copy = apply_hpse_to_model(model, tok, THREE, settings)
        result = weights_copy.result
        assert len(result.rollouts[0]) == 3 and all(len(ro) for ro in result.rollouts[0])
        assert all(torch.isfinite(torch.tensor(r["loss_last"])) for r in result.rounds)
        assert result.rounds[-1]["loss_last"] < result.rounds[0]["loss"]
        assert not torch.equal(_logits(edited, tok), before)  # the edit moved the model
        restored = restore_weights(edited, weights_copy)
        assert same_weights(restored, snapshot) and torch.equal(_logits(restored, tok), before)
        model = restored

    ex = make_executor(model, hp)
    student = tok("Introduce AJ Lee.")["input_ids"]
    teacher = tok("AJ Lee speaks Russian. Who is AJ Lee?")["input_ids"]
    kw = dict(tau=0.5, kappa=0.05, top_k=4, max_new_tokens=12, stop_ids=[tok.eos_token_id])
    with recorded_rollouts() as logprobs:
        runs = [
            batched_hybrid_rollout(
                ex.model,
                ex.row_switch,
                student,
                teacher,
                pad_id=tok.pad_token_id,
                static_decode=mode,
                stop_every=3,
                **kw,
            )
            for mode in (False, "compile")
        ]
    # bfloat16: the compiled kernels round otherwise than the eager ones, so tokens are compared up
    # to a tie within bfloat16's rounding and log-probs within it (tests/greedy_ties.py)
    assert runs[0].tokens.tolist()
    assert_same_greedy(
        rollout_decisions(runs[0]),
        rollout_decisions(runs[1]),
        *logprobs,
        dtype=torch.bfloat16,
        margin=hybrid_margin(kw["tau"], kw["kappa"]),
    )
    restore_weights(ex.model, ex.weights_copy())


def test_twenty_sequential_edits_keep_the_cards_memory_flat(tmp_path):
    """A continual run of 20 short bfloat16 LoRA edits on the compiled decode and the captured
    inner step: after the first few edits (compilation, the kept decoders and their graphs), the
    card's allocated and reserved memory stop growing."""
    hp = _bf16_on_the_card(tmp_path)
    model, tok = load_model(hp)
    allocated, reserved = [], []
    for i in range(20):
        request = [{"subject": f"Person {i}", "target_new": f"Person {i} lives in City {i}."}]
        model, _ = apply_hpse_to_model(model, tok, request, hp)
        torch.cuda.synchronize()
        allocated.append(torch.cuda.memory_allocated())
        reserved.append(torch.cuda.memory_reserved())
    print("allocated", allocated, "reserved", reserved)
    assert max(allocated[5:]) <= allocated[5] + 2**20  # flat within a MiB after edit 6
    assert reserved[-10:] == [reserved[-10]] * 10


def test_bf16_edits_under_cuda_graphs_train_as_the_captured_step(tmp_path):
    """``compile_training: graphs`` on the card: a bfloat16 LoRA edit whose captured inner step is
    replayed as CUDA graphs trains the adapters of the same edit without graphs (within bfloat16
    rounding), moves the logits and restores them bit for bit; then 12 single edits, each restored,
    leave the card's allocated memory flat after the first few (the graphs are replayed on the new
    adapters, not recorded again)."""
    hp = _bf16_on_the_card(tmp_path)
    model, tok = load_model(hp)
    before, snapshot = _logits(model, tok), weights_snapshot(model)
    trained = {}
    for mode in (True, "graphs"):
        edited, weights_copy = apply_hpse_to_model(
            model, tok, THREE, hp.with_overrides({"compile_training": mode})
        )
        assert all(torch.isfinite(torch.tensor(r["loss_last"])) for r in weights_copy.result.rounds)
        assert not torch.equal(_logits(edited, tok), before)
        trained[mode] = {
            n: p.detach().float().clone() for n, p in edited.named_parameters() if "lora_" in n
        }
        model = restore_weights(edited, weights_copy)
        assert same_weights(model, snapshot) and torch.equal(_logits(model, tok), before)
    assert trained[True].keys() == trained["graphs"].keys()
    for name, want in trained[True].items():
        scale = want.abs().max().clamp(min=1e-12)
        assert ((trained["graphs"][name] - want).abs().max() / scale).item() < 2e-2, name
    graphs = hp.with_overrides({"compile_training": "graphs"})
    allocated = []
    for i in range(12):
        request = [{"subject": f"Person {i}", "target_new": f"Person {i} lives in City {i}."}]
        edited, weights_copy = apply_hpse_to_model(model, tok, request, graphs)
        model = restore_weights(edited, weights_copy)
        torch.cuda.synchronize()
        allocated.append(torch.cuda.memory_allocated())
    print("allocated", allocated)
    assert max(allocated[4:]) <= allocated[4] + 2**20  # flat within a MiB after edit 5
