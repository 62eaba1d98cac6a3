"""An edit on disk: ``save_edit`` writes what an edit changed, ``load_edit`` puts it back on the
model.

A saved edit is a directory: the executor's weights (``adapter/hpse/`` for LoRA,
``ft_m.safetensors`` for FT-M, each executor's ``save_edit``), ``hparams.yaml`` (the edit's hparams,
whose ``model_name`` is the unedited model) and ``edit.json`` (the weights' path, the executor, the
requests and per-round statistics).

``save_edit`` writes into a temporary sibling (``.<name>.partial-<host>-<pid>-...``) and renames it
to the directory asked for once it is complete, so a killed save leaves the directory as it was
(absent or empty) and the same command saves again; the next save removes the dead writer's
partial copy. ``load_edit`` never runs code a saved edit asks for by itself: a ``hparams.yaml`` with
``trust_remote_code: true`` (a downloaded edit folder can say anything) is refused unless the
caller passes ``trust_remote_code=True``.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .executors import EXECUTORS
from .hparams import HParamsError, HPSEHyperParams
from .loading import load_model
from .locks import owned_prefix, stale_temporaries

__all__ = ["load_edit", "save_edit"]


def save_edit(
    result: Any, hparams: HPSEHyperParams, out_dir: str | os.PathLike, requests: list[dict]
) -> Path:
    """Write the edited weights (LoRA adapter, or the one FT-M matrix) with the hparams beside them.

    Refuses to write into a directory that already has files, so nothing is overwritten.
    """
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(
            f"--save {out}: the directory exists and is not empty; choose a new directory"
        )
    out.mkdir(parents=True, exist_ok=True)  # its mode is what the finished copy gets
    prefix = f".{out.name}.partial-"
    for stale in stale_temporaries(out.parent, prefix):  # a killed save's partial copy
        shutil.rmtree(stale, ignore_errors=True)
    partial = Path(tempfile.mkdtemp(prefix=owned_prefix(prefix), dir=out.parent))
    try:
        weights = EXECUTORS[hparams.executor].save_edit(result.model, hparams, partial)
        hparams.to_yaml(partial / "hparams.yaml")
        manifest = {
            "weights": weights,
            "executor": hparams.executor,
            "model_name": hparams.model_name,
            "requests": requests,
            "rounds": result.rounds,
            "seconds": result.seconds,
        }
        (partial / "edit.json").write_text(json.dumps(manifest, indent=1))
        os.chmod(partial, out.stat().st_mode & 0o7777)  # mkdtemp makes it 0700
        try:
            os.replace(partial, out)  # ``out`` absent or an empty directory: one step
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            raise FileExistsError(
                f"--save {out}: something else wrote into the directory meanwhile; choose a new "
                "directory"
            ) from None
    except BaseException:  # a full disk, Ctrl-C: nothing half-saved is left behind
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return out


def load_edit(
    directory: str | os.PathLike, *, trust_remote_code: bool = False
) -> tuple[Any, Any, HPSEHyperParams]:
    """The model ``save_edit`` wrote to ``directory``, edited again: ``(model, tokenizer,
    hparams)``.

    The unedited model is loaded as its ``hparams.yaml`` names it (``load_model``), then the
    executor puts the saved weights in (a LoRA adapter around it, or the FT-M matrix copied in).
    The model's own code (``trust_remote_code``) runs only when the caller passes
    ``trust_remote_code=True``; a ``hparams.yaml`` that asks for it is refused otherwise, naming the
    file."""
    root = Path(directory)
    manifest = json.loads((root / "edit.json").read_text(encoding="utf-8"))
    hp_file = root / "hparams.yaml"
    hparams = HPSEHyperParams.from_hparams(hp_file)
    if hparams.trust_remote_code and not trust_remote_code:
        raise HParamsError(
            f"{hp_file}: asks for trust_remote_code: true, which would run the Python code that "
            f"model {hparams.model_name!r} ships; a saved edit never turns that on by itself. If "
            "you trust that code, call load_edit(..., trust_remote_code=True)"
        )
    if trust_remote_code and not hparams.trust_remote_code:
        hparams = hparams.with_overrides({"trust_remote_code": True})
    executor = manifest.get("executor")
    if executor not in EXECUTORS:
        raise HParamsError(
            f"{root / 'edit.json'}: 'executor' is {executor!r}, not one of {sorted(EXECUTORS)}; "
            "this is not an edit save_edit wrote"
        )
    weights = (root / str(manifest.get("weights", ""))).resolve()
    if not weights.is_relative_to(root.resolve()) or not weights.exists():
        raise HParamsError(
            f"{root / 'edit.json'}: 'weights' is {manifest.get('weights')!r}, which is not a "
            f"file or directory inside {root}; this is not an edit save_edit wrote"
        )
    model, tok = load_model(hparams)
    model = EXECUTORS[executor].load_edit(model, weights)
    return model, tok, hparams
