"""The one training loop of every gradient editor this project owns: HPSE (its ablations and the
plain executor baselines with ``kl_weight: 0``) and COIN*.

The loop owns what they share: the executor (what trains, ``weights_copy``, Adam, ``finish``), train
and eval modes, R rounds x M inner steps, ``zero_grad`` / ``step``, the loss history, per-round
statistics and timing. An ``Objective`` owns what differs:

- ``start_round(student)``: what a round prepares before its inner steps (HPSE: that round's hybrid
  rollout, drawn in eval mode); returns the round's statistics.
- ``step(student)``: the loss terms of one inner step, as groups ``{name: (weight, value)}``; each
  group is summed (terms of weight 0 are reported but not trained) and back-propagated on its own,
  so an objective decides how much activation memory an inner step holds at once (HPSE: one group
  per term, peak = the larger forward; COIN*: one group, its terms share forwards).

    executor = make_executor(model, hparams)
    result = train_edit(executor, hparams, MyObjective(executor, ...), rounds=R, inner_steps=M)
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Protocol, Sequence

import torch

from .executors import Executor

__all__ = [
    "MAX_TRAINED_ABS",
    "EditDivergedError",
    "EditResult",
    "Objective",
    "activation_checkpointing",
    "cpu_half_backward",
    "describe_loss",
    "inner_step",
    "train_edit",
    "trained_tensors_problem",
]

logger = logging.getLogger(__name__)

Terms = dict  # name -> (weight, scalar loss tensor)

#: The largest |value| an edit may leave in a trained tensor (a LoRA adapter matrix or the FT-M
#: matrix). Trained language-model weights sit far below it (the largest of SmolLM2-135M's linear
#: weights is 9.25; LoRA's B starts at zero and moves by about lr per step), and a float16 forward
#: overflows (65504) as soon as such a weight meets an activation of a few units. An Adam step at an
#: lr that blows the edit up moves every entry by about lr, so a diverged edit lands orders of
#: magnitude past it (1e9, 1e30), while no converging edit comes near.
MAX_TRAINED_ABS = 1e4


@dataclass
class EditResult:
    """What one edit produced: the edited model, what restores it, and per-round statistics."""

    model: Any
    weights_copy: dict
    rounds: list = field(default_factory=list)
    seconds: float = 0.0
    teacher_forward_tokens: int = 0
    inner_step_teacher_passes: int = (
        0  # times an inner step reached the teacher (0: the teacher's targets were cached)
    )
    rollouts: list = field(
        default_factory=list
    )  # per round: that round's Rollout per request, or None (no KL term)
    #: seconds inside EasyEdit's own algorithm function, for a method whose edit is EasyEdit's code
    #: (MEMIT, AlphaEdit, UnKE, AnyEdit); the rest of ``seconds`` is what this project's integration
    #: adds. None otherwise.
    algorithm_seconds: float | None = None


class EditDivergedError(RuntimeError):
    """An edit's loss became non-finite or grew past ``max_loss_growth``; the edit was stopped.

    The trained tensors are back at their values before this edit (``model`` is as the edit found
    it, wrapped as the executor wraps it); ``weights_copy`` is what restores the unedited model from
    there.
    """

    def __init__(
        self, message: str, *, model: Any, weights_copy: dict, round: int, loss: float
    ) -> None:
        super().__init__(message)
        self.model, self.weights_copy, self.round, self.loss = model, weights_copy, round, loss


def _diverged(total: float, start: float | None, growth: float) -> bool:
    return not math.isfinite(total) or (start is not None and start > 0 and total > growth * start)


def trained_tensors_problem(
    tensors: Mapping[str, torch.Tensor] | Sequence[torch.Tensor],
    *,
    final_loss: float | None = None,
    round_start_loss: float | None = None,
    max_loss_growth: float | None = None,
    max_abs: float = MAX_TRAINED_ABS,
) -> str | None:
    """Why an edit that trained ``tensors`` (name -> tensor, or a list) diverged where no loss an
    inner step saw shows it, or None.

    The losses ``train_edit`` checks are each measured before that step's update, so the last
    update of an edit is never judged by them. Afterwards: every trained tensor must be finite and
    within ``max_abs`` (``MAX_TRAINED_ABS``), and ``final_loss`` (the loss after the last update,
    when given) finite and, with ``round_start_loss`` and ``max_loss_growth``, at most
    ``max_loss_growth`` times the last round's first loss, as inside a round. Pure: reads the
    tensors (one host sync per device), changes nothing.
    """
    items = list(tensors.items() if isinstance(tensors, Mapping) else enumerate(tensors))
    peaks: dict[torch.device, list] = {}
    for name, t in items:
        t = t.detach()
        peak = t.abs().amax() if t.numel() else t.new_zeros(())
        peaks.setdefault(t.device, []).append((name, peak.float()))
    for group in peaks.values():
        for (name, _), value in zip(group, torch.stack([p for _, p in group]).tolist()):
            label = f"trained tensor {name}" if isinstance(name, str) else f"trained tensor #{name}"
            if not math.isfinite(value):
                return f"{label} holds non-finite values"
            if value > max_abs:
                return f"{label} holds |values| up to {value:.3g} (more than {max_abs:g})"
    if final_loss is not None:
        growth = max_loss_growth if max_loss_growth is not None else math.inf
        if _diverged(final_loss, round_start_loss, growth):
            start = (
                f" (round start {round_start_loss:.4g}, max_loss_growth {max_loss_growth:g})"
                if round_start_loss is not None and max_loss_growth is not None
                else ""
            )
            return f"the loss after the last inner step is {final_loss:.4g}{start}"
    return None


class Objective(Protocol):
    """What an editor trains on; see the module docstring."""

    #: the editor's name in log lines
    name: str
    #: every term ``step`` may report, in the order the per-step total adds them up
    terms: Sequence[str]

    def start_round(self, student: Any) -> dict: ...

    def step(self, student: Any) -> Iterator[Terms]: ...

    def describe_round(self, stats: dict) -> str: ...


def train_edit(
    executor: Executor, hparams: Any, objective: Objective, *, rounds: int, inner_steps: int
) -> EditResult:
    """Train ``objective`` into ``executor.model`` (``executors.make_executor`` around the caller's
    model): ``rounds`` x (``start_round``, then ``inner_steps`` Adam steps on ``step``'s terms).
    Returns the edited model and what restores it."""
    start = time.perf_counter()
    result = EditResult(model=executor.model, weights_copy=executor.weights_copy())
    student = executor.model
    optimizer = executor.optimizer()
    was_training = student.training
    for r in range(1, rounds + 1):
        t0 = time.perf_counter()
        student.eval()
        prepared = objective.start_round(student)
        student.train(was_training or hparams.lora_dropout > 0)
        teacher_before = executor.teacher_switches
        with (
            activation_checkpointing(student, getattr(hparams, "gradient_checkpointing", False)),
            # a captured step's kernels are inductor's, which picks its own layouts
            contextlib.nullcontext()
            if getattr(objective, "captured", False)
            else cpu_half_backward(student),
        ):
            steps = [inner_step(objective, student, optimizer) for _ in range(inner_steps)]
        history = []
        for step, terms in enumerate(steps, 1):
            values = {name: v.item() for name, (_, v) in terms.items()}
            total = sum(terms[n][0] * values[n] for n in objective.terms if n in values)
            first = history[0][0] if history else None
            if _diverged(total, first, hparams.max_loss_growth):
                student.train(was_training)
                growth = (
                    f" (round start {first:.4g}, max_loss_growth {hparams.max_loss_growth:g})"
                    if first is not None
                    else ""
                )
                _stop_diverged(
                    executor,
                    result,
                    objective,
                    r,
                    f"inner step {step}: loss {total:.4g}{growth}",
                    total,
                    hparams,
                )
            history.append((total, values))
        result.inner_step_teacher_passes += executor.teacher_switches - teacher_before
        stats = {"round": r, **prepared, "loss": history[0][0], "loss_last": history[-1][0]}
        for name in objective.terms:
            stats[name] = history[0][1].get(name)
            stats[f"{name}_last"] = history[-1][1].get(name)
        stats["seconds"] = time.perf_counter() - t0
        result.rounds.append(stats)
        logger.info(
            "%s round %d/%d: %s, %s, %.1fs",
            objective.name,
            r,
            rounds,
            objective.describe_round(stats),
            describe_loss(stats, inner_steps),
            stats["seconds"],
        )
    student.train(was_training)
    optimizer.zero_grad(set_to_none=True)
    # the losses above were each measured before their step's update: the last update is judged by
    # the tensors it left and the loss after it
    final = _loss_now(objective, student)
    problem = trained_tensors_problem(
        _trained_tensors(executor),
        final_loss=final,
        round_start_loss=result.rounds[-1]["loss"],
        max_loss_growth=hparams.max_loss_growth,
    )
    if problem is not None:
        _stop_diverged(
            executor,
            result,
            objective,
            rounds,
            f"after its last inner step: {problem}",
            final,
            hparams,
        )
    executor.finish()
    result.seconds = time.perf_counter() - start
    return result


def describe_loss(stats: dict, inner_steps: int) -> str:
    """A round's loss for a log line: at its first inner step and at its last (each before that
    step's update)."""
    if inner_steps == 1:
        return f"loss {stats['loss']:.4f} (one inner step)"
    return f"loss {stats['loss']:.4f} (step 1) -> {stats['loss_last']:.4f} (step {inner_steps})"


def _loss_now(objective: Objective, student: Any) -> float:
    """The objective's weighted total on the model as it is now (no gradient, no update): the loss
    after the last inner step."""
    terms: dict = {}
    with torch.no_grad():
        for group in objective.step(student):
            terms.update(group)
    values = {name: v.item() for name, (_, v) in terms.items()}
    return sum(terms[n][0] * values[n] for n in objective.terms if n in values)


def _trained_tensors(executor: Executor) -> dict[str, torch.Tensor]:
    """The tensors the edit trains, by parameter name."""
    names = {id(p): n for n, p in executor.model.named_parameters()}
    return {names.get(id(p), f"#{i}"): p for i, p in enumerate(executor.trainable_parameters())}


def _stop_diverged(
    executor: Executor,
    result: EditResult,
    objective: Objective,
    round_: int,
    what: str,
    loss: float,
    hparams: Any,
) -> None:
    """Put the trained tensors back as the edit found them and raise ``EditDivergedError``."""
    from .executors import copy_back

    executor.finish()
    copy_back(executor.model, result.weights_copy)
    raise EditDivergedError(
        f"the {objective.name} edit diverged in round {round_}, {what}; the edit was undone and "
        f"nothing is kept. Lower 'lr' in the hparams (now {hparams.lr:g})",
        model=executor.model,
        weights_copy=result.weights_copy,
        round=round_,
        loss=loss,
    )


def inner_step(objective: Objective, student: Any, optimizer: torch.optim.Optimizer) -> dict:
    """One Adam step on ``objective.step``'s terms, each group back-propagated on its own; returns
    ``{name: (weight, detached loss)}``, which the caller reads on the host when it needs the
    numbers (once a round in ``train_edit``, so the device never waits for the host inside the inner
    steps)."""
    optimizer.zero_grad(set_to_none=True)
    # under CUDA graphs (``compile_training: graphs``) this step's replays write over the last
    # step's graph outputs, none of which is kept (the losses kept are computed from them outside
    # the graphs): marked as a new step, the replays need not check that
    if getattr(objective, "captured", False) == "graphs":
        torch.compiler.cudagraph_mark_step_begin()
    terms: dict[str, tuple[float, torch.Tensor]] = {}
    for group in objective.step(student):
        loss = None
        for w, v in group.values():
            if w > 0:
                loss = w * v if loss is None else loss + w * v
        if loss is not None:
            loss.backward()
        terms.update((name, (w, v.detach())) for name, (w, v) in group.items())
    optimizer.step()
    return terms


@contextlib.contextmanager
def activation_checkpointing(model: Any, enabled: bool) -> Iterator[None]:
    """Inside: ``model``'s layers recompute their activations in backward (transformers'
    non-reentrant gradient checkpointing), when ``enabled`` and the model supports it; switched off
    again on exit."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if enabled and not getattr(base, "supports_gradient_checkpointing", False):
        logger.warning(
            "gradient_checkpointing: %s does not support it; activations are kept",
            type(base).__name__,
        )
    if not enabled or not getattr(base, "supports_gradient_checkpointing", False):
        yield
        return
    # transformers also hooks the input embeddings to make their output require grad, and takes
    # that hook off again only for its own PEFT integration: left on, the next rollout's compiled
    # decode step meets ``requires_grad_`` and cannot be captured
    had_input_hook = _has_input_grad_hook(base)
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # transformers checkpoints a layer only in training mode; an edit trains in the mode the model
    # came in (eval, so no dropout): only the checkpointed layers' own flags are set, their
    # submodules keep theirs
    layers = [m for m in base.modules() if getattr(m, "gradient_checkpointing", False) is True]
    modes = [m.training for m in layers]
    for m in layers:
        m.training = True
    try:
        yield
    finally:
        for m, mode in zip(layers, modes):
            m.training = mode
        base.gradient_checkpointing_disable()
        if not had_input_hook and _has_input_grad_hook(base):
            base.disable_input_require_grads()


def _has_input_grad_hook(model: Any) -> bool:
    """Whether transformers' ``enable_input_require_grads`` hook is on ``model``'s embeddings (one
    attribute before 5.x, a list after)."""
    return bool(getattr(model, "_require_grads_hooks", None)) or hasattr(
        model, "_require_grads_hook"
    )


@contextlib.contextmanager
def cpu_half_backward(model: Any) -> Iterator[None]:
    """Inside: the gradient that reaches each bfloat16/float16 ``nn.Linear`` of ``model`` on the
    CPU is laid out column-major before the linear's backward multiplies it by the weight.

    On a CPU without native half-precision matrix units (AVX2), torch's half-precision ``mm`` of a
    row-major ``(rows, out)`` gradient by the row-major ``(out, in)`` weight, the input gradient of
    every linear, takes a scalar path 44-60x slower than the same product with the gradient
    column-major (``python -m benchmarks perf-half-backward``; docs/perf/cpu-half-backward.json);
    the forward's ``x @ W.T`` is not affected. One copy of the gradient (rows x out) per linear
    costs far less. The products are the same, rounded by another kernel: half-precision results
    may differ by 1-2 units in the last place. A no-op for float32/float64 models and on any other
    device (the hooks are installed only on CPU half-precision linears), so float32 runs are
    unchanged bit for bit.
    """
    linears = [
        m
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
        and m.weight.device.type == "cpu"
        and m.weight.dtype in (torch.bfloat16, torch.float16)
    ]
    handles = [m.register_forward_hook(_column_major_output_grad) for m in linears]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _column_major_output_grad(module: Any, args: Any, out: Any) -> None:
    if isinstance(out, torch.Tensor) and out.requires_grad:
        out.register_hook(_column_major)


def _column_major(grad: torch.Tensor) -> torch.Tensor:
    """``grad`` (..., n) with the same values, stored so that its (rows, n) view is column-major
    (what the linear's backward reshapes it to)."""
    if grad.dim() < 2 or not grad.is_contiguous():
        return grad
    n = grad.shape[-1]
    return grad.reshape(-1, n).t().contiguous().t().view(grad.shape)
