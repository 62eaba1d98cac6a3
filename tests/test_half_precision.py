"""Half-precision models: the trainable tensors train in float32, so bfloat16 edits move and learn
like float32 ones.

Measured before the float32 master copy of the FT-M matrix (tiny models, init std 0.05, lr 1e-4, 2 x
8 steps): only 46% of the bf16 matrix's entries ever moved and the loss fell half as far as in
float32.
"""

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


def test_float32_ftm_trains_the_model_matrix_itself():
    model, _ = make_tiny_model_and_tokenizer("llama")
    executor = make_executor(model, tiny_hparams(executor="ft_m"))
    assert executor.trainable_parameters() == [executor.weight]
