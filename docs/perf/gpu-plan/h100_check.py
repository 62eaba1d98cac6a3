"""The planner against the H100's measured edit (docs/perf/gpu-h100-perf.json: random-weight
Qwen2.5-7B, bfloat16, LoRA, the demo passage, the file's 96 rollout tokens): the plan at that
edit's lengths (its passage counted with the tokenizer the run used, the embedded SmolLM2 one),
against the CUDA peak allocated during the edit, and the card overhead the run measured (reserved
over allocated, the context). From the repository root:

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python docs/perf/gpu-plan/h100_check.py >
    docs/perf/gpu-plan/h100-check.json"""

import dataclasses
import json
import sys

from hpse_easyedit import HPSEHyperParams, load_model
from hpse_easyedit.loading import EMBEDDED_MODEL
from hpse_easyedit.planner import WORKLOADS, plan_edit

GIB = 2**30
run = json.load(open("docs/perf/gpu-h100-perf.json", encoding="utf-8"))
hp = HPSEHyperParams.from_hparams("hparams/HPSE/qwen2.5-7b.yaml")
_, tok = load_model(
    hp.with_overrides({"model_name": EMBEDDED_MODEL, "device": "cpu", "dtype": "float32"})
)
passage = open("hpse_easyedit/demo_passage.txt", encoding="utf-8").read().strip()
workload = dataclasses.replace(
    WORKLOADS["unkebench"],
    passage_tokens=len(tok(passage)["input_ids"]),
    max_new_tokens=run["max_new_tokens"],
)
# the measured edit's inner step was eager (its two passes), as compile_training: false plans it
measured = {"max_new_tokens": run["max_new_tokens"], "compile_training": False}
plan = plan_edit(hp.with_overrides(measured), workload)
memory = run["memory"]
json.dump(
    {
        "workload": dataclasses.asdict(workload),
        "predicted_peak_gib": plan["peak_gib"],
        "measured_allocated_gib": round(memory["hpse"] / GIB, 3),
        "error": round(plan["peak_gib"] / (memory["hpse"] / GIB) - 1, 4),
        "measured_reserved_over_allocated": round(memory["reserved"] / memory["hpse"], 3),
        "measured_context_gib": round(memory["context"] / GIB, 3),
    },
    sys.stdout,
    indent=1,
)
print()
