#!/usr/bin/env python
"""Edit UnKEBench cases with an hparams file's method and report Jnt / Dmp / Div / Avg / MMLU (paper
appendix C).

    export HPSE_JUDGE_BASE_URL=https://generativelanguage.googleapis.com/v1beta/openai/
    export HPSE_JUDGE_API_KEY=...
    python run_examples/run_hpse_unkebench.py --hparams hparams/HPSE/smollm2-135m.yaml \\
        --set max_new_tokens=128 --limit 20 --out runs/unke-hpse

Without a judge endpoint the offline lexical fallback judge is used and named in every output.
See docs/BENCHMARKS.md for every option and the output files.
"""

import sys
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # run from a checkout without installing

from benchmarks.run.cli import cli_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli_main("unkebench"))
