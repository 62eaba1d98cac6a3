"""The graph-capturable decode (``static_decode``): one graph per step, no host sync in the token
loop, and the dynamic path's greedy tokens on the four tiny families and the embedded SmolLM2."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from graph_backends import Captures
from hpse_easyedit.executors import make_executor
from hpse_easyedit.padding import pad_rows
from hpse_easyedit.rollout import batched_hybrid_rollout, batched_hybrid_rollouts, draw_rollouts
from hpse_easyedit.static_decode import StaticDecoder, compile_step, static_generate
from tiny_models import FAMILIES, make_tiny_model_and_tokenizer, tiny_hparams

STUDENT = "Introduce AJ Lee."
TEACHER = "AJ Lee is a wrestler who speaks Russian. What is established here about AJ Lee?"


class HostSyncs(TorchDispatchMode):
    """Counts aten ops and the ones that read a device value on the host (``.item()``, ``bool()``,
    ``nonzero``)."""

    SYNCS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default)

    def __init__(self) -> None:
        super().__init__()
        self.ops = self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        self.syncs += func in self.SYNCS
        return func(*args, **(kwargs or {}))


def _edited_executor(family: str, executor: str = "lora"):
    """A tiny model with a non-zero edit, so student and teacher rows differ and the gate fires."""
    model, tok = make_tiny_model_and_tokenizer(family, init_std=0.2)
    ex = make_executor(model, tiny_hparams(executor=executor))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in ex.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    return ex, tok


def _rollouts(ex, tok, stop_every: int, stop_ids):
    s, t = tok(STUDENT)["input_ids"], tok(TEACHER)["input_ids"]
    kw = dict(
        tau=0.5, kappa=0.05, top_k=4, max_new_tokens=20, stop_ids=stop_ids, pad_id=tok.pad_token_id
    )
    return (
        batched_hybrid_rollout(ex.model, ex.row_switch, s, t, **kw),
        batched_hybrid_rollout(
            ex.model, ex.row_switch, s, t, static_decode=True, stop_every=stop_every, **kw
        ),
    )


def _same(a, b) -> None:
    assert a.tokens.tolist() == b.tokens.tolist()
    assert a.stepped_in.tolist() == b.stepped_in.tolist()
    assert torch.equal(a.teacher_topk_ids, b.teacher_topk_ids)
    torch.testing.assert_close(a.teacher_topk_logprobs, b.teacher_topk_logprobs, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_static_rollout_gives_the_dynamic_tokens(family):
    ex, tok = _edited_executor(family)
    full, static = _rollouts(ex, tok, 3, [tok.eos_token_id])
    _same(full, static)
    assert full.stepin_count > 0  # the gate fired, so both rows' logits mattered
    # a stop token in the middle of a stop_every block: the steps past it are discarded
    stop = int(full.tokens[6])
    cut, cut_static = _rollouts(ex, tok, 4, [stop])
    assert len(cut) == full.tokens.tolist().index(stop) + 1
    _same(cut, cut_static)


def test_static_rollout_ftm():
    ex, tok = _edited_executor("qwen2", "ft_m")
    _same(*_rollouts(ex, tok, 5, [tok.eos_token_id]))


@pytest.mark.slow
@pytest.mark.parametrize("family,executor", [(f, "lora") for f in FAMILIES] + [("gemma2", "ft_m")])
def test_decode_step_is_one_graph_without_host_syncs(family, executor):
    ex, tok = _edited_executor(family, executor)
    decoder = StaticDecoder(ex.model, [[5, 6, 7], [8, 9, 10, 11, 12]], tok.pad_token_id, 8)
    with torch.no_grad(), ex.row_switch(torch.tensor([False, True])):
        tokens = decoder.prefill().argmax(-1).view(2, 1)
        with HostSyncs() as count:
            decoder.step(tokens)
        assert count.ops > 100 and count.syncs == 0
        torch._dynamo.reset()
        explained = torch._dynamo.explain(decoder.step)(tokens)
        assert explained.graph_break_count == 0 and explained.graph_count == 1, (
            explained.break_reasons
        )
        compiled = compile_step(decoder, backend="eager")  # fullgraph=True: a break would raise
        assert compiled(tokens).shape == (2, len(tok))


def test_a_process_compiles_more_decode_graphs_than_dynamos_limit():
    """Every decoder's ``step`` is one code object to dynamo, which keeps ``recompile_limit``
    graphs of it (8 by default) and, under ``fullgraph``, fails past them: a process that decodes
    several models (the CUDA smoke tests: four families, plain and under LoRA) needs more. Here the
    limit is 1 and three families' decoders compile."""
    # dynamo's own patch, not pytest's monkeypatch: undoing a config field with the latter deletes
    # it (pytest 9.2), and dynamo then refuses the field
    torch._dynamo.reset()
    with torch.no_grad(), torch._dynamo.config.patch(recompile_limit=1):
        for family in FAMILIES[:3]:
            model, tok = make_tiny_model_and_tokenizer(family)
            decoder = StaticDecoder(model, [[5, 6, 7], [8, 9]], tok.pad_token_id, 4)
            tokens = decoder.prefill().argmax(-1).view(2, 1)
            assert compile_step(decoder, backend="eager")(tokens).shape == (2, len(tok))
    torch._dynamo.reset()


@pytest.mark.parametrize("family", FAMILIES)
def test_the_model_decodes_on_the_decoders_static_cache(family):
    """The forward gets the decoder's ``StaticCache`` under the keyword it takes (``cache`` from
    transformers 5.24, ``past_key_values`` before): a keyword it does not take would land in its
    ``**kwargs`` unread, and the model would decode on a cache of its own."""
    model, tok = make_tiny_model_and_tokenizer(family)
    decoder = StaticDecoder(model, [[5, 6, 7], [8, 9, 10, 11, 12]], tok.pad_token_id, 4)
    with torch.no_grad():
        tokens = decoder.prefill().argmax(-1).view(2, 1)
        assert decoder.cache.get_seq_length() == decoder.width == 5
        decoder.step(tokens)
    assert decoder.cache.get_seq_length() == 6


def test_rollout_loop_syncs_only_at_the_stop_tests():
    ex, tok = _edited_executor("llama")
    s, t = tok(STUDENT)["input_ids"], tok(TEACHER)["input_ids"]
    with HostSyncs() as count:
        ro = batched_hybrid_rollout(
            ex.model,
            ex.row_switch,
            s,
            t,
            tau=0.5,
            kappa=0.05,
            top_k=4,
            max_new_tokens=20,
            stop_ids=[-5],
            pad_id=tok.pad_token_id,
            static_decode=True,
            stop_every=8,
        )
    assert len(ro) == 20
    assert (
        count.syncs == 3
    )  # the stop tests after tokens 8, 16 and 20 (no hit: no int() of it); none per token


@pytest.mark.parametrize("family", FAMILIES)
def test_static_generate_gives_generate_tokens(family):
    model, tok = make_tiny_model_and_tokenizer(family, init_std=0.2)
    rows = [
        tok(q)["input_ids"]
        for q in ("Who is AJ Lee?", "The Firm is a legal thriller novel. Who wrote it?")
    ]
    ids, mask = pad_rows(rows, tok.pad_token_id, left=True)

    def generate(stop: int) -> torch.Tensor:
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=16,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            eos_token_id=[stop],
        )
        return out[:, ids.shape[1] :]

    # stop on a token row 0 emits early, so rows finish at different steps
    stop = int(generate(tok.eos_token_id)[0, 3])
    want = generate(stop)
    got = static_generate(
        model, rows, max_new_tokens=16, stop_ids=[stop], pad_id=tok.pad_token_id, stop_every=5
    )
    assert got.tolist() == want.tolist()


def test_hpse_edit_with_static_decode_draws_the_same_rollouts():
    from hpse_easyedit import hpse_edit

    requests = [{"subject": "AJ Lee", "target_new": "AJ Lee speaks Russian and lives in Moscow."}]
    runs = {}
    for static in (False, True):
        model, tok = make_tiny_model_and_tokenizer("qwen2", init_std=0.2)
        hp = tiny_hparams(static_decode=static, decode_stop_every=4, tau=0.5, kappa=0.05)
        runs[static] = hpse_edit(model, tok, requests, hp)
    for a, b in zip(runs[False].rollouts, runs[True].rollouts):
        for ra, rb in zip(a, b):
            assert (
                ra.tokens.tolist() == rb.tokens.tolist()
                and ra.stepped_in.tolist() == rb.stepped_in.tolist()
            )


@pytest.mark.slow
def test_an_edits_requests_decode_as_one_batch_in_each_round(monkeypatch):
    """With static_decode an HPSE round draws all requests' rollouts in one batched decode, and they
    are the rollouts the per-request dynamic path draws."""
    from hpse_easyedit import hpse_edit
    from hpse_easyedit import rollout as rollout_module

    requests = [
        {"subject": "AJ Lee", "target_new": "AJ Lee speaks Russian and lives in Moscow."},
        {
            "subject": "The Firm",
            "target_new": "The Firm is a legal thriller novel by John Grisham.",
        },
    ]
    batched, real = [], rollout_module.batched_hybrid_rollouts
    monkeypatch.setattr(
        rollout_module,
        "batched_hybrid_rollouts",
        lambda model, switch, reqs, **kw: (
            batched.append(len(reqs)) or real(model, switch, reqs, **kw)
        ),
    )
    runs = {}
    for static in (False, True):
        model, tok = make_tiny_model_and_tokenizer("qwen2", init_std=0.2)
        hp = tiny_hparams(static_decode=static, decode_stop_every=4, tau=0.5, kappa=0.05)
        runs[static] = hpse_edit(model, tok, requests, hp)
    assert batched == [2] * hp.rounds
    for a, b in zip(runs[False].rollouts, runs[True].rollouts):
        assert len(a) == len(b) == 2
        for ra, rb in zip(a, b):
            assert (
                ra.tokens.tolist() == rb.tokens.tolist()
                and ra.stepped_in.tolist() == rb.stepped_in.tolist()
            )


TEACHERS = (
    TEACHER,
    "The Firm is a legal thriller novel by John Grisham. Who wrote The Firm?",
    "Kolinda Grabar-Kitarovic was the head of state of Croatia. Who was it?",
)


@pytest.mark.parametrize("family,executor", [(f, "lora") for f in FAMILIES] + [("llama", "ft_m")])
def test_the_requests_of_an_edit_decode_as_one_batch(family, executor):
    """Three requests in one static decode give each request's own rollout: its tokens, step-ins and
    teacher top-K, its own length when one request stops before the others, and its teacher's
    forward tokens."""
    ex, tok = _edited_executor(family, executor)
    s = tok(STUDENT)["input_ids"]
    requests = [(s, tok(t)["input_ids"]) for t in TEACHERS]
    kw = dict(
        tau=0.5, kappa=0.05, top_k=4, max_new_tokens=12, pad_id=tok.pad_token_id, stop_every=3
    )
    alone = None  # each request decoded alone; the second pass stops at a token of the first's
    for stop in (-5, None):  # no stop token, then one that request 1 meets after a few tokens
        if stop is None:
            stop = int(alone[1].tokens[4])
        alone = [
            batched_hybrid_rollout(
                ex.model, ex.row_switch, st, te, static_decode=True, stop_ids=[stop], **kw
            )
            for st, te in requests
        ]
        together = batched_hybrid_rollouts(ex.model, ex.row_switch, requests, stop_ids=[stop], **kw)
        for a, b in zip(alone, together):
            _same(a, b)
        assert sum(ro.stepin_count for ro in together) > 0 or stop != -5
    assert len(together[1]) == alone[1].tokens.tolist().index(stop) + 1 < kw["max_new_tokens"]
    # the batch runs until its last request stops: the teacher forwards counted are at least each
    # one's own
    assert all(
        b.teacher_forward_tokens >= a.teacher_forward_tokens for a, b in zip(alone, together)
    )


def test_draw_rollouts_batches_only_with_static_decode(monkeypatch):
    from hpse_easyedit import rollout as rollout_module
    from hpse_easyedit.prompts import EditPrompts

    ex, tok = _edited_executor("qwen2")
    prompts = [
        EditPrompts(
            subject="s",
            student_ids=tok(STUDENT)["input_ids"],
            teacher_ids=tok(t)["input_ids"],
            passage_ids=[5],
        )
        for t in TEACHERS[:2]
    ]
    batches = []
    monkeypatch.setattr(
        rollout_module,
        "_static_rollouts",
        lambda *a, **k: batches.append(len(a[2])) or [None] * len(a[2]),
    )
    for static, want in ((False, []), (True, [2])):
        batches.clear()
        hp = tiny_hparams(static_decode=static, max_new_tokens=4, batched_rollout=True)
        assert len(draw_rollouts(ex, prompts, hp, stop_ids=[], pad_id=tok.pad_token_id)) == 2
        assert batches == want


def test_auto_compiles_on_cuda_and_stays_dynamic_elsewhere(monkeypatch):
    """``static_decode: auto`` (the shipped 7B-9B files): the compiled step on a CUDA model, the
    dynamic path on a CPU one, for the rollout and the answers alike."""
    from hpse_easyedit import generation, static_decode
    from hpse_easyedit import rollout as rollout_module
    from hpse_easyedit.generation import generate_answers
    from hpse_easyedit.prompts import EditPrompts

    model, tok = make_tiny_model_and_tokenizer("qwen2")
    assert static_decode.decode_mode("auto", model) is False
    for setting in (False, True, "compile"):
        assert static_decode.decode_mode(setting, model) == setting
    monkeypatch.setattr(static_decode, "_model_device", lambda m: torch.device("cuda", 0))
    monkeypatch.setattr(static_decode, "compiler_problem", lambda device_type: None)  # Triton
    assert static_decode.decode_mode("auto", model) == "compile"

    # a CUDA model (the device stood in for): the round's rollouts and the answers go through the
    # compiled static path
    seen = []
    monkeypatch.setattr(
        rollout_module,
        "_static_rollouts",
        lambda *a, **k: seen.append(("rollout", k["compiled"])) or [None] * len(a[2]),
    )
    monkeypatch.setattr(
        generation,
        "static_generate",
        lambda *a, **k: seen.append(("answers", k["compiled"])) or torch.zeros(1, 0, dtype=int),
    )
    ex, tok = _edited_executor("qwen2")
    prompts = [
        EditPrompts(
            subject="s", student_ids=tok(STUDENT)["input_ids"], teacher_ids=[5], passage_ids=[5]
        )
    ] * 2
    hp = tiny_hparams(static_decode="auto", max_new_tokens=4)
    draw_rollouts(ex, prompts, hp, stop_ids=[], pad_id=tok.pad_token_id)
    generate_answers(ex.model, tok, ["Who?"], static_decode="auto")
    assert seen == [("rollout", True), ("answers", True)]


def test_half_precision_lora_decode_costs_two_kernels_per_projection():
    """In a bfloat16 model the decode adds each adapter to the student rows in the model's dtype
    (one cast of the adapters per decode): two kernels per adapted projection, against seven on the
    float32 adapters' path, and the student rows still get their adapter's output, the teacher rows
    none."""
    from hpse_easyedit.executors.lora import LoRAExecutor

    model, tok = make_tiny_model_and_tokenizer("qwen2", init_std=0.2)
    model = model.to(torch.bfloat16)
    ex = make_executor(model, tiny_hparams(executor="lora"))
    assert isinstance(ex, LoRAExecutor)
    with torch.no_grad():
        for p in ex.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.3)
    ids = torch.tensor([[5, 6, 7], [5, 6, 7]])

    def step_ops(adapters: bool) -> tuple[int, torch.Tensor]:
        from benchmarks.perf.gpu_path import OpCounter

        with torch.no_grad(), ex.row_switch(torch.tensor([False, True])):
            if not adapters:
                for layer in ex._lora_layers:
                    layer.forward = layer.base_layer.forward
            with OpCounter() as count:
                logits = ex.model(input_ids=ids).logits
        return count.ops, logits

    with_adapters, logits = step_ops(True)
    projections = len(ex._lora_layers)
    base, base_logits = step_ops(False)
    assert with_adapters - base == 2 * projections
    assert torch.equal(logits[1:], base_logits[1:])  # the teacher row: the base model, bit for bit
    with torch.no_grad():
        student = ex.model(input_ids=ids[:1]).logits.float()  # peft's float32 adapters
    moved = (student - base_logits[:1].float()).abs().max()
    assert moved > 0 and (logits[:1].float() - student).abs().max() < 0.05 * moved


def test_auto_falls_back_to_what_works_on_cuda(monkeypatch):
    """``static_decode: auto`` on a CUDA model never fails where the static decode cannot run: under
    flash attention it decodes on the dynamic path, without a compiler on the static path
    uncompiled; explicit settings stay as they are (the refusals come before loading)."""
    from hpse_easyedit import static_decode

    model, _ = make_tiny_model_and_tokenizer("llama")
    monkeypatch.setattr(static_decode, "_model_device", lambda m: torch.device("cuda", 0))
    monkeypatch.setattr(static_decode, "compiler_problem", lambda device_type: "no Triton")
    assert static_decode.decode_mode("auto", model) is True
    assert static_decode.decode_mode("compile", model) == "compile"
    model.config._attn_implementation = "flash_attention_2"
    assert static_decode.decode_mode("auto", model) is False
    monkeypatch.setattr(static_decode, "compiler_problem", lambda device_type: None)
    assert static_decode.decode_mode("auto", model) is False
    model.config._attn_implementation = "sdpa"
    assert static_decode.decode_mode("auto", model) == "compile"


@pytest.mark.slow
@pytest.mark.parametrize(
    "executor,dtype,sequential",
    [
        ("lora", "bfloat16", False),
        ("lora", "bfloat16", True),
        ("ft_m", "bfloat16", False),
        ("ft_m", "bfloat16", True),
    ],
)
def test_one_capture_over_rounds_and_edits(monkeypatch, executor, dtype, sequential):
    """3 edits x 3 rounds on the compiled static decode: the decoder (KV cache, masks, positions),
    the row switch's masks, LoRA's half-precision adapter copies and FT-M's original matrix are
    kept with the model and refreshed in place, so the step is compiled and captured once, in the
    first round of the first edit, and replayed in every other round and edit of the same shape:
    single edits restored in between and continual edits."""
    from hpse_easyedit import rollout
    from hpse_easyedit.editor import hpse_edit
    from hpse_easyedit.executors import EXECUTORS, copy_back
    from hpse_easyedit.static_decode import release_decoders

    backend = Captures()
    real = compile_step
    monkeypatch.setattr(rollout, "compile_step", lambda d: real(d, backend=backend))
    model, tok = make_tiny_model_and_tokenizer("llama", init_std=0.2)
    model.to(getattr(torch, dtype))
    release_decoders(model)
    request = [{"subject": "AJ Lee", "target_new": "AJ Lee is a wrestler who speaks Russian."}]
    hp = tiny_hparams(
        executor=executor,
        dtype=dtype,
        rounds=3,
        inner_steps=1,
        static_decode="compile",
        max_new_tokens=6,
        lr=0.05,
    )
    seen = []
    for _ in range(3):
        result = hpse_edit(model, tok, request, hp)
        assert all(len(ro) for ros in result.rollouts for ro in ros)
        seen.append((backend.compiles, backend.captures))
        if not sequential:
            copy_back(result.model, result.weights_copy)
            model = EXECUTORS[executor].release(result.model)
        else:
            model = result.model
    assert seen == [(1, 1)] * 3


@pytest.mark.slow
@pytest.mark.parametrize("executor,want", [("lora", [(1, 1)] * 2), ("ft_m", [(1, 1), (1, 2)])])
def test_the_batched_engine_captures_once_per_shape(monkeypatch, executor, want):
    """Two calls of the batched engine (2 cases x 3 rounds each) on the compiled static decode:
    the cases' stacked LoRA adapters are written into the model's decode workspace, so one capture
    serves every round and both calls; FT-M's per-case matrices are new tensors per call, so it is
    captured once per call (and not per round)."""
    from hpse_easyedit import rollout
    from hpse_easyedit.batched import hpse_edit_cases
    from hpse_easyedit.static_decode import release_decoders

    backend = Captures()
    real = compile_step
    monkeypatch.setattr(rollout, "compile_step", lambda d: real(d, backend=backend))
    model, tok = make_tiny_model_and_tokenizer("llama", init_std=0.2)
    model.to(torch.bfloat16)
    release_decoders(model)
    cases = [
        [{"subject": "AJ Lee", "target_new": "AJ Lee is a wrestler who speaks Russian."}],
        [{"subject": "Bob", "target_new": "Bob is a cat from Paris who likes fish."}],
    ]
    hp = tiny_hparams(
        executor=executor,
        dtype="bfloat16",
        rounds=3,
        inner_steps=1,
        static_decode="compile",
        max_new_tokens=6,
    )
    seen = []
    for _ in range(2):
        assert all(e.ok for e in hpse_edit_cases(model, tok, cases, hp))
        seen.append((backend.compiles, backend.captures))
    assert seen == want


@pytest.mark.slow  # three compiled decoders (dynamo, eager backend): about 6 s
def test_a_kept_decoder_refilled_decodes_as_a_new_one():
    """``static_generate`` compiled keeps one decoder per shape: a second batch of rows in the same
    width step decodes on the same decoder, refilled in place, and gives the tokens a new decoder
    gives; a batch of another shape gets its own; the uncompiled decode keeps none."""
    from hpse_easyedit import static_decode

    model, tok = make_tiny_model_and_tokenizer("qwen2", init_std=0.2)
    static_decode.release_decoders(model)
    first = [tok(STUDENT)["input_ids"], tok(TEACHER)["input_ids"]]
    second = [tok("Who is AJ Lee?")["input_ids"], tok(TEACHER + " Again.")["input_ids"]]
    assert static_decode.kept_width(first) == static_decode.kept_width(second)
    args = dict(max_new_tokens=10, stop_ids=[], pad_id=tok.pad_token_id, compile_backend="eager")
    static_generate(model, first, **args)
    (decoder,) = static_decode._KEPT[model].values()
    kept = static_generate(model, second, **args)
    assert list(static_decode._KEPT[model].values()) == [decoder] and decoder.model is None
    static_decode.release_decoders(model)
    assert static_decode._KEPT.get(model) is None
    fresh = static_generate(model, second, **args)
    assert torch.equal(kept, fresh)
    static_generate(model, second[:1], **args)
    assert len(static_decode._KEPT[model]) == 2
    static_decode.release_decoders(model)
    uncompiled = static_generate(model, second, **{**args, "compile_backend": None})
    assert static_decode._KEPT.get(model) is None and torch.equal(uncompiled, fresh)


def test_static_decode_refuses_flash_attention_in_one_line():
    model, tok = make_tiny_model_and_tokenizer("llama")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(
        ValueError, match="static_decode needs attention that takes a 4D mask.*sdpa or eager"
    ):
        StaticDecoder(model, [[5, 6]], tok.pad_token_id, 4)


@pytest.mark.slow
def test_smollm2_static_decode_gives_the_dynamic_tokens(smollm2):
    from hpse_easyedit.generation import generate_answers
    from hpse_easyedit.prompts import chat_prompt_ids, stop_token_ids

    _, model, tok = smollm2
    ex = make_executor(model, tiny_hparams(model_name="smol", ftm_layer=8))
    try:
        s, t = chat_prompt_ids(tok, STUDENT), chat_prompt_ids(tok, "Who is AJ Lee?", TEACHER)
        kw = dict(
            tau=2.0,
            kappa=0.3,
            top_k=16,
            max_new_tokens=24,
            stop_ids=stop_token_ids(model, tok),
            pad_id=tok.pad_token_id,
        )
        _same(
            batched_hybrid_rollout(ex.model, ex.row_switch, s, t, **kw),
            batched_hybrid_rollout(
                ex.model, ex.row_switch, s, t, static_decode=True, stop_every=8, **kw
            ),
        )
    finally:
        from hpse_easyedit import restore_weights

        restore_weights(ex.model, ex.weights_copy())
    questions = ["Who is AJ Lee?", "What is the capital of France?"]
    assert generate_answers(model, tok, questions, max_new_tokens=24) == generate_answers(
        model, tok, questions, max_new_tokens=24, static_decode=True
    )
