"""EasyEdit integration: importing this module registers the registry's methods (HPSE, COIN*, UnKE,
AnyEdit) in EasyEdit.

EasyEdit is used from its GitHub source (``$EASYEDIT_SRC`` or ``sys.path``); see docs/EASYEDIT.md::

    import hpse_easyedit.easyedit  # imports EasyEdit, registers the methods (idempotent)
    from easyeditor import BaseEditor
    from hpse_easyedit import HPSEHyperParams

    editor = BaseEditor.from_hparams(HPSEHyperParams.from_hparams("hparams/HPSE/smollm2-135m.yaml"))
    metrics, edited_model, weights_copy = editor.edit(
        prompts=["Introduce AJ Lee."],
        target_new=[passage],
        subject=["AJ Lee"],
        sequential_edit=True,
    )
    weights_copy()  # undo it (with sequential_edit=False EasyEdit already did)

For this package's hparams (any method: ``load_hparams(path)`` picks the class from ``alg_name``)
``BaseEditor.from_hparams`` is ``make_editor``: the model is loaded by ``hpse_easyedit.load_model``
(the file's dtype, no remote code unless asked, the embedded SmolLM2 offline, Gemma-2, which
EasyEdit's name-based loader cannot load) and handed to ``BaseEditor`` as a ``(model, tokenizer)``
pair.
"""

from __future__ import annotations

from .integrations.easyedit_import import (
    ENV_VAR,
    INSTALL_HINT,
    OPTIONAL_MODULES,
    EasyEditNotFoundError,
    EasyEditVersionError,
    check_easyedit,
    import_easyedit,
)
from .integrations.entries import EditHandle
from .integrations.factory import is_project_hparams
from .integrations.registration import make_editor, plugin_methods, register
from .methods import MethodSpec, get_method, load_hparams, register_method, registered_methods

__all__ = [
    "ENV_VAR",
    "INSTALL_HINT",
    "OPTIONAL_MODULES",
    "EasyEditNotFoundError",
    "EasyEditVersionError",
    "EditHandle",
    "MethodSpec",
    "check_easyedit",
    "get_method",
    "import_easyedit",
    "is_project_hparams",
    "load_hparams",
    "make_editor",
    "plugin_methods",
    "register",
    "register_method",
    "registered_methods",
]

register()
