"""The project's methods in the registry (``methods.register_method``): HPSE and COIN* (the engine's
edits), SDFT (TRL's SDFTTrainer in the LoRA executor, ``integrations.sdft``), UnKE and AnyEdit
(EasyEdit's code through the adapter) and MEMIT and AlphaEdit (EasyEdit's own ``ALG_DICT`` entries,
statistics computed offline). Imported with the package, so every front door finds them.
"""

from __future__ import annotations

from .batched import hpse_edit_cases
from .coin import COINHyperParams, coin_edit
from .editor import hpse_edit
from .executors import restore_weights, resume_edit
from .hparams import HPSEHyperParams
from .integrations.baselines import (
    LOCATE_THEN_EDIT,
    AnyEditHyperParams,
    LocateThenEditHParams,
    UnKEHyperParams,
    apply_locate_then_edit,
    check_locality_data,
    check_statistics_obtainable,
    restore_copied_weights,
)
from .integrations.entries import (
    apply_coin_to_model,
    apply_hpse_to_model,
    apply_sdft_to_model,
    apply_unke_family_to_model,
)
from .integrations.factory import load_checked_model
from .integrations.sdft import SDFTHyperParams, check_trl, sdft_edit
from .loading import load_model
from .methods import MethodSpec, hparams_dict, register_method, timed_edit

__all__: list[str] = []

register_method(
    MethodSpec(
        "HPSE",
        HPSEHyperParams.load,
        hparams_dict,
        load_model,
        hpse_edit,
        restore_weights,
        easyedit_apply=apply_hpse_to_model,
        callable_restore=True,
        resume=resume_edit,
        edit_cases=hpse_edit_cases,
    )
)
register_method(
    MethodSpec(
        "COIN",
        COINHyperParams.load,
        hparams_dict,
        load_checked_model,
        coin_edit,
        restore_weights,
        easyedit_apply=apply_coin_to_model,
        callable_restore=True,
        resume=resume_edit,
    )
)
register_method(
    MethodSpec(
        "SDFT",
        SDFTHyperParams.load,
        hparams_dict,
        load_model,
        sdft_edit,
        restore_weights,
        easyedit_apply=apply_sdft_to_model,
        callable_restore=True,
        preflight=check_trl,
        resume=resume_edit,
    )
)
for _name, _hparams in (
    ("UnKE", UnKEHyperParams),
    ("AnyEdit", AnyEditHyperParams),
):  # EasyEdit's unke / unke_ARE
    register_method(
        MethodSpec(
            _name,
            _hparams.load,
            hparams_dict,
            load_checked_model,
            timed_edit(apply_unke_family_to_model, timer=True),
            restore_copied_weights,
            needs_easyedit=True,
            easyedit_apply=apply_unke_family_to_model,
            preflight=check_locality_data,
        )
    )
for _name in LOCATE_THEN_EDIT:  # EasyEdit's own ALG_DICT entries, statistics computed offline
    register_method(
        MethodSpec(
            _name,
            LocateThenEditHParams.load,
            hparams_dict,
            load_checked_model,
            timed_edit(apply_locate_then_edit, timer=True),
            restore_copied_weights,
            needs_easyedit=True,
            preflight=check_statistics_obtainable,
        )
    )
