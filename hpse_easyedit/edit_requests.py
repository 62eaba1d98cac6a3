"""Edit requests as every editor takes them: EasyEdit's request dicts checked and normalised once.

HPSE, COIN*, the EasyEdit baselines and the benchmark's reference rows all read requests through
``normalize_requests``, so a malformed request is the same one-line ``RequestError`` whichever
method receives it.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

__all__ = ["RequestError", "normalize_requests"]


class RequestError(ValueError):
    """An edit request is malformed; the message names the request, the field and the fix."""


def normalize_requests(requests: Any, hparams: Any) -> list[dict]:
    """EasyEdit request dicts -> ``{"prompt", "subject", "target_new"}`` with clear errors for bad
    input.

    ``hparams`` is any method's hparams with an ``editing_prompt`` (the prompt a request without one
    is given, and the pattern a subject is read back from)."""
    if isinstance(requests, Mapping):
        requests = [requests]
    if not isinstance(requests, Sequence) or isinstance(requests, str) or not requests:
        raise RequestError(
            "requests must be a non-empty list of dicts "
            "with 'subject' and 'target_new' (the passage)"
        )
    out = []
    head, _, tail = hparams.editing_prompt.partition("{subject}")
    for i, req in enumerate(requests):
        if not isinstance(req, Mapping):
            raise RequestError(f"request {i}: expected a dict, got {type(req).__name__}")
        passage = req.get("target_new")
        if isinstance(passage, Mapping):
            passage = passage.get("str")
        if not isinstance(passage, str) or not passage.strip():
            raise RequestError(
                f"request {i}: 'target_new' must be the "
                f"non-empty passage to inject, got {passage!r}"
            )
        if not any(ch.isalnum() for ch in passage):
            raise RequestError(
                f"request {i}: 'target_new' has no letter or digit ({passage.strip()[:40]!r}); "
                "give the passage to inject as text"
            )
        subject = req.get("subject")
        prompt = req.get("prompt")
        if isinstance(subject, str) and not subject.strip():
            subject = None
        if isinstance(prompt, str) and not prompt.strip():
            prompt = None
        if subject is None and prompt is None:
            raise RequestError(
                f"request {i}: needs 'subject' (the topic phrase s of 'Introduce {{s}}.'); "
                "'prompt' alone is accepted when it follows "
                f"editing_prompt {hparams.editing_prompt!r}"
            )
        if subject is None:
            if (
                prompt.startswith(head)
                and prompt.endswith(tail)
                and len(prompt) > len(head) + len(tail)
            ):
                subject = prompt[len(head) : len(prompt) - len(tail)]
            else:
                raise RequestError(
                    f"request {i}: 'subject' is missing and cannot be read from prompt {prompt!r} "
                    f"(editing_prompt is {hparams.editing_prompt!r}); add a 'subject' field"
                )
        if not isinstance(subject, str):
            raise RequestError(
                f"request {i}: 'subject' must be a string, got {type(subject).__name__}"
            )
        if prompt is None:
            prompt = hparams.editing_prompt.format(subject=subject)
        if not isinstance(prompt, str):
            raise RequestError(
                f"request {i}: 'prompt' must be a string, got {type(prompt).__name__}"
            )
        out.append({"prompt": prompt, "subject": subject, "target_new": passage})
    return out
