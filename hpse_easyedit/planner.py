"""How much GPU memory one edit needs, per phase, before any weight is downloaded (``python -m
hpse_easyedit plan``).

The plan runs this project's own edit code on the real architecture without allocating: the model is
built from its config (a local directory's ``config.json``, or the published configs of the paper's
backbones shipped in ``hpse_easyedit/backbones/``) on PyTorch's ``meta`` device, whose tensors have
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
  cache of the teacher prompt plus ``max_new_tokens`` for the student and teacher rows), prefill and
  one decode step;
- ``training``: two inner steps (``training.inner_step``: the KL rows over prompt + rollout, then
  the NLL rows over prompt + passage, each forward and backward, then Adam), at the planned rollout
  length;
- ``answers``: greedy answers after the edit (``generate_answers``' batch of questions, prompt plus
  the benchmark's answer length), prefill and one decode step.

The figure is what the tensors need (a CUDA ``max_memory_allocated``). A CUDA process also holds its
context and the caching allocator's slack: ``card_gib`` adds them (``CUDA_CONTEXT_GIB`` and
``ALLOCATOR_SLACK``, measured on an H100 for one Qwen2.5-7B LoRA edit, docs/GPU.md) before comparing
with a card. Decode memory is planned on the static
path; the default dynamic cache reaches the same KV bytes at its last token. Prompt and passage
lengths are the benchmark's (``WORKLOADS``, counted with the SmolLM2 tokenizer on the data; other
tokenizers differ by a few per cent)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

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
    "WORKLOADS",
    "Workload",
    "backbone_config",
    "card_gib",
    "fused_attention_on_meta",
    "plan_edit",
    "plan_with_knobs",
    "shipped_backbones",
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
    shipped published config whose ``_name_or_path`` is that hub id; ``layers`` cuts the model to
    that many layers."""
    from transformers import AutoConfig

    path = Path(model_name)
    if (path / "config.json").is_file():
        config = AutoConfig.from_pretrained(str(path))
    else:
        shipped = {
            hub_id: BACKBONE_DIR / f"{stem}.json" for stem, hub_id in shipped_backbones().items()
        }
        if model_name not in shipped:
            raise HParamsError(
                f"{source}: key 'model_name' is {model_name!r}, which is neither a local model "
                f"directory nor one of the shipped backbone configs {sorted(shipped)}; point "
                "model_name to a directory with a config.json"
            )
        values = json.loads(shipped[model_name].read_text())
        config = AutoConfig.for_model(
            values.pop("model_type"), **{k: v for k, v in values.items() if not k.startswith("_")}
        )
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
            return 1
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


def _planned_model(hp: Any, layers: int | None, device: str) -> Any:
    """The model ``hp`` names, built from its config on ``device`` (no weights read), in eval mode
    and checked against the hparams' modules and layers."""
    from transformers import AutoModelForCausalLM

    from .loading import check_against_model

    config = backbone_config(hp.model_name, layers, getattr(hp, "_source", None) or "the hparams")
    if hp.attn_implementation != "auto":
        config._attn_implementation = hp.attn_implementation
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=hp.torch_dtype)
    model.eval()
    check_against_model(model, hp)
    return model


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


def _answers_phase(model: Any, workload: Workload) -> None:
    """``generate_answers``' batch after an edit on the preallocated decode: prefill and one
    step."""
    from .static_decode import StaticDecoder

    rows = [[11] * workload.question_tokens] * workload.answer_rows
    answers = StaticDecoder(model, rows, 0, workload.answer_tokens)
    with torch.no_grad():
        logp = answers.prefill()
        answers.step(logp.argmax(-1).view(-1, 1))


def plan_edit(
    hparams: Any, workload: Workload, *, layers: int | None = None, device: str = "meta"
) -> dict:
    """The predicted peak bytes of one edit with ``hparams`` on ``workload``, per phase (see the
    module docstring).

    Runs the edit's own code on the ``meta`` device: nothing is allocated and no weights are needed.
    ``device="cpu"`` runs the same steps on real random weights, which is how the tests check that
    the meta run counts what real tensors take."""
    from .editor import HPSEObjective
    from .executors import make_executor
    from .static_decode import StaticDecoder
    from .training import activation_checkpointing, inner_step

    hp = hparams.with_overrides({"max_new_tokens": workload.max_new_tokens})
    phases: dict[str, dict] = {}
    model = _planned_model(hp, layers, device)
    attention = fused_attention_on_meta() if device == "meta" else contextlib.nullcontext()
    with attention, LiveBytes([*model.parameters(), *model.buffers()]) as mem:
        weights = mem.live
        phases["weights"] = {"peak": weights}

        def close(name: str, start: int) -> None:
            phases[name] = {"peak": mem.phase_peak, "own": mem.phase_peak - start}

        mem.mark()
        executor = make_executor(model, hp)
        weights_copy = executor.weights_copy()
        optimizer = executor.optimizer()
        prompts = _placeholder_prompts(hp, workload)
        after_executor = mem.live

        mem.mark()
        start = mem.live
        decoder = StaticDecoder(
            executor.model,
            [prompts[0].student_ids, prompts[0].teacher_ids],
            0,
            workload.max_new_tokens,
        )
        with torch.no_grad(), executor.row_switch(torch.tensor([False, True])):
            logp = decoder.prefill()
            decoder.step(logp.argmax(-1).view(2, 1)[:1].expand(2, 1))
        del decoder, logp
        close("rollout", start)

        rollouts = _placeholder_rollouts(prompts, hp, workload.max_new_tokens)
        objective = HPSEObjective(executor, prompts, hp, stop_ids=[0], pad_id=0)
        objective.use_rollouts(rollouts if hp.kl_weight > 0 else None)
        mem.mark()
        start = mem.live
        executor.model.train(hp.lora_dropout > 0)
        with activation_checkpointing(executor.model, hp.gradient_checkpointing):
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
        _answers_phase(executor.model, workload)
        del weights_copy
        close("answers", start)
        peak = mem.peak
    return _report(hp, workload, weights, phases, peak, layers)


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
    ("gradient_checkpointing=true", {"gradient_checkpointing": True}, {}),
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
