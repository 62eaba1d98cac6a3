"""The planner against a measured edit: SmolLM2 (the shipped hparams/HPSE/smollm2-135m.yaml), the
demo passage, one round of two inner steps, PyTorch's CPU allocator peak from torch.profiler memory
events (benchmarks.perf.gpu_path.planner_check). Run from the repository root:

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python docs/perf/gpu-plan/planner_check.py >
    docs/perf/gpu-plan/smollm2-check.json"""

import json
import logging
import sys
from pathlib import Path

from benchmarks.perf.gpu_path import planner_check
from hpse_easyedit import HPSEHyperParams, load_model

logging.basicConfig(level=logging.WARNING)
hp = HPSEHyperParams.from_hparams("hparams/HPSE/smollm2-135m.yaml").with_overrides(sys.argv[1:])
model, tok = load_model(hp)
check = planner_check(model, tok, hp, Path("hpse_easyedit/demo_passage.txt").read_text().strip())
check.pop("model")
json.dump({"overrides": sys.argv[1:], **check}, sys.stdout, indent=1)
