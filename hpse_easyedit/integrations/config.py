"""The validated-dataclass bases for the hparams of the methods this package adds (COIN*, UnKE, AnyEdit).

``EditorHParams`` and ``ExecutorHParams`` live in ``hpse_easyedit.hparams`` (``HPSEHyperParams`` derives
from them too) and are re-exported here with ``hp_field``, the field constructor.

Same contract as ``HPSEHyperParams``: fields carry help text and checks, files are read with
``yaml.safe_load``, and unknown keys, wrong types and bad values are ``HParamsError``s naming the key,
the file and the fix. The fields every method shares are the ones EasyEdit's ``BaseEditor`` and its
evaluation read (``alg_name``, ``model_name``, ``device``, ``model_parallel``, ``batch_size``,
``max_length``, ``use_chat_template``, and ``fp16`` derived from ``dtype``) plus what ``load_model`` reads.
"""

from __future__ import annotations

from ..hparams import EditorHParams, ExecutorHParams, YamlHParams, _f

__all__ = ["EditorHParams", "ExecutorHParams", "YamlHParams", "hp_field"]

hp_field = _f
