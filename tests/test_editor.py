"""Full edits on tiny models: the loss falls, only the executor's parameters move, restore is
bit-exact."""

import pytest
import torch

from hpse_easyedit import RequestError, apply_hpse_to_model, hpse_edit, restore_weights
from tiny_models import make_tiny_model_and_tokenizer, tiny_hparams

REQUESTS = [
    {
        "subject": "AJ Lee",
        "target_new": "AJ Lee is a wrestler who speaks Russian fluently and lives in Moscow.",
    },
    {
        "prompt": "Introduce Ellie Kemper.",
        "subject": "Ellie Kemper",
        "target_new": "Ellie Kemper is a citizen of Croatia.",
    },
]


def _snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _probe_logits(model, tok):
    ids = torch.tensor([tok("Who is AJ Lee? Ellie Kemper lives in Croatia.")["input_ids"]])
    with torch.no_grad():
        return model(input_ids=ids).logits.clone()


@pytest.mark.parametrize("executor", ["lora", "ft_m"])
@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_full_edit_trains_only_the_executor_and_restores_bit_exact(family, executor):
    model, tok = make_tiny_model_and_tokenizer(family)
    before_params, before_logits = _snapshot(model), _probe_logits(model, tok)
    hp = tiny_hparams(executor=executor, rounds=3, inner_steps=4, lr=5e-2)
    res = hpse_edit(model, tok, REQUESTS, hp)

    assert len(res.rounds) == 3
    assert res.rounds[-1]["loss_last"] < res.rounds[0]["loss"]
    assert all(r["stepin_rate"] is not None and 0.0 <= r["stepin_rate"] <= 1.0 for r in res.rounds)
    assert res.teacher_forward_tokens > 0 and res.inner_step_teacher_passes == 0
    assert not torch.equal(_probe_logits(res.model, tok), before_logits)

    base = res.model.get_base_model() if executor == "lora" else res.model
    changed = {
        n
        for n, p in base.named_parameters()
        if n in before_params and not torch.equal(p, before_params[n])
    }
    if executor == "lora":
        assert changed == set()  # base weights never move
        assert all("lora_" in k for k in res.weights_copy)
    else:
        assert changed == {"model.layers.1.mlp.down_proj.weight"}
        assert list(res.weights_copy) == ["model.layers.1.mlp.down_proj.weight"]
    n_copied = sum(v.numel() for v in res.weights_copy.values())
    assert n_copied < sum(p.numel() for p in before_params.values()) / 2  # no whole-model copy

    restored = restore_weights(res.model, res.weights_copy)
    assert type(restored) is type(model)
    assert torch.equal(_probe_logits(restored, tok), before_logits)
    after = _snapshot(restored)
    assert after.keys() == before_params.keys()
    assert all(torch.equal(after[n], before_params[n]) for n in after)
    assert all(p.requires_grad for p in restored.parameters())  # flags given back


def test_ablation_switches_change_what_they_should(gate_always_open):
    model, tok = make_tiny_model_and_tokenizer("qwen2")
    nll_only = hpse_edit(model, tok, REQUESTS[:1], tiny_hparams(kl_weight=0.0))
    assert nll_only.teacher_forward_tokens == 0
    assert all(
        r["stepin_rate"] is None and r["kl"] is None and r["nll"] is not None
        for r in nll_only.rounds
    )
    model = restore_weights(nll_only.model, nll_only.weights_copy)

    opsd = hpse_edit(
        model,
        tok,
        REQUESTS[:1],
        tiny_hparams(rollout="on_policy", nll_weight=0.0, tau=-1e9, kappa=0.0),
    )
    assert all(
        r["stepin_rate"] == 0.0 and r["nll"] is None and r["kl"] is not None for r in opsd.rounds
    )
    model = restore_weights(opsd.model, opsd.weights_copy)

    # with a gate that always passes, the hybrid rollout is the teacher's own greedy decoding
    hybrid = hpse_edit(model, tok, REQUESTS[:1], tiny_hparams(tau=-1e9, kappa=0.0, rounds=1))
    assert hybrid.rounds[0]["stepin_rate"] == 1.0
    restore_weights(hybrid.model, hybrid.weights_copy)

    with pytest.raises(ValueError, match="kl_weight and nll_weight are both 0"):
        hpse_edit(model, tok, REQUESTS[:1], tiny_hparams(kl_weight=0.0, nll_weight=0.0))


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["lora", "ft_m"])
def test_the_order_of_the_kl_and_nll_passes_leaves_the_trained_bits_unchanged(
    executor, monkeypatch
):
    """The KL pass runs first (the larger one: the NLL pass then fits into the memory it freed);
    each gradient entry is one sum of the two passes' contributions, so the edit is bit for bit the
    NLL-first edit."""
    from hpse_easyedit import editor

    def edit(model, tok):
        res = hpse_edit(
            model, tok, REQUESTS, tiny_hparams(executor=executor, rounds=2, inner_steps=3, lr=5e-2)
        )
        trained = {
            n: p.detach().clone() for n, p in res.model.named_parameters() if p.requires_grad
        }
        return trained, [(r["kl"], r["nll"], r["kl_last"], r["nll_last"]) for r in res.rounds]

    model, tok = make_tiny_model_and_tokenizer("qwen2")
    order = []
    editor_step = editor.HPSEObjective.step
    monkeypatch.setattr(
        editor.HPSEObjective,
        "step",
        lambda self, student: _record(order, editor_step(self, student)),
    )
    kl_first, kl_first_losses = edit(model, tok)
    assert order[:2] == ["kl", "nll"]

    model, tok = make_tiny_model_and_tokenizer("qwen2")  # the same weights: built from a fixed seed
    order.clear()
    monkeypatch.setattr(
        editor.HPSEObjective,
        "step",
        lambda self, student: _record(order, _reversed(editor_step(self, student))),
    )
    nll_first, nll_first_losses = edit(model, tok)
    assert order[:2] == ["nll", "kl"]
    assert kl_first_losses == nll_first_losses and kl_first.keys() == nll_first.keys()
    assert all(torch.equal(kl_first[n], nll_first[n]) for n in kl_first)


def _record(order, groups):
    for group in groups:
        order.extend(group)
        yield group


def _reversed(groups):
    """The passes in the other order: each forward is run when its group is asked for, as the editor
    runs them."""
    groups = iter(groups)
    first = next(groups)  # the KL pass's forward (its graph is kept until the caller's backward)
    yield from groups
    yield first


@pytest.mark.parametrize("executor", ["lora", "ft_m"])
def test_sequential_edits_accumulate_and_first_copy_restores(executor):
    model, tok = make_tiny_model_and_tokenizer("llama")
    before = _probe_logits(model, tok)
    hp = tiny_hparams(executor=executor, rounds=1, inner_steps=2, lr=5e-2)
    first = hpse_edit(model, tok, REQUESTS[:1], hp)
    after_first = _probe_logits(first.model, tok)
    second = hpse_edit(first.model, tok, REQUESTS[1:], hp)
    assert second.model is first.model  # same adapter / matrix keeps training
    assert not torch.equal(_probe_logits(second.model, tok), after_first)
    # undo the second edit only, then the first
    back = restore_weights(second.model, second.weights_copy)
    assert torch.equal(_probe_logits(back, tok), after_first)
    base = restore_weights(back, first.weights_copy)
    assert torch.equal(_probe_logits(base, tok), before)


def test_apply_hpse_to_model_contract():
    model, tok = make_tiny_model_and_tokenizer("qwen3")
    before = _probe_logits(model, tok)
    edited, weights_copy = apply_hpse_to_model(
        model, tok, REQUESTS, tiny_hparams(), copy=True, return_orig_weights=True
    )
    assert torch.equal(
        _probe_logits(model, tok), before
    )  # copy=True leaves the caller's model alone
    assert weights_copy.result.rounds and weights_copy
    assert torch.equal(_probe_logits(restore_weights(edited, weights_copy), tok), before)


@pytest.mark.parametrize("executor", ["lora", "ft_m"])
def test_what_edits_leave_behind_is_one_state_object_the_restore_empties(executor):
    from hpse_easyedit.executors import EditState, edit_state

    model, tok = make_tiny_model_and_tokenizer("llama")
    edited, handle = apply_hpse_to_model(
        model, tok, REQUESTS, tiny_hparams(executor=executor, rounds=1, inner_steps=1)
    )
    ours = {name for m in (model, edited) for name in vars(m) if "hpse" in name}
    assert ours == {"_hpse_edit_state"}  # one object on the model, no attribute per concern
    state = edit_state(edited)
    assert (
        isinstance(state, EditState)
        and state is edit_state(model)
        and state.pending_restores == [handle]
    )
    assert (
        (state.adapter_model is edited) if executor == "lora" else (state.ftm_original is not None)
    )
    assert handle() is model
    assert state == EditState()  # restored: nothing of the edit is kept


def test_ftm_reuses_its_kept_original_only_while_the_values_are_the_same():
    """Single FT-M edits restored in between share one copy of the original matrix (the compiled
    decode then reads it at one address); once the matrix changes by other means, the next edit
    copies it anew, and the earlier edit's restore handle keeps the values it had."""
    model, tok = make_tiny_model_and_tokenizer("llama")
    hp = tiny_hparams(executor="ft_m", rounds=1, inner_steps=1)
    name = hp.ftm_module_template.format(hp.ftm_layer) + ".weight"
    edited, first = apply_hpse_to_model(model, tok, REQUESTS[:1], hp)
    kept, values = first[name], first[name].clone()
    model = first()
    edited, second = apply_hpse_to_model(model, tok, REQUESTS[:1], hp)
    assert second[name] is kept  # the same values: the same tensor
    model = second()
    with torch.no_grad():
        model.get_parameter(name).add_(1.0)  # changed outside an edit
    changed = model.get_parameter(name).detach().clone()
    edited, third = apply_hpse_to_model(model, tok, REQUESTS[:1], hp)
    assert third[name] is not kept and torch.equal(third[name], changed)
    assert torch.equal(kept, values)  # the earlier handles' tensor was not written
    assert torch.equal(third().get_parameter(name), changed)


def test_the_pad_id_is_the_tokenizers_else_the_smallest_stop_id_else_0():
    from types import SimpleNamespace

    from hpse_easyedit.padding import pad_token_id

    assert pad_token_id(SimpleNamespace(pad_token_id=7), {3, 1}) == 7
    assert pad_token_id(SimpleNamespace(pad_token_id=None), {151645, 151643}) == 151643
    assert pad_token_id(SimpleNamespace(pad_token_id=None)) == 0


@pytest.mark.parametrize(
    "requests, message",
    [
        ([{"subject": "AJ Lee", "target_new": "  "}], "'target_new' must be the non-empty passage"),
        ([{"target_new": "AJ Lee speaks Russian."}], "needs 'subject'"),
        (
            [{"prompt": "Tell me things.", "target_new": "AJ Lee speaks Russian."}],
            "cannot be read from prompt",
        ),
        (
            [{"subject": "AJ Lee", "target_new": "AJ Lee speaks Russian. " * 200}],
            "raise max_length",
        ),
        ([], "non-empty list"),
        (["AJ Lee"], "expected a dict"),
    ],
)
def test_bad_requests_raise_clear_errors(requests, message):
    model, tok = make_tiny_model_and_tokenizer("llama")
    with pytest.raises(RequestError, match=message):
        hpse_edit(model, tok, requests, tiny_hparams(max_length=256))


def test_subject_read_back_from_prompt():
    model, tok = make_tiny_model_and_tokenizer("llama")
    res = hpse_edit(
        model,
        tok,
        [{"prompt": "Introduce AJ Lee.", "target_new": "AJ Lee speaks Russian."}],
        tiny_hparams(rounds=1, inner_steps=1),
    )
    restore_weights(res.model, res.weights_copy)
