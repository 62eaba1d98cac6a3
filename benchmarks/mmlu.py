"""MMLU accuracy as the locality check, the way UnKE's official code measures it.

The prompt is plain text (no chat template): the Hendrycks header, ``shots`` solved dev examples of the
question's subject, then the question ending in ``Answer:``. The prediction is the letter among A-D
whose token has the highest next-token logit (a letter may be tokenised with or without a leading
space; the better of the two counts). Prompts are batched with left padding and explicit position ids,
so a batch scores exactly like its prompts one by one.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .datasets import MMLUItem

__all__ = ["format_mmlu_prompt", "letter_scores", "letter_token_ids", "mmlu_accuracy"]

_LETTERS = "ABCD"


def _example(question: str, choices: Sequence[str], answer: int | None) -> str:
    text = question + "".join(f"\n{_LETTERS[j]}. {c}" for j, c in enumerate(choices)) + "\nAnswer:"
    return text + (f" {_LETTERS[answer]}\n\n" if answer is not None else "")


def format_mmlu_prompt(item: MMLUItem) -> str:
    """Hendrycks' few-shot MMLU prompt for one test item."""
    head = f"The following are multiple choice questions (with answers) about {item.subject.replace('_', ' ')}.\n\n"
    return head + "".join(_example(q, c, a) for q, c, a in item.shots) + _example(item.question, item.choices, None)


def letter_token_ids(tokenizer: Any) -> list[list[int]]:
    """For each of A-D, the token ids that spell it right after ``Answer:`` (with and without a space)."""
    out = []
    for letter in _LETTERS:
        ids = {tokenizer(v, add_special_tokens=False)["input_ids"][-1] for v in (f" {letter}", letter)}
        out.append(sorted(ids))
    return out


@torch.inference_mode()
def letter_scores(model: Any, tokenizer: Any, items: Sequence[MMLUItem], batch_size: int = 4) -> list[list[float]]:
    """Next-token logit of each letter A-D after each item's prompt (the best of its spellings)."""
    from hpse_easyedit.rollout import input_device

    device = input_device(model)  # the embedding's device: the first parameter may sit elsewhere under device_map
    encoded = [tokenizer(format_mmlu_prompt(it))["input_ids"] for it in items]
    letters = letter_token_ids(tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    order = sorted(range(len(items)), key=lambda i: len(encoded[i]))  # similar lengths share a batch
    # Only the last position's logits are read: skip the [B, T, V] head product where the model allows it
    # (transformers >= 4.50 names it logits_to_keep; a model or wrapper that refuses it gets the full product).
    last_only: dict = {"logits_to_keep": 1}
    scores: list[list[float]] = [[] for _ in items]
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            width = max(len(encoded[i]) for i in idx)
            ids = torch.full((len(idx), width), pad, dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            for row, i in enumerate(idx):
                ids[row, width - len(encoded[i]):] = torch.tensor(encoded[i])
                mask[row, width - len(encoded[i]):] = 1
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            inputs = dict(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device))
            try:
                logits = model(**inputs, **last_only).logits[:, -1].float()
            except TypeError:
                if not last_only:
                    raise
                last_only = {}
                logits = model(**inputs).logits[:, -1].float()
            for row, i in enumerate(idx):
                scores[i] = [max(logits[row, t].item() for t in cand) for cand in letters]
    finally:
        model.train(was_training)
    return scores


def mmlu_accuracy(model: Any, tokenizer: Any, items: Sequence[MMLUItem], batch_size: int = 4) -> tuple[float, list[int]]:
    """Accuracy on ``items`` and the predicted choice index per item (in the items' order)."""
    if not items:
        raise ValueError("MMLU subset is empty; use --mmlu-n N with N > 0, or 0 to skip MMLU")
    preds = [max(range(4), key=lambda j: s[j]) for s in letter_scores(model, tokenizer, items, batch_size)]
    return sum(p == it.answer for p, it in zip(preds, items)) / len(items), preds
