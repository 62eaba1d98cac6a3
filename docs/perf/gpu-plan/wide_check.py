"""The planner on the meta device against the same steps on real tensors, at Qwen2.5-7B's widths cut
to 2 layers (bfloat16, LoRA, one UnKEBench request): the bytes both count, per phase. From the
repository root:

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python docs/perf/gpu-plan/wide_check.py >
    docs/perf/gpu-plan/qwen2.5-7b-2-layers-check.json"""

import json
import sys

from hpse_easyedit import HPSEHyperParams
from hpse_easyedit.planner import WORKLOADS, plan_edit

# the eager step on both devices (the file's compile_training: auto would capture it on meta only)
hp = HPSEHyperParams.from_hparams("hparams/HPSE/qwen2.5-7b.yaml").with_overrides(
    {"compile_training": False}
)
meta = plan_edit(hp, WORKLOADS["unkebench"], layers=2)
real = plan_edit(hp, WORKLOADS["unkebench"], layers=2, device="cpu")
json.dump(
    {
        name: {
            "meta_gib": meta["phases"][name]["peak_gib"],
            "real_gib": real["phases"][name]["peak_gib"],
        }
        for name in meta["phases"]
    }
    | {"peak": {"meta_gib": meta["peak_gib"], "real_gib": real["peak_gib"]}},
    sys.stdout,
    indent=1,
)
