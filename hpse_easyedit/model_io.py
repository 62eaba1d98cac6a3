"""An edit on disk: ``save_edit`` writes what an edit changed, ``load_edit`` puts it back on the
model.

A saved edit is a directory: the executor's weights (``adapter/hpse/`` for LoRA,
``ft_m.safetensors`` for FT-M, each executor's ``save_edit``), ``hparams.yaml`` (the edit's hparams,
whose ``model_name`` is the unedited model) and ``edit.json`` (the weights' path, the executor, the
requests and per-round statistics).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from .executors import EXECUTORS
from .hparams import HPSEHyperParams
from .loading import load_model

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
    out.mkdir(parents=True, exist_ok=True)
    try:
        weights = EXECUTORS[hparams.executor].save_edit(result.model, hparams, out)
        hparams.to_yaml(out / "hparams.yaml")
        manifest = {
            "weights": weights,
            "executor": hparams.executor,
            "model_name": hparams.model_name,
            "requests": requests,
            "rounds": result.rounds,
            "seconds": result.seconds,
        }
        (out / "edit.json").write_text(json.dumps(manifest, indent=1))
    except (
        BaseException
    ):  # a full disk, Ctrl-C: no half-saved edit is left behind (the directory is empty again)
        for child in out.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        raise
    return out


def load_edit(directory: str | os.PathLike) -> tuple[Any, Any, HPSEHyperParams]:
    """The model ``save_edit`` wrote to ``directory``, edited again: ``(model, tokenizer,
    hparams)``.

    The unedited model is loaded as its ``hparams.yaml`` names it (``load_model``), then the
    executor puts the saved weights in (a LoRA adapter around it, or the FT-M matrix copied in)."""
    root = Path(directory)
    manifest = json.loads((root / "edit.json").read_text())
    hparams = HPSEHyperParams.from_hparams(root / "hparams.yaml")
    model, tok = load_model(hparams)
    model = EXECUTORS[manifest["executor"]].load_edit(model, root / manifest["weights"])
    return model, tok, hparams
