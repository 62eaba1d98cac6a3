"""The requests EasyEdit's baselines get: a one-turn chat-templated prompt, the passage closed by
the template's end-of-turn token (as in AnyEdit's and UnKE's own data)."""

from __future__ import annotations

from typing import Any, Mapping

from ...prompts import end_of_turn_id

__all__ = ["chat_text", "end_of_turn_text"]


def chat_text(tok: Any, user: str, template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The chat-templated text of a one-turn user message, ending with the assistant header."""
    return tok.apply_chat_template(
        [{"role": "user", "content": user}],
        tokenize=False,
        add_generation_prompt=True,
        **dict(template_kwargs or {}),
    )


def end_of_turn_text(tok: Any, template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The text of the template's end-of-turn token ("" when it has none)."""
    eot = end_of_turn_id(tok, template_kwargs)
    return "" if eot is None else tok.decode([eot], skip_special_tokens=False)
