"""TRL's ``SDFTTrainer`` wired to one edit (``train_sdft``): imported only when an SDFT (TRL) edit
runs, since it imports TRL (an optional extra) and transformers' trainer.

What this module adds to TRL's trainer is the wiring, none of SDFT itself:

- ``SDFTConfig`` from the hparams (``sdft_config``): the budget as TRL expresses it (one row per
  request, ``num_generations`` completions each, ``steps_per_generation`` 1, ``num_iterations`` M,
  ``max_steps`` R x M), TRL's own knobs as the file sets them, and nothing written or sent:
  no checkpoints (``save_strategy: no``), no reporting (``report_to: none``), no progress output,
  outputs in a temporary directory removed afterwards; no mixed-precision autocast (the model trains
  in the dtype it was loaded in, as HPSE), no gradient checkpointing by TRL (the hparams'
  ``gradient_checkpointing`` is ``training.activation_checkpointing``, as for HPSE).
- ``_EditTrainer``: TRL's trainer without its usage ping to the hub on every construction (one per
  edit here); everything else is ``SDFTTrainer``'s.
- ``_Rounds``: a trainer callback that turns TRL's per-step logs into the runner's per-round
  statistics and applies the project's divergence guard (``max_loss_growth``), which stops the
  trainer; the edit is then undone and ``EditDivergedError`` raised, as for HPSE.
- ``_kept_state``: what TRL's trainer changes on the model and tokenizer besides the adapter
  (``config.use_cache``, pad ids, dropout rates, train mode, model tags) and the process's random
  number generators (``set_seed``) are put back, so an SDFT edit leaves the model as the other rows
  do: only the adapter values differ.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import tempfile
import time
from typing import Any, Iterator

import numpy
import torch
from datasets import Dataset
from transformers import PrinterCallback, ProgressCallback, TrainerCallback
from trl.experimental.sdft import SDFTConfig, SDFTTrainer

from ..executors import Executor, copy_back
from ..executors.state import unwrapped
from ..model_calls import input_device
from ..training import (
    EditDivergedError,
    EditResult,
    _diverged,
    activation_checkpointing,
    cpu_half_backward,
    describe_loss,
)

__all__ = ["sdft_config", "train_sdft"]

logger = logging.getLogger(__name__)

#: TRL's log key of a step's distillation loss (its per-token mean, importance weights applied)
LOSS_KEY = "sdft/distillation_loss"


def sdft_config(hp: Any, n_requests: int, output_dir: str, use_cpu: bool) -> SDFTConfig:
    """TRL's configuration of one edit of ``n_requests`` requests (see the module docstring)."""
    batch = n_requests * hp.num_generations
    return SDFTConfig(
        output_dir=output_dir,
        # the budget: R generations x M optimiser steps, each step on every request's completions
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=hp.num_generations,
        num_iterations=hp.inner_steps,
        max_steps=hp.rounds * hp.inner_steps,
        max_prompt_length=None,  # TRL cuts prompts from the left at 512; sdft_edit checks lengths
        max_completion_length=hp.max_new_tokens,
        # TRL's own knobs, as the file sets them
        temperature=hp.temperature,
        top_p=hp.top_p,
        top_k=hp.top_k,
        distillation_mode=hp.distillation_mode,
        distillation_topk=hp.distillation_topk,
        distillation_alpha=hp.distillation_alpha,
        distillation_add_tail=hp.distillation_add_tail,
        distillation_is_clip=hp.distillation_is_clip,
        num_loss_tokens_to_skip=hp.num_loss_tokens_to_skip,
        teacher_prompt_template=hp.teacher_prompt_template,
        teacher_model_kind="base",
        chat_template_kwargs=dict(hp.chat_template_kwargs),
        # the optimiser is the executor's Adam (passed in); its step size and the trainer's clip
        learning_rate=hp.lr,
        lr_scheduler_type="constant",
        max_grad_norm=hp.max_grad_norm,
        seed=hp.seed,
        # precision and memory as HPSE: the model's dtype, activations per the hparams (our context)
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=use_cpu,
        # nothing written, reported or printed
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        logging_strategy="steps",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_pin_memory=False,
        dataloader_num_workers=0,
    )


class _EditTrainer(SDFTTrainer):
    """``SDFTTrainer`` without the usage ping TRL sends to the hub when a trainer is built (one per
    edit here, and an edit must run offline); training is TRL's unchanged."""

    def _send_telemetry(self) -> None:
        return None


class _Rounds(TrainerCallback):
    """Per-round statistics from TRL's per-step logs, and the divergence guard.

    A round is one generation and the ``inner_steps`` optimiser steps on its completions: its
    ``rollout_len`` (TRL's ``completions/mean_length``), ``clipped_ratio`` (the share of
    completions cut at ``max_new_tokens``), ``rollout_seconds`` (sampling the completions and their
    log-probabilities), ``loss`` / ``loss_last`` (TRL's distillation loss at the round's first and
    last step, before each step's update) and ``seconds``.
    """

    def __init__(self, hp: Any) -> None:
        self.hp = hp
        self.rounds: list[dict] = []
        self.diverged: tuple[int, int, float, float | None] | None = None
        self._round_start = self._sampling_start = 0.0
        self._sampling = 0.0

    def problem(self) -> tuple[int, str] | None:
        """(round, what) of the step the guard stopped the trainer at, or None."""
        if self.diverged is None:
            return None
        r, step, loss, start = self.diverged
        growth = (
            f" (round start {start:.4g}, max_loss_growth {self.hp.max_loss_growth:g})"
            if start is not None
            else ""
        )
        return r, f"step {step}: loss {loss:.4g}{growth}"

    def _round_of(self, step: int) -> tuple[int, int]:
        """(round, step within it), both 1-based, of optimiser step ``step`` (1-based)."""
        return (step - 1) // self.hp.inner_steps + 1, (step - 1) % self.hp.inner_steps + 1

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step % self.hp.inner_steps == 0:
            self._round_start = time.perf_counter()

    # TRL's own events (``SDFTTrainer._dispatch_self_distillation_callback``) around sampling
    def on_generation_prompts_selected(self, *args: Any, **kwargs: Any) -> None:
        self._sampling_start = time.perf_counter()

    def on_self_distillation_batch_prepared(self, *args: Any, **kwargs: Any) -> None:
        self._sampling = time.perf_counter() - self._sampling_start

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if not logs or LOSS_KEY not in logs:  # the summary log at the end of training
            return
        loss = float(logs[LOSS_KEY])
        r, step = self._round_of(state.global_step)
        if step == 1:
            self.rounds.append(
                {
                    "round": r,
                    "rollout_len": logs.get("completions/mean_length"),
                    "clipped_ratio": logs.get("completions/clipped_ratio"),
                    "rollout_seconds": self._sampling,
                    "loss": loss,
                }
            )
        current = self.rounds[-1]
        current["loss_last"] = loss
        current["seconds"] = time.perf_counter() - self._round_start
        start = current["loss"] if step > 1 else None
        if _diverged(loss, start, self.hp.max_loss_growth):
            self.diverged = (r, step, loss, start)
            control.should_training_stop = True
        elif step == self.hp.inner_steps:
            logger.info(
                "SDFT (TRL) round %d/%d: completion %.1f tok, %s, %.1fs",
                r,
                self.hp.rounds,
                current["rollout_len"] or 0.0,
                describe_loss(current, self.hp.inner_steps),
                current["seconds"],
            )


def _restore_vars(obj: Any, saved: dict) -> None:
    """Put back the attributes of ``obj`` that differ from ``saved`` (a ``dict(vars(obj))``)."""
    now = vars(obj)
    for key in [k for k in now if k not in saved]:
        delattr(obj, key)
    for key, value in saved.items():
        if key not in now or now[key] is not value:
            setattr(obj, key, value)


@contextlib.contextmanager
def _kept_state(model: Any, tok: Any) -> Iterator[None]:
    """Inside, TRL's trainer may change the model's configs, attributes (``model_tags``), dropout
    rates and train mode, the tokenizer's pad token and every random number generator of the
    process; on exit they are as before."""
    base = unwrapped(model)
    # the configs, and the model objects themselves (the peft wrapper and the model it wraps)
    configs = [base.config, base.config.get_text_config(), base.generation_config, base, model]
    kept = list({id(c): c for c in configs if c is not None}.values())
    saved = [dict(vars(c)) for c in kept]
    tags = list(base.model_tags) if isinstance(vars(base).get("model_tags"), list) else None
    dropouts = {m: m.p for m in base.modules() if isinstance(m, torch.nn.Dropout)}
    # the caller's mode, read from the model it passed (a fresh peft wrapper reports training)
    was_training, pad_token = base.training, tok.pad_token
    device = input_device(model)
    python_rng, numpy_rng = random.getstate(), numpy.random.get_state()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            yield
    finally:
        for obj, attributes in zip(kept, saved):
            _restore_vars(obj, attributes)
        if tags is not None:  # a list TRL extends in place (``add_model_tags``)
            base.model_tags[:] = tags
        for module, p in dropouts.items():
            module.p = p
        model.train(was_training)
        if tok.pad_token != pad_token:
            tok.pad_token = pad_token
        random.setstate(python_rng)
        numpy.random.set_state(numpy_rng)


@contextlib.contextmanager
def _quiet_adapter_warning() -> Iterator[None]:
    """TRL warns once per trainer that the student "already contains a PEFT adapter": that is the
    LoRA executor's adapter, handed in on purpose so that TRL's base teacher is the model with it
    switched off (HPSE's pi_0) and a continual sequence keeps one adapter."""
    trainer_log = logging.getLogger("trl.experimental.sdft.sdft_trainer")
    level = trainer_log.level
    trainer_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        trainer_log.setLevel(level)


def train_sdft(executor: Executor, tok: Any, reqs: list[dict], hp: Any, result: EditResult) -> list:
    """Run TRL's ``SDFTTrainer`` on ``reqs`` (normalised requests) in ``executor``'s adapter;
    returns the per-round statistics. A diverged edit is undone (``result.weights_copy``) and
    raises ``EditDivergedError``."""
    model = executor.model
    device = input_device(model)
    dataset = Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": r["prompt"]}],
                "privileged_context": r["target_new"],
            }
            for r in reqs
        ]
    )
    rounds = _Rounds(hp)
    optimizer = executor.optimizer()
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    cuda = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with (
        tempfile.TemporaryDirectory(prefix="hpse-sdft-") as out,
        _kept_state(model, tok),
        cuda,
    ):
        with _quiet_adapter_warning():
            trainer = _EditTrainer(
                model=model,
                args=sdft_config(hp, len(reqs), out, use_cpu=device.type == "cpu"),
                train_dataset=dataset,
                processing_class=tok,
                optimizers=(optimizer, schedule),
                callbacks=[rounds],
            )
        for quiet in (PrinterCallback, ProgressCallback):
            trainer.remove_callback(quiet)
        with activation_checkpointing(model, hp.gradient_checkpointing), cpu_half_backward(model):
            trainer.train()
    optimizer.zero_grad(set_to_none=True)
    executor.finish()
    problem = rounds.problem()
    if problem is None and not all(
        bool(p.isfinite().all()) for p in executor.trainable_parameters()
    ):
        problem = (len(rounds.rounds), "after its last step: the adapter holds non-finite values")
    if problem is not None:  # undone, as train_edit undoes a diverged HPSE edit
        copy_back(executor.model, result.weights_copy)
        raise EditDivergedError(
            f"the SDFT (TRL) edit diverged in round {problem[0]}, {problem[1]}; the edit was "
            f"undone and nothing is kept. Lower 'lr' in the hparams (now {hp.lr:g})",
            model=executor.model,
            weights_copy=result.weights_copy,
            round=problem[0],
            loss=rounds.diverged[2] if rounds.diverged else math.nan,
        )
    return rounds.rounds
