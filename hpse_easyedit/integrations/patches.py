"""Every place this package changes one of EasyEdit's classes, because EasyEdit offers no hook for
it.

EasyEdit's documented extension points are tables: ``ALG_DICT`` (which function edits for an
``alg_name``) and ``CALLABLE_RESTORE_ALGS`` (whose ``weights_copy`` is called to restore);
``registration`` fills those. Three things it needs have no table or hook, so they are patched here,
each idempotently and each wrapping EasyEdit's own behaviour, which keeps answering for everything
that is not ours:

- ``BatchEditor.is_batchable_method``: a chain of ``alg_name ==`` comparisons, no list to add to;
- ``BaseEditor.from_hparams``: always ``cls(hparams)``, whose constructor loads the model by name;
- ``BaseEditor.edit`` / ``batch_edit`` of an editor ``make_editor`` built: their request checks are
  bare ``assert``s, which would say nothing about a bad request (or fail much later on an empty
  passage).
"""

from __future__ import annotations

from typing import Any, Callable

from ..edit_requests import RequestError, normalize_requests

__all__ = ["check_requests_first", "patch_batchable", "patch_from_hparams"]


def patch_batchable(batch_editor: Any, is_ours: Callable[[str], bool]) -> None:
    """``batch_editor.is_batchable_method(alg_name)`` also says yes for our methods (``is_ours``),
    which edit all requests of a batch jointly. EasyEdit's answer is a hard-coded chain of
    comparisons: no hook."""
    original = batch_editor.is_batchable_method
    if hasattr(original, "_hpse_original"):
        return

    def is_batchable_method(alg_name: str) -> bool:
        """The registry's EasyEdit methods edit all requests of a batch jointly (``batch_edit``)."""
        return is_ours(alg_name) or original(alg_name)

    is_batchable_method._hpse_original = original  # type: ignore[attr-defined]
    batch_editor.is_batchable_method = staticmethod(is_batchable_method)


def patch_from_hparams(
    base_editor: Any, is_ours: Callable[[Any], bool], build: Callable[[Any, Any], Any]
) -> None:
    """``base_editor.from_hparams(hparams)`` of our hparams builds the editor with ``build(cls,
    hparams)`` (the model loaded the project's way); any other hparams go to EasyEdit's own loader.
    EasyEdit's ``from_hparams`` is ``cls(hparams)``, and the constructor loads the model by name (no
    SmolLM2, no Gemma-2, remote code for Qwen, not the file's dtype), with no hook for another
    loader."""
    factory = base_editor.__dict__.get("from_hparams")
    if not isinstance(factory, classmethod) or hasattr(factory.__func__, "_hpse_original"):
        return
    original = factory.__func__

    def from_hparams(cls: Any, hparams: Any) -> Any:
        """``BaseEditor.from_hparams``: hpse_easyedit's hparams get their model from
        ``hpse_easyedit.load_model`` (``make_editor``); any other hparams go to EasyEdit's own
        loader."""
        if is_ours(hparams):
            return build(cls, hparams)
        return original(cls, hparams)

    from_hparams._hpse_original = original  # type: ignore[attr-defined]
    base_editor.from_hparams = classmethod(from_hparams)


def check_requests_first(editor: Any, hparams: Any) -> None:
    """``editor.edit`` and ``editor.batch_edit`` (of this one editor) first check the request lists
    with the project's own one-line ``RequestError``. EasyEdit checks them with bare ``assert``s
    inside those methods and has no hook to validate requests before an edit."""
    for name in ("edit", "batch_edit"):
        setattr(editor, name, _checked(getattr(editor, name), hparams))


def _checked(method: Callable[..., Any], hparams: Any) -> Callable[..., Any]:
    """``BaseEditor.edit`` / ``batch_edit`` that first checks the request lists with the project's
    own one-line ``RequestError`` (EasyEdit's asserts would say nothing, or fail on an empty passage
    much later)."""

    def as_list(value: Any) -> list | None:
        return None if value is None else [value] if isinstance(value, (str, dict)) else list(value)

    def call(prompts: Any, target_new: Any, *args: Any, **kwargs: Any) -> Any:
        if "requests" not in kwargs:
            listed = {
                "prompts": as_list(prompts),
                "target_new": as_list(target_new),
                "subject": as_list(kwargs.get("subject")),
            }
            n = len(listed["prompts"] or [])
            for key, values in listed.items():
                if values is not None and len(values) != n:
                    raise RequestError(
                        f"{key} has {len(values)} entries but prompts has {n}; give one {key} per "
                        "prompt, in the same order"
                    )
            normalize_requests(
                [
                    {
                        "prompt": p,
                        "target_new": t,
                        **({"subject": listed["subject"][i]} if listed["subject"] else {}),
                    }
                    for i, (p, t) in enumerate(
                        zip(listed["prompts"] or [], listed["target_new"] or [])
                    )
                ]
                or None,
                hparams,
            )
        return method(prompts, target_new, *args, **kwargs)

    call.__doc__ = method.__doc__
    call.__name__ = getattr(method, "__name__", "edit")
    return call
