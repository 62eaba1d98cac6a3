"""How much GPU memory one edit needs, per phase, before any weight is downloaded (``python -m
hpse_easyedit plan``).

The plan runs this project's own edit code on the real architecture without allocating: the model is
built from its config (a local directory's ``config.json``, the published configs of the paper's
backbones shipped in ``hpse_easyedit/backbones/``, or a downloaded model's in the Hugging Face
cache) on PyTorch's ``meta`` device, whose tensors have
shapes, dtypes and storage sizes but no data, and ``LiveBytes``, a small ``TorchDispatchMode``, adds
each new storage's bytes when an op creates it and subtracts them when the storage is freed.
(``torch.distributed._tools.mem_tracker.MemTracker`` cannot do this: it hooks every parameter's
gradient, which a frozen parameter refuses; under ``FakeTensorMode`` peft cannot move its new
adapters, as ``Module.to`` cannot swap a fake parameter for itself in torch 2.13.) The phases are
the edit's own steps, in order:

- ``weights``: the model's parameters and buffers in the file's dtype;
- ``trainable_state``: the executor (LoRA adapters, or FT-M's kept and float32 master matrices), the
  copy that restores the model, and Adam's moments after its first step;
- ``rollout``: one request's hybrid rollout on the preallocated decode (``StaticDecoder``: the KV
  cache of the teacher prompt, its width rounded up as ``static_decode.kept_decoder`` rounds it,
  plus ``max_new_tokens`` for the student and teacher rows), prefill and one decode step; on the
  compiled decode (``static_decode: compile``, or ``auto`` on a card) the decoder is kept, so its
  cache stays allocated through the phases after it;
- ``training``: two inner steps (``training.inner_step``: the KL rows over prompt + rollout, then
  the NLL rows over prompt + passage, each forward and backward, then Adam), at the planned rollout
  length; where the step is captured (``compile_training: true``, or ``auto`` on a card), both
  terms' rows in one pass as the captured step stacks them (``captured.CapturedJoint``), run
  eagerly (inductor keeps fewer activations than the eager graph: an upper bound);
- ``answers``: greedy answers after the edit (``generate_answers``' batch of questions, prompt plus
  the benchmark's answer length), prefill and one decode step.

The figure is what the tensors need (a CUDA ``max_memory_allocated``). A CUDA process also holds its
context and the caching allocator's slack: ``card_gib`` adds them (``CUDA_CONTEXT_GIB`` and
``ALLOCATOR_SLACK``, measured on an H100 for one Qwen2.5-7B LoRA edit, docs/GPU.md) before comparing
with a card. Decode memory is planned on the static
path; the default dynamic cache reaches the same KV bytes at its last token. Prompt and passage
lengths are the benchmark's (``WORKLOADS``, counted with the SmolLM2 tokenizer on the data; other
tokenizers differ by a few per cent).

Many independent edits at once (``batched.hpse_edit_cases``, the runners' ``--cases-at-once B``):
``plan_cases`` runs the batched engine's own steps for B cases through the same phases (the stacked
executor with every case's start and Adam; one rollout of every case's student and teacher rows;
two inner steps in passes of ``cases_per_pass`` cases, 'auto' being a GPU's: all in one pass; each
case's result held while one is answered), and ``plan_cases_at_once`` turns plans at a few B into
the memory per extra case and the largest B per card (``plan --cases-at-once``). Checked against
the real engine's measured peak on SmolLM2 by ``benchmarks.perf.plan_check``
(docs/perf/plan-cases-smollm2.json)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from .errors import UsageError
from .hparams import HParamsError

__all__ = [
    "BACKBONE_DIR",
    "CARDS_GIB",
    "ALLOCATOR_SLACK",
    "CUDA_CONTEXT_GIB",
    "LiveBytes",
    "MAX_CASES",
    "WORKLOADS",
    "Workload",
    "backbone_config",
    "card_gib",
    "fused_attention_on_meta",
    "largest_cases",
    "plan_cases",
    "plan_cases_at_once",
    "plan_edit",
    "predicted_peak",
    "plan_with_knobs",
    "shipped_backbones",
    "tensor_budget_gib",
]

logger = logging.getLogger(__name__)

BACKBONE_DIR = Path(__file__).with_name("backbones")
#: the cards a plan is compared with, by their nominal memory in GiB (24: RTX 3090/4090, A10; 40/80:
#: A100; 48: L40S, RTX 6000 Ada; 80: H100); some show a little less to CUDA (an H100 80 GB: 79.6
#: GiB)
CARDS_GIB = (24, 40, 48, 80)
#: what a CUDA process holds besides its tensors and the allocator's pool: the context and its
#: libraries (measured: 0.77 GiB, H100, torch 2.11 + CUDA 13.0, docs/perf/gpu-h100-perf.json)
CUDA_CONTEXT_GIB = 0.8
#: the caching allocator's reserved peak over its allocated peak, minus one (measured: 19.09 / 16.08
#: GiB in one Qwen2.5-7B LoRA edit on an H100, docs/perf/gpu-h100-perf.json; one measurement)
ALLOCATOR_SLACK = 0.19
GIB = 2**30


@dataclass(frozen=True)
class Workload:
    """The sequence lengths one edit of a benchmark builds (p95 of the data, SmolLM2 tokenizer)."""

    name: str
    requests: int  # requests edited jointly (passages)
    passage_tokens: int  # per passage
    max_new_tokens: int  # rollout length (the hparams' value for this benchmark)
    student_prompt_tokens: int = 37  # the chat-templated "Introduce {s}."
    teacher_overhead_tokens: int = (
        171  # the privileged prompt's rules and question around the passage
    )
    answer_rows: int = 8  # generate_answers' batch
    question_tokens: int = 72  # a templated question
    answer_tokens: int = 128


#: UnKEBench: one passage (p95 157 tokens), 128 rollout tokens, answers of up to 200 tokens;
#: MQuAKE-uns: three passages edited jointly (p95 128 tokens each), 96 rollout tokens, answers of up
#: to 128 tokens.
WORKLOADS = {
    "unkebench": Workload(
        "unkebench", requests=1, passage_tokens=157, max_new_tokens=128, answer_tokens=200
    ),
    "mquake": Workload(
        "mquake", requests=3, passage_tokens=128, max_new_tokens=96, question_tokens=48
    ),
}


def shipped_backbones() -> dict[str, str]:
    """The shipped backbone configs: file stem (``qwen2.5-7b``) -> the hub id they describe."""
    return {
        f.stem: json.loads(f.read_text())["_name_or_path"]
        for f in sorted(BACKBONE_DIR.glob("*.json"))
    }


def backbone_config(model_name: str, layers: int | None = None, source: str = "the hparams") -> Any:
    """The transformers config of ``model_name``: a local directory's ``config.json``, else the
    shipped published config whose ``_name_or_path`` is that hub id, else that hub id's config in
    the Hugging Face cache (never downloaded); ``layers`` cuts the model to that many layers."""
    from transformers import AutoConfig

    path = Path(model_name)
    shipped = {
        hub_id: BACKBONE_DIR / f"{stem}.json" for stem, hub_id in shipped_backbones().items()
    }
    if (path / "config.json").is_file():
        config = AutoConfig.from_pretrained(str(path))
    elif model_name in shipped:
        values = json.loads(shipped[model_name].read_text())
        config = AutoConfig.for_model(
            values.pop("model_type"), **{k: v for k, v in values.items() if not k.startswith("_")}
        )
    else:
        try:  # a model downloaded before: its config.json in the Hugging Face cache
            config = AutoConfig.from_pretrained(model_name, local_files_only=True)
        except (OSError, ValueError):
            raise HParamsError(
                f"{source}: key 'model_name' is {model_name!r}, which is neither a local model "
                f"directory, one of the shipped backbone configs {sorted(shipped)}, nor a model "
                "in the Hugging Face cache; point model_name to a directory with a config.json"
            ) from None
    if layers is not None:
        if not 1 <= layers <= config.num_hidden_layers:
            raise UsageError(
                f"--layers {layers}: {model_name} has {config.num_hidden_layers} layers; plan it "
                f"cut to 1 to {config.num_hidden_layers} of them, or leave --layers out for all"
            )
        config.num_hidden_layers = layers
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:layers]
    return config


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages created under this mode that are still alive, and their peak.

    Each op's new outputs are looked at once (views and in-place results, which the op's schema
    marks as aliases, are not new): a storage not seen before adds its ``nbytes`` and a weak
    reference subtracts them when it is freed. (On the meta device a view can get a storage object
    of its own, so the schema, not the storage, decides.) ``mark()`` starts a new phase:
    ``phase_peak`` is the peak since."""

    def __init__(self, existing: Iterable[torch.Tensor] = ()) -> None:
        """``existing``: tensors alive before the mode starts (the model's weights), counted from
        the start, so that a view of one made under the mode is not counted again."""
        super().__init__()
        self.live = self.peak = self.phase_peak = 0
        #: what reading a meta tensor's value on the host gives (it has none)
        self.meta_scalar = 1
        self._refs: dict[int, weakref.ref] = {}
        for t in existing:
            self._track(t)

    def _freed(self, key: int, nbytes: int) -> None:
        self._refs.pop(key, None)
        self.live -= nbytes

    def _track(self, t: Any) -> None:
        if not isinstance(t, torch.Tensor):
            return
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self._refs:
            return
        nbytes = storage.nbytes()
        self._refs[key] = weakref.ref(storage, lambda _, k=key, n=nbytes: self._freed(k, n))
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        self.phase_peak = max(self.phase_peak, self.live)

    def mark(self) -> None:
        self.phase_peak = self.live

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default and args[0].device.type == "meta":
            # a meta tensor has no value; Adam's step count is the one read (its bias correction)
            return self.meta_scalar
        out = func(*args, **(kwargs or {}))
        returns = func._schema.returns
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if len(returns) == 1 and len(outs) > 1:  # one returned list of tensors (split, unbind, ...)
            returns = returns * len(outs)
        for ret, t in zip(returns, outs):
            if ret.alias_info is None:  # a view or an in-place result shares its input's storage
                self._track(t)
        return out


def _fused_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` as the fused kernel (PyTorch's CPU flash attention: keeps
    the output and a float32 log-sum-exp per row for backward, as CUDA's flash and memory-efficient
    kernels do), grouped-query heads unrepeated, where the meta device would pick the math fallback,
    which keeps each ``[T, T]`` matrix."""
    out, _ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
    )
    return out


@contextlib.contextmanager
def fused_attention_on_meta() -> Iterator[None]:
    """Inside: ``torch.nn.functional.scaled_dot_product_attention`` is ``_fused_sdpa`` (transformers
    looks it up at each call, also when gradient checkpointing recomputes a layer in backward); put
    back on exit."""
    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _fused_sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def card_gib(gib: float) -> float:
    """What a card holds for a peak of ``gib`` GiB of tensors: the allocator's pool around them and
    the CUDA context."""
    return gib * (1 + ALLOCATOR_SLACK) + CUDA_CONTEXT_GIB


def _fits(gib: float) -> dict[str, bool]:
    return {str(card): card_gib(gib) <= card for card in CARDS_GIB}


def _planned_model(hp: Any, layers: int | None, device: str, source: str | None) -> Any:
    """The model ``hp`` names, built from its config on ``device`` (no weights read), in eval mode
    and checked against the hparams' modules and layers; ``source`` names the hparams file."""
    from transformers import AutoModelForCausalLM

    from .loading import check_against_model

    config = backbone_config(hp.model_name, layers, source or "the hparams")
    if hp.attn_implementation != "auto":
        config._attn_implementation = hp.attn_implementation
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=hp.torch_dtype)
    model.eval()
    check_against_model(model, hp)
    return model


@contextlib.contextmanager
def _planned_run(
    hparams: Any, workload: Workload, layers: int | None, device: str
) -> Iterator[tuple[Any, Any, LiveBytes, dict, Any]]:
    """The frame of a plan: yields the hparams at the workload's rollout length, the planned model,
    the ``LiveBytes`` counting (from the weights on; a phase starts at ``mem.mark()``), the phases
    (``weights`` filled in) and ``close(name, start)``, which records the phase since the mark."""
    hp = hparams.with_overrides({"max_new_tokens": workload.max_new_tokens})
    phases: dict[str, dict] = {}
    model = _planned_model(hp, layers, device, getattr(hparams, "_source", None))
    attention = fused_attention_on_meta() if device == "meta" else contextlib.nullcontext()
    with attention, LiveBytes([*model.parameters(), *model.buffers()]) as mem:
        phases["weights"] = {"peak": mem.live}

        def close(name: str, start: int) -> None:
            phases[name] = {"peak": mem.phase_peak, "own": mem.phase_peak - start}

        mem.mark()
        yield hp, model, mem, phases, close


def _placeholder_prompts(hp: Any, workload: Workload) -> list:
    """One edit's requests at the workload's lengths (token ids are placeholders: memory depends on
    lengths only)."""
    from .prompts import EditPrompts

    facts = workload.passage_tokens * (1 if hp.teacher_facts == "request" else workload.requests)
    return [
        EditPrompts(
            subject=f"s{i}",
            student_ids=[7] * workload.student_prompt_tokens,
            teacher_ids=[9] * (workload.teacher_overhead_tokens + facts),
            passage_ids=[5] * workload.passage_tokens,
        )
        for i in range(workload.requests)
    ]


def _placeholder_rollouts(prompts: list, hp: Any, length: int) -> list:
    """A rollout of ``length`` tokens per request, with the teacher's top-K per position."""
    from .rollout import Rollout

    return [
        Rollout(
            torch.zeros(length, dtype=torch.long),
            torch.zeros(length, dtype=torch.bool),
            torch.zeros(length, hp.top_k, dtype=torch.long),
            torch.zeros(length, hp.top_k),
        )
        for _ in prompts
    ]


def _answers_phase(model: Any, workload: Workload, kept: bool) -> None:
    """The answers after an edit (``generate_answers``' batch), decoded preallocated: prefill and
    one step."""
    from .static_decode import StaticDecoder, kept_width

    rows = [[11] * workload.question_tokens] * workload.answer_rows
    width = kept_width(rows) if kept else None
    answers = StaticDecoder(model, rows, 0, workload.answer_tokens, width=width)
    with torch.no_grad():
        logp = answers.prefill()
        answers.step(logp.argmax(-1).view(-1, 1))


def _keeps_decoder(hp: Any, model: Any) -> bool:
    """Whether the edit decodes on the compiled static path, whose decoder is kept with the model
    (``static_decode.kept_decoder``: its cache stays allocated through the phases after the
    rollout): ``static_decode: compile``, or ``auto`` on a card (the meta device's plan is a
    card's)."""
    setting = getattr(hp, "static_decode", False)
    if setting == "auto":
        return model.device.type in ("meta", "cuda")
    return setting == "compile"


def _captures_step(hp: Any, model: Any) -> bool:
    """Whether the edit's inner step is captured (``compile_training``), whose one pass over both
    terms' stacked rows (``captured.CapturedJoint``) holds both passes' activations at once: true,
    or ``auto`` on a card (the meta device's plan is a card's) without gradient checkpointing."""
    setting = getattr(hp, "compile_training", False)
    if setting == "auto":
        return model.device.type in ("meta", "cuda") and not getattr(
            hp, "gradient_checkpointing", False
        )
    return bool(setting)


def plan_edit(
    hparams: Any, workload: Workload, *, layers: int | None = None, device: str = "meta"
) -> dict:
    """The predicted peak bytes of one edit with ``hparams`` on ``workload``, per phase (see the
    module docstring).

    Runs the edit's own code on the ``meta`` device: nothing is allocated and no weights are needed.
    ``device="cpu"`` runs the same steps on real random weights, which is how the tests check that
    the meta run counts what real tensors take."""
    from .captured import uncompiled
    from .editor import HPSEObjective
    from .executors import make_executor
    from .static_decode import StaticDecoder, kept_width
    from .training import activation_checkpointing, inner_step

    with _planned_run(hparams, workload, layers, device) as (hp, model, mem, phases, close):
        weights = mem.live
        executor = make_executor(model, hp)
        weights_copy = executor.weights_copy()
        optimizer = executor.optimizer()
        prompts = _placeholder_prompts(hp, workload)
        after_executor = mem.live

        mem.mark()
        start = mem.live
        rows = [prompts[0].student_ids, prompts[0].teacher_ids]
        kept = _keeps_decoder(hp, model)
        decoder = StaticDecoder(
            executor.model,
            rows,
            0,
            workload.max_new_tokens,
            width=kept_width(rows) if kept else None,
        )
        with torch.no_grad(), executor.row_switch(torch.tensor([False, True])):
            logp = decoder.prefill()
            decoder.step(logp.argmax(-1).view(2, 1)[:1].expand(2, 1))
        del logp
        if not kept:
            decoder = None
        close("rollout", start)

        rollouts = _placeholder_rollouts(prompts, hp, workload.max_new_tokens)
        captured = _captures_step(hp, model)
        objective = HPSEObjective(executor, prompts, hp, stop_ids=[0], pad_id=0, captured=captured)
        objective.use_rollouts(rollouts if hp.kl_weight > 0 else None)
        mem.mark()
        start = mem.live
        executor.model.train(hp.lora_dropout > 0)
        with (
            activation_checkpointing(executor.model, hp.gradient_checkpointing),
            uncompiled(),  # the captured step's rows, planned eagerly
        ):
            for _ in range(2):
                inner_step(objective, executor.model, optimizer)
        optimizer.zero_grad(set_to_none=True)
        close("training", start)
        phases["trainable_state"] = {
            "peak": mem.live,
            "own": mem.live - weights,
            "executor_and_copy": after_executor - weights,
        }
        del objective, rollouts

        executor.model.eval()
        executor.finish()
        del optimizer
        mem.mark()
        start = mem.live
        _answers_phase(executor.model, workload, kept)
        del weights_copy, decoder
        close("answers", start)
        peak = mem.peak
    # whether the training phase is the captured step's one pass over both terms' rows
    return {**_report(hp, workload, weights, phases, peak, layers), "captured_step": captured}


def _planned_per_pass(hp: Any, model: Any) -> int | None:
    """Cases per training pass as the batched engine takes them (``batched.cases_per_pass``); on
    the meta device 'auto' is a GPU's choice, every case in one pass (the plan is for a card)."""
    from .batched import cases_per_pass

    if model.device.type == "meta" and getattr(hp, "cases_per_pass", "auto") == "auto":
        return None
    return cases_per_pass(hp, model)


def plan_cases(
    hparams: Any,
    workload: Workload,
    cases: int,
    *,
    layers: int | None = None,
    device: str = "meta",
    prompts: Sequence[Sequence[Any]] | None = None,
) -> dict:
    """The predicted peak bytes of ``cases`` independent edits at once (``batched.hpse_edit_cases``,
    the runners' ``--cases-at-once``) on ``workload``, per phase, as ``plan_edit``'s for one edit.

    Drives the batched engine's own code: the stacked executor with every case's start and Adam,
    ONE batched rollout of every case's student and teacher rows (``StaticDecoder`` routed by
    ``row_switch_for``: prefill and one step), two batched inner steps (``_round_batches`` and
    ``_inner_step``, in passes of ``cases_per_pass`` cases; 'auto' on the meta device is a GPU's:
    every case in one pass) on rollouts of the planned length, the no-grad check after the last
    update, each case's trained tensors read out (all in the ``training`` phase), then one case put
    in and answered while every case's result is held (as the runners do). ``prompts``: the cases'
    own ``EditPrompts`` (one list per case) instead of the workload's lengths; ``device="cpu"``
    runs the same steps on real random weights. Besides ``plan_edit``'s keys: ``cases``,
    ``cases_per_pass``, ``phase_bytes`` (each phase's peak) and ``peak_bytes``."""
    from .batched import (
        CaseEdit,
        _Case,
        _inner_step,
        _pass_values,
        _round_batches,
        _rows_of,
        apply_case_edit,
    )
    from .executors.stacked import make_stacked
    from .model_calls import input_device
    from .static_decode import StaticDecoder, kept_width
    from .training import activation_checkpointing

    if cases < 1:
        raise UsageError(f"cases at once must be >= 1, got {cases}")
    if prompts is not None and len(prompts) != cases:
        raise ValueError(f"prompts has {len(prompts)} cases for {cases} cases at once")
    with _planned_run(hparams, workload, layers, device) as (hp, model, mem, phases, close):
        weights = mem.live
        per_pass = _planned_per_pass(hp, model)
        try:
            stacked = make_stacked(model, hp, cases)
        except ValueError as err:  # what these hparams cannot do batched (LoRA dropout, ...)
            source = getattr(hparams, "_source", None) or "the hparams"
            raise HParamsError(f"{source}: {err}") from None
        base_start = stacked.start_tensors()
        starts = [{n: t.clone() for n, t in base_start.items()} for _ in range(cases)]
        optimizer = stacked.optimizer()
        live = [
            _Case(i, prompts[i] if prompts is not None else _placeholder_prompts(hp, workload), r)
            for i, r in enumerate(CaseEdit() for _ in range(cases))
        ]
        after_executor = mem.live

        mem.mark()
        start = mem.live
        requests = [(p.student_ids, p.teacher_ids) for c in live for p in c.prompts]
        n = len(requests)
        rows = [s for s, _ in requests] + [t for _, t in requests]
        kept = _keeps_decoder(hp, model)
        decoder = StaticDecoder(
            stacked.model,
            rows,
            0,
            workload.max_new_tokens,
            width=kept_width(rows) if kept else None,
        )
        switch = stacked.row_switch_for(_rows_of(live))
        with torch.no_grad(), switch(torch.tensor([False] * n + [True] * n)):
            logp = decoder.prefill()
            decoder.step(logp.argmax(-1).view(2 * n, 1)[:n].repeat(2, 1))
        del logp
        if not kept:
            decoder = None
        close("rollout", start)

        for c in live:
            c.rollouts = _placeholder_rollouts(c.prompts, hp, workload.max_new_tokens)
        mem.mark()
        start = mem.live
        passes = _round_batches(live, hp, 0, input_device(stacked.model), per_pass)
        with activation_checkpointing(stacked.model, hp.gradient_checkpointing):
            for _ in range(2):
                _inner_step(stacked, passes, hp, optimizer)
        optimizer.zero_grad(set_to_none=True)
        phases["trainable_state"] = {
            "peak": mem.live,
            "own": mem.live - weights,
            "executor_and_copy": after_executor - weights,
        }
        with torch.no_grad():  # the check after the last update (batched._final_check)
            for group, batches in passes:
                _pass_values(stacked, group, batches, hp, backward=False)
        del passes, optimizer, live
        results = [stacked.case_tensors(i) for i in range(cases)]  # each CaseEdit's tensors
        close("training", start)

        mem.mark()
        start = mem.live
        # restore_weights unloads the adapter once its lora_B are zero again, as they are after
        # close, and resume_edit then makes a fresh one: the meta device cannot show the zeros
        mem.meta_scalar = 0
        stacked.close()
        mem.meta_scalar = 1
        edited = apply_case_edit(stacked.model, hp, results[0])
        _answers_phase(edited, workload, kept)
        del results, starts, base_start, stacked, edited, decoder
        close("answers", start)
        peak = mem.peak
    plan = _report(hp, workload, weights, phases, peak, layers)
    plan["cases"] = cases
    plan["cases_per_pass"] = min(per_pass or cases, cases)  # as the engine splits them
    plan["phase_bytes"] = {name: p["peak"] for name, p in phases.items()}
    plan["peak_bytes"] = peak
    return plan


#: the most cases at once ``largest_cases`` answers (a phase whose memory does not grow with B would
#: otherwise allow any number)
MAX_CASES = 4096


def plan_cases_at_once(
    hparams: Any, workload: Workload, *, layers: int | None = None, device: str = "meta"
) -> dict:
    """Memory per extra case and the largest number of cases at once each card holds, from
    ``plan_cases`` at a few sizes B.

    Each phase's peak is linear in B once a batch stacks its cases' adapters per row (B >= 2; one
    case runs the solo executor's operations, a little lighter) and, with ``cases_per_pass`` k, once
    B >= k (the activations are one pass's, the state every case's). So B is planned at 1, 2, and
    b0 = max(2, k) and 2 b0 (k = B for 'auto': every case in one pass, as on a GPU); between them
    each phase is interpolated, past them extrapolated, and the largest B is the last whose every
    phase fits. ``per_case_gib`` is the peak's slope between b0 and 2 b0, what each extra case
    costs."""
    setting = getattr(hparams, "cases_per_pass", "auto")
    b0 = max(2, int(setting)) if setting != "auto" else 2
    sizes = sorted({1, 2, b0, 2 * b0})
    plans = {b: plan_cases(hparams, workload, b, layers=layers, device=device) for b in sizes}
    series = {b: {**p["phase_bytes"], "peak": p["peak_bytes"]} for b, p in plans.items()}
    points = {name: [(b, series[b][name]) for b in sizes] for name in series[1]}
    peak = {b: p["peak_bytes"] for b, p in plans.items()}
    solo = plans[1]
    out = {
        "model_name": solo["model_name"],
        "executor": solo["executor"],
        "dtype": solo["dtype"],
        "layers": layers,
        "benchmark": workload.name,
        "workload": solo["workload"],
        "cases_per_pass": setting,
        "planned": {
            str(b): {
                "peak_gib": round(peak[b] / GIB, 3),
                "phases": {n: round(v / GIB, 3) for n, v in p["phase_bytes"].items()},
            }
            for b, p in plans.items()
        },
        "solo_peak_gib": round(peak[1] / GIB, 3),
        "per_case_gib": round((peak[2 * b0] - peak[b0]) / b0 / GIB, 4),
        "per_case_phases_gib": {
            n: round((pts[-1][1] - pts[-2][1]) / b0 / GIB, 4)
            for n, pts in points.items()
            if n != "peak"
        },
        "points": points,
    }
    out["largest_cases"] = {
        str(card): largest_cases(out, tensor_budget_gib(card)) for card in CARDS_GIB
    }
    return out


def tensor_budget_gib(card: float) -> float:
    """The tensors' peak a card of ``card`` GiB holds: ``card_gib`` inverted."""
    return (card - CUDA_CONTEXT_GIB) / (1 + ALLOCATOR_SLACK)


def predicted_peak(plan: dict, cases: int) -> int:
    """The peak bytes of ``cases`` at once by ``plan_cases_at_once``'s model: each phase through its
    planned sizes (interpolated between them, extrapolated past the last two), the largest phase."""
    peaks = []
    for pts in plan["points"].values():
        (b_lo, lo), (b_hi, hi) = pts[-2], pts[-1]
        for (b_a, a), (b_b, b) in zip(pts, pts[1:]):
            if cases <= b_b:
                (b_lo, lo), (b_hi, hi) = (b_a, a), (b_b, b)
                break
        peaks.append(lo + (hi - lo) * (cases - b_lo) / (b_hi - b_lo))
    return round(max(peaks))


def largest_cases(plan: dict, tensors_gib: float) -> int:
    """The most cases at once (``plan_cases_at_once``) whose predicted peak stays within
    ``tensors_gib`` GiB of tensors (0: not even one case fits; at most ``MAX_CASES``)."""
    budget = tensors_gib * GIB
    if predicted_peak(plan, 1) > budget:
        return 0
    last = plan["points"]["weights"][-1][0]
    if predicted_peak(plan, last) > budget:
        return max(b for b in range(1, last) if predicted_peak(plan, b) <= budget)
    best = MAX_CASES  # past the planned sizes every phase grows linearly: the first to fill binds
    for pts in plan["points"].values():
        (b_lo, lo), (b_hi, hi) = pts[-2], pts[-1]
        if hi > lo:
            best = min(best, b_hi + int((budget - hi) * (b_hi - b_lo) // (hi - lo)))
    best = max(best, last)
    while best > last and predicted_peak(plan, best) > budget:  # float rounding at the edge
        best -= 1
    while best < MAX_CASES and predicted_peak(plan, best + 1) <= budget:
        best += 1
    return best


def _report(
    hp: Any, workload: Workload, weights: int, phases: dict, peak: int, layers: int | None
) -> dict:
    out_phases = {}
    for name in ("weights", "trainable_state", "rollout", "training", "answers"):
        p = phases[name]
        gib = p["peak"] / GIB
        entry = {"peak_gib": round(gib, 3), "fits": _fits(gib)}
        if "own" in p:
            entry["own_gib"] = round(p["own"] / GIB, 3)
        out_phases[name] = entry
    gib = peak / GIB
    return {
        "model_name": hp.model_name,
        "executor": hp.executor,
        "dtype": hp.dtype,
        "layers": layers,
        "benchmark": workload.name,
        "workload": dataclasses.asdict(workload),
        "gradient_checkpointing": hp.gradient_checkpointing,
        "peak_gib": round(gib, 3),
        "weights_gib": round(weights / GIB, 3),
        "card_gib": round(card_gib(gib), 3),
        "cuda_overhead_gib": round(card_gib(gib) - gib, 3),
        "fits": _fits(gib),
        "phases": out_phases,
    }


#: what a user can change when an edit does not fit, in the order tried: hparams overrides or a
#: smaller workload
KNOBS = (
    # the eager step's two passes, the larger one's activations at a time (the captured step
    # stacks both terms' rows in one pass)
    ("compile_training=false", {"compile_training": False}, {}),
    ("gradient_checkpointing=true", {"gradient_checkpointing": True}, {}),
    (
        "gradient_checkpointing=true, static_decode=true",
        {"gradient_checkpointing": True, "static_decode": True},
        {},
    ),
    ("executor=lora", {"executor": "lora"}, {}),
    ("one request per edit (batch_size=1)", {}, {"requests": 1}),
    ("shorter rollouts (max_new_tokens halved)", {}, {"max_new_tokens": None}),
    ("answer batch of 2 (generate_answers batch_size=2)", {}, {"answer_rows": 2}),
)


def plan_with_knobs(
    hparams: Any, workload: Workload, gpu_gib: float, *, layers: int | None = None
) -> dict:
    """``plan_edit``, plus for every phase that does not fit ``gpu_gib`` the first knob (``KNOBS``)
    whose own plan makes that phase fit, and each tried knob's peak."""
    plan = plan_edit(hparams, workload, layers=layers)
    plan["gpu_gib"] = gpu_gib
    short = [n for n, p in plan["phases"].items() if card_gib(p["peak_gib"]) > gpu_gib]
    plan["knobs"] = []
    for label, overrides, smaller in KNOBS:
        if not short:
            break
        if all(hparams[k] == v for k, v in overrides.items()):
            continue
        if "max_new_tokens" in smaller:
            smaller = {"max_new_tokens": max(1, workload.max_new_tokens // 2)}
        if smaller and all(getattr(workload, k) == v for k, v in smaller.items()):
            continue
        tried = plan_edit(
            hparams.with_overrides(overrides),
            dataclasses.replace(workload, **smaller),
            layers=layers,
        )
        fixed = [n for n in short if card_gib(tried["phases"][n]["peak_gib"]) <= gpu_gib]
        plan["knobs"].append({"knob": label, "peak_gib": tried["peak_gib"], "makes_fit": fixed})
        for name in fixed:
            plan["phases"][name].setdefault("knob", label)
    for name in short:
        plan["phases"][name].setdefault("knob", None)
    return plan
