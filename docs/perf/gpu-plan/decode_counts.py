"""Kernels (non-view aten ops) and host syncs per decoded rollout token of every shipped 7B-9B HPSE
file, dynamic and static decode, and graph breaks of the static step (benchmarks.gpu_path, meta
device). From the repository root:

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python docs/perf/gpu-plan/decode_counts.py >
    docs/perf/gpu-plan/decode-counts.json"""

import json
import sys
from pathlib import Path

from benchmarks.gpu_path import decode_counts, static_step_graph_breaks
from hpse_easyedit import HPSEHyperParams

out = {}
for path in sorted(Path("hparams/HPSE").glob("*.yaml")):
    if path.stem.startswith("smollm2"):
        continue
    hp = HPSEHyperParams.from_hparams(path)
    out[path.stem] = {
        "dynamic": decode_counts(hp, static=False),
        "static": decode_counts(hp, static=True),
        "static_graph_breaks": static_step_graph_breaks(hp),
    }
json.dump(out, sys.stdout, indent=1)
