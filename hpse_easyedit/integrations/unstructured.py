"""HPSE and COIN* as methods of EasyEdit's unstructured pipeline (``examples/run_AKEW_both.py``).

That script does not go through ``BaseEditor``: it keeps a table ``UNSTRUCTURED_ALG_DICT = {name:
(hparams class, apply function)}``, reads the hparams with ``params_class.from_json(path)``, loads
``AKEWUnifiedDataset(..., use_unstructured_data=True)`` and calls ``apply_algo(model, tok, hparams,
batch_data, **ex_args)`` on a list of its items (``{"id", "question", "para_question", "answer",
"sub_question", "sub_answer"}``). For a name other than ``LoRA_uns`` and ``FT_uns`` it takes what
the function returns as ``weights_copy``, ``{parameter name: tensor before the edit}``, generates
its answers with the model it passed in, and undoes the edit with
``nethook.get_parameter(model, name)[...] = tensor``. The entries here return exactly that, named
as in the model the script holds, so one line

    "HPSE": (HPSEHyperParams, apply_hpse_uns_to_model),

makes HPSE a method of the script, restored by its own code. With the LoRA executor the adapter
stays in the model (its weights back at their initial values, ``lora_B`` zero, so it adds nothing)
and the next edit continues in it, as a fresh adapter would start (the same seeded values).

An item becomes one request: the passage is its ``answer`` (without the end-of-turn marker
EasyEdit's dataset appends for Llama-3 and Qwen2.5), and the editing prompt is ``editing_prompt``
filled with the item's ``subject`` when it has one (``attach_subjects``: the paper's untargeted
regime), otherwise the item's ``question`` itself (the targeted regime, as EasyEdit's ``LoRA_uns``
trains). A question the dataset already wrapped in the chat template is reduced to the user's
words, so the template is applied once.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch

from ..edit_requests import RequestError
from ..prompts import end_of_turn_id
from .entries import apply_coin_to_model, apply_hpse_to_model

__all__ = [
    "apply_coin_uns_to_model",
    "apply_hpse_uns_to_model",
    "attach_subjects",
    "strip_end_of_turn",
    "uns_requests",
    "user_message",
]

_PROBE = "HPSEPROBEQUESTION"


def user_message(tok: Any, text: str, template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The user's words of ``text``: ``text`` itself when it is plain, the user turn's content when
    it is already a one-turn chat prompt in the tokenizer's template ending with the assistant
    header (as EasyEdit's dataset writes Llama-3 and Qwen2.5 questions). EasyEdit leaves out the
    default system message some templates add, so only the user header and the generation header
    are matched."""
    try:
        rendered = tok.apply_chat_template(
            [{"role": "user", "content": _PROBE}],
            tokenize=False,
            add_generation_prompt=True,
            **dict(template_kwargs or {}),
        )
    except Exception:  # a tokenizer without a chat template: nothing can be templated
        return text
    head, _, tail = rendered.partition(_PROBE)
    if not tail.strip() or not text.endswith(tail):
        return text
    body = text[: len(text) - len(tail)]
    for start in range(len(head)):  # the longest end of the user header that the text contains
        header = head[start:]
        at = body.rfind(header)
        if header.strip() and at >= 0:
            return body[at + len(header) :]
    return text


def strip_end_of_turn(tok: Any, passage: str) -> str:
    """``passage`` without a trailing end-of-turn marker (``<|im_end|>``, ``<|eot_id|>``, the EOS
    text): EasyEdit's dataset appends it to the answers of Llama-3 and Qwen2.5, and the edit appends
    its own end-of-turn token."""
    ids = (end_of_turn_id(tok), tok.eos_token_id)
    markers = {tok.convert_ids_to_tokens(i) for i in ids if i is not None}
    for marker in sorted(markers, key=len, reverse=True):
        if marker and passage.endswith(marker):
            return passage[: len(passage) - len(marker)]
    return passage


def uns_requests(tok: Any, batch_data: Sequence[Mapping[str, Any]], hparams: Any) -> list[dict]:
    """``AKEWUnifiedDataset`` items -> edit requests (``prompt``, ``subject``, ``target_new``).

    With a ``subject`` the prompt is ``hparams.editing_prompt`` about it; without one the prompt is
    the item's question, which also stands for ``s`` in the privileged teacher's question ("What
    is established here about <question>? ...").
    """
    if isinstance(batch_data, Mapping) or not isinstance(batch_data, Sequence) or not batch_data:
        raise RequestError(
            "batch_data must be a non-empty list of AKEWUnifiedDataset items "
            "(use_unstructured_data=True), e.g. ds[0:1]"
        )
    template_kwargs = getattr(hparams, "chat_template_kwargs", None)
    requests = []
    for i, item in enumerate(batch_data):
        if not isinstance(item, Mapping):
            raise RequestError(
                f"batch item {i}: expected an AKEWUnifiedDataset item (a dict), "
                f"got {type(item).__name__}"
            )
        where = f"batch item {i} (id {item.get('id')!r})"
        passage = item.get("answer")
        if not isinstance(passage, str) or not passage.strip():
            raise RequestError(
                f"{where}: 'answer' must be the passage to inject, got {passage!r}; "
                "load AKEWUnifiedDataset with use_unstructured_data=True"
            )
        passage = strip_end_of_turn(tok, passage)
        subject = item.get("subject")
        if isinstance(subject, str) and subject.strip():
            requests.append({"subject": subject.strip(), "target_new": passage})
            continue
        question = item.get("question")
        if not isinstance(question, str) or not question.strip():
            raise RequestError(
                f"{where}: needs a 'subject' or a 'question' to edit with, got "
                f"question {question!r}; add 'subject' (attach_subjects)"
            )
        question = user_message(tok, question, template_kwargs).strip()
        requests.append({"prompt": question, "subject": question, "target_new": passage})
    return requests


def attach_subjects(dataset: Any, subjects: Mapping[str, str] | None = None) -> int:
    """Give the items of EasyEdit's ``AKEWUnifiedDataset`` their topic phrase ``subject``, so that
    they are edited with the untargeted prompt ``Introduce {subject}.`` (the paper's regime);
    returns how many got one.

    The subject is the record's ``requested_rewrite`` subject (MQuAKE-CF: its first rewrite, whose
    passage the item carries; CounterFact, WikiUpdate), else ``subjects[record id]`` (UnKEBench has
    no subject field: pass ``json.load`` of a file of record id -> phrase, such as
    ``unkebench/subjects.json``). The items the dataset holds get the key in place.
    """
    raw = getattr(dataset, "raw_data", None)
    if raw is None:
        raise TypeError(
            "attach_subjects needs EasyEdit's AKEWUnifiedDataset (with raw_data), "
            f"got {type(dataset).__name__}"
        )
    found = 0
    for index in range(len(dataset)):
        item = dataset[index]
        record = raw[item["id"]]
        rewrite = record.get("requested_rewrite")
        if isinstance(rewrite, list):
            rewrite = rewrite[0] if rewrite else None
        subject = rewrite.get("subject") if isinstance(rewrite, Mapping) else None
        if not subject and subjects is not None:
            subject = subjects.get(str(record.get("id", item["id"])))
        if isinstance(subject, str) and subject.strip():
            item["subject"] = subject.strip()
            found += 1
    return found


def _changed_tensors(
    model: Any, edited: Any, weights: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``weights`` (named in ``edited``, e.g. a peft ``PeftModel`` around ``model``) named as in
    ``model``."""
    names = {id(p): n for n, p in model.named_parameters()}
    out = {}
    for name, value in weights.items():
        param = edited.get_parameter(name)
        if id(param) not in names:
            raise RuntimeError(
                f"the edited tensor {name} is not a parameter of the model passed "
                "in; pass the model itself, not a copy"
            )
        out[names[id(param)]] = value
    return out


def _uns_entry(
    apply_to_model: Callable[..., tuple[Any, Any]], method: str, name: str
) -> Callable[..., dict]:
    def apply(
        model: Any, tok: Any, hparams: Any, batch_data: Sequence[Mapping[str, Any]], **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        requests = uns_requests(tok, batch_data, hparams)
        edited, weights = apply_to_model(model, tok, requests, hparams)
        return _changed_tensors(model, edited, weights)

    apply.__name__ = apply.__qualname__ = name
    apply.__doc__ = (
        f"{method} under the signature of EasyEdit's unstructured methods, ``apply(model, tok, "
        "hparams, batch_data, **kwargs)``: edits ``model`` in place with the items of "
        "``batch_data`` jointly and returns ``weights_copy``, ``{parameter name in model: tensor "
        "before the edit}``, which run_AKEW_both.py writes back to undo the edit. ``kwargs`` "
        "(EasyEdit passes ``ex_data`` to UnKE-style methods) are not used."
    )
    return apply


apply_hpse_uns_to_model = _uns_entry(apply_hpse_to_model, "HPSE", "apply_hpse_uns_to_model")
apply_coin_uns_to_model = _uns_entry(apply_coin_to_model, "COIN*", "apply_coin_uns_to_model")
