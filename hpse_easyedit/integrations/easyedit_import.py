"""Find and import EasyEdit from its GitHub source, and refuse versions the integration cannot hook.

EasyEdit is not a pip-installable package: users clone https://github.com/zjunlp/EasyEdit and put
the checkout on ``sys.path``; ``$EASYEDIT_SRC`` names that checkout. The PyPI
``easyeditor==0.0.1.dev0`` is a 2023 snapshot (torch 2.0 / transformers 4.30, no Qwen, no AlphaEdit,
no UnKE) and is refused.

``import easyeditor`` imports all of EasyEdit, multimodal editors and trainers included, and with
them packages that text editing never calls and that cannot be installed on every machine
(torchvision and timm are binaries tied to one torch build; OpenCV and PyAV are native media
libraries). When one of the packages in ``OPTIONAL_MODULES`` is missing, the import stands in a
placeholder for it that raises an ``ImportError`` naming the package the moment anything of it is
used (called or instantiated). The placeholders are served only to EasyEdit's own modules, are taken
out of ``sys.modules`` once EasyEdit is imported, and each one is logged. Any other missing package
is an error naming the package to install.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import types
from pathlib import Path
from typing import Any, Iterator

__all__ = [
    "ENV_VAR",
    "INSTALL_HINT",
    "LOCATE_THEN_EDIT",
    "OPTIONAL_MODULES",
    "EasyEditNotFoundError",
    "EasyEditVersionError",
    "check_easyedit",
    "import_easyedit",
]

logger = logging.getLogger(__name__)

ENV_VAR = "EASYEDIT_SRC"
#: EasyEdit's own locate-then-edit algorithms this project runs (their ALG_DICT names)
LOCATE_THEN_EDIT = ("MEMIT", "AlphaEdit")
INSTALL_HINT = (
    "install EasyEdit from its GitHub source: `git clone https://github.com/zjunlp/EasyEdit "
    "/path/to/EasyEdit`, install its text-editing dependencies (`pip install higher einops "
    "hydra-core nltk rouge 'transformers<5.24'`; see "
    f"docs/EASYEDIT.md), and `export {ENV_VAR}=/path/to/EasyEdit`"
)
STALE_PYPI_VERSION = "0.0.1.dev0"

#: Packages EasyEdit imports at top level for features text editing never uses -> why they may be
#: absent.
OPTIONAL_MODULES: dict[str, str] = {
    "torchvision": "vision transforms of the multimodal editors and "
    "BLIP-2 trainers; a binary built for one torch version",
    "timm": "vision backbones of the BLIP-2/MiniGPT-4 trainers; needs torchvision",
    "fairscale": "CLIP ViT of the BLIP-2 trainers; its build needs its own torch",
    "iopath": "checkpoint downloads of the BLIP-2 trainers",
    "cv2": "video/image processors of the LLaVA-OneVision and Qwen2-VL editors (OpenCV, native)",
    "av": "video decoding of the LLaVA-OneVision and Qwen2-VL editors (PyAV, native)",
    "qwen_vl_utils": "Qwen2-VL processors; needs av",
    "scipy": "geometric-mean fluency metric and TF-IDF statistics (native)",
    "sklearn": "F1 metric of some evaluators and EAMET key statistics (native)",
    "sentence_transformers": "IKE demonstrations and embedding-based evaluators (the MiniLM score "
    "of eval_akew_unstructured: the easyedit extra installs it); needs scipy and scikit-learn",
    "zhipuai": "the DeepEdit API editor; needs the native cryptography package",
}

# Pip names of the packages EasyEdit's text-editing import chain needs, for error messages.
_PIP_NAMES = {
    "higher": "higher",
    "einops": "einops",
    "omegaconf": "omegaconf",
    "hydra": "hydra-core",
    "nltk": "nltk",
    "rouge": "rouge",
    "antlr4": "antlr4-python3-runtime",
}

#: Upper bounds on packages whose newer releases dropped a module EasyEdit imports (setup.py's
#: ``easyedit`` extra carries the same pins): transformers 5.24 removed
#: ``transformers.modeling_attn_mask_utils`` (EasyEdit's UnKE).
EASYEDIT_PINS = {"transformers": "<5.24"}


class EasyEditNotFoundError(ImportError):
    """EasyEdit (or a package it needs) cannot be imported; the message says how to install it."""


class EasyEditVersionError(ImportError):
    """The importable EasyEdit is the stale PyPI snapshot or lacks what the integration hooks
    into."""


# ------------------------------------------------------------------------------------- placeholders
class _AbsentMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _absent(f"{cls._absent_name}.{name}")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        root = cls._absent_name.split(".")[0]
        raise ImportError(
            f"{cls._absent_name} is unavailable: the package {root!r} is not installed "
            f"({OPTIONAL_MODULES.get(root, '')}). EasyEdit was imported with a placeholder for it "
            f"because it imports it at top level; install {root} to use this EasyEdit feature"
        )


def _absent(qualname: str) -> type:
    return _AbsentMeta(qualname.rsplit(".", 1)[-1], (), {"_absent_name": qualname})


class _AbsentModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _absent(f"{self.__name__}.{name}")


def _importer_is_easyedit() -> bool:
    """True when the import statement being served runs in an easyeditor module."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if (
            filename.startswith("<frozen importlib")
            or filename == __file__
            or filename.endswith(os.path.join("importlib", "__init__.py"))
        ):
            frame = frame.f_back
            continue
        return str(frame.f_globals.get("__name__", "")).startswith("easyeditor")
    return False


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``_AbsentModule``s for missing optional packages, to easyeditor's imports only (last
    on meta_path)."""

    def __init__(self, roots: set[str]) -> None:
        self.roots = roots
        self.served: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):  # noqa: D401 - importlib API
        if fullname.split(".")[0] not in self.roots or not _importer_is_easyedit():
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _AbsentModule(spec.name)
        module.__path__ = []  # type: ignore[attr-defined]
        self.served.add(spec.name)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _settle_transformers_checks() -> None:
    """Answer transformers' cached ``is_*_available`` checks before placeholders exist, so none is
    fooled."""
    try:
        from transformers.utils import import_utils
    except ImportError:  # pragma: no cover - transformers is a hard dependency
        return
    for name in dir(import_utils):
        if name.startswith("is_") and name.endswith("_available"):
            func = getattr(import_utils, name)
            if callable(func) and hasattr(func, "cache_info"):
                with contextlib.suppress(Exception):
                    func()


@contextlib.contextmanager
def _placeholders(roots: set[str]) -> Iterator[_PlaceholderFinder]:
    _settle_transformers_checks()
    finder = _PlaceholderFinder(roots)
    sys.meta_path.append(finder)
    try:
        yield finder
    finally:
        sys.meta_path.remove(finder)
        for name in list(sys.modules):
            if name in finder.served:
                del sys.modules[name]


# ------------------------------------------------------------------------------------------- import
def _source_dir() -> Path | None:
    value = os.environ.get(ENV_VAR)
    if not value:
        return None
    path = Path(value).expanduser()
    if not (path / "easyeditor" / "__init__.py").is_file():
        raise EasyEditNotFoundError(
            f"${ENV_VAR}={value} is not an EasyEdit checkout "
            f"(no easyeditor/__init__.py there); {INSTALL_HINT}"
        )
    return path.resolve()


def _distribution_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _installed_distribution_version() -> str | None:
    return _distribution_version("easyeditor")


def check_easyedit(module: types.ModuleType | None = None) -> None:
    """Raise ``EasyEditVersionError`` unless the imported EasyEdit has every hook the integration
    uses."""
    ee = module or sys.modules.get("easyeditor")
    where = getattr(ee, "__file__", "?")
    missing = []

    def need(modname: str, *attrs: str) -> Any:
        try:
            mod = importlib.import_module(modname)
        except ImportError:
            missing.append(modname)
            return None
        for attr in attrs:
            if not hasattr(mod, attr):
                missing.append(f"{modname}.{attr}")
        return mod

    alg = need("easyeditor.util.alg_dict", "ALG_DICT")
    utils = need("easyeditor.editors.utils", "restore_after_edit", "CALLABLE_RESTORE_ALGS")
    batch = need("easyeditor.editors.batch_editor", "BatchEditor")
    editor = need("easyeditor.editors.editor", "BaseEditor")
    need("easyeditor.models.unke", "unkeHyperParams", "apply_unke_to_model")
    need("easyeditor.models.unke_ARE", "unkeAREHyperParams", "apply_unke_ARE_to_model")
    need("easyeditor.models.rome.layer_stats", "layer_stats")
    need("easyeditor.models.alphaedit.AlphaEdit_main", "apply_AlphaEdit_to_model", "get_project")
    if alg is not None and hasattr(alg, "ALG_DICT"):
        for name in LOCATE_THEN_EDIT:
            if name not in alg.ALG_DICT:
                missing.append(f"ALG_DICT[{name!r}]")
        if editor is not None and getattr(editor, "ALG_DICT", None) is not alg.ALG_DICT:
            missing.append(
                "easyeditor.editors.editor.ALG_DICT bound to easyeditor.util.alg_dict.ALG_DICT"
            )
    if (
        batch is not None
        and hasattr(batch, "BatchEditor")
        and not hasattr(batch.BatchEditor, "is_batchable_method")
    ):
        missing.append("BatchEditor.is_batchable_method")
    if (
        utils is not None
        and hasattr(utils, "CALLABLE_RESTORE_ALGS")
        and not isinstance(utils.CALLABLE_RESTORE_ALGS, set)
    ):
        missing.append("CALLABLE_RESTORE_ALGS as a set")
    if missing:
        stale = (
            _installed_distribution_version() == STALE_PYPI_VERSION and ENV_VAR not in os.environ
        )
        what = (
            f"the PyPI snapshot easyeditor=={STALE_PYPI_VERSION} "
            "(2023); `pip uninstall easyeditor`, then "
            if stale
            else "an EasyEdit too old for this integration; "
        )
        raise EasyEditVersionError(
            f"EasyEdit at {where} is {what}{INSTALL_HINT}. Missing: {', '.join(missing)}"
        )


def import_easyedit() -> types.ModuleType:
    """Import ``easyeditor`` (from ``$EASYEDIT_SRC`` when set), check it, and return it."""
    if "easyeditor" in sys.modules:
        module = sys.modules["easyeditor"]
        check_easyedit(module)
        return module
    src = _source_dir()
    if src is not None and str(src) not in sys.path:
        sys.path.insert(0, str(src))
    spec = importlib.util.find_spec("easyeditor")
    if spec is None:
        raise EasyEditNotFoundError(f"EasyEdit is not importable; {INSTALL_HINT}")
    version = _installed_distribution_version()
    from_src = (
        src is not None
        and spec.origin is not None
        and Path(spec.origin).resolve().is_relative_to(src)
    )
    if version == STALE_PYPI_VERSION and not from_src:
        raise EasyEditVersionError(
            f"the importable EasyEdit ({spec.origin}) is the PyPI snapshot easyeditor=={version} "
            "from 2023 (torch 2.0, transformers 4.30, no Qwen, AlphaEdit or UnKE); `pip "
            f"uninstall easyeditor`, then {INSTALL_HINT}"
        )
    absent = {name for name in OPTIONAL_MODULES if importlib.util.find_spec(name) is None}
    if absent:
        logger.warning(
            "Importing EasyEdit with placeholders for packages it "
            "imports at top level but text editing never uses: %s",
            "; ".join(f"{n} ({OPTIONAL_MODULES[n]})" for n in sorted(absent)),
        )
    try:
        with _placeholders(absent):
            module = importlib.import_module("easyeditor")
    except ModuleNotFoundError as err:
        for name in [k for k in sys.modules if k == "easyeditor" or k.startswith("easyeditor.")]:
            del sys.modules[name]
        root = (err.name or "").split(".")[0]
        pip_name = _PIP_NAMES.get(root, root)
        if root and err.name != root and importlib.util.find_spec(root) is not None:
            # The package is there but a module EasyEdit imports from it is not: a newer release
            # removed it (transformers 5.24 dropped transformers.modeling_attn_mask_utils, which
            # EasyEdit's UnKE imports).
            installed = _distribution_version(pip_name)
            pinned = EASYEDIT_PINS.get(pip_name)
            fix = (
                f"`pip install '{pip_name}{pinned}'` (or `pip "
                'install -e ".[easyedit]"`, which pins it)'
                if pinned
                else f"install the {pip_name} release that EasyEdit's requirements.txt names"
            )
            raise EasyEditNotFoundError(
                f"EasyEdit at {spec.origin} imports {err.name}, which the installed {pip_name} "
                f"{installed or '(version unknown)'} does not have: {fix}"
            ) from err
        raise EasyEditNotFoundError(
            f"EasyEdit at {spec.origin} needs the Python package {root!r}, which is not installed: "
            f"`pip install {pip_name}` ({INSTALL_HINT})"
        ) from err
    check_easyedit(module)
    return module
