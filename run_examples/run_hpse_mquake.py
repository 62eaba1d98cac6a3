#!/usr/bin/env python
"""Edit MQuAKE-uns cases with an hparams file's method and report Ind / Cmp / Avg (paper appendix
C).

    python run_examples/run_hpse_mquake.py --hparams hparams/HPSE/smollm2-135m.yaml --limit 20 \\
        --out runs/mq-hpse
    python run_examples/run_hpse_mquake.py --hparams hparams/HPSE/smollm2-135m.yaml \\
        --set kl_weight=0 --out runs/mq-lora

See docs/BENCHMARKS.md for every option and the output files.
"""

import sys
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # run from a checkout without installing

from benchmarks.run.cli import cli_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli_main("mquake-uns"))
