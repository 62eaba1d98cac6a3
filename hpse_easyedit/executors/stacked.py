"""Stacked executors: the trainable state of B independent edits of ONE frozen model, side by side.

A solo executor (``lora.py``, ``ftm.py``) trains tensors inside the model. A stacked executor keeps
B copies of those tensors outside it, one set per case, and routes each batch row to its case's
copy while the model computes: LoRA as adapters stacked per row into ``A [N, r, in]``, ``B [N, out,
r]`` and applied with one batched matmul per projection (never B copies of the model; a pass whose
rows are all one case's uses that case's adapters directly, the solo executor's very operations),
FT-M as copies of the edited matrix, each case's rows multiplied by its own (with float32 masters
in a half-precision model, as the solo FT-M has). Gradients reach only the cases a pass computes.
The model's own tensors never change: each case's result is read out under the solo executor's
parameter names (``case_tensors``), which is what a solo edit of that case would have left in the
model.

Rows are routed by ``rows(cases)``: ``cases[i]`` is row i's case, or -1 for a row that computes the
frozen base model pi_0 (a teacher row); teacher rows come last. Adam is elementwise, so one
optimiser over every case's tensors is B independent optimisers.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator, Sequence

import torch
import torch.nn.functional as F

from .ftm import FTMExecutor, grad_to_master
from .lora import ADAPTER_NAME, LoRAExecutor
from .state import edit_state, kept_tensor, unwrapped

__all__ = ["STACKED", "StackedExecutor", "StackedFTM", "StackedLoRA", "make_stacked"]


def _segments(cases: Sequence[int]) -> list[tuple[int, int, int]]:
    """Runs of equal case ids as ``(start, stop, case)``."""
    runs: list[tuple[int, int, int]] = []
    for i, c in enumerate(cases):
        if runs and runs[-1][2] == c:
            runs[-1] = (runs[-1][0], i + 1, c)
        else:
            runs.append((i, i + 1, c))
    return runs


def _students(cases: Sequence[int]) -> int:
    """How many rows lead with a case (>= 0) before the trailing teacher rows (-1); refuses any
    other layout."""
    n = next((i for i, c in enumerate(cases) if c < 0), len(cases))
    if any(c >= 0 for c in cases[n:]):
        raise ValueError("stacked executors need the teacher rows (-1) after every case row")
    return n


class StackedExecutor:
    """B cases' trainable state beside one frozen model; see the module docstring."""

    name = "base"

    def __init__(self, model: Any, hparams: Any, cases: int) -> None:
        self.hparams, self.cases = hparams, cases
        self.model = model
        self._rows: list[int] | None = None
        self._patched: list[torch.nn.Module] = []

    # -- what trains ---------------------------------------------------------------------------
    def trainable_parameters(self) -> list[torch.Tensor]:
        raise NotImplementedError

    def optimizer(self) -> torch.optim.Optimizer:
        """One Adam over every case's tensors (elementwise, so B independent Adams), configured as
        the solo executor's (``Executor.optimizer``)."""
        hp = self.hparams
        params = self.trainable_parameters()
        fused = {"fused": True} if all(p.device.type == "cuda" for p in params) else {}
        optimizer = torch.optim.Adam(
            params, lr=hp.lr, betas=tuple(hp.adam_betas), weight_decay=hp.weight_decay, **fused
        )
        optimizer.register_step_post_hook(lambda *_: self.after_step())
        return optimizer

    def after_step(self) -> None:
        """After each optimiser step (FT-M in half precision: the masters cast into the model's
        dtype)."""

    def case_tensors(self, case: int) -> dict[str, torch.Tensor]:
        """Case ``case``'s tensors under the solo executor's parameter names (detached clones)."""
        raise NotImplementedError

    def set_case(self, case: int, tensors: dict[str, torch.Tensor]) -> None:
        """Put ``tensors`` (solo names, as ``case_tensors`` gives them) in as case ``case``'s
        values."""
        raise NotImplementedError

    # -- routing rows --------------------------------------------------------------------------
    @contextlib.contextmanager
    def rows(self, cases: Sequence[int]) -> Iterator[None]:
        """Inside: row i of every forward computes case ``cases[i]`` (-1: the frozen base model;
        teacher rows last)."""
        _students(cases)
        before, self._rows = self._rows, list(cases)
        try:
            yield
        finally:
            self._rows = before
            self._release_cache()

    def _release_cache(self) -> None:
        """Drop what a no-grad decode cached for the current row layout."""

    def row_switch_for(self, student_cases: Sequence[int]) -> Any:
        """A ``row_switch`` for the rollout drivers (``rollout.py``), whose batches are the students
        followed by as many teacher rows: student row i computes case ``student_cases[i]``."""

        def row_switch(teacher_rows: torch.Tensor) -> Any:
            flags = teacher_rows.tolist()
            if flags != [False] * len(student_cases) + [True] * (len(flags) - len(student_cases)):
                raise ValueError("the rollout's rows are not the students, then their teachers")
            return self.rows(list(student_cases) + [-1] * (len(flags) - len(student_cases)))

        return row_switch

    def close(self) -> None:
        """Give the model back as it came: forwards unpatched, flags and wrappers released."""
        for module in self._patched:
            del module.forward
        self._patched = []


class StackedLoRA(StackedExecutor):
    """B LoRA adapters of the solo executor's shape, initialised as it initialises one (same seed,
    so every case starts where its solo edit starts) or from given tensors."""

    name = "lora"

    def __init__(self, model: Any, hparams: Any, cases: int) -> None:
        super().__init__(model, hparams, cases)
        if hparams.lora_dropout > 0:
            raise ValueError(
                "editing several cases at once needs lora_dropout: 0 (dropout draws random masks "
                "that a solo edit draws in another order); set lora_dropout: 0 in the hparams"
            )
        self.solo = LoRAExecutor(model, hparams)
        self.model = self.solo.model
        self._start = self.solo.weights_copy()  # the model's adapter: every case's start
        self._flags = {n: p.requires_grad for n, p in self.model.named_parameters()}
        for p in self.model.parameters():
            p.requires_grad_(False)
        names = {id(p): n for n, p in self.model.named_parameters()}
        self._layers = []
        self._a: list[list[torch.Tensor]] = []  # per layer, per case
        self._b: list[list[torch.Tensor]] = []
        self._names: list[tuple[str, str]] = []
        for layer in self.solo._lora_layers:
            if ADAPTER_NAME not in layer.lora_A:
                continue
            wa, wb = layer.lora_A[ADAPTER_NAME].weight, layer.lora_B[ADAPTER_NAME].weight
            na, nb = names[id(wa)], names[id(wb)]
            self._names.append((na, nb))
            self._a.append([self._start[na].clone().requires_grad_(True) for _ in range(cases)])
            self._b.append([self._start[nb].clone().requires_grad_(True) for _ in range(cases)])
            self._layers.append(layer)
        self._gathered: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for i, layer in enumerate(self._layers):
            layer.forward = self._make_forward(i, layer)
            self._patched.append(layer)

    def _make_forward(self, i: int, layer: Any) -> Any:
        base, scaling = layer.base_layer, layer.scaling[ADAPTER_NAME]

        def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            result = base(x, *args, **kwargs)
            cases = self._rows
            if cases is None or layer.disable_adapters:
                return result
            n, a, b = self._per_row(i, cases)
            dtype = result.dtype
            xs = x[:n].to(a.dtype)
            if a.dim() == 2:  # every row one case's: the solo executor's very operations
                delta = F.linear(F.linear(xs, a), b)
            else:
                delta = torch.matmul(torch.matmul(xs, a.transpose(-1, -2)), b.transpose(-1, -2))
            students = (result[:n] + delta * scaling).to(dtype)
            return students if n == result.shape[0] else torch.cat([students, result[n:]])

        return forward

    def _per_row(self, i: int, cases: Sequence[int]) -> tuple[int, torch.Tensor, torch.Tensor]:
        """The number of student rows and layer ``i``'s adapters for them: the case's own ``[r,
        in]``, ``[out, r]`` when every row is one case's, else stacked per row ``[N, r, in]``, ``[N,
        out, r]`` (gradients reach only the cases in the batch). Kept for the whole of a no-grad
        decode, whose adapters cannot change."""
        cached = self._gathered.get(i)
        if cached is not None:
            return cached
        rows = list(cases[: _students(cases)])
        a, b = self._a[i], self._b[i]
        if len(set(rows)) == 1:
            out = (len(rows), a[rows[0]], b[rows[0]])
        else:
            out = (len(rows), torch.stack([a[c] for c in rows]), torch.stack([b[c] for c in rows]))
        if not torch.is_grad_enabled():
            if len(set(rows)) > 1:  # a decode's stacks in the model's workspace: same addresses
                # in every round, so a captured decode step is replayed, not captured again
                n, sa, sb = out
                out = (
                    n,
                    kept_tensor(self.model, f"stacked_a{i}", sa, sa.device, sa.dtype),
                    kept_tensor(self.model, f"stacked_b{i}", sb, sb.device, sb.dtype),
                )
            self._gathered[i] = out
        return out

    def _release_cache(self) -> None:
        self._gathered = {}

    def trainable_parameters(self) -> list[torch.Tensor]:
        return [t for pair in zip(self._a, self._b) for per_case in pair for t in per_case]

    def case_tensors(self, case: int) -> dict[str, torch.Tensor]:
        out = {}
        for (na, nb), a, b in zip(self._names, self._a, self._b):
            out[na], out[nb] = a[case].detach().clone(), b[case].detach().clone()
        return out

    def set_case(self, case: int, tensors: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for (na, nb), a, b in zip(self._names, self._a, self._b):
                a[case].copy_(tensors[na])
                b[case].copy_(tensors[nb])

    def start_tensors(self) -> dict[str, torch.Tensor]:
        """The values every case starts from unless given its own (the model's adapter)."""
        return {n: t.clone() for n, t in self._start.items()}

    def close(self) -> None:
        super().close()
        for n, p in self.model.named_parameters():
            p.requires_grad_(self._flags.get(n, False))
        from . import restore_weights

        self.solo.finish()
        self.model = restore_weights(self.model, self._start)


class StackedFTM(StackedExecutor):
    """B copies of FT-M's matrix; teacher rows see the original matrix (the unedited model's, as
    the solo FT-M keeps it), each case's rows its own copy. In half precision Adam trains float32
    masters and each step's result is cast into the copies the forward reads, as in the solo
    executor."""

    name = "ft_m"

    def __init__(self, model: Any, hparams: Any, cases: int) -> None:
        super().__init__(model, hparams, cases)
        base = unwrapped(model)
        problem = FTMExecutor.model_mismatch(base, hparams)
        if problem is not None:
            raise ValueError(f"{getattr(hparams, '_source', None) or 'the hparams'}: {problem}")
        self.module_name = hparams.ftm_module_template.format(hparams.ftm_layer)
        prefix = "base_model.model." if base is not model else ""
        self.param_name = prefix + f"{self.module_name}.weight"
        module = base.get_submodule(self.module_name)
        weight = module.weight
        state = edit_state(base)
        if state.ftm_original is not None and state.ftm_original[0] != f"{self.module_name}.weight":
            raise ValueError(
                f"this model was already edited with FT-M at {state.ftm_original[0]}, not "
                f"{self.module_name}.weight; restore it first or keep the same 'ftm_layer'"
            )
        self._start = weight.detach().clone()
        # on a first edit the original is the start: one copy of the matrix, not two (neither is
        # written to; ``close`` restores from ``_start``)
        self._original = state.ftm_original[1] if state.ftm_original is not None else self._start
        self._flags = {n: p.requires_grad for n, p in model.named_parameters()}
        for p in model.parameters():
            p.requires_grad_(False)
        self._copies = [self._start.clone().requires_grad_(True) for _ in range(cases)]
        self._masters: list[torch.Tensor] | None = None
        if weight.dtype in (torch.float16, torch.bfloat16):
            self._masters = [c.detach().float().requires_grad_(True) for c in self._copies]
            for copy, master in zip(self._copies, self._masters):
                copy.register_post_accumulate_grad_hook(self._grad_to(master))
        self._module = module
        module.forward = self._make_forward(module)
        self._patched.append(module)

    def _make_forward(self, module: torch.nn.Module) -> Any:
        def forward(x: torch.Tensor) -> torch.Tensor:
            cases = self._rows
            if cases is None:
                return F.linear(x, self._original.to(x.device, x.dtype), module.bias)
            parts = [
                F.linear(
                    x[s:e],
                    self._copies[c] if c >= 0 else self._original.to(x.device, x.dtype),
                    module.bias,
                )
                for s, e, c in _segments(cases)
            ]
            return parts[0] if len(parts) == 1 else torch.cat(parts)

        return forward

    @staticmethod
    def _grad_to(master: torch.Tensor) -> Any:
        """A copy's gradient, accumulated in float32 into its master (the solo FT-M's
        ``grad_to_master``)."""
        return functools.partial(grad_to_master, master)

    def after_step(self) -> None:
        if self._masters is not None:
            with torch.no_grad():
                torch._foreach_copy_(self._copies, self._masters)

    def trainable_parameters(self) -> list[torch.Tensor]:
        return self._copies if self._masters is None else self._masters

    def case_tensors(self, case: int) -> dict[str, torch.Tensor]:
        return {self.param_name: self._copies[case].detach().clone()}

    def set_case(self, case: int, tensors: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            self._copies[case].copy_(tensors[self.param_name])
            if self._masters is not None:
                self._masters[case].copy_(tensors[self.param_name].float())

    def start_tensors(self) -> dict[str, torch.Tensor]:
        return {self.param_name: self._start.clone()}

    def close(self) -> None:
        super().close()
        for n, p in self.model.named_parameters():
            p.requires_grad_(self._flags.get(n, False))


#: ``hparams.executor`` -> its stacked executor
STACKED: dict[str, type[StackedExecutor]] = {"lora": StackedLoRA, "ft_m": StackedFTM}


def make_stacked(model: Any, hparams: Any, cases: int) -> StackedExecutor:
    """The stacked executor named by ``hparams.executor`` for ``cases`` cases around ``model``."""
    try:
        cls = STACKED[hparams.executor]
    except KeyError:
        raise ValueError(
            f"executor {hparams.executor!r} cannot edit several cases at once; set 'executor' to "
            f"one of {sorted(STACKED)}"
        ) from None
    return cls(model, hparams, cases)
