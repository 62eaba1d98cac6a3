"""``fast_decode``: the rollout's few-row matmuls as ``W @ x^T``, the same tokens as ``F.linear`` on
every family."""

import pytest
import torch
import torch.nn.functional as F

from hpse_easyedit.fast_decode import MAX_ROWS, few_row_linears
from hpse_easyedit.prompts import build_edit_prompts
from hpse_easyedit.rollout import batched_hybrid_rollout, draw_rollout
from tiny_models import FAMILIES, make_tiny_model_and_tokenizer, tiny_hparams

REQUEST = [
    {
        "prompt": "Introduce AJ Lee.",
        "subject": "AJ Lee",
        "target_new": "AJ Lee speaks Russian fluently.",
    }
]


def test_few_row_calls_switch_and_everything_else_stays_f_linear():
    torch.manual_seed(0)
    frozen = torch.nn.Linear(48, 40).requires_grad_(False)
    trained = torch.nn.Linear(48, 40)
    model = torch.nn.ModuleDict({"frozen": frozen, "trained": trained})
    few, many = torch.randn(2, 1, 48), torch.randn(MAX_ROWS + 1, 48)
    with few_row_linears(model) as switched:
        assert switched == 1 and "forward" in vars(frozen) and "forward" not in vars(trained)
        with torch.no_grad():
            fast = frozen(few)
            assert torch.equal(
                frozen(many), F.linear(many, frozen.weight, frozen.bias)
            )  # prefill-sized: F.linear
        assert torch.equal(
            frozen(few), F.linear(few, frozen.weight, frozen.bias)
        )  # autograd on: F.linear
    assert "forward" not in vars(frozen)  # nothing left behind
    assert fast.shape == (2, 1, 40) and fast.is_contiguous()
    assert torch.allclose(fast, F.linear(few, frozen.weight, frozen.bias), atol=1e-6)
    with few_row_linears(model, enabled=False) as switched:
        assert switched == 0 and "forward" not in vars(frozen)


@pytest.mark.parametrize("executor", ["lora", "ft_m"])
@pytest.mark.parametrize("family", FAMILIES)
def test_fast_decode_rollout_gives_the_eager_tokens(family, executor):
    from hpse_easyedit.executors import make_executor

    model, tok = make_tiny_model_and_tokenizer(family, init_std=0.3)
    ex = make_executor(model, tiny_hparams(executor=executor))
    with (
        torch.no_grad(),
        torch.random.fork_rng(devices=[]),
    ):  # a student that differs from its teacher
        torch.manual_seed(3)
        for p in ex.trainable_parameters():
            p.add_(torch.randn_like(p) * 0.3)
    prompts = build_edit_prompts(tok, model.config.model_type, REQUEST)[0]
    runs = {}
    for fast in (True, False):
        for batched in (True, False):
            hp = tiny_hparams(
                executor=executor,
                fast_decode=fast,
                batched_rollout=batched,
                tau=1.0,
                kappa=0.05,
                top_k=5,
            )
            runs[fast, batched] = draw_rollout(
                ex, prompts, hp, stop_ids=[], pad_id=tok.pad_token_id
            )
    eager = runs[False, True]
    for ro in runs.values():
        assert ro.tokens.tolist() == eager.tokens.tolist()
        assert ro.stepped_in.tolist() == eager.stepped_in.tolist()
        assert torch.equal(ro.teacher_topk_ids, eager.teacher_topk_ids)
        assert torch.allclose(ro.teacher_topk_logprobs, eager.teacher_topk_logprobs, atol=1e-4)
    # fast_decode: false is the F.linear path bit for bit
    direct = batched_hybrid_rollout(
        ex.model,
        ex.row_switch,
        prompts.student_ids,
        prompts.teacher_ids,
        tau=1.0,
        kappa=0.05,
        top_k=eager.teacher_topk_ids.shape[1],
        max_new_tokens=12,
        stop_ids=[],
        pad_id=tok.pad_token_id,
    )
    assert torch.equal(direct.teacher_topk_logprobs, eager.teacher_topk_logprobs)
    assert not any("forward" in vars(m) for m in ex.model.modules())


def test_fast_decode_is_a_kernel_choice_for_the_run_config():
    from benchmarks.run.runner import config_policy, default_out_dir

    policy = config_policy(tiny_hparams())
    assert policy.ignored(("hparams", "fast_decode"))
    assert default_out_dir("mquake-uns", "x.yaml", ["fast_decode=false"]) == default_out_dir(
        "mquake-uns", "x.yaml", []
    )


def test_layers_under_accelerate_dispatch_hooks_are_switched_and_put_back(tmp_path):
    from accelerate import dispatch_model
    from transformers import AutoModelForCausalLM

    make_tiny_model_and_tokenizer("llama", tmp_path / "m")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval().requires_grad_(False)
    model = dispatch_model(model, device_map={"": "cpu"}, force_hooks=True)
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    assert linears and all(hasattr(m, "_hf_hook") for m in linears)
    before = [m._old_forward for m in linears]
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        want = model(input_ids=ids).logits
        with few_row_linears(model) as switched:
            assert switched == len(linears)
            assert all(m._old_forward.__func__.__name__ == "_forward" for m in linears)
            got = model(input_ids=ids[:, :1]).logits  # one row: the W @ x^T path, through the hooks
    assert [m._old_forward for m in linears] == before
    assert torch.allclose(got[0, -1], want[0, 0], atol=1e-5)


@pytest.mark.parametrize("choice", [True, False])
def test_auto_switches_every_layer_or_none_as_the_timing_decides(choice, monkeypatch):
    """``fast_decode: auto`` asks ``pays_off`` (one timing per process and weight shapes) and then
    switches all frozen float32 layers, or none: the W @ x^T path where it is clearly faster,
    F.linear elsewhere."""
    from hpse_easyedit import fast_decode

    model, _ = make_tiny_model_and_tokenizer("llama")
    model.requires_grad_(False)
    n_linear = sum(type(m) is torch.nn.Linear for m in model.modules())
    monkeypatch.setattr(fast_decode, "_pays_off", lambda weights: choice)
    with few_row_linears(model, enabled="auto") as switched:
        assert switched == (n_linear if choice else 0)


def test_pays_off_times_once_per_process_and_answers_a_bool(monkeypatch):
    from hpse_easyedit import fast_decode

    model, _ = make_tiny_model_and_tokenizer("qwen2")
    model.requires_grad_(False)
    monkeypatch.setattr(fast_decode, "_AUTO_CHOICE", {})
    first = fast_decode.pays_off(model)
    assert first in (True, False) and len(fast_decode._AUTO_CHOICE) == 1
    monkeypatch.setattr(fast_decode.F, "linear", lambda *a, **k: pytest.fail("timed twice"))
    assert fast_decode.pays_off(model) is first  # cached: no second timing
    assert fast_decode.pays_off(torch.nn.Sequential()) is False  # nothing to switch


@pytest.mark.parametrize(
    "value, ok", [("auto", True), (True, True), (False, True), ("fast", False), (1, False)]
)
def test_fast_decode_hparam_takes_auto_true_or_false(value, ok):
    from hpse_easyedit.hparams import HParamsError

    if ok:
        assert tiny_hparams(fast_decode=value).fast_decode == value
    else:
        with pytest.raises(HParamsError, match="fast_decode"):
            tiny_hparams(fast_decode=value)
    assert tiny_hparams().fast_decode == "auto"
