"""``rollout.decode_route``: one place chooses how a round's rollouts are decoded, and every route
``draw_rollouts`` takes gives the same tokens, step-ins and teacher top-K."""

import pytest
import torch

from hpse_easyedit.executors import make_executor
from hpse_easyedit.prompts import build_edit_prompts
from hpse_easyedit.rollout import DECODE_ROUTES, decode_route, draw_rollout, draw_rollouts
from tiny_models import make_tiny_model_and_tokenizer, tiny_hparams

REQUESTS = [
    {"prompt": "Introduce AJ Lee.", "subject": "AJ Lee", "target_new": "AJ Lee speaks Russian."},
    {
        "prompt": "Introduce Ellie Kemper.",
        "subject": "Ellie Kemper",
        "target_new": "Ellie Kemper is a citizen of Croatia.",
    },
]
ROUTE_OF = {  # (static_decode, batched_rollout) -> route, on CPU
    (False, False): "two_passes",
    (False, True): "row_pair",
    (True, False): "static",
    (True, True): "static",
    ("auto", True): "row_pair",  # auto compiles on CUDA only
    ("auto", False): "two_passes",
}


@pytest.mark.parametrize("setting", sorted(ROUTE_OF, key=str))
def test_the_hparams_pick_one_documented_route(setting):
    model, _ = make_tiny_model_and_tokenizer("llama")
    static, batched = setting
    hp = tiny_hparams(static_decode=static, batched_rollout=batched)
    route = decode_route(hp, model)
    assert route == ROUTE_OF[setting] and route in DECODE_ROUTES


@pytest.mark.parametrize("executor", ["lora", "ft_m"])
def test_every_cpu_route_draws_the_same_rollouts(executor):
    model, tok = make_tiny_model_and_tokenizer("qwen2", init_std=0.3)
    ex = make_executor(model, tiny_hparams(executor=executor))
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        for p in ex.trainable_parameters():  # a student unlike its teacher
            p.add_(torch.randn_like(p) * 0.3)
    prompts = build_edit_prompts(tok, model.config.model_type, REQUESTS)
    kw = dict(stop_ids=[tok.eos_token_id], pad_id=tok.pad_token_id)
    drawn = {}
    for static, batched in [(False, False), (False, True), (True, True)]:
        hp = tiny_hparams(executor=executor, static_decode=static, batched_rollout=batched)
        route = decode_route(hp, model)
        drawn[route] = draw_rollouts(ex, prompts, hp, **kw)
        assert [draw_rollout(ex, p, hp, **kw).tokens.tolist() for p in prompts] == [
            r.tokens.tolist() for r in drawn[route]
        ]
    assert set(drawn) == {"two_passes", "row_pair", "static"}
    reference = drawn["two_passes"]
    for route, rollouts in drawn.items():
        for got, want in zip(rollouts, reference):
            assert got.tokens.tolist() == want.tokens.tolist(), route
            assert got.stepped_in.tolist() == want.stepped_in.tolist(), route
            assert torch.equal(got.teacher_topk_ids, want.teacher_topk_ids), route
            assert torch.allclose(
                got.teacher_topk_logprobs, want.teacher_topk_logprobs, atol=1e-4
            ), route
