"""Greedy chat answers, batched with left padding: what every before/after comparison reads."""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Sequence

import torch

from .model_calls import input_device
from .padding import pad_rows, pad_token_id
from .prompts import chat_prompt_ids, has_system_role, stop_token_ids
from .static_decode import decode_mode, plain_greedy, static_generate

__all__ = ["generate_answers"]

logger = logging.getLogger(__name__)


@torch.no_grad()
def generate_answers(
    model: Any,
    tok: Any,
    questions: Sequence[str],
    *,
    max_new_tokens: int = 128,
    batch_size: int = 8,
    system: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    static_decode: bool | str = False,
    stop_every: int = 8,
    progress: Callable[[int], Any] | None = None,
    on_batch: Callable[[list[str]], Any] | None = None,
) -> list[str]:
    """Answer each question greedily as a one-turn chat; returns the decoded new text, special
    tokens dropped.

    ``system``: a system message for every question (folded into the user turn for chat templates
    without a system role, e.g. Gemma2's). ``static_decode``: decode on the graph-capturable path
    (``static_decode.static_generate``, the stop test every ``stop_every`` tokens) instead of
    ``model.generate`` (``"compile"``: its step under ``torch.compile``, CUDA graphs on CUDA;
    ``"auto"``: that on CUDA, ``model.generate`` elsewhere): the same tokens, unless the model's
    generation config asks for a logits processor (e.g. a repetition penalty), in which case
    ``generate`` is used. ``progress``: called
    with the number of questions answered after each batch (a progress bar's ``update``);
    ``on_batch``: called with each batch's answers as it finishes (to store them).
    """
    if not questions:
        return []
    system_role = system is None or has_system_role(
        tok, getattr(getattr(model, "config", None), "model_type", ""), template_kwargs
    )
    device = input_device(model)
    stops = sorted(stop_token_ids(model, tok))
    pad_id = pad_token_id(tok, stops)
    static_decode = decode_mode(static_decode, model)
    if static_decode and (field := plain_greedy(model)) is not None:
        logger.info(
            "static_decode: generation_config.%s is set, so answers use model.generate", field
        )
        static_decode = False
    was_training = model.training
    model.eval()
    answers: list[str] = []
    try:
        for start in range(0, len(questions), batch_size):
            chunk = questions[start : start + batch_size]
            rows = [
                chat_prompt_ids(
                    tok, q, system, system_role=system_role, template_kwargs=template_kwargs
                )
                for q in chunk
            ]
            if static_decode:
                new = static_generate(
                    model,
                    rows,
                    max_new_tokens=max_new_tokens,
                    stop_ids=stops,
                    pad_id=pad_id,
                    stop_every=stop_every,
                    compiled=static_decode == "compile",
                )
            else:
                ids, mask = pad_rows(rows, pad_id, left=True)
                out = model.generate(
                    input_ids=ids.to(device),
                    attention_mask=mask.to(device),
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    eos_token_id=stops or None,
                    pad_token_id=pad_id,
                    temperature=None,
                    top_p=None,
                    top_k=None,
                )
                new = out[:, ids.shape[1] :]
            batch = [tok.decode(row, skip_special_tokens=True).strip() for row in new]
            answers += batch
            if on_batch is not None:
                on_batch(batch)
            if progress is not None:
                progress(len(chunk))
    finally:
        model.train(was_training)
    return answers
