"""HPSE hyper-parameters: one validated dataclass, read from YAML with ``safe_load``.

Names follow the paper (Algorithm 1 and Table ``tab:hp_hpsd``):

- ``tau``: the privileged-student gap gate. The privileged teacher steps into the rollout when
  ``log pi*(y*) - log pi_theta(y*) > tau`` ...
- ``kappa``: ... and the teacher is confident, ``pi*(y*) > kappa`` (``y*`` = the teacher's argmax).
- ``top_k``: the teacher distribution is restricted to its top-K tokens (renormalised) in the KL.
- ``kl_weight`` / ``nll_weight`` (lambda): weights of the hybrid KL term and of the passage NLL
  anchor.
- ``rounds`` (R): outer rounds, each draws one greedy rollout; ``inner_steps`` (M): Adam steps per
  rollout.
- ``rollout``: ``hybrid`` (HPSE) or ``on_policy`` (plain OPSD, the "w/o HP" ablation).

Every ablation of the paper is one field away: ``rollout: on_policy`` (w/o HP), ``nll_weight: 0``
(w/o NLL), both (w/o both, i.e. OPSD), ``kl_weight: 0`` (the plain executor baseline, NLL only).

The fields are dataclass fields declared with ``hp_field`` (default, help text, checks); a
pydantic 2 schema built from those declarations validates every file, override and constructor
call, and its errors are reported as one line that names the file, the key and what the key must
be.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
import string
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, ClassVar, Iterable, Mapping, Union

import pydantic
import yaml
from typing_extensions import TypedDict

from .encoding import TextEncodingError, read_text
from .errors import file_problem

__all__ = [
    "EditorHParams",
    "ExecutorHParams",
    "HPSEHyperParams",
    "HParamsError",
    "YamlHParams",
    "hp_field",
    "parse_overrides",
    "read_hparams_file",
    "read_hparams_json",
    "safe_yaml",
]

#: The checks ``hp_field`` takes (see its docstring).
_CHECKS = frozenset(
    {
        "types",
        "choices",
        "min",
        "max",
        "exclusive_min",
        "exclusive_max",
        "nonempty",
        "length",
        "contains",
        "check",
    }
)


class HParamsError(ValueError):
    """A hyper-parameter file or override is invalid; the message names the key, the file and the
    fix."""


def hp_field(default: Any, help: str, **checks: Any) -> Any:
    """A dataclass field with its help text and the checks its class's pydantic schema applies.

    Checks: ``types`` (the accepted types; default: the default's type; a ``float`` field takes
    ints and numeric strings such as YAML 1.1's ``5e-4``), ``choices`` (a tuple, or a function
    returning one, read at each validation: the names in a registry), ``min``/``max`` (with
    ``exclusive_min``/``exclusive_max``), ``nonempty``, ``length`` (of a list), ``contains`` (a
    substring of a string), and ``check=fn``, a rule of the field's own: ``fn(value) -> value``,
    raising ``ValueError("must be ..., got ...")``, which the one-line error prefixes with the file
    and the key.
    """
    unknown = set(checks) - _CHECKS
    if unknown:
        raise TypeError(
            f"hp_field: unknown check(s) {sorted(unknown)}; the checks are {sorted(_CHECKS)}"
        )
    metadata = {"help": help, **checks}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=metadata)
    return field(default=default, metadata=metadata)


# ---------------------------------------------------------------------------------- field rules
def _gpu_index(value: Any) -> Any:
    if isinstance(value, int) and value < 0:
        raise ValueError(f"must be a GPU index >= 0 or a device string, got {value!r}")
    return value


def _cases_per_pass(value: Any) -> Any:
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError(f"must be 'auto' or an integer >= 1, got {value!r}")


def _betas(value: list) -> list:
    if not all(isinstance(b, (int, float)) and 0.0 <= b < 1.0 for b in value):
        raise ValueError(f"must be two numbers in [0, 1), got {value!r}")
    return [float(b) for b in value]


def _layer_indices(value: Any) -> Any:
    if value is not None and (
        not value
        or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value)
    ):
        raise ValueError(
            f"must be null (all layers) or a non-empty list of layer indices, got {value!r}"
        )
    return value


def _module_names(value: list) -> list:
    if not all(isinstance(m, str) and m for m in value):
        raise ValueError(f"must be a list of module names such as q_proj, got {value!r}")
    return value


def _subject_template(value: str) -> str:
    """An editing prompt is filled with ``str.format(subject=...)``: its one placeholder is
    ``{subject}``; literal braces are doubled."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(value) if f is not None]
    except ValueError as err:
        raise ValueError(
            f"must be a template whose one placeholder is {{subject}} ({err}); write a literal "
            f"brace as {{{{ or }}}}, got {value!r}"
        ) from None
    other = [f for f in fields if f != "subject"]
    if other or not fields:
        found = f"{{{other[0]}}}" if other else "no {subject} placeholder"
        raise ValueError(
            f"must hold the placeholder {{subject}} and no other, got {found} in {value!r}; write "
            "a literal brace as {{ or }}"
        )
    return value


def _layer_template(value: str) -> str:
    if "{}" not in value:
        raise ValueError(f"must contain '{{}}' where the layer index goes, got {value!r}")
    return value


def _registered_executors() -> tuple[str, ...]:
    """The names of the executor registry (``executors.EXECUTORS``), read at each validation so
    that an executor registered there is accepted. Imported here, not at the top: the hparams are
    the layer below the executors, which may import from this module."""
    from .executors import EXECUTORS

    return tuple(EXECUTORS)


class YamlHParams:
    """Base of a hparams dataclass: ``from_hparams`` (YAML), ``from_dict``, ``with_overrides``,
    ``to_dict``.

    Every field is checked by a pydantic schema built from the fields' ``hp_field`` checks (strict
    types, ranges, choices, no unknown keys); a failure is one ``HParamsError`` line naming the
    file, the key and what the key must be. ``check`` adds the rules that relate several fields of
    a class.
    """

    ALG_NAME: ClassVar[str] = ""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, source: str | None = None) -> None:
        """Check every field's type and range; raise HParamsError naming the key, the file and the
        fix."""
        source = source or f"<{type(self).__name__}>"
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        for name, value in _validated(type(self), values, source).items():
            setattr(self, name, value)
        self.check(source)

    def check(self, source: str) -> None:
        """Cross-field checks of a subclass (raise HParamsError)."""

    @classmethod
    def from_hparams(cls, path: str | os.PathLike) -> "YamlHParams":
        """Read a YAML file with ``yaml.safe_load``; unknown keys, wrong types and bad values are
        errors."""
        path = os.fspath(path)
        if not os.path.isfile(path) and os.path.isfile(path + ".yaml"):
            path = path + ".yaml"
        return cls.from_dict(read_hparams_file(path), source=path)

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "YamlHParams":
        """Read a JSON file with the keys of the YAML files (``json.load``), checked as
        ``from_hparams`` checks them: how EasyEdit's ``examples/run_AKEW_both.py`` reads hparams
        (``params_class.from_json(path)``)."""
        path = os.fspath(path)
        return cls.from_dict(read_hparams_json(path), source=path)

    @classmethod
    def load(
        cls, path: str | os.PathLike, overrides: Iterable[str] | Mapping[str, Any] = ()
    ) -> "YamlHParams":
        """``from_hparams(path)`` with ``key=value`` overrides applied: how the method registry
        reads a file."""
        return cls.from_hparams(path).with_overrides(overrides)

    @classmethod
    def from_dict(cls, config: Mapping[str, Any], source: str = "<dict>") -> "YamlHParams":
        if "alg_name" in config and config["alg_name"] != cls.ALG_NAME:
            raise HParamsError(
                f"{source}: alg_name must be {cls.ALG_NAME!r} for {cls.__name__}, got "
                f"{config['alg_name']!r}; this file belongs to another method"
            )
        defaults = {f.name: _default(f) for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        obj = cls.__new__(cls)
        for name, value in _validated(cls, {**defaults, **config}, source).items():
            setattr(obj, name, value)
        obj.check(source)
        obj._source = source  # named in errors found later (layers checked against the model)
        return obj

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def to_yaml(self, path: str | os.PathLike) -> None:
        with open(path, "w", encoding="utf-8") as fh:
            yaml.safe_dump(self.to_dict(), fh, sort_keys=False)

    def with_overrides(self, overrides: Iterable[str] | Mapping[str, Any] | None) -> "YamlHParams":
        """A copy with ``key=value`` strings (values parsed as YAML) or a dict applied, then
        validated."""
        updates = (
            {}
            if not overrides
            else (dict(overrides) if isinstance(overrides, Mapping) else parse_overrides(overrides))
        )
        base = getattr(self, "_source", None)
        if base is None or base.startswith("<"):
            source = "--set overrides"
        else:
            source = f"{base} with --set overrides" if updates else base
        return type(self).from_dict({**self.to_dict(), **updates}, source=source)

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    @property
    def fp16(self) -> bool:
        """EasyEdit's ``BaseEditor`` loads a model by name in float16 when this is true, else
        float32."""
        return getattr(self, "dtype", "float32") == "float16"

    @property
    def torch_dtype(self):
        import torch

        dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
        return dtypes[self.dtype]  # type: ignore[attr-defined]


@dataclass
class EditorHParams(YamlHParams):
    """The fields EasyEdit's ``BaseEditor`` reads and ``hpse_easyedit.load_model`` needs, shared by
    every method."""

    alg_name: str = hp_field("", "Method name; EasyEdit's BaseEditor dispatches on it.")
    model_name: str = hp_field(
        "", "HF model id or local directory of the model to edit.", nonempty=True
    )
    device: Any = hp_field(
        "cpu",
        "'cpu', 'cuda', 'cuda:N' or an int GPU index (EasyEdit style).",
        types=(str, int),
        check=_gpu_index,
    )
    dtype: str = hp_field(
        "float32", "Weights dtype when loading.", choices=("float32", "bfloat16", "float16")
    )
    model_parallel: bool = hp_field(
        False, "Spread the model over all visible GPUs (device_map='auto')."
    )
    trust_remote_code: bool = hp_field(
        False, "Allow model code from the hub; off unless you trust the repo."
    )
    max_length: int = hp_field(
        2048,
        "Longest token sequence (prompt + passage, prompt + rollout) an edit may build; "
        "EasyEdit's evaluation also reads it.",
        min=8,
    )
    batch_size: int = hp_field(
        1,
        "Requests per batch_edit call (EasyEdit); all requests of one call are edited jointly.",
        min=1,
    )
    use_chat_template: bool = hp_field(
        True,
        "EasyEdit evaluation only: BaseEditor scores teacher-forced accuracy with prompts in "
        "the chat template.",
    )
    editing_prompt: str = hp_field(
        "Introduce {subject}.",
        "Untargeted editing prompt; '{subject}' is filled in.",
        contains="{subject}",
        check=_subject_template,
    )
    chat_template_kwargs: dict = hp_field(
        {}, "Extra keyword arguments for apply_chat_template (e.g. enable_thinking: false)."
    )
    attn_implementation: str = hp_field(
        "auto",
        "Attention kernels when loading: 'auto' (transformers' choice, as before this key "
        "existed), 'sdpa', 'flash_attention_2' (needs the flash-attn package and a CUDA GPU) or "
        "'eager'.",
        choices=("auto", "sdpa", "flash_attention_2", "eager"),
    )


@dataclass
class ExecutorHParams(EditorHParams):
    """What moves in an edit and the Adam optimiser that moves it, for the methods that train
    through an executor (HPSE, COIN*)."""

    executor: str = hp_field(
        "lora",
        "Which parameters move: 'lora' (adapters) or 'ft_m' (one MLP matrix).",
        choices=_registered_executors,
    )
    lora_rank: int = hp_field(12, "LoRA rank r.", min=1)
    lora_alpha: float = hp_field(24.0, "LoRA alpha (scaling = alpha / r).", min=0.0)
    lora_dropout: float = hp_field(0.0, "LoRA dropout.", min=0.0, max=1.0)
    target_modules: list = hp_field(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "Module names that get LoRA adapters.",
        nonempty=True,
        check=_module_names,
    )
    layers: Any = hp_field(
        None,
        "Layer indices that get LoRA adapters; null = all layers.",
        types=(list, type(None)),
        check=_layer_indices,
    )
    ftm_layer: int = hp_field(
        8,
        "FT-M: the layer L whose MLP down_proj is fine-tuned (8 Qwen/Gemma, 16 Llama-3.1).",
        min=0,
    )
    ftm_module_template: str = hp_field(
        "model.layers.{}.mlp.down_proj",
        "FT-M: module path template, '{}' = layer.",
        check=_layer_template,
    )
    seed: int = hp_field(0, "Seed for adapter initialisation.", min=0)
    lr: float = hp_field(1e-4, "Adam step size (eta).", min=0.0, exclusive_min=True)
    adam_betas: list = hp_field([0.9, 0.999], "Adam betas.", length=2, check=_betas)
    weight_decay: float = hp_field(0.0, "Adam weight decay.", min=0.0)
    max_loss_growth: float = hp_field(
        2.0,
        "Divergence guard: an inner step whose loss is not finite, or above this multiple of "
        "its round's first loss, stops the edit as diverged (the model is restored, nothing is "
        "saved). Within a round the loss falls on every committed edit of docs/study (last/first "
        "at most 0.98).",
        min=1.0,
        exclusive_min=True,
    )
    gradient_checkpointing: bool = hp_field(
        False,
        "Recompute each layer's activations in the backward pass instead of keeping them "
        "(transformers' gradient checkpointing, non-reentrant) during the inner steps: less memory "
        "for about one more forward per step; the same gradients up to float rounding. false = "
        "activations kept, as before this key existed.",
    )


@dataclass
class HPSEHyperParams(ExecutorHParams):
    """Hyper-parameters of one HPSE edit (and of its executor baselines and ablations)."""

    ALG_NAME: ClassVar[str] = "HPSE"

    alg_name: str = hp_field(
        "HPSE", "Method name; must be HPSE (EasyEdit dispatches on it).", choices=("HPSE",)
    )

    tau: float = hp_field(
        2.0,
        "Step-in gap gate: log pi*(y*) - log pi_theta(y*) > tau (a log-probability margin, >= 0).",
        min=0.0,
    )
    kappa: float = hp_field(
        0.3,
        "Step-in confidence gate: pi*(y*) > kappa (a probability in [0, 1)).",
        min=0.0,
        max=1.0,
        exclusive_max=True,
    )
    top_k: int = hp_field(16, "Teacher top-K kept (renormalised) for the KL target.", min=1)
    kl_weight: float = hp_field(
        1.0, "Weight of the hybrid KL term; 0 = plain executor baseline (NLL only).", min=0.0
    )
    nll_weight: float = hp_field(
        1.0, "lambda: weight of the passage NLL anchor; 0 = 'w/o NLL'.", min=0.0
    )
    rollout: str = hp_field(
        "hybrid",
        "'hybrid' (HPSE) or 'on_policy' (OPSD, the 'w/o HP' ablation).",
        choices=("hybrid", "on_policy"),
    )
    rounds: int = hp_field(5, "R: outer rounds, one greedy rollout each.", min=1)
    inner_steps: int = hp_field(8, "M: Adam steps per round on that round's fixed rollout.", min=1)
    max_new_tokens: int = hp_field(96, "Rollout length cap (96 MQuAKE-uns, 128 UnKEBench).", min=1)
    teacher_prompt_style: str = hp_field(
        "auto",
        "Privileged system prompt wording: 'auto' (from model_type), 'default' or 'llama' "
        "(the paper's), or 'plain' (the passage alone, no rules; not in the paper).",
        choices=("auto", "default", "llama", "plain"),
    )
    teacher_facts: str = hp_field(
        "request",
        "What the teacher reads for a request: its own passage ('request'), all passages of the "
        "edit ('all'), or all passages each headed 'About <subject>:' ('labelled'; not in the "
        "paper).",
        choices=("request", "all", "labelled"),
    )
    batched_rollout: bool = hp_field(
        True,
        "Advance student and teacher in ONE batched forward per rollout token (one KV cache of "
        "batch 2); false = two separate cached forwards. Same tokens either way.",
    )
    fast_decode: bool | str = hp_field(
        "auto",
        "Rollout decode steps on CPU compute the frozen float32 weights' matmuls as W @ x^T, which "
        "is faster on some CPUs (1.77x per rollout on one development VM) and slower on others "
        "(0.62x on another); logits differ from F.linear's in the last bits. 'auto' = time both "
        "once per process and use W @ x^T only where it is clearly faster; true = always; false = "
        "F.linear, bit for bit as before this switch existed. No effect on GPU, in half precision, "
        "or in training.",
        types=(bool, str),
        choices=(True, False, "auto"),
    )
    static_decode: bool | str = hp_field(
        False,
        "Rollout and answer decode on the graph-capturable path: a KV cache preallocated for the "
        "prompt plus max_new_tokens, masks and positions kept on the device, the stop test every "
        "decode_stop_every tokens; the same tokens as the dynamic path. 'compile' also runs the "
        "step under torch.compile (CUDA graphs on CUDA: 3.5x the rollout tokens/s of the dynamic "
        "path for Qwen2.5-7B on an H100; compilation takes about a minute, and on CPU it does not "
        "pay per edit). 'auto' = 'compile' on a CUDA device, false elsewhere (the shipped 7B-9B "
        "files); on CUDA under flash_attention_2 false, and true (uncompiled) where torch.compile "
        "finds no Triton. false = the growing DynamicCache with a host check per token and "
        "model.generate for answers. true and 'compile' need sdpa or eager attention (refused "
        "with flash_attention_2); 'compile' needs a working compiler (Triton on CUDA, a C++ "
        "compiler on CPU), checked before the weights load.",
        types=(bool, str),
        choices=(True, False, "compile", "auto"),
    )
    compile_training: bool | str = hp_field(
        False,
        "Inner steps under torch.compile, the KL and NLL terms' rows stacked in one forward and "
        "backward (inductor: the elementwise work fused into a few kernels around the matrix "
        "products, each product once per step; rows padded to 64-token steps so the rounds reuse "
        "one graph; both terms' activations at once, where the eager step holds the larger "
        "pass's: python -m hpse_easyedit plan shows it): the trained tensors equal "
        "the eager step's within float rounding, not bit for bit; the first edit pays the "
        "compilation. 'auto' = on for a CUDA device with Triton, off elsewhere (the shipped 7B-9B "
        "files; off under gradient_checkpointing, which true refuses). true needs a working "
        "compiler (a C++ compiler on CPU), checked before the weights load. 'graphs' = true with "
        "the step's forward and backward under CUDA graphs as well (torch.compile's "
        "reduce-overhead: each replayed as one launch; a CUDA device only, refused elsewhere; "
        "not yet timed on a card, docs/GPU.md). Solo edits only: the batched engine's inner "
        "step stays eager.",
        types=(bool, str),
        choices=(True, False, "auto", "graphs"),
    )
    cases_per_pass: int | str = hp_field(
        "auto",
        "Several cases edited at once (hpse_edit_cases, the runners' --cases-at-once): how many "
        "cases' training rows share one forward/backward of an inner step (the rollouts always "
        "decode every case together). Each case's gradient is its own either way; fewer cases per "
        "pass hold less activation memory (the logits of a pass are rows x tokens x vocabulary), "
        "more pay each kernel's launch once for more cases. 'auto' = 1 on CPU (its training "
        "matmuls are already compute-bound), every case on a GPU; an integer >= 1 sets it.",
        types=(int, str),
        check=_cases_per_pass,
    )
    decode_stop_every: int = hp_field(
        8,
        "static_decode: test for stop tokens every this many tokens (the decode loop's one host "
        "sync); the steps decoded past a stop are discarded.",
        min=1,
    )
    scored_logits_only: bool = hp_field(
        True,
        "Training forwards compute the output head only at the positions the losses score "
        "(logits_to_keep: the passage and rollout positions, not the prompt before them): the same "
        "gradients and weights, the logged NLL differs in the last bits (summation order). false = "
        "every position's logits, bit for bit as before this switch existed.",
    )
    kl_student: str = hp_field(
        "full",
        "Student side of the top-K KL: 'full' (the paper's: the student's full-vocabulary "
        "log-probabilities of the teacher's top-K tokens) or 'topk' (NOT the paper's: renormalised "
        "over the teacher's top-K as well, a weaker regulariser with zero gradient outside the "
        "top-K).",
        choices=("full", "topk"),
    )

    def check(self, source: str) -> None:
        if self.attn_implementation == "flash_attention_2" and self.static_decode in (
            True,
            "compile",
        ):
            raise HParamsError(
                f"{source}: key 'static_decode' is {self.static_decode!r} but attn_implementation "
                "is 'flash_attention_2', whose layers take no 4D mask, which the static decode "
                "builds; set static_decode: auto (the dynamic decode under flash attention) or "
                "false, or attn_implementation: sdpa"
            )
        if self.compile_training in (True, "graphs") and getattr(
            self, "gradient_checkpointing", False
        ):
            raise HParamsError(
                f"{source}: key 'compile_training' is "
                f"{'true' if self.compile_training is True else repr(self.compile_training)} but "
                "gradient_checkpointing is true, "
                "whose recomputation a captured step cannot hold; set compile_training: auto (the "
                "eager step under gradient checkpointing) or gradient_checkpointing: false"
            )


#: The most values (mappings, lists and scalars, each use of an alias counted again) an hparams
#: file or ``--set`` value may stand for: the shipped files hold under 100, while a few nested
#: aliases (``&a [*b, *b, ...]``) can stand for billions that every copy of the hparams expands.
MAX_YAML_VALUES = 10_000


class _DuplicateKeyError(yaml.YAMLError):
    """A mapping gives one key twice."""


class _TooManyValuesError(yaml.YAMLError):
    """Anchors and aliases stand for more than ``MAX_YAML_VALUES`` values."""


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping: YAML keys are unique, and
    PyYAML would let the later value win silently. (A key a ``<<`` merge brings in may still be
    overridden, as YAML allows.)"""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                line = key_node.start_mark.line + 1
                try:
                    if key in seen:
                        raise _DuplicateKeyError(
                            f"key {key!r} is given twice (lines {seen[key]} and {line}); keep one"
                        )
                    seen[key] = line
                except TypeError:  # an unhashable key: SafeLoader says so itself
                    continue
        return super().construct_mapping(node, deep=deep)


def safe_yaml(text: str) -> Any:
    """``text`` read as YAML with ``yaml.safe_load``'s types, refusing a key given twice and
    anchors and aliases that stand for more than ``MAX_YAML_VALUES`` values (``yaml.YAMLError``)."""
    value = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - _StrictLoader is a SafeLoader
    _check_size(value)
    return value


def _check_size(value: Any) -> None:
    """``yaml.YAMLError`` when ``value`` stands for more than ``MAX_YAML_VALUES`` values, each
    shared (aliased) one counted at every place it stands, as a copy of it would hold it."""
    left, stack = MAX_YAML_VALUES, [value]
    while stack:
        item = stack.pop()
        left -= 1
        if left < 0:
            raise _TooManyValuesError(
                f"its anchors and aliases (&name, *name) stand for more than {MAX_YAML_VALUES:,} "
                "values, which copying the hparams would expand; write the values out"
            )
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def read_hparams_file(path: str | os.PathLike) -> dict:
    """The top-level mapping of a YAML hparams file (``safe_yaml``: ``yaml.safe_load``'s types, no
    key twice, no alias bomb); every way it can be unreadable is an ``HParamsError`` naming the file
    and the fix. Every YAML hparams file of every method is read here."""
    return _read_mapping(path, "YAML", "hparams/HPSE/smollm2-135m.yaml", safe_yaml, yaml.YAMLError)


def read_hparams_json(path: str | os.PathLike) -> dict:
    """The top-level object of a JSON hparams file (``json.load``; the keys of the YAML files), with
    the one-line errors of ``read_hparams_file``: EasyEdit's unstructured example reads JSON."""
    return _read_mapping(
        path, "JSON", "hparams/HPSE/smollm2-135m.json", json.loads, json.JSONDecodeError
    )


def _read_mapping(
    path: str | os.PathLike,
    kind: str,
    example: str,
    load: Callable[[Any], Any],
    syntax_error: type[Exception],
) -> dict:
    path = os.fspath(path)
    problem = file_problem(path)
    if problem == "no such file":
        raise HParamsError(
            f"{path}: no such hparams file; pass the path of a {kind} file such as {example}"
        )
    if problem == "is a directory, not a file":
        raise HParamsError(f"{path}: is a directory; pass an hparams {kind} file such as {example}")
    if problem is not None:
        raise HParamsError(f"{path}: {problem}; pass an hparams {kind} file such as {example}")
    try:
        config = load(read_text(path))
    except TextEncodingError as err:
        raise HParamsError(f"{err}; an hparams file is {kind} text") from None
    except FileNotFoundError:
        raise HParamsError(
            f"{path}: no such hparams file; pass the path of a {kind} file such as {example}"
        ) from None
    except (_DuplicateKeyError, _TooManyValuesError) as err:
        raise HParamsError(f"{path}: {err}") from None
    except syntax_error as err:
        reason = " ".join(str(err).split())
        raise HParamsError(f"{path}: not valid {kind} ({reason}); fix the syntax") from None
    if not isinstance(config, dict):
        raise HParamsError(
            f"{path}: expected a mapping of key: value at the top level, "
            f"got {type(config).__name__}"
        )
    return config


def parse_overrides(items: Iterable[str]) -> dict:
    """Parse ``key=value`` strings; the value is read as YAML (``0`` -> int, ``[1, 2]`` -> list)."""
    out: dict = {}
    for item in items:
        if "=" not in item:
            raise HParamsError(f"--set {item!r}: expected key=value, e.g. --set kl_weight=0")
        key, raw = item.split("=", 1)
        try:
            out[key.strip()] = safe_yaml(raw) if raw.strip() else ""
        except (_DuplicateKeyError, _TooManyValuesError) as err:
            raise HParamsError(f"--set {key.strip()}: {err}") from None
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


# ----------------------------------------------------------------------------------- validation
def _as_float(value: Any) -> Any:
    """A ``float`` field's input as a float where it is a number: an int, or a string such as YAML
    1.1's ``5e-4`` (read as a string without a dot); anything else is left for the type check."""
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def _one_of(choices: tuple | Callable[[], tuple]) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        allowed = list(choices() if callable(choices) else choices)
        if value not in allowed:
            raise ValueError(f"must be one of {allowed}, got {value!r}")
        return value

    return check


def _default(f: dataclasses.Field) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


def _types(f: dataclasses.Field) -> tuple:
    return tuple(f.metadata.get("types") or (type(_default(f)),))


def _annotation(f: dataclasses.Field) -> Any:
    """The pydantic type of one ``hp_field``: its types (strict), ranges and lengths, then its
    choices and rule."""
    meta, types = f.metadata, _types(f)
    bounds: dict[str, Any] = {}
    if "min" in meta:
        bounds["gt" if meta.get("exclusive_min") else "ge"] = meta["min"]
    if "max" in meta:
        bounds["lt" if meta.get("exclusive_max") else "le"] = meta["max"]
    if meta.get("nonempty"):
        bounds["min_length"] = 1
    if "length" in meta:
        bounds["min_length"] = bounds["max_length"] = meta["length"]
    if "contains" in meta:
        bounds["pattern"] = re.escape(meta["contains"])
    steps: list[Any] = [pydantic.BeforeValidator(_as_float)] if float in types else []
    steps.append(pydantic.Field(description=meta["help"], **bounds))
    if "choices" in meta:
        steps.append(pydantic.AfterValidator(_one_of(meta["choices"])))
    if "check" in meta:
        steps.append(pydantic.AfterValidator(meta["check"]))
    return Annotated[(Union[types], *steps)]  # type: ignore[valid-type]


@functools.cache
def _schema(cls: type) -> pydantic.TypeAdapter:
    """The pydantic schema of a hparams dataclass: every field required (``from_dict`` fills in the
    defaults), strict types (no bool for an int, no string for a number but a ``float``'s), finite
    numbers, no other key."""
    annotations = {f.name: _annotation(f) for f in dataclasses.fields(cls)}
    fields = TypedDict(cls.__name__, annotations)  # type: ignore[misc]
    config = pydantic.ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    return pydantic.TypeAdapter(pydantic.with_config(config)(fields))


def _validated(cls: type, values: Mapping[str, Any], source: str) -> dict:
    """``values`` (every field of ``cls``) checked and converted; ``HParamsError`` with the one-line
    message of the first problem: unknown keys, else the first field (in declaration order) that
    is wrong."""
    try:
        return _schema(cls).validate_python(dict(values))
    except pydantic.ValidationError as err:
        raise HParamsError(_message(cls, err.errors(include_url=False), source)) from None


def _message(cls: type, errors: list, source: str) -> str:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    # extra_forbidden: a key that is no field; invalid_key: a key that is not a string (``1: x``)
    unknown = [e["loc"][0] for e in errors if e["type"] in ("extra_forbidden", "invalid_key")]
    try:
        unknown.sort()
    except TypeError:  # keys of several types (``1: x`` beside ``learning_rate: 1``): by repr
        unknown.sort(key=repr)
    if unknown:
        return (
            f"{source}: unknown key(s) {unknown}; remove them or fix the spelling "
            f"(known keys: {sorted(fields)})"
        )
    error = errors[0]  # pydantic reports the fields in their declaration order
    return _line(fields[error["loc"][0]], error, source)


def _line(f: dataclasses.Field, error: dict, source: str) -> str:
    """One pydantic error of field ``f`` as a one-line message: the value's finiteness and type
    first, then the check that failed."""
    meta, types = f.metadata, _types(f)
    where = f"{source}: key '{f.name}'"
    value = _as_float(error["input"]) if float in types else error["input"]
    names = "/".join("null" if t is type(None) else t.__name__ for t in types)
    kind = error["type"]
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} must be a finite number, got {value!r} ({meta['help']})"
    if isinstance(value, bool) and bool not in types:
        return f"{where} must be {names}, got a boolean {value!r}"
    if not isinstance(value, types):
        return f"{where} must be {names}, got {type(value).__name__} {value!r} ({meta['help']})"
    if kind in ("greater_than", "greater_than_equal"):
        op = ">" if meta.get("exclusive_min") else ">="
        return f"{where} must be {op} {meta['min']}, got {value!r}"
    if kind in ("less_than", "less_than_equal"):
        op = "<" if meta.get("exclusive_max") else "<="
        return f"{where} must be {op} {meta['max']}, got {value!r}"
    if kind in ("too_short", "string_too_short") and meta.get("nonempty") and not value:
        return f"{where} must not be empty ({meta['help']})"
    if kind in ("too_short", "too_long", "string_too_short", "string_too_long"):
        return f"{where} must have {meta['length']} entries, got {value!r}"
    if kind == "string_pattern_mismatch":
        return f"{where} must contain {meta['contains']!r}, got {value!r}"
    if kind == "value_error":  # a choice or a field's own rule: its message
        return f"{where} {error['ctx']['error']}"
    return f"{where} is invalid: {error['msg']}"
