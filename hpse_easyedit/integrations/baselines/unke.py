"""UnKE and AnyEdit through EasyEdit's own ``models/unke`` and ``models/unke_ARE`` (outside
``ALG_DICT``): their hparams classes, and the adapter that calls EasyEdit's
``apply_unke*_to_model``."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

from ...edit_requests import RequestError, normalize_requests
from ...hparams import EditorHParams, HParamsError, hp_field
from ..easyedit_import import import_easyedit
from .common import algorithm_timer, check_depth, easyedit_model_name, grad_flags_kept, padding_side
from .locality import LocalityTexts, draw_locality_texts
from .prompts import chat_text, end_of_turn_text

__all__ = ["AnyEditHyperParams", "UnKEHyperParams", "apply_unke_family"]


@dataclass
class UnKEHyperParams(EditorHParams):
    """EasyEdit's UnKE fields (``models/unke/unke_hparams.py``), the fields BaseEditor reads, and
    the locality data."""

    ALG_NAME = "UnKE"

    alg_name: str = hp_field("UnKE", "Method name; must be UnKE.", choices=("UnKE",))
    layers: list = hp_field(
        [7], "Decoder layers UnKE rewrites (whole blocks, one after another).", nonempty=True
    )
    layer_selection: str = hp_field(
        "all", "EasyEdit field (unused by UnKE's code).", choices=("all", "random")
    )
    fact_token: str = hp_field(
        "last",
        "EasyEdit field (unused by UnKE's code).",
        choices=("last", "subject_first", "subject_last", "subject_first_after_last"),
    )
    lr: float = hp_field(
        2e-4, "AdamW step size of the layer optimisation.", min=0.0, exclusive_min=True
    )
    v_num_grad_steps: int = hp_field(
        25, "Steps of the target-representation (z) optimisation.", min=1
    )
    v_lr: float = hp_field(0.5, "Step size of the z optimisation.", min=0.0, exclusive_min=True)
    v_loss_layer: int = hp_field(
        27, "Layer whose output the z loss reads (the last layer in EasyEdit's files).", min=0
    )
    v_weight_decay: float = hp_field(1e-3, "Weight decay of the z optimisation.", min=0.0)
    clamp_norm_factor: float = hp_field(
        4.0, "Bound on the z update's norm, relative to the original.", min=0.0
    )
    optim_num_step: int = hp_field(50, "AdamW steps on each rewritten layer.", min=1)
    ex_data_num: int = hp_field(20, "Locality texts drawn per edit from ex_data.", min=1)
    rewrite_module_tmp: str = hp_field("model.layers.{}.mlp.down_proj", "EasyEdit module template.")
    layer_module_tmp: str = hp_field(
        "model.layers.{}", "EasyEdit module template of a decoder layer."
    )
    mlp_module_tmp: str = hp_field("model.layers.{}.mlp", "EasyEdit module template.")
    attn_module_tmp: str = hp_field("model.layers.{}.self_attn", "EasyEdit module template.")
    ln_f_module: str = hp_field("model.norm", "Final norm module.")
    lm_head_module: str = hp_field(
        "lm_head", "Output projection module (model.embed_tokens for tied embeddings)."
    )
    ex_data: list = hp_field(
        ["editevery"],
        "Locality data UnKE preserves (Alpaca in the original): built-in 'editevery' or 'mmlu', "
        "or Alpaca/question-answer JSON/JSONL files, or text corpora.",
        nonempty=True,
    )
    ex_data_seed: int = hp_field(
        0, "Seed of the per-edit draw of ex_data_num locality texts.", min=0
    )
    ex_data_max_tokens: int = hp_field(
        256,
        "Locality texts are cut to this many tokens (0 = no cap): EditEverything texts average "
        "~300 tokens, Alpaca's ~100, and UnKE runs the whole model on all of them at once.",
        min=0,
    )

    def check(self, source: str) -> None:
        if not all(
            isinstance(layer, int) and not isinstance(layer, bool) and layer >= 0
            for layer in self.layers
        ):
            raise HParamsError(
                f"{source}: key 'layers' must be a list of layer indices, got {self.layers!r}"
            )
        if self.v_loss_layer < max(self.layers):
            raise HParamsError(
                f"{source}: v_loss_layer ({self.v_loss_layer}) "
                f"must be >= the rewritten layers {self.layers}"
            )


@dataclass
class AnyEditHyperParams(UnKEHyperParams):
    """AnyEdit = EasyEdit's ``unke_ARE``: UnKE with the passage edited autoregressively in token
    windows."""

    ALG_NAME = "AnyEdit"

    alg_name: str = hp_field("AnyEdit", "Method name; must be AnyEdit.", choices=("AnyEdit",))
    window_size: int = hp_field(50, "Tokens of the passage per autoregressive chunk.", min=1)
    overlap: int = hp_field(0, "Tokens shared by consecutive chunks.", min=0)

    def check(self, source: str) -> None:
        super().check(source)
        if self.overlap >= self.window_size:
            raise HParamsError(
                f"{source}: overlap ({self.overlap}) must be < window_size ({self.window_size})"
            )


def _easyedit_unke(alg_name: str) -> tuple[type, Any]:
    import_easyedit()
    if alg_name == "UnKE":
        mod = importlib.import_module("easyeditor.models.unke.unke_main")
        return mod.unkeHyperParams, mod.apply_unke_to_model
    mod = importlib.import_module("easyeditor.models.unke_ARE.unke_ARE_main")
    return mod.unkeAREHyperParams, mod.apply_unke_ARE_to_model


@contextlib.contextmanager
def _tuple_layer_outputs(model: Any, layer_names: Sequence[str]) -> Iterator[None]:
    """Direct calls of these layers return ``(hidden,)``, as UnKE's code expects; calls inside the
    model's forward don't."""
    inner = getattr(model, "model", model)
    depth = [0]

    def enter(module: Any, args: Any) -> None:
        depth[0] += 1

    def leave(module: Any, args: Any, output: Any) -> None:
        depth[0] -= 1

    def as_tuple(module: Any, args: Any, output: Any) -> Any:
        if depth[0] == 0 and isinstance(output, torch.Tensor):
            return (output,)
        return None

    handles = [
        inner.register_forward_pre_hook(enter),
        inner.register_forward_hook(leave, always_call=True),
    ]
    handles += [model.get_submodule(n).register_forward_hook(as_tuple) for n in layer_names]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def apply_unke_family(
    model: Any,
    tok: Any,
    requests: Any,
    hparams: UnKEHyperParams,
    copy: bool = False,
    timer: dict | None = None,
    locality: LocalityTexts | None = None,
) -> tuple[Any, dict]:
    """Edit with EasyEdit's ``apply_unke_to_model`` / ``apply_unke_ARE_to_model``; returns ``(model,
    weights_copy)``.

    ``timer``: a dict that receives ``"algorithm_seconds"``, the time spent inside EasyEdit's
    function. ``locality``: the cache of loaded locality texts to draw from (without one they are
    read for this edit).
    """
    if copy:
        import copy as copy_module

        model = copy_module.deepcopy(model)
    ee_cls, ee_apply = _easyedit_unke(hparams.alg_name)
    reqs = normalize_requests(requests, hparams)
    check_depth(model, hparams.layers, [hparams.v_loss_layer], f"<{hparams.alg_name} hparams>")
    ee_fields = {f.name for f in dataclasses.fields(ee_cls)}
    values = {name: getattr(hparams, name) for name in ee_fields}
    values["model_name"] = easyedit_model_name(hparams.model_name, model, hparams.alg_name)
    ee_hparams = ee_cls(**values)
    eot_text = end_of_turn_text(tok, hparams.chat_template_kwargs)
    batch = [
        {
            "question": chat_text(tok, r["prompt"], hparams.chat_template_kwargs),
            "answer": r["target_new"] + eot_text,
        }
        for r in reqs
    ]
    ex_data = draw_locality_texts(tok, hparams, reqs, locality)
    if tok.pad_token_id is None:
        raise RequestError(
            "the tokenizer has no pad token; UnKE pads its "
            "batches (set tok.pad_token = tok.eos_token)"
        )
    layer_names = [hparams.layer_module_tmp.format(layer) for layer in hparams.layers]
    with (
        grad_flags_kept(model),
        padding_side(tok, "right"),
        _tuple_layer_outputs(model, layer_names),
    ):
        with algorithm_timer(timer):
            weights_copy = ee_apply(model, tok, ee_hparams, batch, ex_data)
    return model, weights_copy
