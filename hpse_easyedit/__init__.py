"""Hybrid-Policy Self-Editing (HPSE) for unstructured knowledge editing, as an EasyEdit plugin."""

from . import builtin_methods  # noqa: F401  (registers HPSE, COIN*, SDFT, UnKE, AnyEdit, MEMIT, AlphaEdit)
from .edit_requests import RequestError, normalize_requests
from .editor import hpse_edit
from .executors import restore_weights
from .generation import generate_answers
from .hparams import HParamsError, HPSEHyperParams
from .integrations.entries import apply_hpse_to_model
from .integrations.sdft import SDFTHyperParams
from .loading import ModelNotFoundError, load_model
from .methods import MethodSpec, get_method, register_method, registered_methods
from .model_io import load_edit, save_edit
from .training import EditResult

__version__ = "0.1.0"


def register() -> None:
    """Register the registry's methods (HPSE, COIN*, UnKE, AnyEdit) as EasyEdit methods (imports
    EasyEdit; idempotent)."""
    from .integrations.registration import register as _register

    _register()


__all__ = [
    "EditResult",
    "HParamsError",
    "HPSEHyperParams",
    "MethodSpec",
    "ModelNotFoundError",
    "RequestError",
    "SDFTHyperParams",
    "apply_hpse_to_model",
    "generate_answers",
    "get_method",
    "hpse_edit",
    "load_edit",
    "load_model",
    "normalize_requests",
    "register",
    "register_method",
    "registered_methods",
    "restore_weights",
    "save_edit",
]
