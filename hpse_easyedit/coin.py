"""COIN*: next-token fine-tuning on the passage over long and short contexts, regularised against
context reliance.

COIN (Zhou et al. 2026, "Uncovering Context Reliance in Unstructured Knowledge Editing", arXiv
2602.19043) observes that knowledge learned by next-token prediction (NTP) on a passage becomes
bound to the passage's preceding text ("context reliance"): the edited model recalls a fact when the
sentences before it are present and fails when they are not. COIN adds a Context Alignment Loss and
a Knowledge Consistency Loss to NTP so that the model keeps each piece of knowledge within its local
scope. There is no official code. The HPSE paper reproduced it as COIN* ("we keep its training over
both long and short contexts, and remove additional context data augmentation"); this module is our
reproduction of that description, with every assumption below explicit and switchable in the
hparams.

Per request (editing prompt ``x`` = ``Introduce {s}.`` through the chat template, passage ``c`` cut
into sentence chunks ``c_1 .. c_n``; the end-of-turn token closes ``c`` and its last chunk):

- long context:  ``x + c``  (the whole passage, as every NTP editor trains),
- short context: ``x + c_j`` for every chunk ``j`` (the sentence without the sentences before it).

Loss, summed over tokens and averaged over requests (the HPSE engine's convention)::

    L = long_weight  * NLL(c | x)
      + short_weight * sum_j NLL(c_j | x)
      + cons_weight  * sum_j sum_t KL( p(. | x, c_<j, c_j<t) [no grad] || p(. | x, c_j<t) )
      + align_weight * sum_j sum_t (1 - cos(h_t^long, h_t^short))

Assumptions (the paper's method section was not available to us; see docs/EASYEDIT.md):

1. Short contexts are sentences (as ``hpse_easyedit.text.sentence_spans`` splits them, the splitter
   the benchmarks use: ``.``, ``!`` or ``?`` before an upper-case word, not after initials or
   titles, and at line breaks; merged when shorter than ``min_chunk_tokens``, split when longer than
   ``max_chunk_tokens``), each placed right
   after the editing prompt. Token ids are the passage's own ids (one tokenisation), so each chunk
   token is the same token in both contexts.
2. Knowledge Consistency Loss: forward KL from the long-context next-token distribution (target, no
   gradient) to the short-context one, over every token of every chunk: what the model predicts for
   a fact with the whole passage before it must also be predicted from the fact's own sentence.
3. Context Alignment Loss: ``1 - cosine`` between the hidden states (``align_layer``, default the
   last) of each chunk token in the long and the short context, gradient through both: the
   representation a fact is stored against should not depend on the text before its sentence.
4. No augmentation data and no extra model: the passage is the only source of knowledge.
5. Parameterisation and budget: the same executors as the LoRA/FT-M baselines (LoRA r=12 on every
   projection by default) and the same number of Adam steps (40 = 5 rounds x 8 inner steps), so that
   a comparison with them isolates the objective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
import torch.nn.functional as F

from .edit_requests import RequestError, normalize_requests
from .executors import make_executor
from .hparams import ExecutorHParams, HParamsError, hp_field
from .locks import editing
from .losses import sequence_nll
from .model_calls import input_device
from .padding import next_token_labels, pad_rows, pad_token_id
from .prompts import chat_prompt_ids, end_of_turn_id
from .text import sentence_spans
from .training import EditResult, Terms, train_edit

__all__ = [
    "COINHyperParams",
    "COINObjective",
    "coin_edit",
    "context_consistency_kl",
    "hidden_alignment",
    "sentence_chunks",
]


@dataclass
class COINHyperParams(ExecutorHParams):
    """Hyper-parameters of one COIN* edit (see the module docstring for each loss term)."""

    ALG_NAME = "COIN"

    alg_name: str = hp_field(
        "COIN", "Method name; must be COIN (EasyEdit dispatches on it).", choices=("COIN",)
    )
    steps: int = hp_field(
        40, "Adam steps on the fixed long + short batch (40 = the LoRA baseline's 5 x 8).", min=1
    )
    long_weight: float = hp_field(
        1.0, "Weight of NLL(passage | editing prompt), the long context.", min=0.0
    )
    short_weight: float = hp_field(
        1.0, "Weight of NLL(chunk | editing prompt) over every chunk, the short contexts.", min=0.0
    )
    cons_weight: float = hp_field(
        1.0,
        "Knowledge Consistency Loss: KL(long-context || short-context) next-token distributions.",
        min=0.0,
    )
    align_weight: float = hp_field(
        1.0,
        "Context Alignment Loss: 1 - cos of chunk-token hidden states, long vs short context.",
        min=0.0,
    )
    align_layer: int = hp_field(
        -1, "Hidden state aligned: index into the model's hidden_states (-1 = last layer)."
    )
    min_chunk_tokens: int = hp_field(
        4, "Sentences shorter than this many tokens merge into their neighbour.", min=1
    )
    max_chunk_tokens: int = hp_field(
        64, "Sentences longer than this many tokens are split into windows of this size.", min=2
    )

    def check(self, source: str) -> None:
        if self.long_weight == self.short_weight == self.cons_weight == self.align_weight == 0:
            raise HParamsError(
                f"{source}: every loss weight is 0, so the "
                "edit would train nothing; set one of them > 0"
            )
        if self.min_chunk_tokens > self.max_chunk_tokens:
            raise HParamsError(
                f"{source}: min_chunk_tokens ({self.min_chunk_tokens}) must be <= "
                f"max_chunk_tokens ({self.max_chunk_tokens})"
            )


# -------------------------------------------------------------------------------------- pure pieces
def sentence_chunks(
    text: str, offsets: Sequence[tuple[int, int]], *, min_tokens: int = 4, max_tokens: int = 64
) -> list[tuple[int, int]]:
    """Token spans ``[start, end)`` of the sentences of ``text``, given each token's character
    offsets.

    A new chunk starts at the first token that begins at or after a sentence end. Chunks shorter
    than ``min_tokens`` merge into the previous chunk (the first into the next); chunks longer than
    ``max_tokens`` are split into consecutive windows. The spans cover every token, in order.
    """
    n = len(offsets)
    if n == 0:
        return []
    ends = [end for _, end in sentence_spans(text)]
    starts = [0]
    e = 0
    for i in range(1, n):
        while e < len(ends) and ends[e] <= offsets[i - 1][0]:
            e += 1
        if e < len(ends) and offsets[i][0] >= ends[e] and offsets[i - 1][1] <= ends[e]:
            starts.append(i)
            e += 1
    spans = [(s, t) for s, t in zip(starts, starts[1:] + [n])]
    merged: list[list[int]] = []
    for s, t in spans:
        if merged and (t - s < min_tokens or merged[-1][1] - merged[-1][0] < min_tokens):
            merged[-1][1] = t
        else:
            merged.append([s, t])
    out: list[tuple[int, int]] = []
    for s, t in merged:
        while t - s > max_tokens:
            out.append((s, s + max_tokens))
            s += max_tokens
        out.append((s, t))
    return out


def context_consistency_kl(long_logits: torch.Tensor, short_logits: torch.Tensor) -> torch.Tensor:
    """Summed ``KL(p_long || p_short)`` over positions; ``p_long`` is the target (no gradient)."""
    target = F.log_softmax(long_logits.detach().float(), dim=-1)
    pred = F.log_softmax(short_logits.float(), dim=-1)
    return (target.exp() * (target - pred)).sum()


def hidden_alignment(long_hidden: torch.Tensor, short_hidden: torch.Tensor) -> torch.Tensor:
    """Summed ``1 - cos`` between matching rows of two ``[T, H]`` hidden-state tensors (gradient
    through both)."""
    return (1.0 - F.cosine_similarity(long_hidden.float(), short_hidden.float(), dim=-1)).sum()


# ----------------------------------------------------------------------------------------- the edit
@dataclass
class _Item:
    prompt_ids: list[int]
    passage_ids: list[int]
    chunks: list[tuple[int, int]]


def _build_items(tok: Any, reqs: list[dict], hparams: COINHyperParams) -> list[_Item]:
    eot = end_of_turn_id(tok, hparams.chat_template_kwargs)
    items = []
    for i, req in enumerate(reqs):
        prompt = chat_prompt_ids(tok, req["prompt"], template_kwargs=hparams.chat_template_kwargs)
        enc = tok(req["target_new"], add_special_tokens=False, return_offsets_mapping=True)
        ids = [int(t) for t in enc["input_ids"]]
        offsets = [tuple(o) for o in enc["offset_mapping"]]
        chunks = sentence_chunks(
            req["target_new"],
            offsets,
            min_tokens=hparams.min_chunk_tokens,
            max_tokens=hparams.max_chunk_tokens,
        )
        if eot is not None:
            ids.append(eot)
            s, _ = chunks[-1]
            chunks[-1] = (s, len(ids))
        longest = len(prompt) + len(ids)
        if longest > hparams.max_length:
            raise RequestError(
                f"request {i} ({req['subject']!r}): prompt + passage need {longest} tokens but "
                f"max_length is {hparams.max_length}; raise "
                "max_length in the hparams or shorten the passage"
            )
        items.append(_Item(prompt, ids, chunks))
    return items


def _batch(rows: list[list[int]], label_from: list[int], pad_id: int, device: torch.device):
    ids, mask = pad_rows(rows, pad_id)
    return ids.to(device), mask.to(device), next_token_labels(rows, label_from).to(device)


class COINObjective:
    """COIN*'s loss on the fixed long + short batch (the module docstring gives each term); one
    backward per step over all terms, since the consistency and alignment terms share the two
    forwards."""

    name = "COIN*"
    terms = ("long", "short", "cons", "align")

    def __init__(
        self, items: Sequence[_Item], hparams: COINHyperParams, pad_id: int, device: torch.device
    ) -> None:
        self.hp, self.n = hparams, len(items)
        self.long = _batch(
            [it.prompt_ids + it.passage_ids for it in items],
            [len(it.prompt_ids) for it in items],
            pad_id,
            device,
        )
        self.use_short = any(
            w > 0 for w in (hparams.short_weight, hparams.cons_weight, hparams.align_weight)
        )
        self.pairs: list[
            tuple[int, int, int, int]
        ] = []  # (long row, long first position, short row, chunk length)
        short_rows: list[list[int]] = []
        self.short_from: list[int] = []
        for r, it in enumerate(items):
            for a, b in it.chunks:
                self.pairs.append((r, len(it.prompt_ids) + a, len(short_rows), b - a))
                short_rows.append(it.prompt_ids + it.passage_ids[a:b])
                self.short_from.append(len(it.prompt_ids))
        self.short = _batch(short_rows, self.short_from, pad_id, device) if self.use_short else None

    def start_round(self, student: Any) -> dict:
        return {"chunks": len(self.pairs)}

    def step(self, student: Any) -> Iterator[Terms]:
        hp, n, pairs, short_from = self.hp, self.n, self.pairs, self.short_from
        need_hidden = hp.align_weight > 0
        long_ids, long_mask, long_labels = self.long
        out_long = student(
            input_ids=long_ids, attention_mask=long_mask, output_hidden_states=need_hidden
        )
        # labels go to the logits (the last layer's device when the model spans several GPUs)
        terms = {
            "long": (
                hp.long_weight,
                sequence_nll(out_long.logits, long_labels.to(out_long.logits.device)) / n,
            )
        }
        if self.use_short:
            short_ids, short_mask, short_labels = self.short
            out_short = student(
                input_ids=short_ids, attention_mask=short_mask, output_hidden_states=need_hidden
            )
            terms["short"] = (
                hp.short_weight,
                sequence_nll(out_short.logits, short_labels.to(out_short.logits.device)) / n,
            )
            # logits at position p predict token p+1: a chunk starting at long position q is
            # predicted from q-1 .. q+len-2 (long) and from prompt_len-1 .. prompt_len+len-2
            # (short).
            lg_long = torch.cat([out_long.logits[r, q - 1 : q - 1 + k] for r, q, _, k in pairs])
            lg_short = torch.cat(
                [
                    out_short.logits[s, short_from[s] - 1 : short_from[s] - 1 + k]
                    for _, _, s, k in pairs
                ]
            )
            terms["cons"] = (hp.cons_weight, context_consistency_kl(lg_long, lg_short) / n)
            if need_hidden:
                h_long_all = out_long.hidden_states[hp.align_layer]
                h_short_all = out_short.hidden_states[hp.align_layer]
                h_long = torch.cat([h_long_all[r, q : q + k] for r, q, _, k in pairs])
                h_short = torch.cat(
                    [h_short_all[s, short_from[s] : short_from[s] + k] for _, _, s, k in pairs]
                )
                terms["align"] = (hp.align_weight, hidden_alignment(h_long, h_short) / n)
        yield terms

    def describe_round(self, stats: dict) -> str:
        parts = [
            f"{t} {stats[t]:.4f} -> {stats[t + '_last']:.4f}"
            for t in self.terms
            if stats.get(t) is not None
        ]
        return f"{self.n} request(s), {stats['chunks']} chunk(s), " + ", ".join(parts)


def coin_edit(
    model: Any,
    tok: Any,
    requests: Any,
    hparams: COINHyperParams,
    *,
    keep_original_weight: bool = False,
) -> EditResult:
    """Inject the passages of ``requests`` jointly with COIN*: ``hparams.steps`` Adam steps of
    ``COINObjective`` through the shared training loop (one round); returns the edited model and
    what restores it."""
    reqs = normalize_requests(requests, hparams)
    items = _build_items(tok, reqs, hparams)
    pad_id = pad_token_id(tok)
    with editing(model):  # a second thread's edit of the same model is refused, not interleaved
        executor = make_executor(model, hparams, keep_original_weight=keep_original_weight)
        objective = COINObjective(items, hparams, pad_id, input_device(executor.model))
        return train_edit(executor, hparams, objective, rounds=1, inner_steps=hparams.steps)
