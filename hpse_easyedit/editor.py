"""``hpse_edit``: R rounds of (one greedy hybrid rollout, then M Adam steps on it).

Data flows one way: requests -> prompts (``prompts.py``) -> rollout (``rollout.py``) -> loss
(``losses.py``, the ``HPSEObjective`` here) -> the training loop and its executor (``training.py``,
``executors/``) -> edited model.
"""

from __future__ import annotations

import time
from typing import Any, Iterator, Sequence

import torch

from .captured import CapturedJoint, CapturedKL, CapturedNLL, logits_window, training_mode
from .edit_requests import RequestError, normalize_requests
from .executors import Executor, make_executor
from .hparams import HPSEHyperParams
from .locks import editing
from .losses import sequence_nll, topk_forward_kl
from .model_calls import input_device
from .padding import next_token_labels, pad_rows, pad_token_id
from .prompts import EditPrompts, build_edit_prompts, stop_token_ids
from .rollout import Rollout, draw_rollouts
from .training import EditResult, Terms, train_edit

__all__ = ["HPSEObjective", "edit_prompts", "hpse_edit"]


def _check_lengths(prompts: Sequence[EditPrompts], hparams: HPSEHyperParams) -> None:
    for i, p in enumerate(prompts):
        nll_len = len(p.student_ids) + len(p.passage_ids)
        longest = max(
            nll_len,
            len(p.student_ids) + hparams.max_new_tokens,
            len(p.teacher_ids) + hparams.max_new_tokens,
        )
        if longest > hparams.max_length:
            subject = p.subject if len(p.subject) <= 60 else p.subject[:57] + "..."
            longer = "subject" if len(p.student_ids) > len(p.passage_ids) else "passage"
            raise RequestError(
                f"request {i} ({subject!r}): its sequences need {longest} tokens (editing prompt "
                f"{len(p.student_ids)}, passage {len(p.passage_ids)}, teacher prompt "
                f"{len(p.teacher_ids)}, max_new_tokens {hparams.max_new_tokens}) but max_length "
                f"is {hparams.max_length}; raise max_length in the hparams or shorten the {longer}"
            )


def edit_prompts(
    model: Any, tok: Any, requests: Any, hparams: HPSEHyperParams
) -> list[EditPrompts]:
    """What an edit trains on, per request: student prompt, teacher prompt and passage ids, as
    ``hparams`` words them (teacher style, facts, chat template), with bad requests and over-long
    sequences refused."""
    reqs = normalize_requests(requests, hparams)
    model_type = getattr(getattr(model, "config", None), "model_type", "")
    prompts = build_edit_prompts(
        tok,
        model_type,
        reqs,
        teacher_prompt_style=hparams.teacher_prompt_style,
        teacher_facts=hparams.teacher_facts,
        template_kwargs=hparams.chat_template_kwargs,
    )
    _check_lengths(prompts, hparams)
    return prompts


def _logits_from(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, first: int, scored_only: bool = True
) -> tuple[torch.Tensor, int]:
    """The training forward's logits from position ``first`` on, and the position they start at.

    Only those positions are scored (the prompt before them is context), so with ``scored_only``
    (hparams ``scored_logits_only``) the output head and its backward skip the rest where the model
    takes ``logits_to_keep``; otherwise every position's logits come back, starting at 0. The kept
    logits, and so the gradients, are the same values either way.
    """
    keep, first = logits_window(model, ids.shape[1], first, scored_only)
    kwargs = {"logits_to_keep": keep} if keep else {}
    return model(input_ids=ids, attention_mask=mask, **kwargs).logits, first


class _NLLBatch:
    """Prompt + passage rows, labels on the passage tokens: the NLL anchor, fixed for the whole
    edit."""

    def __init__(self, prompts: Sequence[EditPrompts], pad_id: int, device: torch.device) -> None:
        seqs = [p.student_ids + p.passage_ids for p in prompts]
        ids, mask = pad_rows(seqs, pad_id)
        self.ids, self.mask = ids.to(device), mask.to(device)
        self.labels = next_token_labels(seqs, [len(p.student_ids) for p in prompts]).to(device)
        self.first = (
            min(len(p.student_ids) for p in prompts) - 1
        )  # the first position that predicts a label

    def loss(self, model: Any, scored_only: bool = True) -> torch.Tensor:
        logits, first = _logits_from(model, self.ids, self.mask, self.first, scored_only)
        return sequence_nll(
            logits, self.labels[:, first:].to(logits.device)
        )  # logits sit on the last layer's device


class _KLBatch:
    """Prompt + rollout rows with the teacher's cached top-K per rollout position: the hybrid KL
    term."""

    def __init__(
        self,
        prompts: Sequence[EditPrompts],
        rollouts: Sequence[Rollout],
        pad_id: int,
        device: torch.device,
    ) -> None:
        seqs = [p.student_ids + r.tokens.tolist() for p, r in zip(prompts, rollouts)]
        ids, mask = pad_rows(seqs, pad_id)
        self.ids, self.mask = ids.to(device), mask.to(device)
        self.spans = [
            (row, len(p.student_ids) - 1, len(r))
            for row, (p, r) in enumerate(zip(prompts, rollouts))
        ]
        # The rollout keeps the teacher's top-K beside the logits (the last layer's device under
        # device_map); the loss is computed there, so only these small [T, K] tensors ever move,
        # never [T, V] logits.
        self.topk_ids = torch.cat([r.teacher_topk_ids for r in rollouts])
        self.topk_lp = torch.cat([r.teacher_topk_logprobs for r in rollouts])

    def loss(self, model: Any, student: str = "full", scored_only: bool = True) -> torch.Tensor:
        logits, first = _logits_from(
            model, self.ids, self.mask, min(start for _, start, _ in self.spans), scored_only
        )
        picked = torch.cat(
            [
                logits[row, start - first : start - first + length]
                for row, start, length in self.spans
            ]
        )
        return topk_forward_kl(
            picked, self.topk_ids.to(picked.device), self.topk_lp.to(picked.device), student=student
        )


class HPSEObjective:
    """HPSE's loss, per inner step and averaged over requests: ``kl_weight * sum_t KL_topK(pi* ||
    pi_theta)`` over the round's rollout positions plus ``nll_weight * NLL(passage | editing
    prompt)``.

    Each round starts with one hybrid rollout per request (none when ``kl_weight == 0``: the plain
    executor baseline); its teacher top-K targets are cached, so the inner steps never run the
    teacher. The two terms are separate forward/backward passes accumulating into one Adam step, so
    activation memory peaks at the larger of the two rather than their sum. The KL pass (prompt and
    rollout, the larger one) runs first, so the NLL pass after it fits into the memory it freed.
    Each gradient entry is one sum of the two passes' contributions, which commutes: the order
    leaves the trained bits as they were (tests/test_editor.py). A captured step
    (``compile_training``) runs both terms as one pass over the stacked rows instead
    (``captured.CapturedJoint``): half the matrix products, both passes' activations at once.
    """

    name = "HPSE"
    terms = ("kl", "nll")

    def __init__(
        self,
        executor: Executor,
        prompts: Sequence[EditPrompts],
        hparams: HPSEHyperParams,
        *,
        stop_ids: Sequence[int],
        pad_id: int,
        captured: bool | None = None,
    ) -> None:
        self.executor, self.prompts, self.hp = executor, prompts, hparams
        self.stop_ids, self.pad_id = stop_ids, pad_id
        self.device = input_device(executor.model)
        #: the inner step's passes under torch.compile (hparams ``compile_training``; ``captured``
        #: decides instead where given, as the memory planner does for a card)
        self.captured = (
            training_mode(
                getattr(hparams, "compile_training", False),
                executor.model,
                getattr(hparams, "gradient_checkpointing", False),
            )
            if captured is None
            else captured
        )
        self.nll_batch = None
        if hparams.nll_weight > 0:
            self.nll_batch = (
                CapturedNLL(prompts, pad_id, self.device, graphs=self.captured == "graphs")
                if self.captured
                else _NLLBatch(prompts, pad_id, self.device)
            )
        self.kl_batch: _KLBatch | None = None
        #: the captured step's one pass over both terms' rows (both terms on, ``captured`` only)
        self.joint: CapturedJoint | None = None
        # per round: that round's Rollout per request, or None (no KL term)
        self.rollouts: list = []
        self.teacher_forward_tokens = 0

    def start_round(self, student: Any) -> dict:
        t0 = time.perf_counter()
        rollouts = None
        if self.hp.kl_weight > 0:
            rollouts = draw_rollouts(
                self.executor, self.prompts, self.hp, stop_ids=self.stop_ids, pad_id=self.pad_id
            )
            self.teacher_forward_tokens += sum(ro.teacher_forward_tokens for ro in rollouts)
        seconds = time.perf_counter() - t0
        self.use_rollouts(rollouts)
        n_tokens = sum(len(ro) for ro in rollouts) if rollouts else 0
        return {
            "stepin_rate": (sum(ro.stepin_count for ro in rollouts) / max(n_tokens, 1))
            if rollouts
            else None,
            "rollout_len": (n_tokens / len(rollouts)) if rollouts else 0.0,
            "rollout_seconds": seconds,
        }

    def use_rollouts(self, rollouts: Sequence[Rollout] | None) -> None:
        """Train the inner steps that follow on ``rollouts`` (one per request; None: no KL term), as
        a round does after drawing them (``start_round``); the memory planner hands in rollouts of
        the planned length."""
        self.kl_batch = None
        if rollouts is not None:
            self.kl_batch = (
                CapturedKL(
                    self.prompts, rollouts, self.pad_id, self.device, self.captured == "graphs"
                )
                if self.captured
                else _KLBatch(self.prompts, rollouts, self.pad_id, self.device)
            )
        self.joint = (
            CapturedJoint(self.kl_batch, self.nll_batch, self.pad_id)
            if self.captured and self.kl_batch is not None and self.nll_batch is not None
            else None
        )
        self.rollouts.append(rollouts)

    def step(self, student: Any) -> Iterator[Terms]:
        n = len(self.prompts)
        if self.joint is not None:
            kl, nll = self.joint.losses(student, self.hp.kl_student, self.hp.scored_logits_only)
            yield {"kl": (self.hp.kl_weight, kl / n), "nll": (self.hp.nll_weight, nll / n)}
            return
        if self.kl_batch is not None:
            kl = self.kl_batch.loss(student, self.hp.kl_student, self.hp.scored_logits_only)
            yield {"kl": (self.hp.kl_weight, kl / n)}
        if self.nll_batch is not None:
            yield {
                "nll": (
                    self.hp.nll_weight,
                    self.nll_batch.loss(student, self.hp.scored_logits_only) / n,
                )
            }

    def describe_round(self, stats: dict) -> str:
        def fmt(v: float | None, spec: str) -> str:
            return "n/a" if v is None else format(v, spec)

        return (
            "step-in "
            f"{fmt(None if stats['stepin_rate'] is None else 100 * stats['stepin_rate'], '.1f')}%, "
            f"rollout {stats['rollout_len']:.1f} tok, kl {fmt(stats['kl'], '.3f')}, "
            f"nll {fmt(stats['nll'], '.3f')}"
        )


def hpse_edit(
    model: Any,
    tok: Any,
    requests: Any,
    hparams: HPSEHyperParams,
    *,
    keep_original_weight: bool = False,
) -> EditResult:
    """Inject the passages of ``requests`` jointly into ``model`` with HPSE (or one of its
    ablations).

    ``hparams.rounds`` x (one rollout, ``hparams.inner_steps`` Adam steps) of ``HPSEObjective``
    through the shared training loop (``training.train_edit``). With ``kl_weight == 0`` no rollout
    is drawn at all: the plain executor baseline.
    """
    if hparams.kl_weight == 0 and hparams.nll_weight == 0:
        raise ValueError(
            "kl_weight and nll_weight are both 0, so the "
            "edit would train nothing; set one of them > 0"
        )
    start = time.perf_counter()
    prompts = edit_prompts(model, tok, requests, hparams)
    stop_ids = stop_token_ids(model, tok)
    pad_id = pad_token_id(tok, stop_ids)
    with editing(model):  # a second thread's edit of the same model is refused, not interleaved
        executor = make_executor(model, hparams, keep_original_weight=keep_original_weight)
        objective = HPSEObjective(executor, prompts, hparams, stop_ids=stop_ids, pad_id=pad_id)
        result = train_edit(
            executor, hparams, objective, rounds=hparams.rounds, inner_steps=hparams.inner_steps
        )
    result.rollouts = objective.rollouts
    result.teacher_forward_tokens = objective.teacher_forward_tokens
    result.seconds = time.perf_counter() - start
    return result
