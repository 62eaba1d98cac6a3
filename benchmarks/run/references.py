"""Two reference rows for a results table: the model before any edit, and the model reading the
passages.

- ``UNEDITED``: the edit changes nothing, so the answers are the pre-edit model's (the "before" of
  a before/after case study, and the floor every editor should clear).
- ``IN_CONTEXT``: the edit changes nothing either, but every question of the case is asked with the
  case's passages (all of them) in the system prompt, worded as HPSE's privileged teacher reads them
  (paper Fig. ``teacher_prompt``). On a one-edit case that is the teacher HPSE distils from; with
  several edits HPSE's teacher reads one request's passage per rollout unless ``teacher_facts:
  all``, so there the row shows what the passages allow in context, not what the shipped teacher
  sees.

Both run through the ordinary runner (``alg_name: UNEDITED`` / ``IN_CONTEXT`` in a small hparams
file, ``hparams/REFERENCE/``; registered in ``benchmarks.run.methods``), so they are scored, stored,
resumed and compared like any editor.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

from hpse_easyedit.hparams import EditorHParams, hp_field

__all__ = [
    "InContextHParams",
    "ReferenceHParams",
    "ReferenceResult",
    "answer_system",
    "keep_model",
    "reference_edit",
]


@dataclass
class ReferenceHParams(EditorHParams):
    """UNEDITED: just the model to load (the fields every method shares)."""

    ALG_NAME: ClassVar[str] = "UNEDITED"

    alg_name: str = hp_field("UNEDITED", "Method name; must be UNEDITED.", choices=("UNEDITED",))


@dataclass
class InContextHParams(ReferenceHParams):
    """IN_CONTEXT: the model to load and the wording of the passages' system prompt."""

    ALG_NAME: ClassVar[str] = "IN_CONTEXT"

    alg_name: str = hp_field(
        "IN_CONTEXT", "Method name; must be IN_CONTEXT.", choices=("IN_CONTEXT",)
    )
    teacher_prompt_style: str = hp_field(
        "auto",
        "System-prompt wording, as HPSE's teacher_prompt_style ('auto' = from model_type).",
        choices=("auto", "default", "llama", "plain"),
    )


@dataclass
class ReferenceResult:
    """What the runner reads from an edit result; ``context`` is what the answers are conditioned
    on."""

    model: Any
    weights_copy: dict = field(default_factory=dict)
    rounds: list = field(default_factory=list)
    seconds: float = 0.0
    context: list = field(
        default_factory=list
    )  # [(subject, passage)] for IN_CONTEXT, [] for UNEDITED


def keep_model(model: Any, weights_copy: Any) -> Any:
    """The restore of an edit that changed nothing: the model as it is."""
    return model


def reference_edit(
    model: Any, tok: Any, requests: list[dict], hp: ReferenceHParams
) -> ReferenceResult:
    """No weight changes; IN_CONTEXT keeps the requests' passages for the answers' system prompt
    (requests checked and read exactly as an HPSE edit reads them)."""
    from hpse_easyedit.edit_requests import normalize_requests

    t0 = time.perf_counter()
    context = []
    if hp.alg_name == "IN_CONTEXT":
        context = [(r["subject"], r["target_new"]) for r in normalize_requests(requests, hp)]
    return ReferenceResult(model=model, context=context, seconds=time.perf_counter() - t0)


def answer_system(model: Any, results: Sequence[Any], hp: Any) -> str | None:
    """The system prompt the answers of these edits are generated under: ``None`` unless some result
    carries ``context`` (IN_CONTEXT), else the privileged teacher's wording with all their
    passages."""
    from hpse_easyedit.prompts import privileged_system, teacher_style_for

    context = [c for res in results for c in (getattr(res, "context", None) or [])]
    if not context:
        return None
    model_type = getattr(getattr(model, "config", None), "model_type", "")
    style = teacher_style_for(model_type, getattr(hp, "teacher_prompt_style", "auto"))
    subjects = ", ".join(dict.fromkeys(s for s, _ in context))
    return privileged_system(style, subjects, [p for _, p in context])
