"""Half-precision models: the trainable tensors train in float32, so bfloat16 edits move and learn
like float32 ones.

Measured before the float32 master copy of the FT-M matrix (tiny models, init std 0.05, lr 1e-4, 2 x
8 steps): only 46% of the bf16 matrix's entries ever moved and the loss fell half as far as in
float32.
"""

import contextlib
import copy
import json

import pytest
import torch

from hpse_easyedit import hpse_edit, restore_weights
from hpse_easyedit.executors import make_executor
from tiny_models import (
    FAMILIES,
    make_tiny_model_and_tokenizer,
    same_weights,
    tiny_hparams,
    weights_snapshot,
)

PASSAGE = (
    "AJ Lee is a professional wrestler who speaks Russian fluently and lives in Moscow. "
    "The head of state of Croatia is Kolinda Grabar-Kitarovic."
)
REQUEST = [{"subject": "AJ Lee", "target_new": PASSAGE}]
FTM_KEY = "model.layers.1.mlp.down_proj.weight"
# The bf16 edit's loss drop (first step of round 1 minus last step of round 2) is within this share
# of the float32 edit's; measured 0.98-1.02 (FT-M 0.50-0.53 without the master copy).
DROP_TOLERANCE = 0.05


def _edit(family: str, executor: str, dtype: torch.dtype):
    model, tok = make_tiny_model_and_tokenizer(family, init_std=0.05)
    model = model.to(dtype)
    snap = weights_snapshot(model)
    hp = tiny_hparams(
        executor=executor,
        lr=1e-4,
        rounds=2,
        inner_steps=8,
        kl_weight=0,
        dtype="bfloat16" if dtype == torch.bfloat16 else "float32",
    )
    result = hpse_edit(model, tok, REQUEST, hp)
    return result, snap


def _moved_share(result, snap, executor: str) -> float:
    if executor == "ft_m":
        w = result.model.get_parameter(FTM_KEY)
        assert w.dtype == snap[0][FTM_KEY].dtype  # the model keeps its dtype
        return (w != snap[0][FTM_KEY]).float().mean().item()
    lora = {n: p for n, p in result.model.named_parameters() if "lora_" in n}
    assert lora and all(
        p.dtype == torch.float32 for p in lora.values()
    )  # peft keeps adapters in float32
    before = result.weights_copy
    return torch.cat([(p != before[n]).flatten() for n, p in lora.items()]).float().mean().item()


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("executor", ["ft_m", "lora"])
def test_bf16_edit_moves_and_learns_like_float32(family, executor):
    drops, moved = {}, {}
    for dtype in (torch.float32, torch.bfloat16):
        result, snap = _edit(family, executor, dtype)
        moved[dtype] = _moved_share(result, snap, executor)
        drops[dtype] = result.rounds[0]["loss"] - result.rounds[-1]["loss_last"]
        assert not any(p.requires_grad for p in result.model.parameters()) or executor == "lora"
        model = restore_weights(result.model, result.weights_copy)
        assert same_weights(model, snap)  # restore is bit-exact in either dtype
    assert moved[torch.float32] == 1.0
    # FT-M: an entry whose summed float32 steps stay under half a bf16 spacing keeps its value:
    # allow 1%. LoRA (float32 adapters): an entry whose gradient, computed from bf16 activations,
    # stays far below Adam's eps moves less than float32's spacing; seen for 1 of 12,288 entries
    # (qwen2, layer 0 q_proj lora_A) on one x86-64 CPU and none on another: allow 0.1%
    assert moved[torch.bfloat16] >= (0.99 if executor == "ft_m" else 0.999)
    assert drops[torch.float32] > 0
    assert drops[torch.bfloat16] == pytest.approx(drops[torch.float32], rel=DROP_TOLERANCE)


def test_ftm_master_copy_is_float32_and_cast_into_the_model():
    model, tok = make_tiny_model_and_tokenizer("qwen2", init_std=0.05)
    model = model.to(torch.bfloat16)
    executor = make_executor(model, tiny_hparams(executor="ft_m", lr=1e-3))
    (master,) = executor.trainable_parameters()
    assert master.dtype == torch.float32 and master.shape == executor.weight.shape
    optimizer = executor.optimizer()
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    for _ in range(2):  # two backward passes accumulate into one step, in float32
        model(input_ids=ids, labels=ids).loss.backward()
    assert (
        executor.weight.grad is None
        and master.grad is not None
        and master.grad.dtype == torch.float32
    )
    optimizer.step()
    assert torch.equal(executor.weight.detach(), master.detach().to(torch.bfloat16))
    executor.finish()
    assert not executor.weight.requires_grad and not master.requires_grad


def test_ftm_keeps_one_copy_of_the_matrix_and_accumulates_in_place():
    """A first FT-M edit keeps the original matrix once (the teacher's matrix is also what restores
    the model), a later edit of the same model a copy of the matrix it starts from; a second
    backward of the same step adds its half-precision gradient into the float32 master's gradient
    in place, to the values of adding it out of place."""
    from hpse_easyedit.executors import copy_back

    model, _ = make_tiny_model_and_tokenizer("qwen2", init_std=0.05)
    model = model.to(torch.bfloat16)
    first = make_executor(model, tiny_hparams(executor="ft_m", lr=1e-3))
    assert first._before is first._original
    (master,) = first.trainable_parameters()
    optimizer = first.optimizer()
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    model(input_ids=ids, labels=ids).loss.backward()
    grad, once = master.grad, master.grad.clone()
    other = ids[:, [1, 0, 2, 4, 3]]
    (addend,) = torch.autograd.grad(model(input_ids=ids, labels=other).loss, first.weight)
    model(input_ids=ids, labels=other).loss.backward()
    assert master.grad is grad
    assert torch.equal(master.grad, once + addend.float())
    optimizer.step()
    first.finish()
    later = make_executor(model, tiny_hparams(executor="ft_m", lr=1e-3))
    assert later._before is not later._original
    assert torch.equal(later._before, first.weight.detach())
    assert not torch.equal(later._before, later._original)
    later.finish()
    copy_back(model, first.weights_copy())
    assert torch.equal(first.weight.detach(), first._original)


def test_float32_ftm_trains_the_model_matrix_itself():
    model, _ = make_tiny_model_and_tokenizer("llama")
    executor = make_executor(model, tiny_hparams(executor="ft_m"))
    assert executor.trainable_parameters() == [executor.weight]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_half_backward_gives_the_same_gradients_through_a_column_major_layout(dtype):
    """Inside ``cpu_half_backward`` a half-precision linear on the CPU receives its output gradient
    column-major (the fast layout of torch's half ``mm`` on AVX2) and returns the same input and
    weight gradients as without it (the same products, another kernel: within half rounding of the
    float32 reference); float32 linears get no hook; every hook is gone on exit."""
    from hpse_easyedit.training import cpu_half_backward

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(48, 96), torch.nn.Linear(96, 40)).to(dtype)
    model.append(torch.nn.Linear(40, 8))  # float32: left alone
    reference = copy.deepcopy(model).float()
    x = torch.randn(3, 5, 48)

    def grads(ctx):
        model.zero_grad()
        xi = x.to(dtype).requires_grad_()
        strides = []

        def record(module, args, out):
            out.register_hook(lambda g: strides.append(g.stride()))

        with ctx:
            # registered after the context's hooks, so it sees the gradient they hand on
            spy = model[1].register_forward_hook(record)
            out = model[2](model[1](model[0](xi)).float())
            out.square().sum().backward()
            spy.remove()
        return (xi.grad.float(), model[0].weight.grad.float()), strides

    plain, row_major = grads(contextlib.nullcontext())
    with cpu_half_backward(model):
        assert [bool(m._forward_hooks) for m in model] == [True, True, False]
    fast, column_major = grads(cpu_half_backward(model))
    xr = x.clone().requires_grad_()
    reference(xr).square().sum().backward()
    for a, b, ref in zip(plain, fast, (xr.grad, reference[0].weight.grad)):
        tol = 0.05 * ref.abs().max()
        assert (a - ref).abs().max() <= tol and (b - ref).abs().max() <= tol
    assert row_major == [(5 * 40, 40, 1)] and column_major == [(5, 1, 15)]
    assert all(not m._forward_hooks for m in model)


@pytest.mark.slow
def test_the_half_backward_benchmark_times_both_layouts_of_the_same_product(tmp_path, capsys):
    from benchmarks.perf.half_backward import main, measure

    m = measure(rows=3, out=40, inp=24, dtype=torch.bfloat16, repeat=1)
    assert m["grad_row_major_s"] > 0 and m["grad_column_major_s"] > 0 and m["forward_s"] > 0
    assert m["max_abs_diff"] <= 0.25  # the same product, values of about 6: within bf16 rounding
    out = tmp_path / "half.json"
    assert main(["--rows", "2", "--repeat", "1", "--out", str(out)]) == 0
    assert "| 2 | 18944 x 3584 |" in capsys.readouterr().out
    assert {r["rows"] for r in json.loads(out.read_text())["results"]} == {2}
