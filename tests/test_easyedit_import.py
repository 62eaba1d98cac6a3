"""Finding EasyEdit: the stale PyPI snapshot and old checkouts are refused with the fix; optional
packages get placeholders.

Each case imports a small fake ``easyeditor`` package, so no real EasyEdit is needed; the fixture
takes a real EasyEdit out of ``sys.modules`` for the test and puts it back afterwards.
"""

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

from hpse_easyedit.integrations.easyedit_import import (
    EASYEDIT_PINS,
    OPTIONAL_MODULES,
    EasyEditNotFoundError,
    EasyEditVersionError,
    import_easyedit,
)
from hpse_easyedit.integrations.registration import register

# The modules and names the integration hooks into, as a current EasyEdit checkout has them.
CURRENT = {
    "easyeditor/__init__.py": "from .util.alg_dict import ALG_DICT\n{extra}",
    "easyeditor/util/__init__.py": "",
    "easyeditor/util/alg_dict.py": "ALG_DICT = {'MEMIT': print, 'AlphaEdit': print}\n",
    "easyeditor/editors/__init__.py": "",
    "easyeditor/editors/utils.py": "CALLABLE_RESTORE_ALGS = {'KN'}\ndef "
    "restore_after_edit(*a): pass\n",
    "easyeditor/editors/batch_editor.py": (
        "from enum import Enum\nclass BatchEditor(Enum):\n    MEMIT = 'MEMIT'\n"
        "    @staticmethod\n    def is_batchable_method(alg_name):\n        "
        "return alg_name == 'MEMIT'\n"
    ),
    "easyeditor/editors/editor.py": "from ..util.alg_dict import *\nclass BaseEditor: pass\n",
    "easyeditor/models/__init__.py": "",
    "easyeditor/models/unke/__init__.py": "unkeHyperParams = apply_unke_to_model = None\n",
    "easyeditor/models/unke_ARE/__init__.py": "unkeAREHyperParams = "
    "apply_unke_ARE_to_model = None\n",
    "easyeditor/models/rome/__init__.py": "",
    "easyeditor/models/rome/layer_stats.py": "def layer_stats(): pass\n",
    "easyeditor/models/alphaedit/__init__.py": "",
    "easyeditor/models/alphaedit/AlphaEdit_main.py": "def apply_AlphaEdit_to_model(): "
    "pass\ndef get_project(): pass\n",
}


def _fake(root: Path, files: dict, extra: str = "") -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.replace("{extra}", extra))
    importlib.invalidate_caches()
    return root


def _easyedit_modules() -> dict:
    return {
        k: m for k, m in sys.modules.items() if k == "easyeditor" or k.startswith("easyeditor.")
    }


@pytest.fixture
def isolated(monkeypatch):
    """No EasyEdit importable unless the test provides one; a real one already imported is restored
    afterwards."""
    saved = _easyedit_modules()
    for name in saved:
        del sys.modules[name]
    monkeypatch.delenv("EASYEDIT_SRC", raising=False)
    monkeypatch.setattr(
        sys, "path", [p for p in sys.path if not Path(p, "easyeditor", "__init__.py").is_file()]
    )
    yield monkeypatch
    for name in _easyedit_modules():
        del sys.modules[name]
    sys.modules.update(saved)


def test_the_stale_pypi_snapshot_is_refused_with_the_fix(tmp_path, isolated):
    site = _fake(tmp_path / "site", {"easyeditor/__init__.py": "ALG_DICT = {}\n"})
    info = site / "easyeditor-0.0.1.dev0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: easyeditor\nVersion: 0.0.1.dev0\n")
    isolated.syspath_prepend(str(site))
    with pytest.raises(EasyEditVersionError) as err:
        import_easyedit()
    for fragment in (
        "easyeditor==0.0.1.dev0",
        "pip uninstall easyeditor",
        "git clone https://github.com/zjunlp/EasyEdit",
        "EASYEDIT_SRC",
    ):
        assert fragment in str(err.value)


def test_an_old_checkout_is_refused_naming_what_it_lacks(tmp_path, isolated):
    files = dict(CURRENT)
    files["easyeditor/editors/utils.py"] = (
        "def restore_after_edit(*a): pass\n"  # before CALLABLE_RESTORE_ALGS existed
    )
    del files["easyeditor/models/unke_ARE/__init__.py"]
    isolated.setenv("EASYEDIT_SRC", str(_fake(tmp_path / "EasyEdit", files)))
    with pytest.raises(EasyEditVersionError) as err:
        import_easyedit()
    assert "too old" in str(err.value)
    assert "easyeditor.editors.utils.CALLABLE_RESTORE_ALGS" in str(
        err.value
    ) and "easyeditor.models.unke_ARE" in str(err.value)


def test_missing_or_wrong_checkouts_say_how_to_install(tmp_path, isolated):
    with pytest.raises(EasyEditNotFoundError, match="git clone https://github.com/zjunlp/EasyEdit"):
        import_easyedit()
    isolated.setenv("EASYEDIT_SRC", str(tmp_path))
    with pytest.raises(EasyEditNotFoundError, match="is not an EasyEdit checkout"):
        import_easyedit()


def test_optional_packages_get_placeholders_only_for_easyedit_and_only_while_importing(
    tmp_path, isolated
):
    extra = (
        "import hpse_test_absent_vision\n"
        "from hpse_test_absent_vision.transforms.functional import InterpolationMode\n"
        "DEFAULT = InterpolationMode.BICUBIC\n"
        "def make(): return hpse_test_absent_vision.create_model('vit')\n"
    )
    isolated.setenv("EASYEDIT_SRC", str(_fake(tmp_path / "EasyEdit", CURRENT, extra=extra)))
    isolated.setitem(
        OPTIONAL_MODULES, "hpse_test_absent_vision", "vision models of the multimodal editors"
    )
    ee = import_easyedit()
    assert not [m for m in sys.modules if m.startswith("hpse_test_absent_vision")]
    assert importlib.util.find_spec("hpse_test_absent_vision") is None
    with pytest.raises(
        ImportError,
        match="hpse_test_absent_vision.create_model is unavailable: the package "
        "'hpse_test_absent_vision' is not installed \\(vision models",
    ):
        ee.make()
    with pytest.raises(ModuleNotFoundError):
        import hpse_test_absent_vision  # noqa: F401  - outside EasyEdit there is no placeholder


def test_a_missing_required_package_is_named_with_its_pip_name(tmp_path, isolated):
    isolated.setenv(
        "EASYEDIT_SRC",
        str(_fake(tmp_path / "EasyEdit", CURRENT, extra="import hydra_is_not_installed\n")),
    )
    with pytest.raises(EasyEditNotFoundError) as err:
        import_easyedit()
    assert "needs the Python package 'hydra_is_not_installed'" in str(err.value)
    assert "pip install hydra_is_not_installed" in str(err.value)
    assert "easyeditor" not in sys.modules  # a failed import leaves nothing half-imported


def test_a_module_missing_from_an_installed_package_names_the_version_and_the_pin(
    tmp_path, isolated
):
    """transformers 5.24 removed transformers.modeling_attn_mask_utils, which EasyEdit's UnKE
    imports: the error must not claim transformers is not installed, but name its version and the
    pin that works."""
    import transformers

    extra = "from transformers.hpse_test_removed_module import AttentionMaskConverter\n"
    isolated.setenv("EASYEDIT_SRC", str(_fake(tmp_path / "EasyEdit", CURRENT, extra=extra)))
    with pytest.raises(EasyEditNotFoundError) as err:
        import_easyedit()
    msg = str(err.value)
    assert "imports transformers.hpse_test_removed_module" in msg
    assert f"the installed transformers {transformers.__version__} does not have" in msg
    assert f"pip install 'transformers{EASYEDIT_PINS['transformers']}'" in msg
    assert "not installed" not in msg
    assert "easyeditor" not in sys.modules


def test_setup_easyedit_extra_carries_the_same_pins():
    import ast

    setup_py = (Path(__file__).resolve().parents[1] / "setup.py").read_text()
    extra = next(
        ast.literal_eval(value)
        for node in ast.walk(ast.parse(setup_py))
        if isinstance(node, ast.Dict)
        for key, value in zip(node.keys, node.values)
        if isinstance(key, ast.Constant) and key.value == "easyedit"
    )
    for package, bound in EASYEDIT_PINS.items():
        assert f"{package}{bound}" in extra


def test_registration_adds_methods_to_the_same_dict_and_wraps_the_batchable_check(
    tmp_path, isolated
):
    isolated.setenv("EASYEDIT_SRC", str(_fake(tmp_path / "EasyEdit", CURRENT)))
    register()
    register()
    alg_dict = importlib.import_module("easyeditor.util.alg_dict").ALG_DICT
    editor = importlib.import_module("easyeditor.editors.editor")
    utils = importlib.import_module("easyeditor.editors.utils")
    batch = importlib.import_module("easyeditor.editors.batch_editor").BatchEditor
    assert editor.ALG_DICT is alg_dict
    assert sorted(alg_dict) == ["AlphaEdit", "AnyEdit", "COIN", "HPSE", "MEMIT", "SDFT", "UnKE"]
    assert sorted(utils.CALLABLE_RESTORE_ALGS) == ["COIN", "HPSE", "KN", "SDFT"]
    assert [
        batch.is_batchable_method(a)
        for a in ("HPSE", "COIN", "UnKE", "AnyEdit", "MEMIT", "SDFT", "ROME")
    ] == [True, True, True, True, True, True, False]
    assert not hasattr(batch.is_batchable_method._hpse_original, "_hpse_original")  # wrapped once
