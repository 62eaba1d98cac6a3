"""Loading for GPUs: weights straight onto the card, the attn_implementation hparam, and offloaded
placements refused in ``load_model`` (every entry point loads through it), each mistake one line
naming the key and the fix."""

from __future__ import annotations

import pytest
import torch

from hpse_easyedit import load_model
from hpse_easyedit.hparams import HParamsError
from hpse_easyedit.loading import check_placement
from tiny_models import tiny_hparams


@pytest.fixture(scope="module")
def tiny_dir(saved_tiny_model):
    return str(saved_tiny_model("qwen2"))


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


# ------------------------------------------------ settings that cannot work together, refused early
@pytest.mark.parametrize("static", [True, "compile"])
def test_flash_attention_with_the_static_decode_is_refused_in_the_file(static):
    """The static decode builds a 4D mask, which flash attention's layers do not take: the file is
    refused when it is read, before anything loads."""
    with pytest.raises(
        HParamsError,
        match=f"key 'static_decode' is {static!r} but attn_implementation is 'flash_attention_2'"
        ".*set static_decode: auto",
    ) as err:
        tiny_hparams(attn_implementation="flash_attention_2", static_decode=static)
    assert "\n" not in str(err.value)
    for fine in ("auto", False):
        tiny_hparams(attn_implementation="flash_attention_2", static_decode=fine)


def _a_card(monkeypatch, capability, name="Tesla T4"):
    """A machine with one CUDA card of ``capability``, stood in for on this CPU host."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: name)
    monkeypatch.setattr(torch.version, "hip", None)


class _Loaded(Exception):
    """What the stand-in ``from_pretrained`` raises: the weights would have loaded."""


def _no_weights(monkeypatch):
    from transformers import AutoModelForCausalLM

    def refuse(*args, **kwargs):
        raise _Loaded

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)


def test_bfloat16_on_a_card_without_it_is_refused_before_the_weights_load(tiny_dir, monkeypatch):
    _a_card(monkeypatch, (7, 5))
    _no_weights(monkeypatch)
    with pytest.raises(
        HParamsError,
        match=r"key 'dtype' is 'bfloat16' but GPU 0 \(Tesla T4, compute capability 7\.5\) has no "
        r"bfloat16 arithmetic.*set dtype: float16",
    ) as err:
        load_model(tiny_hparams(model_name=tiny_dir, device="cuda", dtype="bfloat16"))
    assert "\n" not in str(err.value)
    # the same card in float16, and an Ampere card in bfloat16, go on to load the weights
    with pytest.raises(_Loaded):
        load_model(tiny_hparams(model_name=tiny_dir, device="cuda", dtype="float16"))
    _a_card(monkeypatch, (8, 0), "NVIDIA A100")
    with pytest.raises(_Loaded):
        load_model(tiny_hparams(model_name=tiny_dir, device="cuda", dtype="bfloat16"))


def test_cuda_graphs_of_the_training_step_off_cuda_are_refused_before_the_weights_load(
    tiny_dir, monkeypatch
):
    """``compile_training: graphs`` needs a CUDA device: on CPU one line names the key and the fix
    before the weights load; on a card (stood in for) the weights go on to load."""
    _no_weights(monkeypatch)
    with pytest.raises(
        HParamsError,
        match="key 'compile_training' is 'graphs' but the model goes to 'cpu', and CUDA graphs "
        "need a CUDA device; set compile_training: true",
    ) as err:
        load_model(tiny_hparams(model_name=tiny_dir, compile_training="graphs"))
    assert "\n" not in str(err.value)
    _a_card(monkeypatch, (9, 0), "NVIDIA H100")
    from hpse_easyedit import static_decode

    monkeypatch.setattr(static_decode, "compiler_problem", lambda device_type: None)
    with pytest.raises(_Loaded):
        load_model(
            tiny_hparams(
                model_name=tiny_dir, device="cuda", dtype="bfloat16", compile_training="graphs"
            )
        )


@pytest.mark.parametrize(
    "key,value,named",
    [
        ("static_decode", "compile", "key 'static_decode' is 'compile'"),
        ("compile_training", True, "key 'compile_training' is true"),
    ],
)
def test_compile_without_a_compiler_is_refused_before_the_weights_load(
    tiny_dir, monkeypatch, key, value, named
):
    """The real check of inductor's C++ compiler search, with the compiler it looks for made one
    that does not exist."""
    from torch._inductor import config

    from hpse_easyedit.static_decode import compiler_problem

    _no_weights(monkeypatch)
    compiler_problem.cache_clear()
    # torch's own patch of its config (monkeypatch.setattr on the config's proxy is undone by
    # deleting the key on pytest >= 9.2, which reads the old value from the instance's __dict__)
    try:
        with config.patch({"cpp.cxx": ("no-such-c++-compiler",)}):
            with pytest.raises(
                HParamsError,
                match=f"{named} but torch.compile builds CPU kernels with a "
                "C\\+\\+ compiler, and none was found.*set " + key,
            ) as err:
                load_model(tiny_hparams(model_name=tiny_dir, **{key: value}))
            assert "\n" not in str(err.value)
            # auto never refuses: on CPU it is the eager path, which needs no compiler
            with pytest.raises(_Loaded):
                load_model(tiny_hparams(model_name=tiny_dir, **{key: "auto"}))
    finally:
        compiler_problem.cache_clear()
    monkeypatch.undo()
    assert compiler_problem("cpu") is None  # this host has one
    with pytest.raises(_Loaded):
        _no_weights(monkeypatch)
        load_model(tiny_hparams(model_name=tiny_dir, **{key: value}))
