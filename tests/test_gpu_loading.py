"""Loading for GPUs: weights straight onto the card, the attn_implementation hparam, and offloaded
placements refused in ``load_model`` (every entry point loads through it), each mistake one line
naming the key and the fix."""

from __future__ import annotations

import pytest
import torch

from hpse_easyedit import load_model
from hpse_easyedit.hparams import HParamsError
from hpse_easyedit.loading import check_placement
from tiny_models import make_tiny_model_and_tokenizer, tiny_hparams


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-qwen2")
    make_tiny_model_and_tokenizer("qwen2", path)
    return str(path)


def test_attn_implementation_auto_keeps_the_default_and_eager_is_passed_on(tiny_dir):
    model, _ = load_model(tiny_hparams(model_name=tiny_dir))
    assert model.config._attn_implementation == "sdpa"
    model, _ = load_model(tiny_hparams(model_name=tiny_dir, attn_implementation="eager"))
    assert model.config._attn_implementation == "eager"


def test_flash_attention_without_flash_attn_is_one_line(tiny_dir, monkeypatch):
    import transformers.utils

    monkeypatch.setattr(transformers.utils, "is_flash_attn_2_available", lambda: False)
    with pytest.raises(
        HParamsError,
        match="key 'attn_implementation' is 'flash_attention_2' but this machine lacks "
        "it.*set attn_implementation: sdpa",
    ) as err:
        load_model(tiny_hparams(model_name=tiny_dir, attn_implementation="flash_attention_2"))
    assert "\n" not in str(err.value)


def test_attn_implementation_is_validated_in_the_file():
    with pytest.raises(HParamsError, match="key 'attn_implementation' must be one of"):
        tiny_hparams(attn_implementation="flash")


def test_a_gpu_device_loads_the_weights_straight_onto_the_card(tiny_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    seen = {}
    real = AutoModelForCausalLM.from_pretrained

    def spy(source, **kwargs):
        seen.update(kwargs)
        kwargs.pop("device_map")
        model = real(source, **kwargs)
        model.to = lambda *a, **k: pytest.fail("the model was moved after loading")
        return model

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    load_model(tiny_hparams(model_name=tiny_dir, device=1))
    assert seen["device_map"] == {"": "cuda:1"}


@pytest.mark.parametrize(
    "device_map,refused",
    [
        ({"model.layers.0": 0, "model.layers.1": 1}, False),
        ({"": "cpu"}, False),
        ({"model.layers.0": 0, "lm_head": "cpu"}, True),
        ({"model": 0, "lm_head": "disk"}, True),
    ],
)
def test_offloaded_placements_are_refused_by_load_model(tiny_dir, monkeypatch, device_map, refused):
    from transformers import AutoModelForCausalLM

    real = AutoModelForCausalLM.from_pretrained

    def placed(source, **kwargs):
        kwargs.pop("device_map")
        model = real(source, **kwargs)
        model.hf_device_map = device_map
        return model

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", placed)
    hp = tiny_hparams(model_name=tiny_dir, model_parallel=True)
    if not refused:
        load_model(hp)
        return
    with pytest.raises(
        HParamsError, match=r"key 'model_parallel'.*offloaded 1 module\(s\) to CPU/disk.*plan"
    ) as err:
        load_model(hp)
    assert "\n" not in str(err.value)
    with pytest.raises(HParamsError):
        check_placement(type("M", (), {"hf_device_map": device_map})())
