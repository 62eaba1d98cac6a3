"""Thin adapters that run EasyEdit's own MEMIT, AlphaEdit, UnKE and AnyEdit on unstructured edits.

Nothing here re-implements a method: each adapter turns our requests (editing prompt ``Introduce
{s}.``, passage, subject) into what EasyEdit's implementation takes, supplies what it would
otherwise download or hard-code, calls it, and hands back ``(model, weights_copy)``.

- Requests. The editing prompt goes through the tokenizer's chat template (the edited models are
  chat models and are asked through their template); the target is the passage followed by the
  template's end-of-turn token, as in AnyEdit's and UnKE's own data. MEMIT and AlphaEdit get
  ``{prompt, subject, target_new}``; UnKE and AnyEdit get ``{question, answer}``.
- MEMIT / AlphaEdit run through EasyEdit's own ``ALG_DICT`` entries with EasyEdit's own hparams
  classes, read from our YAML files (which keep EasyEdit's schema, so
  ``MEMITHyperParams.from_hparams`` reads them too). Their covariance statistics are computed
  offline by ``hpse_easyedit.integrations.covariance`` when ``mom2_dataset`` names a local corpus;
  AlphaEdit's null-space projection ``P`` is computed once per model with EasyEdit's own
  ``get_project`` and stored at ``P_loc``. EasyEdit keeps per-process caches that assume one model
  (``COV_CACHE``, AlphaEdit's ``P`` and ``cache_c``); an ``EasyEditCaches`` object, kept with
  EasyEdit's AlphaEdit module (the state it describes lives and dies with that module), resets them
  when another model is edited, and AlphaEdit's ``cache_c`` also after every restore (each single
  edit starts fresh).
- UnKE / AnyEdit (EasyEdit's ``models/unke`` and ``models/unke_ARE``, outside ``ALG_DICT``, with
  JSON hparams) are called with EasyEdit's own hparams classes built from our YAML, and the locality
  data they preserve (``ex_data``: 20 instruction/answer texts, Alpaca in the original) drawn from a
  local set; a ``LocalityTexts`` cache passed in by the caller keeps the loaded set across edits.

Three places where EasyEdit's code decides by model name get a name it recognises, chosen from the
model's config, never changing the algorithm (``easyedit_model_name``):

- AlphaEdit sizes ``P`` and ``cache_c`` from ``down_proj``'s layout only when the name contains
  ``llama``/``qwen``; every backbone we ship has that ``(hidden, intermediate)`` layout.
- UnKE and AnyEdit call one decoder layer directly and pick the call by name; only the
  ``Qwen2.5-7B-Instruct`` branch passes ``position_embeddings``, which every decoder layer of
  transformers >= 4.48 requires (the ``Llama3-8B-Instruct`` branch would fail there).
- The same direct call indexes ``layer(...)[0]``, written for decoder layers that return a tuple.
  transformers >= 4.54 returns the hidden-state tensor itself, where ``[0]`` would silently take the
  first example of the batch (and broadcast it against the 20 locality examples). While UnKE/AnyEdit
  run, a forward hook gives direct calls of the edited layers their tuple back
  (``unke._tuple_layer_outputs``); calls inside the model's own forward are untouched.

One module per concern: ``prompts`` (chat-templated requests), ``common`` (the names EasyEdit's code
tests, layer-depth check, the context managers around EasyEdit's calls), ``locality`` (UnKE's /
AnyEdit's locality data), ``unke`` (UnKE, AnyEdit), ``locate_then_edit`` (MEMIT, AlphaEdit).
"""

from __future__ import annotations

from .common import check_depth, easyedit_model_name
from .locality import LocalityTexts, check_locality_data, load_instruction_texts
from .locate_then_edit import (
    LOCATE_THEN_EDIT,
    AdapterOptions,
    EasyEditCaches,
    LocateThenEditHParams,
    apply_locate_then_edit,
    as_locate_then_edit,
    check_statistics_obtainable,
    easyedit_locate_then_edit_classes,
    easyedit_requests,
    load_locate_then_edit_hparams,
    prepare_locate_then_edit,
    restore_copied_weights,
)
from .prompts import chat_text
from .unke import AnyEditHyperParams, UnKEHyperParams, apply_unke_family

__all__ = [
    "LOCATE_THEN_EDIT",
    "AdapterOptions",
    "AnyEditHyperParams",
    "EasyEditCaches",
    "LocalityTexts",
    "LocateThenEditHParams",
    "UnKEHyperParams",
    "apply_locate_then_edit",
    "apply_unke_family",
    "as_locate_then_edit",
    "chat_text",
    "check_depth",
    "check_locality_data",
    "check_statistics_obtainable",
    "easyedit_locate_then_edit_classes",
    "easyedit_model_name",
    "easyedit_requests",
    "load_instruction_texts",
    "load_locate_then_edit_hparams",
    "prepare_locate_then_edit",
    "restore_copied_weights",
]
