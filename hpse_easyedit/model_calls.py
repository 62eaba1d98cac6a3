"""How to call a model, whatever its family and transformers version: where its input ids go
(``input_device``), which keywords its forward takes (``accepts_keyword``), and the KV cache's
keyword and place in the output (``cache_keyword``, ``output_cache``: ``cache`` from transformers
5.24, ``past_key_values`` before). The rollout, the static decode, the generation, the captured step
and the benchmarks' MMLU probe all call models through these."""

from __future__ import annotations

import inspect
import weakref
from typing import Any

import torch

__all__ = ["accepts_keyword", "cache_keyword", "input_device", "output_cache"]


def input_device(model: torch.nn.Module) -> torch.device:
    """Where input ids must go: the input embedding's device (also right under
    device_map='auto')."""
    try:
        return model.get_input_embeddings().weight.device
    except (AttributeError, NotImplementedError):
        return next(model.parameters()).device


#: model -> the keywords its forward takes (inspected once per model; the entry goes with the model)
_FORWARD_KEYWORDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def accepts_keyword(model: torch.nn.Module, name: str) -> bool:
    """Whether ``model``'s forward (or, for a peft wrapper, its base model's) takes the keyword
    ``name``."""
    try:
        keywords = _FORWARD_KEYWORDS.get(model)
    except TypeError:  # an object that cannot be weakly referenced: inspected at every call
        keywords = None
    if keywords is None:
        try:
            keywords = set(inspect.signature(model.forward).parameters)
            base = getattr(model, "get_base_model", None)
            if base is not None:
                keywords |= set(inspect.signature(base().forward).parameters)
        except (TypeError, ValueError):
            keywords = set()
        keywords = frozenset(keywords)
        try:
            _FORWARD_KEYWORDS[model] = keywords
        except TypeError:
            pass
    return name in keywords


def cache_keyword(model: torch.nn.Module) -> str:
    """The forward keyword of the KV cache: ``cache`` where the model takes it (transformers >=
    5.24, which deprecates ``past_key_values``), else ``past_key_values``."""
    return "cache" if accepts_keyword(model, "cache") else "past_key_values"


def output_cache(out: Any) -> Any:
    """The updated KV cache of a forward's output: ``out.cache`` (transformers >= 5.24) or
    ``out.past_key_values``."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values
