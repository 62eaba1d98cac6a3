"""The hybrid rollout: greedy decoding in which the privileged teacher steps in token by token.

Student and teacher each keep their own KV cache and are advanced one token at a time on the same
response. At every position the teacher's top-K ids and log-probabilities are kept, so the M inner
steps of a round never run the teacher again. ``hybrid=False`` gives the plain on-policy rollout
(OPSD, the "w/o HP" ablation): the same loop with the gate switched off.

The engine asks for one round's rollouts through ``draw_rollouts`` (``draw_rollout`` for one
request); ``decode_route`` is the one place that chooses how they are decoded, from the hparams
(``DECODE_ROUTES``): every route gives the same tokens, step-ins and teacher top-K
(``tests/test_static_decode.py``, ``tests/test_rollout.py``), at different costs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterable, Sequence

import torch
import torch.nn.functional as F

from .fast_decode import few_row_linears
from .losses import stepin_decision
from .model_calls import accepts_keyword, cache_keyword, input_device, output_cache
from .padding import pad_rows
from .static_decode import compile_step, decode_mode, kept_decoder

__all__ = [
    "DECODE_ROUTES",
    "Rollout",
    "batched_hybrid_rollout",
    "batched_hybrid_rollouts",
    "decode_route",
    "draw_rollout",
    "draw_rollouts",
    "hybrid_rollout",
]


@dataclass
class Rollout:
    """One rollout: response token ids, where the teacher stepped in, and the teacher's top-K per
    position."""

    tokens: torch.Tensor  # [T] long
    stepped_in: torch.Tensor  # [T] bool
    teacher_topk_ids: torch.Tensor  # [T, K] long
    teacher_topk_logprobs: torch.Tensor  # [T, K] float32, full-vocabulary log-probs
    teacher_forward_tokens: int = 0  # tokens the teacher processed (prompt prefill + one per step)
    gate_gap: torch.Tensor | None = (
        None  # [T] float32, log pi*(y*) - log pi_theta(y*) at each position (the tau test)
    )

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def stepin_count(self) -> int:
        return int(self.stepped_in.sum())

    @property
    def stepin_rate(self) -> float:
        return self.stepin_count / max(len(self), 1)


def _step(model: torch.nn.Module, ids: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
    """One cached forward; returns the last position's float32 log-probs and the updated cache."""
    kwargs: dict = {"input_ids": ids, cache_keyword(model): cache, "use_cache": True}
    if accepts_keyword(model, "logits_to_keep"):
        kwargs["logits_to_keep"] = 1
    elif accepts_keyword(model, "num_logits_to_keep"):
        kwargs["num_logits_to_keep"] = 1
    out = model(**kwargs)
    return F.log_softmax(out.logits[:, -1, :].float(), dim=-1), output_cache(out)


def _new_cache(model: torch.nn.Module) -> Any:
    try:
        from transformers import DynamicCache

        cfg = getattr(model, "config", None)
        try:
            return DynamicCache(config=cfg) if cfg is not None else DynamicCache()
        except TypeError:
            return DynamicCache()
    except ImportError:  # pragma: no cover - very old transformers
        return None


class _Recorder:
    """The per-token gate and the records kept for the loss, of R requests decoded side by side (row
    i of every record is request i; R = 1 on the dynamic paths); shared by all rollout drivers."""

    def __init__(
        self,
        requests: int,
        max_new_tokens: int,
        top_k: int,
        vocab: int,
        tau: float,
        kappa: float,
        hybrid: bool,
        stop_ids: Iterable[int],
        device: torch.device,
    ) -> None:
        self.k = min(top_k, vocab)
        self.tau, self.kappa, self.hybrid = tau, kappa, hybrid
        self.stop = torch.tensor(sorted(set(int(i) for i in stop_ids)) or [-1], device=device)
        self.tokens = torch.empty(requests, max_new_tokens, dtype=torch.long, device=device)
        self.stepped = torch.zeros(requests, max_new_tokens, dtype=torch.bool, device=device)
        self.topk_ids = torch.empty(
            requests, max_new_tokens, self.k, dtype=torch.long, device=device
        )
        self.topk_lp = torch.empty(
            requests, max_new_tokens, self.k, dtype=torch.float32, device=device
        )
        self.gap = torch.empty(requests, max_new_tokens, dtype=torch.float32, device=device)
        self.n = 0

    def step(self, s_logp: torch.Tensor, t_logp: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """``record``, and whether to stop (the dynamic paths' one host sync per token): a request's
        stop token or ``max_new_tokens`` reached. One request only."""
        token = self.record(s_logp, t_logp)
        return token, bool(torch.isin(token, self.stop)) or self.n == self.tokens.shape[1]

    def record(self, s_logp: torch.Tensor, t_logp: torch.Tensor) -> torch.Tensor:
        """Record position n of every request from its student and teacher log-probs (``[R, V]``
        each); return the emitted tokens ``[R]`` (on the device; nothing is read on the host)."""
        s_logp, t_logp = s_logp.to(self.tokens.device), t_logp.to(self.tokens.device)
        gate, y_star, gap = stepin_decision(t_logp, s_logp, self.tau, self.kappa)
        if not self.hybrid:
            gate = torch.zeros_like(gate)
        token = torch.where(gate, y_star, s_logp.argmax(-1))
        values, ids = t_logp.topk(self.k)
        n = self.n
        self.tokens[:, n], self.stepped[:, n], self.topk_ids[:, n], self.topk_lp[:, n] = (
            token,
            gate,
            ids,
            values,
        )
        self.gap[:, n] = gap
        self.n += 1
        return token

    def lengths(self, last: bool) -> list[int] | None:
        """Each request's rollout length (up to its first stop token, else all positions recorded)
        once every request has stopped or at the ``last`` test; else None. One host sync, a second
        to read the lengths."""
        hits = torch.isin(self.tokens[:, : self.n], self.stop)
        stopped = hits.any(-1)
        if not (bool(stopped.all()) or last):
            return None
        return torch.where(stopped, hits.int().argmax(-1) + 1, self.n).tolist()

    def results(
        self, teacher_tokens: Sequence[int], lengths: Sequence[int] | None = None
    ) -> list[Rollout]:
        """Request i's first ``lengths[i]`` positions (all recorded ones by default) as its
        ``Rollout``."""
        lengths = [self.n] * len(teacher_tokens) if lengths is None else lengths
        return [
            Rollout(
                self.tokens[i, :n].clone(),
                self.stepped[i, :n].clone(),
                self.topk_ids[i, :n].clone(),
                self.topk_lp[i, :n].clone(),
                int(teacher_tokens[i]),
                self.gap[i, :n].clone(),
            )
            for i, n in enumerate(lengths)
        ]


@torch.no_grad()
def hybrid_rollout(
    student: torch.nn.Module,
    teacher: torch.nn.Module,
    student_prompt_ids: Sequence[int],
    teacher_prompt_ids: Sequence[int],
    *,
    tau: float,
    kappa: float,
    top_k: int,
    max_new_tokens: int,
    stop_ids: Iterable[int],
    hybrid: bool = True,
    teacher_context: Callable[[], ContextManager] = contextlib.nullcontext,
) -> Rollout:
    """Greedy hybrid rollout of one request, student and teacher advanced by separate cached
    forwards.

    Args:
        student: the model being edited (pi_theta).
        teacher: the privileged model; usually the same object, reached through ``teacher_context``
            (adapter disabled, or the original FT-M matrix swapped in).
        student_prompt_ids / teacher_prompt_ids: chat-templated prompt ids (editing prompt /
            passage + question).
        tau, kappa: the step-in gates. top_k: teacher ids kept per position for the KL.
        max_new_tokens: rollout length cap. stop_ids: tokens that end the response (kept in the
            rollout).
        hybrid: False for the plain on-policy rollout (the gate never fires).
    """
    device = input_device(student)
    t_device = input_device(teacher)
    s_ids = torch.tensor([list(student_prompt_ids)], dtype=torch.long, device=device)
    t_ids = torch.tensor([list(teacher_prompt_ids)], dtype=torch.long, device=t_device)

    s_logp, s_cache = _step(student, s_ids, _new_cache(student))
    with teacher_context():
        t_logp, t_cache = _step(teacher, t_ids, _new_cache(teacher))
    teacher_tokens = t_ids.shape[1]
    # Under device_map="auto" the logits live on the last layer's device and inputs go to the first:
    # records stay beside the logits, each token is sent to where the next forward starts.
    rec = _Recorder(
        1, max_new_tokens, top_k, t_logp.shape[-1], tau, kappa, hybrid, stop_ids, s_logp.device
    )
    while True:
        token, stop = rec.step(s_logp[:1], t_logp[:1])
        if stop:
            return rec.results([teacher_tokens])[0]
        nxt = token.view(1, 1).to(device)
        s_logp, s_cache = _step(student, nxt, s_cache)
        with teacher_context():
            t_logp, t_cache = _step(teacher, nxt.to(t_device), t_cache)
        teacher_tokens += 1


@torch.no_grad()
def batched_hybrid_rollout(
    model: torch.nn.Module,
    row_switch: Callable[[torch.Tensor], ContextManager],
    student_prompt_ids: Sequence[int],
    teacher_prompt_ids: Sequence[int],
    *,
    tau: float,
    kappa: float,
    top_k: int,
    max_new_tokens: int,
    stop_ids: Iterable[int],
    pad_id: int,
    hybrid: bool = True,
    static_decode: bool | str = False,
    stop_every: int = 8,
) -> Rollout:
    """The same rollout with student (row 0) and teacher (row 1) advanced in ONE batched forward per
    token.

    Prompts are left-padded to a common length with explicit position ids; ``row_switch`` makes row
    1 compute the frozen base model inside the shared module (adapter output zeroed, or the original
    FT-M matrix), so one set of weights and one KV cache of batch 2 serve both policies.

    ``static_decode``: the graph-capturable decode (``static_decode.StaticDecoder``): a KV cache
    preallocated for the teacher prompt plus ``max_new_tokens``, masks and positions on the device,
    and the stop test every ``stop_every`` tokens (the loop's one host sync); the steps decoded past
    a stop are discarded, and counted in ``teacher_forward_tokens``. Same tokens, step-ins and
    teacher top-K ids as the dynamic path (``tests/test_static_decode.py``). ``"compile"``: the step
    under ``torch.compile`` (CUDA graphs on CUDA); ``"auto"``: that on CUDA, the dynamic path
    elsewhere (``static_decode.decode_mode``).
    """
    static_decode = decode_mode(static_decode, model)
    if static_decode:
        return batched_hybrid_rollouts(
            model,
            row_switch,
            [(student_prompt_ids, teacher_prompt_ids)],
            tau=tau,
            kappa=kappa,
            top_k=top_k,
            max_new_tokens=max_new_tokens,
            stop_ids=stop_ids,
            pad_id=pad_id,
            hybrid=hybrid,
            compiled=static_decode == "compile",
            stop_every=stop_every,
        )[0]
    device = input_device(model)
    rows = [list(student_prompt_ids), list(teacher_prompt_ids)]
    ids, mask = pad_rows(rows, pad_id, left=True)
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    teacher_rows = torch.tensor([False, True])  # on the host: the executor moves what it needs once
    use_keep = accepts_keyword(model, "logits_to_keep")
    cache_kw = cache_keyword(model)

    def forward(
        step_ids: torch.Tensor, step_pos: torch.Tensor, cache: Any
    ) -> tuple[torch.Tensor, Any]:
        kwargs: dict = {
            "input_ids": step_ids,
            "attention_mask": mask,
            "position_ids": step_pos,
            cache_kw: cache,
            "use_cache": True,
        }
        if use_keep:
            kwargs["logits_to_keep"] = 1
        out = model(**kwargs)
        return F.log_softmax(out.logits[:, -1, :].float(), dim=-1), output_cache(out)

    with row_switch(teacher_rows):
        logp, cache = forward(ids, positions, _new_cache(model))
        teacher_tokens = len(rows[1])
        last_pos = positions[:, -1:]
        rec = _Recorder(
            1, max_new_tokens, top_k, logp.shape[-1], tau, kappa, hybrid, stop_ids, logp.device
        )
        while True:
            token, stop = rec.step(logp[:1], logp[1:])
            if stop:
                return rec.results([teacher_tokens])[0]
            mask = torch.cat([mask, mask.new_ones(2, 1)], dim=1)
            last_pos = last_pos + 1
            logp, cache = forward(token.to(device).view(1, 1).expand(2, 1), last_pos, cache)
            teacher_tokens += 1


def _vocab(model: torch.nn.Module) -> int:
    return model.get_output_embeddings().weight.shape[0]


def _logits_device(model: torch.nn.Module) -> torch.device:
    return model.get_output_embeddings().weight.device


def _static_rollouts(
    model: torch.nn.Module,
    row_switch: Callable[[torch.Tensor], ContextManager],
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    pad_id: int,
    rec: _Recorder,
    *,
    stop_every: int,
    compiled: bool,
) -> list[Rollout]:
    """The rollouts of ``requests`` (student and teacher prompt ids each) as ONE batch on a
    ``StaticDecoder``: rows ``0..R-1`` the students, ``R..2R-1`` their teachers; no host sync but
    the stop test every ``stop_every`` tokens, which ends the decode once every request has
    stopped."""
    max_new_tokens = rec.tokens.shape[1]
    count = len(requests)
    rows = [list(s) for s, _ in requests] + [list(t) for _, t in requests]
    teacher_rows = torch.tensor([False] * count + [True] * count)
    teacher_tokens = [len(t) for _, t in requests]
    kept = kept_decoder(model, rows, pad_id, max_new_tokens, keep=compiled)
    with kept as decoder, row_switch(teacher_rows):
        step = decoder.compiled_step(compile_step) if compiled else decoder.step
        logp = decoder.prefill()
        for n in range(1, max_new_tokens + 1):
            token = rec.record(logp[:count], logp[count:])
            if n % stop_every == 0 or n == max_new_tokens:
                ends = rec.lengths(last=n == max_new_tokens)
                if ends is not None:
                    return rec.results(teacher_tokens, ends)
            logp = step(token.view(1, count, 1).expand(2, count, 1).reshape(2 * count, 1))
            teacher_tokens = [t + 1 for t in teacher_tokens]
    raise AssertionError("unreachable: the loop returns at max_new_tokens")  # pragma: no cover


def _dynamic_rollouts(
    model: torch.nn.Module,
    row_switch: Callable[[torch.Tensor], ContextManager],
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    pad_id: int,
    rec: _Recorder,
) -> list[Rollout]:
    """The rollouts of ``requests`` as ONE batch on the dynamic decode (a growing ``DynamicCache``,
    left padding with explicit positions, as ``batched_hybrid_rollout``'s): rows ``0..R-1`` the
    students, ``R..2R-1`` their teachers, the stop test after every token."""
    count = len(requests)
    device = input_device(model)
    rows = [list(s) for s, _ in requests] + [list(t) for _, t in requests]
    ids, mask = pad_rows(rows, pad_id, left=True)
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    use_keep = accepts_keyword(model, "logits_to_keep")
    cache_kw = cache_keyword(model)
    teacher_rows = torch.tensor([False] * count + [True] * count)
    teacher_tokens = [len(t) for _, t in requests]
    max_new_tokens = rec.tokens.shape[1]

    def forward(step_ids: torch.Tensor, step_pos: torch.Tensor, cache: Any) -> tuple:
        kwargs: dict = {
            "input_ids": step_ids,
            "attention_mask": mask,
            "position_ids": step_pos,
            cache_kw: cache,
            "use_cache": True,
        }
        if use_keep:
            kwargs["logits_to_keep"] = 1
        out = model(**kwargs)
        return F.log_softmax(out.logits[:, -1, :].float(), dim=-1), output_cache(out)

    with row_switch(teacher_rows):
        logp, cache = forward(ids, positions, _new_cache(model))
        last_pos = positions[:, -1:]
        for n in range(1, max_new_tokens + 1):
            token = rec.record(logp[:count], logp[count:])
            ends = rec.lengths(last=n == max_new_tokens)
            if ends is not None:
                return rec.results([t + m - 1 for t, m in zip(teacher_tokens, ends)], ends)
            mask = torch.cat([mask, mask.new_ones(2 * count, 1)], dim=1)
            last_pos = last_pos + 1
            step = token.to(device).view(1, count, 1).expand(2, count, 1).reshape(2 * count, 1)
            logp, cache = forward(step, last_pos, cache)
    raise AssertionError("unreachable: the loop returns at max_new_tokens")  # pragma: no cover


@torch.no_grad()
def batched_hybrid_rollouts(
    model: torch.nn.Module,
    row_switch: Callable[[torch.Tensor], ContextManager],
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    tau: float,
    kappa: float,
    top_k: int,
    max_new_tokens: int,
    stop_ids: Iterable[int],
    pad_id: int,
    hybrid: bool = True,
    compiled: bool = False,
    stop_every: int = 8,
    static: bool = True,
) -> list[Rollout]:
    """The rollouts of all ``requests`` of an edit (``(student_prompt_ids, teacher_prompt_ids)``
    each) in ONE batch on the graph-capturable decode: each decode step is one forward of the R
    students and their R teachers, so a step's kernels serve R tokens. Each request's rollout ends
    at its own stop token; the batch decodes until every request has stopped (the steps past a
    request's stop are discarded, and counted in its ``teacher_forward_tokens``). ``compiled``: the
    step under ``torch.compile`` (CUDA graphs on CUDA). ``static=False``: the same batch on the
    dynamic decode (stop test after every token; each request's ``teacher_forward_tokens`` counts
    its own prompt and rollout, as a decode of that request alone)."""
    rec = _Recorder(
        len(requests),
        max_new_tokens,
        top_k,
        _vocab(model),
        tau,
        kappa,
        hybrid,
        stop_ids,
        _logits_device(model),
    )
    if not static:
        return _dynamic_rollouts(model, row_switch, requests, pad_id, rec)
    return _static_rollouts(
        model, row_switch, requests, pad_id, rec, stop_every=stop_every, compiled=compiled
    )


#: How one round's rollouts are decoded (``decode_route`` picks one from the hparams):
DECODE_ROUTES = {
    "two_passes": "student and teacher advanced by two cached forwards, one request at a time "
    "(hybrid_rollout; batched_rollout: false)",
    "row_pair": "student and teacher as two rows of ONE forward per token on a dynamic KV cache, "
    "one request at a time (batched_hybrid_rollout; the default off CUDA)",
    "static": "every request's student and teacher rows in ONE batch on the graph-capturable "
    "decode: a preallocated KV cache, the stop test every decode_stop_every tokens "
    "(batched_hybrid_rollouts; static_decode: true)",
    "compiled": "the static route with its step under torch.compile, CUDA graphs on CUDA "
    "(static_decode: compile, or auto on CUDA)",
}


def decode_route(hparams: Any, model: torch.nn.Module) -> str:
    """The ``DECODE_ROUTES`` key ``hparams`` choose for ``model``: ``static_decode`` first
    (resolved by ``static_decode.decode_mode``: ``auto`` compiles on CUDA only), then
    ``batched_rollout``."""
    mode = decode_mode(hparams.static_decode, model)
    if mode:
        return "compiled" if mode == "compile" else "static"
    return "row_pair" if hparams.batched_rollout else "two_passes"


def draw_rollout(
    executor: Any, prompts: Any, hparams: Any, *, stop_ids: Iterable[int], pad_id: int
) -> Rollout:
    """One round's rollout of one request (``prompts``: its student and teacher prompt ids):
    ``draw_rollouts`` of that request alone."""
    return draw_rollouts(executor, [prompts], hparams, stop_ids=stop_ids, pad_id=pad_id)[0]


def draw_rollouts(
    executor: Any, prompts: Sequence[Any], hparams: Any, *, stop_ids: Iterable[int], pad_id: int
) -> list[Rollout]:
    """One round's rollouts of all requests of an edit (``prompts``: each request's student and
    teacher prompt ids), on the route ``decode_route`` picks: the static routes decode all
    requests as ONE batch (a step's kernels serve every request's token), the others one request
    at a time. ``rollout: on_policy`` switches the gate off (the "w/o HP" ablation).
    ``fast_decode`` computes the decode steps' frozen CPU matmuls as ``W @ x^T``
    (``fast_decode.py``; ``auto``, the default: where this machine runs that product clearly faster
    than ``F.linear``).
    """
    gate = dict(
        tau=hparams.tau,
        kappa=hparams.kappa,
        top_k=hparams.top_k,
        max_new_tokens=hparams.max_new_tokens,
        stop_ids=stop_ids,
        hybrid=hparams.rollout == "hybrid",
    )
    model = executor.model
    route = decode_route(hparams, model)
    with few_row_linears(model, enabled=hparams.fast_decode):
        if route in ("static", "compiled"):
            return batched_hybrid_rollouts(
                model,
                executor.row_switch,
                [(p.student_ids, p.teacher_ids) for p in prompts],
                pad_id=pad_id,
                compiled=route == "compiled",
                stop_every=hparams.decode_stop_every,
                **gate,
            )
        if route == "row_pair":
            return [
                batched_hybrid_rollout(
                    model,
                    executor.row_switch,
                    p.student_ids,
                    p.teacher_ids,
                    pad_id=pad_id,
                    **gate,
                )
                for p in prompts
            ]
        return [
            hybrid_rollout(
                model,
                model,
                p.student_ids,
                p.teacher_ids,
                teacher_context=executor.teacher_context,
                **gate,
            )
            for p in prompts
        ]
