"""One padding helper for everything that batches token ids: training rows (right-padded, with
next-token labels) and prompts to decode from (left-padded, so every row's last token sits at the
same position).

Written here rather than with ``tokenizer.pad`` because the rollout and the training batches hold
token ids without a tokenizer in reach, and the labels need their own fill value (-100).
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch

__all__ = ["IGNORE", "next_token_labels", "pad_rows", "pad_token_id"]

#: the label value ``cross_entropy`` ignores
IGNORE = -100


def pad_rows(
    rows: Sequence[Sequence[int]], pad_id: int, *, left: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` padded to the longest with ``pad_id``: ids ``[B, W]`` and attention mask ``[B, W]``
    (both long, CPU).

    ``left=True`` puts the padding before each row (for decoding); otherwise after it (for
    training).
    """
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if len(r):
            span = slice(width - len(r), width) if left else slice(0, len(r))
            ids[i, span] = torch.tensor(list(r), dtype=torch.long)
            mask[i, span] = 1
    return ids, mask


def next_token_labels(rows: Sequence[Sequence[int]], label_from: Sequence[int]) -> torch.Tensor:
    """Labels for a next-token NLL over right-padded ``rows``: ``labels[b, t]`` is the token at
    ``t + 1`` of row ``b`` when ``t + 1 >= label_from[b]``, else ``IGNORE`` (so ``logits[b, t]`` is
    scored on it)."""
    labels, _ = pad_rows(
        [[IGNORE] * start + list(r[start:]) for r, start in zip(rows, label_from)], IGNORE
    )
    return torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE)], dim=1)


def pad_token_id(tok: Any, stop_ids: Iterable[int] = ()) -> int:
    """The id every batch pads with: the tokenizer's pad token; for a tokenizer without one, the
    smallest of ``stop_ids`` (the turn-ending tokens, which the model already treats as the end of
    text), else 0.

    Padded positions are masked out of attention and labels, so the id only has to be a valid
    token."""
    if tok.pad_token_id is not None:
        return tok.pad_token_id
    return min(stop_ids, default=0)
