#!/usr/bin/env python
"""Compare methods side by side over the same cases (paper-layout table + step-in rate plot).

    python run_examples/run_compare.py --limit 10 \
        --method LoRA hparams/HPSE/smollm2-135m.yaml --set kl_weight=0 \
        --method "LoRA + HPSE" hparams/HPSE/smollm2-135m.yaml \
        --benchmark mquake-uns --out runs/compare

``--set KEY=VALUE`` after a ``--method`` overrides that method's hparams (the older form, KEY=VALUE
right after its FILE, works too); before the first ``--method`` it applies to every method.

See docs/BENCHMARKS.md for every option and the output files.
"""

import sys
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # run from a checkout without installing

from benchmarks.analysis.compare import compare_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(compare_main())
