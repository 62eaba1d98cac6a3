"""What UnKE/AnyEdit and MEMIT/AlphaEdit share around EasyEdit's call: the model name its code must
see, the layer-depth check, and the tokenizer/model settings kept across the call."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator, Sequence

from ...hparams import HParamsError

__all__ = [
    "algorithm_timer",
    "check_depth",
    "easyedit_model_name",
    "grad_flags_kept",
    "padding_side",
]

# Substrings EasyEdit's code tests model names for (see the module docstring).
_ALPHAEDIT_NAMES = ("llama", "qwen", "gpt-j-6b", "gpt2-xl")
_ALPHAEDIT_TAG = "llama"
_UNKE_CALL_TAG = "Qwen2.5-7B-Instruct"
# model_type values whose down_proj weight is (hidden, intermediate), like Llama's.
_LLAMA_LAYOUT = (
    "llama",
    "qwen2",
    "qwen3",
    "qwen2_moe",
    "qwen3_moe",
    "mistral",
    "gemma",
    "gemma2",
    "gemma3_text",
)


def easyedit_model_name(model_name: str, model: Any, method: str) -> str:
    """The ``model_name`` EasyEdit's ``method`` code must see to take the branch that fits
    ``model``."""
    model_type = getattr(getattr(model, "config", None), "model_type", "") or ""
    if method == "AlphaEdit":
        if any(s in model_name.lower() for s in _ALPHAEDIT_NAMES):
            return model_name
        if model_type not in _LLAMA_LAYOUT:
            raise HParamsError(
                "EasyEdit's AlphaEdit supports Llama-, Qwen-, GPT-J- and GPT2-XL-style models; "
                f"{model_name!r} is a {model_type!r} model whose down_proj layout it cannot size"
            )
        return f"{model_name} ({_ALPHAEDIT_TAG}-layout {model_type})"
    if method in ("UnKE", "AnyEdit"):
        if not hasattr(getattr(model, "model", None), "rotary_emb"):
            raise HParamsError(
                f"EasyEdit's {method} calls model.model.rotary_emb, "
                f"which {type(model).__name__} does not have"
            )
        return f"{model_name} ({_UNKE_CALL_TAG} call path)"
    return model_name


@contextlib.contextmanager
def padding_side(tok: Any, side: str) -> Iterator[None]:
    """The tokenizer pads on ``side`` inside the block (EasyEdit's code assumes it), as before
    after."""
    before = tok.padding_side
    tok.padding_side = side
    try:
        yield
    finally:
        tok.padding_side = before


@contextlib.contextmanager
def grad_flags_kept(model: Any) -> Iterator[None]:
    """Every parameter's ``requires_grad`` after the block as before it (EasyEdit's code changes
    them)."""
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    try:
        yield
    finally:
        for n, p in model.named_parameters():
            p.requires_grad_(flags.get(n, p.requires_grad))


def check_depth(model: Any, layers: Sequence[int], extra: Sequence[int], source: str) -> None:
    """``HParamsError`` naming ``source`` when the edited or loss layers exceed the model's
    depth."""
    n = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if n is not None and max(list(layers) + list(extra)) >= n:
        raise HParamsError(
            f"{source}: layers {list(layers)} / loss layer {list(extra)} exceed the model's {n} "
            f"layers (0..{n - 1}); fix the hparams for this model"
        )


@contextlib.contextmanager
def algorithm_timer(timer: dict | None) -> Iterator[None]:
    """Put the seconds of the block (EasyEdit's own function) under
    ``timer["algorithm_seconds"]``."""
    start = time.perf_counter()
    yield
    if timer is not None:
        timer["algorithm_seconds"] = time.perf_counter() - start
