"""The benchmark runner's view of the method registry (``hpse_easyedit.methods``), and its two
reference rows.

The runner knows nothing about any method. The ``alg_name`` of an hparams file picks a
``MethodSpec`` (``method_for_file``) that tells it how to read the hparams (with ``--set key=value``
overrides), load the model, apply one edit and undo it. ``edit`` follows the EasyEdit / ROME
contract: it returns an object with ``.model`` (the edited model, possibly a wrapper such as a peft
``PeftModel``), ``.weights_copy`` (what ``restore`` needs to get the unedited model back) and
``.rounds`` (per-round diagnostics, a list of dicts; empty for methods without rounds). For
continual editing the runner passes the returned ``.model`` into the next ``edit`` and restores with
the FIRST edit's ``weights_copy``.

A method is added in ONE place, ``hpse_easyedit.methods`` (one module plus one ``register_method``
line); the runner, run_compare and EasyEdit's ``BaseEditor`` then all find it. This module registers
only what belongs to the benchmarks: the UNEDITED and IN_CONTEXT reference rows
(``benchmarks.run.references``). The plain LoRA / FT-M baselines need no entry: they are HPSE files
with ``kl_weight: 0``.
"""

from __future__ import annotations

from hpse_easyedit.loading import load_model
from hpse_easyedit.methods import (
    MethodSpec,
    get_method,
    hparams_dict,
    method_for_file,
    register_method,
)

from .references import InContextHParams, ReferenceHParams, keep_model, reference_edit

__all__ = ["MethodSpec", "get_method", "method_for_file", "method_label", "register_method"]

#: how tables name an executor
EXECUTOR_LABELS = {"lora": "LoRA", "ft_m": "FT-M"}


def method_label(name: str, hparams: dict) -> str:
    """What a run edits with, as tables name it: ``LoRA`` (an HPSE file with ``kl_weight: 0``),
    ``LoRA + HPSE``, ``FT-M + HPSE``, ``COIN*``, ``SDFT (TRL)``; other methods by their
    ``alg_name``."""
    if name == "HPSE":
        executor = EXECUTOR_LABELS.get(str(hparams.get("executor")), str(hparams.get("executor")))
        return f"{executor} + HPSE" if hparams.get("kl_weight") else executor
    return {"COIN": "COIN*", "SDFT": "SDFT (TRL)"}.get(name, name)


register_method(
    MethodSpec(
        "UNEDITED", ReferenceHParams.load, hparams_dict, load_model, reference_edit, keep_model
    )
)
register_method(
    MethodSpec(
        "IN_CONTEXT", InContextHParams.load, hparams_dict, load_model, reference_edit, keep_model
    )
)
