"""The captured inner step (``compile_training``): its padded passes compute the eager passes'
losses, an edit with it trains the eager edit's tensors within float rounding (traced whole, and
with inductor's real kernels), rollouts of other lengths reuse its graphs, and ``auto`` chooses it
only where it can run."""

from __future__ import annotations

import copy
from pathlib import Path
from unittest import mock

import pytest
import torch

from graph_backends import Replays
from hpse_easyedit import captured
from hpse_easyedit.editor import HPSEObjective, edit_prompts, hpse_edit
from hpse_easyedit.executors import make_executor
from hpse_easyedit.padding import pad_token_id
from hpse_easyedit.prompts import stop_token_ids
from tiny_models import FAMILIES, make_tiny_model_and_tokenizer, tiny_hparams

REQUESTS = [
    {
        "subject": "AJ Lee",
        "target_new": "AJ Lee is a wrestler who speaks Russian fluently and lives in Moscow.",
    },
    {"subject": "Bob", "target_new": "Bob is a cat."},
]


class Compiles:
    """A ``torch.compile`` backend that counts the graphs dynamo hands it and runs them eagerly."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm, inputs):
        self.graphs += 1
        return gm.forward


@pytest.fixture
def backend(monkeypatch):
    """The captured passes traced whole (``fullgraph=True``) and run eagerly: the graph and the
    padding are checked without inductor's compile time."""
    counting = Compiles()
    monkeypatch.setattr(captured, "BACKEND", counting)
    monkeypatch.setattr(captured, "_COMPILED", {})
    # each test's own models: dynamo's caches of the passes' code start empty (a run edits one
    # model, whose edits share a few graphs; a process of tests would reach the recompile limit)
    torch._dynamo.reset()
    return counting


def _objective(family: str, executor: str, dtype=torch.float32, **overrides):
    model, tok = make_tiny_model_and_tokenizer(family, init_std=0.2)
    model.to(dtype)
    hp = tiny_hparams(executor=executor, max_new_tokens=8, **overrides)
    prompts = edit_prompts(model, tok, REQUESTS, hp)
    stops = stop_token_ids(model, tok)
    ex = make_executor(model, hp)
    return ex, HPSEObjective(ex, prompts, hp, stop_ids=stops, pad_id=pad_token_id(tok, stops))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_padded_passes_give_the_eager_losses(family):
    """The captured batches (rows padded to 64 tokens, scored positions to 64, padding weighted 0)
    give the eager batches' KL and NLL on the same rollouts (their eager function: no gradient)."""
    ex, eager = _objective(family, "lora")
    eager.start_round(ex.model)
    _, padded = _objective(family, "lora", compile_training=True)
    assert padded.captured and not eager.captured
    padded.use_rollouts(eager.rollouts[-1])
    assert padded.kl_batch.ids.shape[1] % captured.WIDTH_STEP == 0
    assert padded.kl_batch.rows.shape[0] % captured.POSITION_STEP == 0
    with torch.no_grad():
        for scored_only in (True, False):
            want = eager.kl_batch.loss(ex.model, "full", scored_only)
            got = padded.kl_batch.loss(ex.model, "full", scored_only)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
            want_nll = eager.nll_batch.loss(ex.model, scored_only)
            got = padded.nll_batch.loss(ex.model, scored_only)
            torch.testing.assert_close(got, want_nll, rtol=1e-5, atol=1e-4)
            # the captured step's one pass over both terms' stacked rows gives both losses
            kl, nll = padded.joint.losses(ex.model, "full", scored_only)
            torch.testing.assert_close(kl, want, rtol=1e-5, atol=1e-4)
            torch.testing.assert_close(nll, want_nll, rtol=1e-5, atol=1e-4)
        student = padded.kl_batch.loss(ex.model, "topk")
        torch.testing.assert_close(
            student, eager.kl_batch.loss(ex.model, "topk"), rtol=1e-5, atol=1e-4
        )


def _edit(model, tok, **overrides):
    hp = tiny_hparams(max_new_tokens=8, inner_steps=3, **overrides)
    result = hpse_edit(copy.deepcopy(model), tok, REQUESTS, hp)
    tensors = {
        n: p.detach().clone() for n, p in result.model.named_parameters() if "lora_" in n
    } or {"ftm": result.model.get_parameter("model.layers.1.mlp.down_proj.weight").detach()}
    return result, tensors


def _step_gradients(objective, rollouts=None) -> tuple[dict, list]:
    """One inner step's gradients of the executor's trained tensors (float32, by position), on
    ``rollouts`` (another objective's, so both steps train on the same tokens) or, without them, on
    a round of its own; and the rollouts it trained on."""
    ex = objective.executor
    if rollouts is not None:
        objective.use_rollouts(rollouts)
    else:
        objective.start_round(ex.model)
        rollouts = objective.rollouts[-1]
    ex.model.train(False)
    for group in objective.step(ex.model):
        sum(w * v for w, v in group.values()).backward()
    return dict(enumerate(p.grad.float().clone() for p in ex.trainable_parameters())), rollouts


def _close(got: dict, want: dict, rtol: float) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        scale = tensor.abs().max().clamp(min=1e-12)
        assert ((got[name] - tensor).abs().max() / scale).item() < rtol, name


@pytest.mark.slow
@pytest.mark.parametrize("family,executor", [(f, "lora") for f in FAMILIES] + [("llama", "ft_m")])
def test_a_captured_edit_trains_the_eager_edits_tensors(backend, family, executor):
    """Three rounds x three inner steps of two requests, traced whole: the same rollouts and
    step-ins, the same losses and the trained tensors within float32 rounding of the eager edit's;
    every round reuses the one graph of both terms' pass (``CapturedJoint``)."""
    model, tok = make_tiny_model_and_tokenizer(family, init_std=0.2)
    eager, want = _edit(model, tok, executor=executor, rounds=3)
    assert backend.graphs == 0
    got_result, got = _edit(model, tok, executor=executor, rounds=3, compile_training=True)
    assert backend.graphs == 1
    _same_edit(got_result, got, eager, want)


def _same_edit(got_result, got: dict, eager, want: dict) -> None:
    """The same rollouts and step-ins as the eager edit, its losses, and its trained tensors within
    float32 rounding."""
    for a, b in zip(eager.rollouts, got_result.rollouts):
        for x, y in zip(a, b):
            assert torch.equal(x.tokens, y.tokens) and torch.equal(x.stepped_in, y.stepped_in)
    for a, b in zip(eager.rounds, got_result.rounds):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["loss_last"] == pytest.approx(b["loss_last"], rel=1e-4)
    _close(got, want, 1e-4)


def _cut(rollout, n):
    from hpse_easyedit.rollout import Rollout

    return Rollout(
        rollout.tokens[:n],
        rollout.stepped_in[:n],
        rollout.teacher_topk_ids[:n],
        rollout.teacher_topk_logprobs[:n],
    )


@pytest.mark.slow
def test_rollouts_of_other_lengths_reuse_the_graphs(backend):
    """Rounds whose rollouts end at different steps (here cut to 3, 5 and 8 tokens) train through
    the graph the first made: the padded batch has the same shape."""
    ex, objective = _objective("llama", "lora", compile_training=True)
    objective.start_round(ex.model)
    drawn = objective.rollouts[-1]
    for n in (8, 3, 5):
        objective.use_rollouts([_cut(ro, n) for ro in drawn])
        for group in objective.step(ex.model):
            sum(w * v for w, v in group.values()).backward()
    assert backend.graphs == 1


@pytest.mark.slow
def test_a_captured_edit_with_inductors_kernels_trains_the_eager_edits_tensors(monkeypatch):
    """The same with inductor's compiled kernels (CPU C++), LoRA on a tiny Llama: fused kernels
    round differently, so the tensors agree within float32 rounding, not bit for bit."""
    monkeypatch.setattr(captured, "_COMPILED", {})
    torch._dynamo.reset()
    model, tok = make_tiny_model_and_tokenizer("llama", init_std=0.2)
    eager, want = _edit(model, tok, executor="lora", rounds=2)
    compiled, got = _edit(model, tok, executor="lora", rounds=2, compile_training=True)
    for a, b in zip(eager.rollouts, compiled.rollouts):
        assert all(torch.equal(x.tokens, y.tokens) for x, y in zip(a, b))
    _close(got, want, 1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["lora", "ft_m"])
def test_the_captured_half_precision_step_gives_the_eager_gradients(backend, executor):
    """In bfloat16 one captured inner step's gradients (the LoRA adapters', FT-M's float32
    master's) equal the eager step's within bfloat16 rounding."""
    grads, first = {}, None
    for mode in (False, True):
        _, objective = _objective("qwen2", executor, torch.bfloat16, compile_training=mode)
        grads[mode], first = _step_gradients(objective, first)
    _close(grads[True], grads[False], 2e-2)


def test_auto_captures_on_cuda_with_a_compiler_only(monkeypatch):
    from hpse_easyedit import static_decode

    model, _ = make_tiny_model_and_tokenizer("llama")
    assert captured.training_mode("auto", model) is False
    assert captured.training_mode(True, model) is True
    assert captured.training_mode(False, model) is False
    monkeypatch.setattr(static_decode, "_model_device", lambda m: torch.device("cuda", 0))
    monkeypatch.setattr(static_decode, "compiler_problem", lambda device_type: None)
    assert captured.training_mode("auto", model) is True
    monkeypatch.setattr(static_decode, "compiler_problem", lambda device_type: "no Triton")
    assert captured.training_mode("auto", model) is False


def test_gradient_checkpointing_keeps_the_eager_step():
    """Gradient checkpointing's recomputation cannot run inside a captured graph: ``auto`` keeps the
    eager step under it, and true is refused in one line when the file is read."""
    from hpse_easyedit.hparams import HParamsError

    model, _ = make_tiny_model_and_tokenizer("llama")
    assert captured.training_mode(True, model, checkpointing=True) is True
    assert captured.training_mode("auto", model, checkpointing=True) is False
    with pytest.raises(
        HParamsError,
        match="key 'compile_training' is true but gradient_checkpointing is true.*set "
        "compile_training: auto",
    ) as err:
        tiny_hparams(compile_training=True, gradient_checkpointing=True)
    assert "\n" not in str(err.value)
    with pytest.raises(
        HParamsError, match="key 'compile_training' is 'graphs' but gradient_checkpointing is true"
    ):
        tiny_hparams(compile_training="graphs", gradient_checkpointing=True)
    tiny_hparams(compile_training="auto", gradient_checkpointing=True)


@pytest.mark.slow
def test_a_run_of_single_edits_compiles_a_few_graphs(backend):
    """Ten single LoRA edits of one model, each restored (a new adapter each time) with passages of
    growing length: dynamo compiles a few graphs (it makes the changing sizes symbolic), far from
    the recompile limit, past which a ``fullgraph`` compile would fail the run."""
    from hpse_easyedit import apply_hpse_to_model, restore_weights

    model, tok = make_tiny_model_and_tokenizer("llama", init_std=0.2)
    hp = tiny_hparams(rounds=1, inner_steps=1, max_new_tokens=6, compile_training=True)
    for i in range(10):
        passage = f"Person {i} lives in City {i} and likes tea" + " very" * i + "."
        edited, handle = apply_hpse_to_model(
            model, tok, [{"subject": f"Person {i}", "target_new": passage}], hp
        )
        model = restore_weights(edited, handle)
    assert 1 <= backend.graphs <= 6


HPSE_FILES = Path(__file__).resolve().parents[1] / "hparams" / "HPSE"
#: the shipped 7B-9B files and the tiny family whose tokenizer (and chat template) stands in
BACKBONES = {
    "qwen2.5-7b": "qwen2",
    "qwen3-8b": "qwen3",
    "llama3.1-8b": "llama",
    "gemma2-9b": "gemma2",
}


@pytest.mark.slow
@pytest.mark.parametrize("stem", sorted(BACKBONES))
def test_the_captured_step_at_7b_widths_gives_the_eager_gradients(backend, stem):
    """The published 7B-9B architectures (their configs: widths, heads, rope scaling, Gemma-2's
    soft-capping and sliding window) cut to one layer and a small vocabulary, the shipped file's
    LoRA: the one pass over both terms' rows traces as one graph (``fullgraph``) and one inner
    step's adapter gradients equal the eager step's within float32 rounding. Float32, so the check
    is the graph's and the padding's, not bfloat16's rounding (CPU bfloat16 products at these widths
    are slow)."""
    from transformers import AutoModelForCausalLM

    from hpse_easyedit import HPSEHyperParams
    from hpse_easyedit.planner import backbone_config
    from tiny_models import make_tokenizer

    shipped = HPSEHyperParams.from_hparams(HPSE_FILES / f"{stem}.yaml")
    tok = make_tokenizer(BACKBONES[stem])
    config = backbone_config(shipped.model_name, layers=1)
    config.vocab_size = len(tok)
    config.pad_token_id, config.bos_token_id, config.eos_token_id = (
        tok.pad_token_id,
        tok.bos_token_id,
        tok.eos_token_id,
    )
    # the model's own init draws every weight; torch's default init of each linear before it,
    # overwritten unread, is skipped
    with mock.patch.object(torch.nn.Linear, "reset_parameters", lambda self: None):
        torch.manual_seed(0)
        pristine = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    grads, first = {}, None
    for mode in (False, True):
        # the executor's adapter goes into the model it is given: the first step gets a copy, the
        # last the pristine model itself (one copy of the layer's ~1 GB, not two)
        model = copy.deepcopy(pristine) if not mode else pristine
        torch.manual_seed(0)  # the same adapter for both steps
        hp = shipped.with_overrides(
            {
                "model_name": stem,
                "device": "cpu",
                "dtype": "float32",
                "max_new_tokens": 6,
                # the passage alone as the teacher's system text: a short teacher prompt for the
                # in-test tokenizer (the KL pass trains on the student's rows either way)
                "teacher_prompt_style": "plain",
            }
        ).with_overrides({"compile_training": mode})
        prompts = edit_prompts(model, tok, REQUESTS[:1], hp)
        stops = stop_token_ids(model, tok)
        ex = make_executor(model, hp)
        objective = HPSEObjective(ex, prompts, hp, stop_ids=stops, pad_id=pad_token_id(tok, stops))
        grads[mode], first = _step_gradients(objective, first)
    assert backend.graphs == 1  # both terms' pass, whole
    assert len(grads[True]) > 0
    _close(grads[True], grads[False], 1e-4)


@pytest.fixture
def replays(monkeypatch):
    """The captured passes under ``Replays``: CUDA graphs' overwriting of outputs, on CPU."""
    replaying = Replays()
    monkeypatch.setattr(captured, "BACKEND", replaying)
    monkeypatch.setattr(captured, "_COMPILED", {})
    torch._dynamo.reset()
    return replaying


def test_replays_overwrite_a_graphs_earlier_outputs(replays):
    """What the check below relies on: under ``Replays`` a graph output kept past the next forward
    reads NaN, as it reads another replay's values under CUDA graphs, while what was computed from
    it outside the graph, and the parameters, keep theirs."""
    weight = torch.nn.Parameter(torch.ones(3))
    fn = torch.compile(lambda x: (x * weight).sum() * 2, fullgraph=True, backend=replays)
    first = fn(torch.ones(3))
    outside = first.detach() / 2
    first.backward()
    second = fn(torch.full((3,), 2.0))
    assert torch.isnan(first.detach()).all()
    assert outside.item() == 3.0 and second.item() == 12.0
    assert torch.equal(weight.detach(), torch.ones(3)) and replays.captures == 1


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["lora", "ft_m"])
def test_a_graphs_edit_under_replays_trains_the_eager_edits_tensors(replays, executor):
    """``compile_training: graphs`` under replays that overwrite earlier outputs: no step keeps a
    graph output past the next step's replay, so three rounds x three inner steps give the eager
    edit's rollouts, losses and trained tensors (within float32 rounding), with one graph compiled
    for all rounds."""
    model, tok = make_tiny_model_and_tokenizer("llama", init_std=0.2)
    eager, want = _edit(model, tok, executor=executor, rounds=3)
    got_result, got = _edit(model, tok, executor=executor, rounds=3, compile_training="graphs")
    assert replays.compiles == 1
    _same_edit(got_result, got, eager, want)


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["lora", "ft_m"])
@pytest.mark.parametrize("sequential", [False, True], ids=["single", "sequential"])
def test_graphs_are_recorded_once_over_rounds_and_edits(replays, monkeypatch, executor, sequential):
    """3 edits x 3 rounds with ``compile_training: graphs``: the pass is compiled once and a card
    would record its graphs once, in the first round of the first edit, and replay them in every
    other round and edit: single edits restored in between (each LoRA edit's new adapter is written
    into the last one's memory, so the parameters keep their addresses) and edits in sequence.
    Every inner step is marked as a new step for the graphs."""
    from hpse_easyedit.executors import EXECUTORS, copy_back

    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))

    model, tok = make_tiny_model_and_tokenizer("llama", init_std=0.2)
    hp = tiny_hparams(
        executor=executor, rounds=3, inner_steps=2, max_new_tokens=6, compile_training="graphs"
    )
    request = [{"subject": "AJ Lee", "target_new": "AJ Lee is a wrestler who speaks Russian."}]
    seen = []
    for _ in range(3):
        result = hpse_edit(model, tok, request, hp)
        seen.append((replays.compiles, replays.captures))
        if sequential:
            model = result.model
        else:
            copy_back(result.model, result.weights_copy)
            model = EXECUTORS[executor].release(result.model)
    assert seen == [(1, 1)] * 3
    assert len(marks) == 3 * 3 * 2  # edits x rounds x inner steps


def test_a_single_edits_new_adapter_reuses_the_last_ones_memory_and_trains_the_same(backend):
    """LoRA's kept memory under ``compile_training: graphs``: the adapter of a single edit after a
    restored one lies in the same memory as the first (where a copy of the model, without the kept
    memory, allocates anew), and the edit in it trains the same tensors bit for bit."""
    from hpse_easyedit import apply_hpse_to_model, restore_weights

    model, tok = make_tiny_model_and_tokenizer("llama", init_std=0.2)
    hp = tiny_hparams(rounds=1, inner_steps=2, max_new_tokens=4, compile_training="graphs")

    def adapter(model):
        return {n: p for n, p in model.named_parameters() if "lora_" in n}

    edited, handle = apply_hpse_to_model(model, tok, REQUESTS[:1], hp)
    first = {n: p.data_ptr() for n, p in adapter(edited).items()}
    model = restore_weights(edited, handle)
    twin = copy.deepcopy(model)
    ours, _ = apply_hpse_to_model(model, tok, REQUESTS[:1], hp)
    theirs, _ = apply_hpse_to_model(twin, tok, REQUESTS[:1], hp)
    assert {n: p.data_ptr() for n, p in adapter(ours).items()} == first
    assert not set(first.values()) & {p.data_ptr() for p in adapter(theirs).values()}
    assert adapter(ours).keys() == adapter(theirs).keys()
    for name, p in adapter(ours).items():
        assert torch.equal(p.detach(), adapter(theirs)[name].detach()), name
