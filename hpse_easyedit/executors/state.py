"""What the edits on one model leave behind for later edits and restores: one ``EditState`` per
model.

An edit ends, but some of what it set up must outlive it: the LoRA adapter this package wrapped
around the model (so that a later edit continues in it, and a restore can unload it), FT-M's
original matrix (the teacher of every later edit, and how a restore knows it is done), the
``requires_grad`` flags to give back, and the restore handles of edits not undone yet (so that they
are undone last first). The executors own this state; everything else reaches it through
``edit_state(model)``.

It is kept with the unwrapped model (one attribute, held by nothing else), so it lives and dies with
the model, and a ``copy.deepcopy`` of the model (EasyEdit's ``copy=True``) copies it along, its
adapter and matrix with it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["EditState", "edit_state", "kept_tensor", "release_workspace", "unwrapped", "workspace"]

_ATTRIBUTE = "_hpse_edit_state"


@dataclass
class EditState:
    """The edit state of one model (see the module docstring)."""

    #: LoRA: the peft ``PeftModel`` around the model that the last LoRA edit trained in (None: none)
    adapter_model: Any = None
    #: LoRA: whether this package created that adapter (only such an adapter is unloaded by a
    #: restore)
    adapter_created: bool = False
    #: LoRA: every parameter's ``requires_grad`` before the adapter was created
    adapter_grad_flags: dict[str, bool] = field(default_factory=dict)
    #: FT-M: ``(parameter name, its value before the first FT-M edit)``; None once a restore brought
    #: it back
    ftm_original: tuple[str, torch.Tensor] | None = None
    #: FT-M: every parameter's ``requires_grad`` before the first FT-M edit
    ftm_grad_flags: dict[str, bool] = field(default_factory=dict)
    #: the restore handles of the edits not undone yet, oldest first
    pending_restores: list = field(default_factory=list)


def unwrapped(model: Any) -> Any:
    """``model`` without a peft wrapper (peft injects its layers into the wrapped model, which stays
    the same object)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if get_base is not None else model


def edit_state(model: Any) -> EditState:
    """The ``EditState`` of ``model`` (wrapped or not), created empty on first use."""
    base = unwrapped(model)
    state = base.__dict__.get(_ATTRIBUTE)
    if state is None:
        state = base.__dict__[_ATTRIBUTE] = EditState()
    return state


#: per model (its base): the decode's workspace (``workspace``)
_WORKSPACES: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def workspace(model: Any) -> dict:
    """The decode's workspace of ``model`` (wrapped or not): tensors a decode step reads that are
    refreshed in place before every decode (the row switch's masks, LoRA's half-precision adapter
    copies), or reused while their values hold (FT-M's copy of the original matrix, ``ftm.py``), so
    that a captured step reads the same addresses in every round and edit and is replayed, not
    captured again. Not edit state: what an edit needs from it, the edit holds itself, so a restore
    leaves it; it lives and dies with the model, and a copy of the model starts without one.
    ``release_workspace`` frees it."""
    return _WORKSPACES.setdefault(unwrapped(model), {})


def release_workspace(model: Any) -> None:
    """Free ``model``'s decode workspace; the next decode allocates it again."""
    _WORKSPACES.pop(unwrapped(model), None)


def kept_tensor(
    model: Any, name: str, value: torch.Tensor, device: Any, dtype: torch.dtype
) -> torch.Tensor:
    """``value`` on ``device`` in ``dtype``, written into a tensor of ``model``'s ``workspace``
    (one per name, shape, device and dtype) in place: a decode step that reads it (the row
    switch's masks) reads the same address in every round and edit. Called outside the captured
    step (once per decode)."""
    key = (name, tuple(value.shape), str(device), dtype)
    space = workspace(model)
    kept = space.get(key)
    if kept is None:
        kept = space[key] = torch.empty(value.shape, device=device, dtype=dtype)
        torch._dynamo.mark_static_address(kept)
    with torch.no_grad():
        kept.copy_(value)
    return kept
