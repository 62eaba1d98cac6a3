"""The inner step's forwards and backwards under ``torch.compile`` (the ``compile_training`` hparams
switch).

An eager inner step dispatches every aten op of the KL and the NLL pass (forward and backward) one
by one: at 7B widths about 12,300 per step, each paying the host's dispatch cost whatever its size
(docs/GPU.md). Here each pass is one function of fixed-role tensors, ``kl_loss`` and ``nll_loss``,
compiled once per process with ``torch.compile(fullgraph=True)`` (inductor): AOTAutograd derives
its backward, inductor fuses the elementwise work of both into a few kernels around the matrix
products, and the step's Adam stays the executor's (one fused kernel on CUDA). A pass without
gradient (the loss after the last step, which the divergence check reads) runs the same function
eagerly: no second graph to compile for it.

Where an edit has both terms, the step runs them as one pass (``joint_losses``,
``CapturedJoint``): the KL rows and the NLL rows stacked into one batch, one forward and one
backward giving both losses, so every matrix product of a layer runs once per step instead of
once per term and no gradient is added up between passes (at 7B widths 56 products per layer
instead of 112, docs/GPU.md). Its
activations are the two passes' together, where the eager step's peak is the larger pass's.

So that the compiled functions see few shapes, the rows are padded to steps: a batch's width is
rounded up to a multiple of ``WIDTH_STEP`` tokens (right padding, masked; under causal attention a
real position never sees a later one, so its logits are the unpadded batch's up to the kernels'
rounding), and the KL's scored positions to a multiple of ``POSITION_STEP`` (padding positions weigh
0). The rounds of an edit, whose rollouts differ in length, then mostly reuse one compiled graph,
and dynamo compiles a shape-generic one once it has seen two.

With ``compile_training: graphs`` the passes compile under inductor's ``reduce-overhead`` mode: on
CUDA each of the pass's forward and backward graphs is recorded once as a CUDA graph and then
replayed as one launch, so its ~70 kernels a layer stop costing host time. A replay writes its
outputs where the last replay wrote them: an inner step marks its start
(``torch.compiler.cudagraph_mark_step_begin``) and keeps no graph output past it (the losses it
reports are the objective's, computed from the outputs outside the graphs), which
``tests/test_captured.py`` checks on CPU with a backend that overwrites a graph's earlier outputs
the way a replay does.

The losses are the eager ones' (``losses.topk_forward_kl``, ``losses.sequence_nll``) on the same
positions: the trained tensors after a captured step equal the eager step's within float rounding
(``tests/test_captured.py``), not bit for bit, which is why the switch is off by default and
``auto`` turns it on only on a CUDA device.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import torch

from .losses import sequence_nll, topk_forward_kl
from .padding import IGNORE, next_token_labels, pad_rows

__all__ = [
    "POSITION_STEP",
    "WIDTH_STEP",
    "CapturedJoint",
    "CapturedKL",
    "CapturedNLL",
    "joint_losses",
    "kl_loss",
    "logits_window",
    "nll_loss",
    "training_mode",
    "uncompiled",
]

#: a captured batch's width is rounded up to a multiple of this many tokens
WIDTH_STEP = 64
#: the KL's scored positions are padded to a multiple of this
POSITION_STEP = 64


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def training_mode(setting: bool | str, model: Any, checkpointing: bool = False) -> bool | str:
    """Whether a ``compile_training`` setting captures the inner step for ``model``: ``"auto"`` is
    on for a model on a CUDA device where ``torch.compile`` finds its compiler (Triton), off
    elsewhere and under gradient checkpointing (``checkpointing``: its recomputation marks tensors
    that a captured graph cannot return); true and false are themselves, and ``"graphs"`` (the
    captured step under CUDA graphs, which ``load_model`` refuses off CUDA) is itself: on a model
    loaded elsewhere and not on a card it runs as true (inductor records no CUDA graphs there)."""
    if setting == "graphs":
        return "graphs"
    if setting != "auto":
        return bool(setting)
    if checkpointing:
        return False
    from .static_decode import _model_device, compiler_problem

    device = _model_device(model)
    return device.type == "cuda" and compiler_problem(device.type) is None


def _forward(model: Any, ids: torch.Tensor, mask: torch.Tensor, keep: int) -> torch.Tensor:
    """The training forward's logits of the last ``keep`` positions (all with 0), without a KV
    cache (which gradient checkpointing would switch off with a log line, which a captured graph
    cannot hold)."""
    kwargs = {"logits_to_keep": keep} if keep else {}
    return model(input_ids=ids, attention_mask=mask, use_cache=False, **kwargs).logits


def kl_loss(
    model: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    keep: int,
    rows: torch.Tensor,
    positions: torch.Tensor,
    weight: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_logprobs: torch.Tensor,
    student: str,
) -> torch.Tensor:
    """The KL pass: the logits of the last ``keep`` positions of each row (all of them with
    ``keep`` 0), the scored ones picked by ``rows`` and ``positions`` (counted from the first kept
    one), and the summed top-K forward KL with each position weighted by ``weight`` (0 for
    padding)."""
    logits = _forward(model, ids, mask, keep)
    return _picked_kl(logits, rows, positions, weight, topk_ids, topk_logprobs, student)


def _picked_kl(
    logits: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    weight: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_logprobs: torch.Tensor,
    student: str,
) -> torch.Tensor:
    picked = logits[rows, positions]
    return topk_forward_kl(
        picked,
        topk_ids.to(picked.device),
        topk_logprobs.to(picked.device),
        mask=weight.to(picked.device),
        student=student,
    )


def nll_loss(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, keep: int, labels: torch.Tensor
) -> torch.Tensor:
    """The NLL pass: the summed NLL of ``labels`` (``IGNORE`` where nothing is scored) under the
    logits of the last ``keep`` positions (all with ``keep`` 0)."""
    logits = _forward(model, ids, mask, keep)
    return sequence_nll(logits, labels.to(logits.device))


def joint_losses(
    model: Any,
    ids: torch.Tensor,
    mask: torch.Tensor,
    keep: int,
    split: int,
    rows: torch.Tensor,
    positions: torch.Tensor,
    weight: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_logprobs: torch.Tensor,
    student: str,
    labels: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both passes in one forward: the first ``split`` rows are the KL pass's (``kl_loss``'s
    ``rows``, ``positions`` and ``weight`` index them), the rest the NLL pass's (``nll_loss``'s
    ``labels``); returns ``(kl, nll)``."""
    logits = _forward(model, ids, mask, keep)
    kl = _picked_kl(logits, rows, positions, weight, topk_ids, topk_logprobs, student)
    return kl, sequence_nll(logits[split:], labels.to(logits.device))


#: the ``torch.compile`` backend of the captured passes (None: inductor); the tests trace with
#: ``"eager"`` where they check the graph, not the kernels
BACKEND: str | None = None

_COMPILED: dict[Any, Callable[..., torch.Tensor]] = {}
_UNCOMPILED = False


@contextlib.contextmanager
def uncompiled() -> Iterator[None]:
    """Inside: the captured passes run their functions eagerly (the padded, stacked rows as a
    captured step has them, without compiling): the memory planner's run on the meta device."""
    global _UNCOMPILED
    before, _UNCOMPILED = _UNCOMPILED, True
    try:
        yield
    finally:
        _UNCOMPILED = before


def _compiled(fn: Callable[..., torch.Tensor], graphs: bool = False) -> Callable[..., torch.Tensor]:
    """``fn`` under ``torch.compile(fullgraph=True)``, made once per process, ``BACKEND`` and
    ``graphs`` (inductor's ``reduce-overhead``: its forward and backward graphs each replayed as a
    CUDA graph on CUDA; ``fn`` itself inside ``uncompiled``)."""
    if _UNCOMPILED:
        return fn
    backend = BACKEND
    key = (fn, backend, graphs)
    if key not in _COMPILED:
        kwargs: dict[str, Any] = {"backend": backend} if backend is not None else {}
        if graphs and backend is None:
            kwargs["mode"] = "reduce-overhead"
        _COMPILED[key] = torch.compile(fn, fullgraph=True, **kwargs)
    return _COMPILED[key]


def logits_window(model: Any, width: int, first: int, scored_only: bool) -> tuple[int, int]:
    """``(logits_to_keep, the position the kept logits start at)`` of a training forward over rows
    of ``width`` tokens whose scored positions start at ``first``: only those with ``scored_only``
    where the model takes ``logits_to_keep`` (``(0, 0)``, every position, otherwise). The eager
    passes (``editor._logits_from``) and the captured ones decide here."""
    from .model_calls import accepts_keyword

    if scored_only and first > 0 and accepts_keyword(model, "logits_to_keep"):
        return width - first, first
    return 0, 0


class CapturedNLL:
    """The NLL anchor's rows (prompt + passage, labels on the passage) padded to ``WIDTH_STEP``:
    ``loss`` is ``nll_loss`` compiled (under CUDA graphs with ``graphs``)."""

    def __init__(
        self,
        prompts: Sequence[Any],
        pad_id: int,
        device: torch.device,
        graphs: bool = False,
    ) -> None:
        self.graphs = graphs
        seqs = [p.student_ids + p.passage_ids for p in prompts]
        width = _round_up(max(len(s) for s in seqs), WIDTH_STEP)
        ids, mask = pad_rows([*seqs, [pad_id] * width], pad_id)
        labels = next_token_labels(seqs, [len(p.student_ids) for p in prompts])
        labels = torch.cat(  # padding is never scored
            [labels, labels.new_full((labels.shape[0], width - labels.shape[1]), IGNORE)], dim=1
        )
        self.ids, self.mask = ids[:-1].to(device), mask[:-1].to(device)
        self.labels = labels.to(device)
        self.first = min(len(p.student_ids) for p in prompts) - 1

    def loss(self, model: Any, scored_only: bool = True) -> torch.Tensor:
        keep, first = logits_window(model, self.ids.shape[1], self.first, scored_only)
        return self._fn()(model, self.ids, self.mask, keep, self.labels[:, first:])

    def _fn(self) -> Callable[..., torch.Tensor]:
        return _compiled(nll_loss, self.graphs) if torch.is_grad_enabled() else nll_loss


class CapturedKL:
    """The KL term's rows (prompt + rollout) padded to ``WIDTH_STEP`` and its scored positions to
    ``POSITION_STEP``, with the teacher's cached top-K per position: ``loss`` is ``kl_loss``
    compiled (under CUDA graphs with ``graphs``)."""

    def __init__(
        self,
        prompts: Sequence[Any],
        rollouts: Sequence[Any],
        pad_id: int,
        device: torch.device,
        graphs: bool = False,
    ) -> None:
        self.graphs = graphs
        seqs = [p.student_ids + r.tokens.tolist() for p, r in zip(prompts, rollouts)]
        width = _round_up(max(len(s) for s in seqs), WIDTH_STEP)
        ids, mask = pad_rows([*seqs, [pad_id] * width], pad_id)
        self.ids, self.mask = ids[:-1].to(device), mask[:-1].to(device)
        # rollout position t of a row is predicted by the logits at prompt length - 1 + t
        spans = [
            (row, len(p.student_ids) - 1, len(r))
            for row, (p, r) in enumerate(zip(prompts, rollouts))
        ]
        self.first = min(start for _, start, _ in spans)
        rows = [row for row, _, n in spans for _ in range(n)]
        starts = [start + t for _, start, n in spans for t in range(n)]
        count = len(rows)
        padded = _round_up(max(count, 1), POSITION_STEP)
        self.rows = torch.tensor(rows + [0] * (padded - count), dtype=torch.long, device=device)
        self._starts = torch.tensor(starts + [self.first] * (padded - count), dtype=torch.long)
        self.weight = torch.zeros(padded, device=device)
        self.weight[:count] = 1.0
        topk_ids = torch.cat([r.teacher_topk_ids for r in rollouts])
        topk_lp = torch.cat([r.teacher_topk_logprobs for r in rollouts])
        k = topk_ids.shape[-1]
        self.topk_ids = torch.cat([topk_ids, topk_ids.new_zeros(padded - count, k)])
        self.topk_lp = torch.cat([topk_lp, topk_lp.new_zeros(padded - count, k)])
        self.device = device
        self._positions: dict[int, torch.Tensor] = {}

    def loss(self, model: Any, student: str = "full", scored_only: bool = True) -> torch.Tensor:
        keep, first = logits_window(model, self.ids.shape[1], self.first, scored_only)
        return self._fn()(
            model,
            self.ids,
            self.mask,
            keep,
            self.rows,
            self.positions(first),
            self.weight,
            self.topk_ids,
            self.topk_lp,
            student,
        )

    def positions(self, first: int) -> torch.Tensor:
        """The scored positions counted from the kept logits' first, ``first`` (made once per batch
        and window, not per inner step)."""
        positions = self._positions.get(first)
        if positions is None:
            positions = self._positions[first] = (self._starts - first).to(self.device)
        return positions

    def _fn(self) -> Callable[..., torch.Tensor]:
        return _compiled(kl_loss, self.graphs) if torch.is_grad_enabled() else kl_loss


class CapturedJoint:
    """A ``CapturedKL``'s rows and a ``CapturedNLL``'s stacked into one batch (both right-padded to
    the wider of the two, a multiple of ``WIDTH_STEP``): ``losses`` is ``joint_losses`` compiled,
    both terms from one forward."""

    def __init__(self, kl: CapturedKL, nll: CapturedNLL, pad_id: int) -> None:
        width = max(kl.ids.shape[1], nll.ids.shape[1])

        def widen(t: torch.Tensor, fill: int) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill)

        self.kl, self.nll = kl, nll
        self.ids = torch.cat([widen(kl.ids, pad_id), widen(nll.ids, pad_id)])
        self.mask = torch.cat([widen(kl.mask, 0), widen(nll.mask, 0)])
        self.labels = widen(nll.labels, IGNORE)
        self.split = kl.ids.shape[0]
        self.first = min(kl.first, nll.first)

    def losses(
        self, model: Any, student: str = "full", scored_only: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keep, first = logits_window(model, self.ids.shape[1], self.first, scored_only)
        fn = _compiled(joint_losses, self.kl.graphs) if torch.is_grad_enabled() else joint_losses
        return fn(
            model,
            self.ids,
            self.mask,
            keep,
            self.split,
            self.kl.rows,
            self.kl.positions(first),
            self.kl.weight,
            self.kl.topk_ids,
            self.kl.topk_lp,
            student,
            self.labels[:, first:],
        )
