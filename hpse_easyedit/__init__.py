"""Hybrid-Policy Self-Editing (HPSE) for unstructured knowledge editing, as an EasyEdit plugin."""

from .editor import EditResult, RequestError, apply_hpse_to_model, hpse_edit, normalize_requests
from .executors import restore_weights
from .generation import generate_answers
from .hparams import HParamsError, HPSEHyperParams
from .loading import ModelNotFoundError, load_model
from .methods import MethodSpec, get_method, register_method, registered_methods

__version__ = "0.1.0"


def register() -> None:
    """Register the registry's methods (HPSE, COIN*, UnKE, AnyEdit) as EasyEdit methods (imports EasyEdit; idempotent)."""
    from .integrations.registration import register as _register

    _register()


__all__ = [
    "EditResult",
    "HParamsError",
    "HPSEHyperParams",
    "MethodSpec",
    "ModelNotFoundError",
    "RequestError",
    "apply_hpse_to_model",
    "generate_answers",
    "get_method",
    "hpse_edit",
    "load_model",
    "normalize_requests",
    "register",
    "register_method",
    "registered_methods",
    "restore_weights",
]
