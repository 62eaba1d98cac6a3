"""``apply_hpse_to_model``: R rounds of (one greedy hybrid rollout, then M Adam steps on it).

Data flows one way: requests -> prompts (``prompts.py``) -> rollout (``rollout.py``) -> loss
(``losses.py``) -> executor update (``executors/``) -> edited model.
"""

from __future__ import annotations

import copy as copy_module
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from .executors import make_executor
from .hparams import HPSEHyperParams
from .losses import sequence_nll, topk_forward_kl
from .prompts import EditPrompts, build_edit_prompts, stop_token_ids
from .rollout import Rollout, batched_hybrid_rollout, hybrid_rollout, input_device

__all__ = ["EditResult", "RequestError", "apply_hpse_to_model", "edit_prompts", "hpse_edit", "normalize_requests"]

logger = logging.getLogger(__name__)


class RequestError(ValueError):
    """An edit request is malformed; the message names the request, the field and the fix."""


@dataclass
class EditResult:
    """What one edit produced: the edited model, what restores it, and per-round statistics."""

    model: Any
    weights_copy: dict
    rounds: list = field(default_factory=list)
    seconds: float = 0.0
    teacher_forward_tokens: int = 0
    inner_step_teacher_passes: int = 0
    rollouts: list = field(default_factory=list)  # per round: that round's Rollout per request, or None (no KL term)


def normalize_requests(requests: Any, hparams: HPSEHyperParams) -> list[dict]:
    """EasyEdit request dicts -> ``{"prompt", "subject", "target_new"}`` with clear errors for bad input."""
    if isinstance(requests, Mapping):
        requests = [requests]
    if not isinstance(requests, Sequence) or isinstance(requests, str) or not requests:
        raise RequestError("requests must be a non-empty list of dicts with 'subject' and 'target_new' (the passage)")
    out = []
    head, _, tail = hparams.editing_prompt.partition("{subject}")
    for i, req in enumerate(requests):
        if not isinstance(req, Mapping):
            raise RequestError(f"request {i}: expected a dict, got {type(req).__name__}")
        passage = req.get("target_new")
        if isinstance(passage, Mapping):
            passage = passage.get("str")
        if not isinstance(passage, str) or not passage.strip():
            raise RequestError(f"request {i}: 'target_new' must be the non-empty passage to inject, got {passage!r}")
        subject = req.get("subject")
        prompt = req.get("prompt")
        if isinstance(subject, str) and not subject.strip():
            subject = None
        if isinstance(prompt, str) and not prompt.strip():
            prompt = None
        if subject is None and prompt is None:
            raise RequestError(
                f"request {i}: needs 'subject' (the topic phrase s of 'Introduce {{s}}.'); "
                f"'prompt' alone is accepted when it follows editing_prompt {hparams.editing_prompt!r}"
            )
        if subject is None:
            if prompt.startswith(head) and prompt.endswith(tail) and len(prompt) > len(head) + len(tail):
                subject = prompt[len(head): len(prompt) - len(tail)]
            else:
                raise RequestError(
                    f"request {i}: 'subject' is missing and cannot be read from prompt {prompt!r} "
                    f"(editing_prompt is {hparams.editing_prompt!r}); add a 'subject' field"
                )
        if not isinstance(subject, str):
            raise RequestError(f"request {i}: 'subject' must be a string, got {type(subject).__name__}")
        if prompt is None:
            prompt = hparams.editing_prompt.format(subject=subject)
        if not isinstance(prompt, str):
            raise RequestError(f"request {i}: 'prompt' must be a string, got {type(prompt).__name__}")
        out.append({"prompt": prompt, "subject": subject, "target_new": passage})
    return out


def _check_lengths(prompts: Sequence[EditPrompts], hparams: HPSEHyperParams) -> None:
    for i, p in enumerate(prompts):
        nll_len = len(p.student_ids) + len(p.passage_ids)
        longest = max(nll_len, len(p.student_ids) + hparams.max_new_tokens, len(p.teacher_ids) + hparams.max_new_tokens)
        if longest > hparams.max_length:
            raise RequestError(
                f"request {i} ({p.subject!r}): its sequences need {longest} tokens (passage {len(p.passage_ids)}, "
                f"teacher prompt {len(p.teacher_ids)}, max_new_tokens {hparams.max_new_tokens}) but max_length is "
                f"{hparams.max_length}; raise max_length in the hparams or shorten the passage"
            )


def edit_prompts(model: Any, tok: Any, requests: Any, hparams: HPSEHyperParams) -> list[EditPrompts]:
    """What an edit trains on, per request: student prompt, teacher prompt and passage ids, as ``hparams``
    words them (teacher style, facts, chat template), with bad requests and over-long sequences refused."""
    reqs = normalize_requests(requests, hparams)
    model_type = getattr(getattr(model, "config", None), "model_type", "")
    prompts = build_edit_prompts(
        tok, model_type, reqs, teacher_prompt_style=hparams.teacher_prompt_style,
        teacher_facts=hparams.teacher_facts, template_kwargs=hparams.chat_template_kwargs,
    )
    _check_lengths(prompts, hparams)
    return prompts


def _pad_batch(sequences: list[list[int]], labels: list[list[int]], pad_id: int, device: torch.device):
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    lab = torch.full((len(sequences), width), -100, dtype=torch.long)
    for row, (s, l) in enumerate(zip(sequences, labels)):
        ids[row, : len(s)] = torch.tensor(s)
        mask[row, : len(s)] = 1
        lab[row, : len(l)] = torch.tensor(l)
    return ids.to(device), mask.to(device), lab.to(device)


class _NLLBatch:
    """Prompt + passage rows, labels on the passage tokens: the NLL anchor, fixed for the whole edit."""

    def __init__(self, prompts: Sequence[EditPrompts], pad_id: int, device: torch.device) -> None:
        seqs = [p.student_ids + p.passage_ids for p in prompts]
        labels = [[-100] * len(p.student_ids) + p.passage_ids for p in prompts]
        self.ids, self.mask, lab = _pad_batch(seqs, labels, pad_id, device)
        self.labels = torch.cat([lab[:, 1:], torch.full_like(lab[:, :1], -100)], dim=1)  # logits[t] predicts t+1

    def loss(self, model: Any) -> torch.Tensor:
        logits = model(input_ids=self.ids, attention_mask=self.mask).logits
        return sequence_nll(logits, self.labels.to(logits.device))  # logits sit on the last layer's device


class _KLBatch:
    """Prompt + rollout rows with the teacher's cached top-K per rollout position: the hybrid KL term."""

    def __init__(self, prompts: Sequence[EditPrompts], rollouts: Sequence[Rollout], pad_id: int,
                 device: torch.device) -> None:
        seqs = [p.student_ids + r.tokens.tolist() for p, r in zip(prompts, rollouts)]
        self.ids, self.mask, _ = _pad_batch(seqs, [[] for _ in seqs], pad_id, device)
        self.spans = [(row, len(p.student_ids) - 1, len(r)) for row, (p, r) in enumerate(zip(prompts, rollouts))]
        # The rollout keeps the teacher's top-K beside the logits (the last layer's device under device_map);
        # the loss is computed there, so only these small [T, K] tensors ever move, never [T, V] logits.
        self.topk_ids = torch.cat([r.teacher_topk_ids for r in rollouts])
        self.topk_lp = torch.cat([r.teacher_topk_logprobs for r in rollouts])

    def loss(self, model: Any, student: str = "full") -> torch.Tensor:
        logits = model(input_ids=self.ids, attention_mask=self.mask).logits
        picked = torch.cat([logits[row, start: start + length] for row, start, length in self.spans])
        return topk_forward_kl(picked, self.topk_ids.to(picked.device), self.topk_lp.to(picked.device), student=student)


def hpse_edit(
    model: Any,
    tok: Any,
    requests: Any,
    hparams: HPSEHyperParams,
    *,
    keep_original_weight: bool = False,
) -> EditResult:
    """Inject the passages of ``requests`` jointly into ``model`` with HPSE (or one of its ablations).

    Loss per inner step, averaged over requests: ``kl_weight * sum_t KL_topK(pi* || pi_theta)`` over
    the round's rollout positions plus ``nll_weight * NLL(passage | editing prompt)``. With
    ``kl_weight == 0`` no rollout is drawn at all: the plain executor baseline.
    """
    if hparams.kl_weight == 0 and hparams.nll_weight == 0:
        raise ValueError("kl_weight and nll_weight are both 0, so the edit would train nothing; set one of them > 0")
    start = time.perf_counter()
    prompts = edit_prompts(model, tok, requests, hparams)
    stop_ids = stop_token_ids(model, tok)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else next(iter(stop_ids), 0)

    executor = make_executor(model, hparams, keep_original_weight=keep_original_weight)
    weights_copy = executor.weights_copy()
    student = executor.model
    device = input_device(student)
    optimizer = executor.optimizer()
    use_kl = hparams.kl_weight > 0
    use_nll = hparams.nll_weight > 0
    nll_batch = _NLLBatch(prompts, pad_id, device) if use_nll else None
    result = EditResult(model=student, weights_copy=weights_copy)
    was_training = student.training
    teacher_passes = [0]
    inner_phase = [False]

    def counted_teacher_context():
        teacher_passes[0] += inner_phase[0]
        return executor.teacher_context()

    def counted_row_switch(rows: torch.Tensor):
        teacher_passes[0] += inner_phase[0]
        return executor.row_switch(rows)

    batched = hparams.batched_rollout and hasattr(executor, "row_switch")

    for r in range(1, hparams.rounds + 1):
        t0 = time.perf_counter()
        rollouts = None
        if use_kl:
            student.eval()
            gate = dict(tau=hparams.tau, kappa=hparams.kappa, top_k=hparams.top_k,
                        max_new_tokens=hparams.max_new_tokens, stop_ids=stop_ids, hybrid=hparams.rollout == "hybrid")
            if batched:
                rollouts = [batched_hybrid_rollout(student, counted_row_switch, p.student_ids, p.teacher_ids,
                                                   pad_id=pad_id, **gate) for p in prompts]
            else:
                rollouts = [hybrid_rollout(student, student, p.student_ids, p.teacher_ids,
                                           teacher_context=counted_teacher_context, **gate) for p in prompts]
            result.teacher_forward_tokens += sum(ro.teacher_forward_tokens for ro in rollouts)
        t_rollout = time.perf_counter() - t0
        kl_batch = _KLBatch(prompts, rollouts, pad_id, device) if rollouts is not None else None
        student.train(was_training or hparams.lora_dropout > 0)
        history = []
        inner_phase[0] = True
        for _ in range(hparams.inner_steps):
            # The two terms are separate forward/backward passes accumulating into one Adam step, so
            # activation memory peaks at the larger of the two rather than their sum.
            optimizer.zero_grad(set_to_none=True)
            kl = nll = None
            if use_nll:
                nll = nll_batch.loss(student) / len(prompts)
                (hparams.nll_weight * nll).backward()
            if kl_batch is not None:
                kl = kl_batch.loss(student, hparams.kl_student) / len(prompts)
                (hparams.kl_weight * kl).backward()
            optimizer.step()
            kl_v = None if kl is None else kl.item()
            nll_v = None if nll is None else nll.item()
            history.append((hparams.kl_weight * (kl_v or 0.0) + hparams.nll_weight * (nll_v or 0.0), kl_v, nll_v))
        inner_phase[0] = False
        n_tokens = sum(len(ro) for ro in rollouts) if rollouts else 0
        stats = {
            "round": r,
            "stepin_rate": (sum(ro.stepin_count for ro in rollouts) / max(n_tokens, 1)) if rollouts else None,
            "rollout_len": (n_tokens / len(rollouts)) if rollouts else 0.0,
            "loss": history[0][0],
            "loss_last": history[-1][0],
            "kl": history[0][1],
            "kl_last": history[-1][1],
            "nll": history[0][2],
            "nll_last": history[-1][2],
            "rollout_seconds": t_rollout,
            "seconds": time.perf_counter() - t0,
        }
        result.rounds.append(stats)
        result.rollouts.append(rollouts)
        logger.info(
            "HPSE round %d/%d: step-in %s, rollout %.1f tok, loss %.4f -> %.4f (kl %s, nll %s), %.1fs",
            r, hparams.rounds,
            "n/a" if stats["stepin_rate"] is None else f"{100 * stats['stepin_rate']:.1f}%",
            stats["rollout_len"], stats["loss"], stats["loss_last"],
            "n/a" if stats["kl"] is None else f"{stats['kl']:.3f}",
            "n/a" if stats["nll"] is None else f"{stats['nll']:.3f}", stats["seconds"],
        )
    student.train(was_training)
    optimizer.zero_grad(set_to_none=True)
    executor.finish()
    result.inner_step_teacher_passes = teacher_passes[0]
    result.seconds = time.perf_counter() - start
    return result


def apply_hpse_to_model(
    model: Any,
    tok: Any,
    requests: Any,
    hparams: HPSEHyperParams,
    copy: bool = False,
    return_orig_weights: bool = False,
    keep_original_weight: bool = False,
    **kwargs: Any,
) -> tuple[Any, dict]:
    """EasyEdit's editor contract: ``(edited_model, weights_copy)``.

    ``weights_copy`` holds, for the tensors this edit changed only (LoRA adapter weights or the one
    FT-M matrix), their values before the edit; ``restore_weights(edited_model, weights_copy)``
    brings back the unedited model bit for bit. It is returned whatever ``return_orig_weights`` says,
    since it costs only those tensors. Per-round statistics are on ``edited_model.hpse_last_edit``.
    """
    if copy:
        model = copy_module.deepcopy(model)
    result = hpse_edit(model, tok, requests, hparams, keep_original_weight=keep_original_weight)
    try:
        result.model.hpse_last_edit = {"rounds": result.rounds, "seconds": result.seconds}
    except Exception:  # pragma: no cover - exotic module types
        pass
    return result.model, result.weights_copy
