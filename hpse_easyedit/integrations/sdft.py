"""SDFT (TRL): TRL's own on-policy self-distillation trainer (``trl.experimental.sdft``) as an
editor row, run per edit through the same executor, restore and runners as every other row.

SDFT (Shenfeld et al. 2026, "Self-Distillation Enables Continual Learning"; TRL's ``SDFTTrainer``)
is HPSE's nearest relative users already have: the student samples a completion of the prompt, the
same frozen model reading a privileged context is the teacher, and the student is trained towards
the teacher's next-token distributions on the student's own tokens. It has neither HPSE's
confidence-gated step-ins (the teacher never writes a rollout token) nor the passage NLL anchor.

Per edit (``sdft_edit``), for the requests of one edit:

- the dataset TRL trains on is one row per request: the untargeted prompt (``editing_prompt``,
  ``Introduce {subject}.``) as a one-turn chat, so TRL applies the tokenizer's chat template to it
  exactly as HPSE's student prompt is built, and the passage as ``privileged_context``, which TRL
  puts into the teacher's user turn through ``teacher_prompt_template``;
- the trainable tensors are the LoRA executor's adapter (``executors.lora``: the rank, alpha and
  target modules of the file, as HPSE's LoRA row), handed to TRL as a peft model; TRL's
  ``teacher_model_kind="base"`` then reaches the teacher by switching the adapter off, HPSE's
  teacher pi_0 exactly, also for later edits of a continual sequence, which continue in the same
  adapter;
- the budget is HPSE's: ``rounds`` (R) generations, each one sampled completion per request
  (``num_generations``), then ``inner_steps`` (M) optimiser steps on those completions
  (``num_iterations``), with HPSE's Adam (``Executor.optimizer``) at a constant ``lr``;
- ``weights_copy`` is taken before training and ``restore_weights`` undoes the edit bit for bit, as
  for the HPSE rows; what TRL's trainer changes on the model besides the adapter (its config's
  ``use_cache``, pad ids, dropout, train mode, model tags) and the process's random state are put
  back (``sdft_trainer``).

Nothing of SDFT is re-implemented: sampling, teacher prompt, loss and update are TRL's code
(``sdft_trainer`` only wires it up). The hparams fields keep TRL's ``SDFTConfig`` names for TRL's
own knobs; hparams/SDFT/*.yaml say which of TRL's defaults differ from HPSE and what each file
chose. ``trl`` is an optional extra (``pip install -e '.[trl]'``): ``check_trl`` (the registry's
preflight) says in one line how to install it before any model is loaded.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import time
from dataclasses import dataclass
from typing import Any

from ..edit_requests import RequestError, normalize_requests
from ..errors import UsageError
from ..executors import make_executor
from ..hparams import ExecutorHParams, HParamsError, hp_field
from ..prompts import chat_prompt_ids
from ..training import EditResult

__all__ = [
    "INSTALL_HINT",
    "SDFTHyperParams",
    "TRLNotFoundError",
    "check_trl",
    "sdft_edit",
    "teacher_text",
]

#: the TRL release whose ``trl.experimental.sdft`` this row is written against (setup.py's extra)
TRL_VERSION = "1.16"
INSTALL_HINT = "pip install -e '.[trl]' (or pip install 'trl==1.16.*')"


class TRLNotFoundError(UsageError):
    """The SDFT (TRL) row needs TRL's ``trl.experimental.sdft``, which cannot be imported here."""


def _positive_or_null(value: Any) -> Any:
    if value is not None and value <= 0:
        raise ValueError(f"must be null (no clipping) or a number > 0, got {value!r}")
    return value


def _template(value: str) -> str:
    if "{prompt}" not in value or "{privileged_context}" not in value:
        raise ValueError(
            "must contain both '{prompt}' and '{privileged_context}' (TRL fills them in), "
            f"got {value!r}"
        )
    return value


@dataclass
class SDFTHyperParams(ExecutorHParams):
    """Hyper-parameters of one SDFT (TRL) edit: HPSE's adapter, optimiser and budget, TRL's
    ``SDFTConfig`` knobs under TRL's names (see the module docstring)."""

    ALG_NAME = "SDFT"

    alg_name: str = hp_field(
        "SDFT", "Method name; must be SDFT (EasyEdit dispatches on it).", choices=("SDFT",)
    )
    executor: str = hp_field(
        "lora",
        "Which parameters move: 'lora' only (TRL's base teacher is the model with the adapter "
        "off; with a full matrix TRL would load a second copy of the model from the hub).",
        choices=("lora",),
    )
    rounds: int = hp_field(
        5, "R: generations; each samples num_generations completions per request.", min=1
    )
    inner_steps: int = hp_field(
        8, "M: optimiser steps on each generation's completions (TRL's num_iterations).", min=1
    )
    num_generations: int = hp_field(
        1,
        "Completions sampled per request and generation (TRL's default 8; 1 = HPSE's one "
        "rollout per request and round).",
        min=1,
    )
    max_new_tokens: int = hp_field(
        96,
        "Completion length cap (TRL's max_completion_length; 96 MQuAKE-uns, 128 UnKEBench).",
        min=1,
    )
    temperature: float = hp_field(
        1.0,
        "TRL's sampling temperature (also divides both models' logits in the loss); HPSE's "
        "rollouts are greedy.",
        min=0.0,
        exclusive_min=True,
    )
    top_p: float = hp_field(
        1.0, "TRL's nucleus-sampling mass (1 = off).", min=0.0, max=1.0, exclusive_min=True
    )
    top_k: int = hp_field(
        0,
        "TRL's sampling filter: sample among the k likeliest tokens (0 = off). NOT HPSE's top_k, "
        "the KL's support, which is distillation_topk here.",
        min=0,
    )
    distillation_mode: str = hp_field(
        "topk_logits",
        "TRL's objective: 'topk_logits' (the divergence over the student's top-k tokens), "
        "'full_logits' (over the vocabulary) or 'sampled_token' (reverse KL on the sampled token).",
        choices=("topk_logits", "full_logits", "sampled_token"),
    )
    distillation_topk: int = hp_field(
        100, "TRL's top-k support size (the student's top-k tokens at each position).", min=1
    )
    distillation_alpha: float = hp_field(
        0.5,
        "TRL's divergence mix: 0 = forward KL(teacher || student) (HPSE's), 1 = reverse KL, "
        "between = the generalised Jensen-Shannon divergence through the alpha-mixture.",
        min=0.0,
        max=1.0,
    )
    distillation_add_tail: bool = hp_field(
        False,
        "TRL: add one bucket for the mass outside the top-k support (false = renormalise the "
        "top-k).",
    )
    distillation_is_clip: Any = hp_field(
        2.0,
        "TRL: clip of the importance weight pi_theta / pi_rollout on each token's loss when a "
        "completion is trained on for several steps (null = no weight).",
        types=(float, type(None)),
        check=_positive_or_null,
    )
    num_loss_tokens_to_skip: int = hp_field(
        0, "TRL: first completion tokens left out of the loss.", min=0
    )
    teacher_prompt_template: str = hp_field(
        "{prompt}\n\n{privileged_context}",
        "TRL's teacher user turn: the student prompt and the passage ('{privileged_context}').",
        check=_template,
    )
    max_grad_norm: float = hp_field(
        0.0,
        "Gradient-norm clip of TRL's trainer (transformers' default 1.0; 0 = no clip, as HPSE).",
        min=0.0,
    )

    def check(self, source: str) -> None:
        if self.distillation_mode == "sampled_token" and self.distillation_alpha != 1.0:
            raise HParamsError(
                f"{source}: distillation_mode 'sampled_token' is TRL's reverse KL only; set "
                f"distillation_alpha: 1.0 (now {self.distillation_alpha:g}) or another "
                "distillation_mode"
            )


def check_trl(hparams: Any = None) -> None:
    """Before any model is loaded (the registry's preflight): ``TRLNotFoundError`` in one line when
    TRL's SDFT cannot run in this process. ``hparams`` is unused (the registry's signature)."""
    problem = _trl_problem()
    if problem is not None:
        raise TRLNotFoundError(
            f"SDFT (TRL) runs TRL's trl.experimental.sdft.SDFTTrainer, but {problem}; "
            f"install it with {INSTALL_HINT}"
        )
    world = os.environ.get("WORLD_SIZE", "1")
    if world.isdigit() and int(world) > 1:
        raise UsageError(
            f"SDFT (TRL) runs TRL's trainer in one process, but this launch has WORLD_SIZE={world} "
            "(accelerate launch / torchrun), under which the trainer would average gradients "
            "across processes editing different cases; run it as one process per job (no launcher)"
        )


def _trl_problem() -> str | None:
    """Why TRL's SDFT cannot be imported here, or None when it can (without importing it)."""
    try:
        spec = importlib.util.find_spec("trl")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return "trl is not installed"
    try:
        version = importlib.metadata.version("trl")
    except importlib.metadata.PackageNotFoundError:
        return None  # a source checkout on the path: the import decides
    major_minor = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if major_minor < (1, 16):
        return f"trl {version} is installed, which has no trl.experimental.sdft"
    return None


def teacher_text(prompt: str, passage: str, template: str) -> str:
    """The teacher's user turn as TRL composes it (``teacher_prompt_template`` filled in)."""
    return template.format(prompt=prompt, privileged_context=passage)


def _check_lengths(tok: Any, reqs: list[dict], hp: SDFTHyperParams) -> None:
    for i, req in enumerate(reqs):
        student = chat_prompt_ids(tok, req["prompt"], template_kwargs=hp.chat_template_kwargs)
        teacher = chat_prompt_ids(
            tok,
            teacher_text(req["prompt"], req["target_new"], hp.teacher_prompt_template),
            template_kwargs=hp.chat_template_kwargs,
        )
        longest = max(len(student), len(teacher)) + hp.max_new_tokens
        if longest > hp.max_length:
            raise RequestError(
                f"request {i} ({req['subject']!r}): its sequences need {longest} tokens (teacher "
                f"prompt {len(teacher)}, max_new_tokens {hp.max_new_tokens}) but max_length is "
                f"{hp.max_length}; raise max_length in the hparams or shorten the passage"
            )


def sdft_edit(
    model: Any,
    tok: Any,
    requests: Any,
    hparams: SDFTHyperParams,
    *,
    keep_original_weight: bool = False,
) -> EditResult:
    """Inject the passages of ``requests`` jointly with TRL's ``SDFTTrainer`` in the LoRA adapter:
    ``hparams.rounds`` generations x ``hparams.inner_steps`` optimiser steps. Returns the edited
    model (the peft model) and ``weights_copy``, which ``restore_weights`` undoes bit for bit."""
    check_trl()
    start = time.perf_counter()
    reqs = normalize_requests(requests, hparams)
    _check_lengths(tok, reqs, hparams)
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if isinstance(vocab, int) and hparams.distillation_topk > vocab:
        raise HParamsError(
            f"{getattr(hparams, '_source', None) or 'the hparams'}: key 'distillation_topk' is "
            f"{hparams.distillation_topk} but the model has a vocabulary of {vocab} tokens; set "
            f"distillation_topk to {vocab} or less"
        )
    try:
        from .sdft_trainer import train_sdft
    except ImportError as err:
        raise TRLNotFoundError(
            f"SDFT (TRL) cannot import TRL's SDFT ({' '.join(str(err).split())}); "
            f"install it with {INSTALL_HINT}"
        ) from None
    executor = make_executor(model, hparams, keep_original_weight=keep_original_weight)
    result = EditResult(model=executor.model, weights_copy=executor.weights_copy())
    result.rounds = train_sdft(executor, tok, reqs, hparams, result)
    result.seconds = time.perf_counter() - start
    return result
