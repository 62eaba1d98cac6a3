"""Student and privileged-teacher prompts, as token ids, through the tokenizer's chat template.

The student reads the untargeted editing prompt ``x`` (``Introduce {s}.``). The privileged teacher
is the same frozen model reading the passage ``c`` in its system prompt (paper Fig.
``teacher_prompt``) and asked the privileged question about ``s``. Both then continue the SAME
response tokens.

Wording and chat-role handling dispatch on ``model.config.model_type``; families whose chat template
has no system role get the system text folded into the user turn.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

__all__ = [
    "DEFAULT_SYSTEM",
    "LLAMA_SYSTEM",
    "PLAIN_SYSTEM",
    "PASSAGE_LABEL",
    "PRIVILEGED_QUESTION",
    "TEACHER_STYLES",
    "EditPrompts",
    "build_edit_prompts",
    "chat_prompt_ids",
    "end_of_turn_id",
    "has_system_role",
    "privileged_system",
    "stop_token_ids",
    "teacher_style_for",
    "text_ids",
]

DEFAULT_SYSTEM = (
    "You are answering strictly from the established facts given below.\n"
    "RULES:\n"
    "1. Use ONLY the information in these facts. Do not add, infer, or elaborate with any "
    "knowledge beyond them.\n2. If a detail (date, place, number, name) is not stated in the "
    "facts, do NOT invent or guess it -- simply omit it.\n3. Treat these facts as your own "
    "knowledge: answer naturally, do not mention 'the facts', 'the context', 'based on', or "
    "'according to'.\n4. Keep the answer to what the facts actually support.\n"
    "FACTS:\n{passage}"
)

LLAMA_SYSTEM = (
    "You know the following facts and treat them as true and current. Answer the question "
    "directly using them, in the THIRD PERSON as factual information -- never role-play or use "
    "'I'/speak as the subject. Cover every relevant fact the question calls for; be specific and "
    "do not omit details, but add nothing beyond these facts. Do not refuse, and do not mention "
    "'the facts', 'the context', or 'according to'.\nFACTS:\n"
    "This paragraph introduces {subject}.\n{passage}\n"
    "Use this information comprehensively: answer in full, including every relevant detail when "
    "answering relevant questions."
)

# Not in the paper: the passage alone, no rules. For small models, where a block of instructions
# ahead of the facts is more text to get lost in than guidance (see docs/RESULTS.md).
PLAIN_SYSTEM = "{passage}"

TEACHER_STYLES = {"default": DEFAULT_SYSTEM, "llama": LLAMA_SYSTEM, "plain": PLAIN_SYSTEM}

PASSAGE_LABEL = "About {subject}:\n{passage}"  # one passage under teacher_facts: labelled

PRIVILEGED_QUESTION = (
    "What is established here about {subject}? State, in full and in detail, every fact given "
    "about {subject} -- leave nothing out."
)

# model_type -> (teacher wording, chat template has a system role)
_FAMILIES: dict[str, tuple[str, bool]] = {
    "llama": ("llama", True),
    "qwen2": ("default", True),
    "qwen3": ("default", True),
    "qwen2_moe": ("default", True),
    "qwen3_moe": ("default", True),
    "gemma": ("default", False),
    "gemma2": ("default", False),
    "gemma3": ("default", True),
    "gemma3_text": ("default", True),
    "mistral": ("default", False),
}


def teacher_style_for(model_type: str, requested: str = "auto") -> str:
    """The privileged system-prompt wording: explicit choice, else the family's (Llama has its
    own)."""
    if requested != "auto":
        return requested
    return _FAMILIES.get(model_type, ("default", True))[0]


def has_system_role(
    tokenizer: Any, model_type: str, template_kwargs: Mapping[str, Any] | None = None
) -> bool:
    """Whether the model's chat template takes a system message (else it is folded into the user
    turn)."""
    template_kwargs = dict(template_kwargs or {})
    if model_type in _FAMILIES:
        return _FAMILIES[model_type][1]
    try:  # unknown family: ask the template itself
        tokenizer.apply_chat_template(
            [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
            tokenize=False,
            **template_kwargs,
        )
        return True
    except Exception:  # jinja raises for templates that reject the system role
        return False


def _as_ids(out: Any) -> list[int]:
    """apply_chat_template(tokenize=True) returns a list (4.x) or a BatchEncoding (5.x)."""
    if hasattr(out, "keys") and "input_ids" in out:
        out = out["input_ids"]
    if out and isinstance(out[0], list):
        out = out[0]
    return [int(t) for t in out]


def _control_texts(tokenizer: Any) -> list[str]:
    """The texts a tokenizer turns into special (control) ids wherever they appear, longest
    first."""
    found = {
        t.content
        for t in getattr(tokenizer, "added_tokens_decoder", {}).values()
        if getattr(t, "special", False)
    }
    found |= set(getattr(tokenizer, "all_special_tokens", []) or [])
    return sorted((t for t in found if t), key=len, reverse=True)


def text_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of user text (a passage, a subject, a question): a special token's text inside it,
    e.g. ``<|im_end|>``, stays ordinary text instead of becoming a control token
    (``split_special_tokens``); text without one gets the ids it always had."""
    return _as_ids(
        tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    )


_SLOT = "\ue000{}\ue001"
_SLOT_RE = re.compile("(\ue000\\d+\ue001)")


def chat_prompt_ids(
    tokenizer: Any,
    user: str,
    system: str | None = None,
    *,
    system_role: bool = True,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """Token ids of a one-turn chat ending with the assistant generation header.

    The messages are user text: where one holds a special token's text
    (``<|im_end|><|im_start|>user``), the template is rendered around placeholders and each message
    is tokenized as text into its place, so no message can end a turn or open another; other
    messages get exactly the template's own ids.
    """
    template_kwargs = dict(template_kwargs or {})
    if system is not None and not system_role:
        user, system = f"{system}\n\n{user}", None
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": user}
    ]
    controls = _control_texts(tokenizer)
    if not any(c in m["content"] for m in messages for c in controls):
        return _as_ids(
            tokenizer.apply_chat_template(
                messages, tokenize=True, add_generation_prompt=True, **template_kwargs
            )
        )
    slots = [{**m, "content": _SLOT.format(i)} for i, m in enumerate(messages)]
    rendered = tokenizer.apply_chat_template(
        slots, tokenize=False, add_generation_prompt=True, **template_kwargs
    )
    ids: list[int] = []
    for piece in _SLOT_RE.split(rendered):
        if _SLOT_RE.fullmatch(piece):
            ids += text_ids(tokenizer, messages[int(piece[1:-1])]["content"])
        elif piece:
            ids += _as_ids(tokenizer(piece, add_special_tokens=False)["input_ids"])
    return ids


def stop_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every token that ends an assistant turn: generation_config's EOS ids plus the tokenizer's
    EOS."""
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    for value in (eos, tokenizer.eos_token_id, end_of_turn_id(tokenizer)):
        if value is None:
            continue
        ids.update([value] if isinstance(value, int) else list(value))
    return ids


def end_of_turn_id(tokenizer: Any, template_kwargs: Mapping[str, Any] | None = None) -> int | None:
    """The special token the chat template puts after an assistant message (e.g. <|im_end|>,
    <end_of_turn>).

    Found by rendering a probe conversation as text and reading what follows the assistant content;
    this inspects the template once and never touches rollout tokens.
    """
    cache = getattr(tokenizer, "_hpse_end_of_turn", "missing")
    if cache != "missing":
        return cache
    marker = "ZQXJVKW"
    found: int | None = None
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": marker}],
            tokenize=False,
            **dict(template_kwargs or {}),
        )
        suffix = text[text.rindex(marker) + len(marker) :]
        special = set(tokenizer.all_special_ids)
        for tok in tokenizer(suffix, add_special_tokens=False)["input_ids"]:
            if tok in special:
                found = int(tok)
                break
    except Exception:  # a template that cannot render an assistant turn: fall back to EOS
        found = None
    if found is None and tokenizer.eos_token_id is not None:
        found = int(tokenizer.eos_token_id)
    try:
        tokenizer._hpse_end_of_turn = found
    except Exception:
        pass
    return found


def privileged_system(style: str, subject: str, passages: Sequence[str]) -> str:
    """The privileged teacher's system text in ``style`` (``TEACHER_STYLES``): the paper's wordings
    (Fig. ``teacher_prompt``, rules then the passages) or ``plain`` (the passages alone)."""
    return TEACHER_STYLES[style].format(passage="\n\n".join(passages), subject=subject)


@dataclass
class EditPrompts:
    """Token ids for one request: the student prompt, the teacher prompt, and the NLL target."""

    subject: str
    student_ids: list[int]
    teacher_ids: list[int]
    passage_ids: list[int]


def build_edit_prompts(
    tokenizer: Any,
    model_type: str,
    requests: Sequence[Mapping[str, Any]],
    *,
    teacher_prompt_style: str = "auto",
    teacher_facts: str = "request",
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[EditPrompts]:
    """Student/teacher prompt ids and passage target ids for each (normalised) request."""
    template_kwargs = dict(template_kwargs or {})
    style = teacher_style_for(model_type, teacher_prompt_style)
    system_role = has_system_role(tokenizer, model_type, template_kwargs)
    eot = end_of_turn_id(tokenizer, template_kwargs)
    all_passages = [r["target_new"] for r in requests]
    # 'labelled' (not in the paper): every passage, each headed by the subject it is about, so a
    # teacher introducing one subject can tell its facts from the facts of another request
    labelled = [
        PASSAGE_LABEL.format(subject=r["subject"], passage=r["target_new"]) for r in requests
    ]
    out = []
    for req in requests:
        subject, passage = req["subject"], req["target_new"]
        facts = {"all": all_passages, "labelled": labelled}.get(teacher_facts, [passage])
        system = privileged_system(style, subject, facts)
        teacher = chat_prompt_ids(
            tokenizer,
            PRIVILEGED_QUESTION.format(subject=subject),
            system,
            system_role=system_role,
            template_kwargs=template_kwargs,
        )
        student = chat_prompt_ids(tokenizer, req["prompt"], template_kwargs=template_kwargs)
        target = text_ids(tokenizer, passage)
        if eot is not None:
            target.append(eot)
        out.append(
            EditPrompts(
                subject=subject, student_ids=student, teacher_ids=teacher, passage_ids=target
            )
        )
    return out
