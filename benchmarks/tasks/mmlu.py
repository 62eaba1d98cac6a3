"""MMLU accuracy as the locality check, the way UnKE's official code measures it.

The prompt is plain text (no chat template): the Hendrycks header, ``shots`` solved dev examples of
the question's subject, then the question ending in ``Answer:``. The prediction is the letter among
A-D whose token has the highest next-token logit (a letter may be tokenised with or without a
leading space; the better of the two counts). Prompts are batched with left padding and explicit
position ids, so a batch scores like its prompts one by one; the few-shot prefix a subject's
questions share is computed once per subject and its KV cache reused.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from hpse_easyedit.padding import pad_rows

from ..records.store import IncompleteRunError, write_json_atomic
from .datasets import MMLUItem, load_mmlu_subset

__all__ = [
    "MMLUProbe",
    "format_mmlu_prompt",
    "letter_scores",
    "letter_token_ids",
    "mmlu_accuracy",
]

_LETTERS = "ABCD"


def _example(question: str, choices: Sequence[str], answer: int | None) -> str:
    text = question + "".join(f"\n{_LETTERS[j]}. {c}" for j, c in enumerate(choices)) + "\nAnswer:"
    return text + (f" {_LETTERS[answer]}\n\n" if answer is not None else "")


def format_mmlu_prompt(item: MMLUItem) -> str:
    """Hendrycks' few-shot MMLU prompt for one test item."""
    head = (
        "The following are multiple choice questions (with answers) about "
        f"{item.subject.replace('_', ' ')}.\n\n"
    )
    return (
        head
        + "".join(_example(q, c, a) for q, c, a in item.shots)
        + _example(item.question, item.choices, None)
    )


def letter_token_ids(tokenizer: Any) -> list[list[int]]:
    """For each of A-D, the token ids that spell it right after ``Answer:`` (with and without a
    space)."""
    out = []
    for letter in _LETTERS:
        ids = {
            tokenizer(v, add_special_tokens=False)["input_ids"][-1] for v in (f" {letter}", letter)
        }
        out.append(sorted(ids))
    return out


def _shared_prefix_len(rows: Sequence[Sequence[int]]) -> int:
    """Tokens all ``rows`` start with, leaving each row at least its last token to compute."""
    n = min(len(r) for r in rows) - 1
    first = rows[0]
    for r in rows[1:]:
        k = 0
        while k < n and r[k] == first[k]:
            k += 1
        n = k
    return max(n, 0)


class _LastLogits:
    """The last position's logits of a forward; skips the [B, T, V] head product where the model
    allows it (transformers >= 4.50 names it logits_to_keep; a model or wrapper that refuses it gets
    the full product)."""

    def __init__(self, model: Any) -> None:
        self.model, self.keep = model, {"logits_to_keep": 1}

    def __call__(self, **inputs: Any) -> Any:
        try:
            return self.model(**inputs, **self.keep)
        except TypeError:
            if not self.keep:
                raise
            self.keep = {}
            return self.model(**inputs)


@torch.inference_mode()
def letter_scores(
    model: Any,
    tokenizer: Any,
    items: Sequence[MMLUItem],
    batch_size: int = 4,
    share_prefix: bool = True,
) -> list[list[float]]:
    """Next-token logit of each letter A-D after each item's prompt (the best of its spellings).

    ``share_prefix`` (default): the items of one subject share the header and the few-shot examples,
    so their common token prefix is run ONCE and its KV cache reused for each question's own tokens
    (the same token ids as the whole prompt, so the same predictions; logits agree to float
    rounding). ``share_prefix=False``: every prompt is run whole, batches of similar lengths (the
    earlier path).
    """
    from hpse_easyedit.model_calls import cache_keyword, input_device, output_cache

    device = input_device(
        model
    )  # the embedding's device: the first parameter may sit elsewhere under device_map
    encoded = [tokenizer(format_mmlu_prompt(it))["input_ids"] for it in items]
    letters = letter_token_ids(tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    forward = _LastLogits(model)
    cache_kw = cache_keyword(model)
    scores: list[list[float]] = [[] for _ in items]

    def score(idx: Sequence[int], logits: torch.Tensor) -> None:
        for row, i in enumerate(idx):
            scores[i] = [max(logits[row, t].item() for t in cand) for cand in letters]

    was_training = model.training
    model.eval()
    try:
        if not share_prefix:
            order = sorted(
                range(len(items)), key=lambda i: len(encoded[i])
            )  # similar lengths share a batch
            for start in range(0, len(order), batch_size):
                idx = order[start : start + batch_size]
                ids, mask = pad_rows([encoded[i] for i in idx], pad, left=True)
                positions = (mask.cumsum(-1) - 1).clamp(min=0)
                out = forward(
                    input_ids=ids.to(device),
                    attention_mask=mask.to(device),
                    position_ids=positions.to(device),
                )
                score(idx, out.logits[:, -1].float())
            return scores
        groups: dict[
            str, list[int]
        ] = {}  # the common token prefix is computed, so subject alone is safe
        for i, it in enumerate(items):
            groups.setdefault(it.subject, []).append(i)
        for members in groups.values():
            shared = _shared_prefix_len([encoded[i] for i in members])
            prefix_cache = None
            if shared:
                prefix_cache = _new_cache(model)
                prefix = torch.tensor(
                    [encoded[members[0]][:shared]], dtype=torch.long, device=device
                )
                prefix_cache = output_cache(
                    forward(input_ids=prefix, use_cache=True, **{cache_kw: prefix_cache})
                )
            order = sorted(members, key=lambda i: len(encoded[i]))
            for start in range(0, len(order), batch_size):
                idx = order[start : start + batch_size]
                ids, mask = pad_rows([encoded[i][shared:] for i in idx], pad, left=True)
                positions = shared + (mask.cumsum(-1) - 1).clamp(min=0)
                inputs = dict(input_ids=ids.to(device), position_ids=positions.to(device))
                if prefix_cache is not None:
                    cache = copy.deepcopy(prefix_cache)
                    cache.batch_repeat_interleave(len(idx))
                    mask = torch.cat([mask.new_ones(len(idx), shared), mask], dim=1)
                    inputs.update({cache_kw: cache, "use_cache": True})
                out = forward(attention_mask=mask.to(device), **inputs)
                score(idx, out.logits[:, -1].float())
    finally:
        model.train(was_training)
    return scores


def _new_cache(model: Any) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=getattr(model, "config", None))


def mmlu_accuracy(
    model: Any,
    tokenizer: Any,
    items: Sequence[MMLUItem],
    batch_size: int = 4,
    share_prefix: bool = True,
) -> tuple[float, list[int]]:
    """Accuracy on ``items`` and the predicted choice index per item (in the items' order)."""
    if not items:
        raise ValueError("MMLU subset is empty; use --mmlu-n N with N > 0, or 0 to skip MMLU")
    preds = [
        max(range(4), key=lambda j: s[j])
        for s in letter_scores(model, tokenizer, items, batch_size, share_prefix=share_prefix)
    ]
    return sum(p == it.answer for p, it in zip(preds, items)) / len(items), preds


class MMLUProbe:
    """MMLU as the locality check around a run's edits (a task that ``measures_mmlu``): the unedited
    model's accuracy once per output directory (``mmlu_before.json``), and the edited model's after
    every ``mmlu_every``-th edit (case in single mode, block in continual mode)."""

    enabled = True

    def __init__(self, options: Mapping[str, Any], data_dir: Path, out_dir: Path) -> None:
        self.options = options
        self.data_dir = data_dir
        self.path = out_dir / "mmlu_before.json"
        self.items: list[MMLUItem] = []

    def load(self) -> None:
        """The fixed subset (``mmlu_n`` questions, ``mmlu_shots`` dev examples each,
        ``mmlu_seed``)."""
        o = self.options
        self.items = load_mmlu_subset(
            self.data_dir, o["mmlu_n"], shots=o["mmlu_shots"], seed=o["mmlu_seed"]
        )

    def lacks_before(self) -> bool:
        """True when the unedited model's accuracy is still to be measured (the model must be loaded
        for it)."""
        return not self.path.is_file()

    def due(self, unit: int) -> bool:
        """MMLU after the edit of this case (single) or block (sequential): every ``mmlu_every``-th
        one, from the first."""
        return unit % self.options["mmlu_every"] == 0

    def measure(self, model: Any, tokenizer: Any) -> float:
        acc, _ = mmlu_accuracy(
            model, tokenizer, self.items, batch_size=self.options["mmlu_batch_size"]
        )
        return 100.0 * acc

    def before(self, unedited: Callable[[], tuple[Any, Any]] | None) -> float | None:
        """MMLU of the unedited model, computed once per output directory (``unedited()`` gives the
        model and its tokenizer; None: it must be recorded already, by the main process)."""
        if self.path.is_file():
            return json.loads(self.path.read_text(encoding="utf-8"))["MMLU_before"]
        if unedited is None:
            raise IncompleteRunError(
                f"{self.path} is missing; the main process computes it before its cases"
            )
        value = self.measure(*unedited())
        write_json_atomic(self.path, {"MMLU_before": value, "n": len(self.items)})
        return value
