"""Many independent edits at once: ``hpse_edit_cases`` edits B cases of one frozen model in one
batched pass, each case exactly as ``hpse_edit`` edits it alone.

A case is what ``hpse_edit`` takes (one request or several, edited jointly). The B cases share the
frozen model and nothing else: each has its own trainable tensors (``executors/stacked.py``: stacked
LoRA adapters applied per batch row, or stacked copies of FT-M's matrix), its own Adam state, its
own rollouts, losses, divergence test and result. Each round runs

- ONE batched hybrid rollout: every case's student rows (each on its own adapter) and their teacher
  rows (adapters off, each with its own passage in context), each request stopping at its own stop
  token, the gate applied per row against that row's own teacher;
- per inner step ONE forward/backward per loss term over every case's rows; the loss is the SUM of
  the cases' solo losses, so the gradient of each case's tensors is its solo gradient;
- one Adam step over the stacked tensors, which is elementwise and so B solo Adam steps.

A case whose request is malformed, or whose loss diverges, is reported failed (its message is the
solo edit's) and leaves the batch; the others go on unchanged. The model's own tensors are never
written: ``CaseEdit.tensors`` holds what a solo edit of that case leaves in the model, under the
same names, and ``apply_case_edit`` puts it in (``executors.resume_edit``) for answering.

Exactly the solo edit up to float rounding (``tests/test_batched.py``: within 1e-9 in float64 for
LoRA and FT-M, static and dynamic decode); in float32, sums over a wider padded batch round
differently in their last bits, which can flip a greedy token where two are within rounding.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from .edit_requests import RequestError
from .editor import _logits_from, edit_prompts
from .executors import resume_edit
from .executors.stacked import StackedExecutor, make_stacked
from .fast_decode import few_row_linears
from .hparams import HPSEHyperParams
from .locks import editing
from .losses import sequence_nll, topk_forward_kl
from .model_calls import input_device
from .padding import next_token_labels, pad_rows, pad_token_id
from .prompts import EditPrompts, stop_token_ids
from .rollout import Rollout, batched_hybrid_rollouts
from .static_decode import decode_mode
from .training import (
    _diverged,
    activation_checkpointing,
    cpu_half_backward,
    trained_tensors_problem,
)

__all__ = ["CaseEdit", "apply_case_edit", "hpse_edit_cases"]

logger = logging.getLogger(__name__)


@dataclass
class CaseEdit:
    """One case's edit from ``hpse_edit_cases``: what ``hpse_edit`` alone would have returned for
    it, with the trained tensors by name instead of an edited model; ``error`` when it failed."""

    tensors: dict = field(default_factory=dict)  # solo parameter name -> edited value
    rounds: list = field(default_factory=list)  # per-round statistics, as EditResult.rounds
    rollouts: list = field(default_factory=list)  # per round: its Rollout per request, or None
    teacher_forward_tokens: int = 0
    seconds: float = 0.0  # the whole batch's time (the cases ran together)
    error: str | None = None  # why the case failed (its tensors are then its starting values)
    #: the case's tensors before its edit: ``restore_weights(model, start)`` undoes
    #: ``apply_case_edit``
    start: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None


class _Case:
    """A live case inside the batch: its index in the stacked tensors, prompts and records."""

    def __init__(self, index: int, prompts: Sequence[EditPrompts], result: CaseEdit) -> None:
        self.index, self.prompts, self.result = index, list(prompts), result
        self.rollouts: list[Rollout] | None = None
        self.history: list[tuple[float, dict]] = []


def _rows_of(cases: Sequence[_Case]) -> list[int]:
    """The stacked index of each training row: every request of each live case, in order."""
    return [c.index for c in cases for _ in c.prompts]


def _round_rollouts(
    stacked: StackedExecutor,
    cases: Sequence[_Case],
    hparams: HPSEHyperParams,
    stop_ids: Sequence[int],
    pad_id: int,
) -> None:
    """One batched rollout of every live case's requests; each case keeps its own."""
    model = stacked.model
    mode = decode_mode(hparams.static_decode, model)
    requests = [(p.student_ids, p.teacher_ids) for c in cases for p in c.prompts]
    with few_row_linears(model, enabled=hparams.fast_decode):
        rollouts = batched_hybrid_rollouts(
            model,
            stacked.row_switch_for(_rows_of(cases)),
            requests,
            tau=hparams.tau,
            kappa=hparams.kappa,
            top_k=hparams.top_k,
            max_new_tokens=hparams.max_new_tokens,
            stop_ids=stop_ids,
            pad_id=pad_id,
            hybrid=hparams.rollout == "hybrid",
            compiled=mode == "compile",
            stop_every=hparams.decode_stop_every,
            static=bool(mode),
        )
    at = 0
    for c in cases:
        c.rollouts = rollouts[at : at + len(c.prompts)]
        at += len(c.prompts)


def _kl_batch(cases: Sequence[_Case], pad_id: int, device: torch.device) -> dict:
    seqs = [p.student_ids + r.tokens.tolist() for c in cases for p, r in zip(c.prompts, c.rollouts)]
    ids, mask = pad_rows(seqs, pad_id)
    spans, row = [], 0
    for c in cases:
        case_spans = []
        for p, r in zip(c.prompts, c.rollouts):
            case_spans.append((row, len(p.student_ids) - 1, len(r)))
            row += 1
        spans.append(case_spans)
    return {
        "ids": ids.to(device),
        "mask": mask.to(device),
        "spans": spans,
        "first": min(s for case_spans in spans for _, s, _ in case_spans),
        "topk_ids": [torch.cat([r.teacher_topk_ids for r in c.rollouts]) for c in cases],
        "topk_lp": [torch.cat([r.teacher_topk_logprobs for r in c.rollouts]) for c in cases],
    }


def _nll_batch(cases: Sequence[_Case], pad_id: int, device: torch.device) -> dict:
    prompts = [p for c in cases for p in c.prompts]
    seqs = [p.student_ids + p.passage_ids for p in prompts]
    ids, mask = pad_rows(seqs, pad_id)
    labels = next_token_labels(seqs, [len(p.student_ids) for p in prompts])
    bounds, row = [], 0
    for c in cases:
        bounds.append((row, row + len(c.prompts)))
        row += len(c.prompts)
    return {
        "ids": ids.to(device),
        "mask": mask.to(device),
        "labels": labels.to(device),
        "bounds": bounds,
        "first": min(len(p.student_ids) for p in prompts) - 1,
    }


def _kl_values(model: Any, batch: dict, hparams: HPSEHyperParams) -> list[torch.Tensor]:
    """Each case's KL term (summed over its rollout positions, divided by its request count)."""
    logits, first = _logits_from(
        model, batch["ids"], batch["mask"], batch["first"], hparams.scored_logits_only
    )
    values = []
    for spans, ids, lp in zip(batch["spans"], batch["topk_ids"], batch["topk_lp"]):
        picked = torch.cat([logits[r, s - first : s - first + n] for r, s, n in spans])
        kl = topk_forward_kl(
            picked,
            ids.to(picked.device),
            lp.to(picked.device),
            student=hparams.kl_student,
        )
        values.append(kl / len(spans))
    return values


def _nll_values(model: Any, batch: dict, hparams: HPSEHyperParams) -> list[torch.Tensor]:
    """Each case's passage NLL (summed over its passage tokens, divided by its request count)."""
    logits, first = _logits_from(
        model, batch["ids"], batch["mask"], batch["first"], hparams.scored_logits_only
    )
    labels = batch["labels"][:, first:].to(logits.device)
    return [sequence_nll(logits[a:b], labels[a:b]) / (b - a) for a, b in batch["bounds"]]


def cases_per_pass(hparams: HPSEHyperParams, model: Any) -> int | None:
    """How many cases share a training forward (``hparams.cases_per_pass``; None: all of them)."""
    setting = getattr(hparams, "cases_per_pass", "auto")
    if setting == "auto":
        return None if input_device(model).type == "cuda" else 1
    return int(setting)


def _passes(cases: Sequence[_Case], size: int | None) -> list[list[_Case]]:
    size = size or len(cases)
    return [list(cases[s : s + size]) for s in range(0, len(cases), size)]


def _round_batches(
    cases: Sequence[_Case], hparams: HPSEHyperParams, pad_id: int, device: torch.device, size: Any
) -> list[tuple[list[_Case], dict]]:
    """The training batches of a round: per pass of ``size`` cases, its KL and NLL rows."""
    out = []
    for group in _passes(cases, size):
        batches = {}
        if hparams.kl_weight > 0:
            batches["kl"] = _kl_batch(group, pad_id, device)
        if hparams.nll_weight > 0:
            batches["nll"] = _nll_batch(group, pad_id, device)
        out.append((group, batches))
    return out


def _pass_values(
    stacked: StackedExecutor,
    group: Sequence[_Case],
    batches: dict,
    hparams: HPSEHyperParams,
    backward: bool,
) -> list[dict[str, torch.Tensor]]:
    """One pass's term values per case (detached), each term back-propagated on its own when
    ``backward`` (the loss the sum of the cases' solo losses: each case's gradient is its own)."""
    per_case: list[dict[str, torch.Tensor]] = [{} for _ in group]
    rows = _rows_of(group)
    for name, weight, values_of in (
        ("kl", hparams.kl_weight, _kl_values),
        ("nll", hparams.nll_weight, _nll_values),
    ):
        batch = batches.get(name)
        if batch is None:
            continue
        with stacked.rows(rows):
            values = values_of(stacked.model, batch, hparams)
            if backward and weight > 0:
                torch.stack([weight * v for v in values]).sum().backward()
        for slot, v in zip(per_case, values):
            slot[name] = v.detach()
    return per_case


def _inner_step(
    stacked: StackedExecutor,
    passes: Sequence[tuple[list[_Case], dict]],
    hparams: HPSEHyperParams,
    optimizer: torch.optim.Optimizer,
) -> list[dict[str, float]]:
    """One Adam step of every live case, its gradients accumulated pass by pass; each case's term
    values, read on the host."""
    optimizer.zero_grad(set_to_none=True)
    per_case = [
        slot
        for group, batches in passes
        for slot in _pass_values(stacked, group, batches, hparams, backward=True)
    ]
    optimizer.step()
    return [{n: float(v) for n, v in slot.items()} for slot in per_case]


def _fail(stacked: StackedExecutor, case: _Case, start: dict, message: str) -> None:
    """Take ``case`` out of the batch: its tensors back at their start, its error recorded."""
    stacked.set_case(case.index, start)
    case.result.error = message
    case.result.rounds = []  # a failed case reports no rounds, as a failed solo edit's record
    case.result.tensors = {n: t.clone() for n, t in start.items()}


def _round_stats(case: _Case, r: int, seconds: float, rollout_seconds: float) -> dict:
    ros = case.rollouts
    n_tokens = sum(len(ro) for ro in ros) if ros else 0
    stats = {
        "round": r,
        "stepin_rate": (sum(ro.stepin_count for ro in ros) / max(n_tokens, 1)) if ros else None,
        "rollout_len": (n_tokens / len(ros)) if ros else 0.0,
        "rollout_seconds": rollout_seconds,
        "loss": case.history[0][0],
        "loss_last": case.history[-1][0],
    }
    for name in ("kl", "nll"):
        stats[name] = case.history[0][1].get(name)
        stats[f"{name}_last"] = case.history[-1][1].get(name)
    stats["seconds"] = seconds
    return stats


def hpse_edit_cases(
    model: Any,
    tok: Any,
    cases: Sequence[Any],
    hparams: HPSEHyperParams,
    *,
    starts: Sequence[dict | None] | None = None,
) -> list[CaseEdit]:
    """Edit each of ``cases`` (requests as ``hpse_edit`` takes them) into ``model`` independently,
    all in one batched pass; returns one ``CaseEdit`` per case, in order.

    ``starts[i]``: case i's trainable tensors before its edit (solo names, as ``CaseEdit.tensors``
    gives them: a continual sequence's state after its earlier edits); None or absent: the model's
    own (a fresh adapter, or FT-M's matrix as the model holds it). ``model`` is left as it came.
    """
    if hparams.kl_weight == 0 and hparams.nll_weight == 0:
        raise ValueError(
            "kl_weight and nll_weight are both 0, so the edit would train nothing; set one of "
            "them > 0"
        )
    if not cases:
        return []
    if starts is not None and len(starts) != len(cases):
        raise ValueError(f"starts has {len(starts)} entries for {len(cases)} cases")
    start_time = time.perf_counter()
    results = [CaseEdit() for _ in cases]
    stop_ids = stop_token_ids(model, tok)
    pad_id = pad_token_id(tok, stop_ids)
    live: list[_Case] = []
    for i, requests in enumerate(cases):
        try:
            live.append(_Case(i, edit_prompts(model, tok, requests, hparams), results[i]))
        except RequestError as e:
            results[i].error = str(e)
    with editing(model):  # a second thread's edit of the same model is refused, not interleaved
        stacked = make_stacked(model, hparams, len(cases))
        try:
            base_start = stacked.start_tensors()
            case_start = []
            for i in range(len(cases)):
                given = starts[i] if starts is not None else None
                case_start.append(base_start if given is None else given)
                if given is not None:
                    stacked.set_case(i, given)
            for i, r in enumerate(results):
                r.start = {n: t.clone() for n, t in case_start[i].items()}
                if r.error is not None:
                    r.tensors = {n: t.clone() for n, t in case_start[i].items()}
            _train(stacked, live, case_start, hparams, stop_ids, pad_id)
            for c in live:
                if c.result.error is None:
                    c.result.tensors = stacked.case_tensors(c.index)
        finally:
            stacked.close()
    seconds = time.perf_counter() - start_time
    for r in results:
        r.seconds = seconds
    return results


def _train(
    stacked: StackedExecutor,
    live: list[_Case],
    case_start: Sequence[dict],
    hparams: HPSEHyperParams,
    stop_ids: Sequence[int],
    pad_id: int,
) -> None:
    """R rounds x (one batched rollout, M batched Adam steps) over the live cases; a diverging case
    leaves the batch as ``train_edit`` would stop its solo edit."""
    model = stacked.model
    device = input_device(model)
    optimizer = stacked.optimizer()
    was_training = model.training
    per_pass = cases_per_pass(hparams, model)
    passes: list = []
    for r in range(1, hparams.rounds + 1):
        if not live:
            break
        t0 = time.perf_counter()
        model.eval()
        if hparams.kl_weight > 0:
            _round_rollouts(stacked, live, hparams, stop_ids, pad_id)
            for c in live:
                c.result.rollouts.append(c.rollouts)
                c.result.teacher_forward_tokens += sum(
                    ro.teacher_forward_tokens for ro in c.rollouts
                )
        else:
            for c in live:
                c.result.rollouts.append(None)
        rollout_seconds = time.perf_counter() - t0
        model.train(was_training)
        passes = _round_batches(live, hparams, pad_id, device, per_pass)
        for c in live:
            c.history = []
        with (
            activation_checkpointing(model, getattr(hparams, "gradient_checkpointing", False)),
            cpu_half_backward(model),
        ):
            steps = [
                _inner_step(stacked, passes, hparams, optimizer) for _ in range(hparams.inner_steps)
            ]
        weights = {"kl": hparams.kl_weight, "nll": hparams.nll_weight}
        failed = []
        for k, c in enumerate(live):
            for step, values in enumerate(s[k] for s in steps):
                total = sum(weights[n] * values[n] for n in ("kl", "nll") if n in values)
                start = c.history[0][0] if c.history else None
                if _diverged(total, start, hparams.max_loss_growth):
                    growth = (
                        f" (round start {start:.4g}, max_loss_growth {hparams.max_loss_growth:g})"
                        if start is not None
                        else ""
                    )
                    failed.append(c)
                    _fail(
                        stacked,
                        c,
                        case_start[c.index],
                        _diverged_message(
                            r, f"inner step {step + 1}: loss {total:.4g}{growth}", hparams
                        ),
                    )
                    break
                c.history.append((total, values))
        seconds = time.perf_counter() - t0
        for c in live:
            if c not in failed:
                c.result.rounds.append(_round_stats(c, r, seconds, rollout_seconds))
        live[:] = [c for c in live if c not in failed]
        if failed:
            _freeze(stacked, optimizer, [c.index for c in failed], case_start)
        logger.info(
            "HPSE round %d/%d: %d case(s) at once, %d failed, %.1fs",
            r,
            hparams.rounds,
            len(live),
            len(failed),
            seconds,
        )
    model.train(was_training)
    optimizer.zero_grad(set_to_none=True)
    if live:
        _final_check(
            stacked, [(g, b) for g, b in passes if any(c in live for c in g)], case_start, hparams
        )


def _diverged_message(round_: int, what: str, hparams: HPSEHyperParams) -> str:
    """The solo edit's ``EditDivergedError`` message (``training._stop_diverged``)."""
    return (
        f"the HPSE edit diverged in round {round_}, {what}; the edit was undone and nothing is "
        f"kept. Lower 'lr' in the hparams (now {hparams.lr:g})"
    )


def _final_check(
    stacked: StackedExecutor,
    passes: Sequence[tuple[list[_Case], dict]],
    case_start: Sequence[dict],
    hparams: HPSEHyperParams,
) -> None:
    """The solo edit's check after its last update (``training.trained_tensors_problem``): each
    case's tensors finite and bounded, its loss after the last step finite and within
    ``max_loss_growth`` of its last round's first loss; a case that fails it is failed."""
    weights = {"kl": hparams.kl_weight, "nll": hparams.nll_weight}
    with torch.no_grad():
        values = [
            (c, slot)
            for group, batches in passes
            for c, slot in zip(group, _pass_values(stacked, group, batches, hparams, False))
        ]
    for c, slot in values:
        if c.result.error is not None:
            continue
        final = sum(weights[n] * float(v) for n, v in slot.items())
        problem = trained_tensors_problem(
            stacked.case_tensors(c.index),
            final_loss=final,
            round_start_loss=c.result.rounds[-1]["loss"],
            max_loss_growth=hparams.max_loss_growth,
        )
        if problem is not None:
            _fail(
                stacked,
                c,
                case_start[c.index],
                _diverged_message(hparams.rounds, f"after its last inner step: {problem}", hparams),
            )


def _freeze(
    stacked: StackedExecutor,
    optimizer: torch.optim.Optimizer,
    indices: Sequence[int],
    case_start: Sequence[dict],
) -> None:
    """Keep failed cases at their start for the rest of the batch: Adam's moments would move them
    with a zero gradient, so after every later step their values are put back."""
    frozen = list(indices)

    def hold(*_: Any) -> None:
        for i in frozen:
            stacked.set_case(i, case_start[i])

    optimizer.register_step_post_hook(hold)


def apply_case_edit(model: Any, hparams: HPSEHyperParams, tensors: dict) -> Any:
    """``model`` (unedited) with one case's edit put in, as its solo edit would have left it;
    returns the model to use. ``restore_weights(model, start)`` with the case's starting tensors
    (``CaseEdit`` of a fresh case: the executor's initial values) undoes it."""
    return resume_edit(model, hparams, tensors)
