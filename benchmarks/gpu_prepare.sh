#!/usr/bin/env bash
# What `benchmarks/gpu_run.sh` needs on a lent GPU machine without network, made here, once, where
# pip reaches a package index: .whl/ (the wheels of the packages its image lacks, for its Python)
# and .gpu/tokenizer (the embedded model's tokenizer, saved, for the perf runs on random weights).
# Both are ignored by git; name them in the device call's `carry`, then run gpu_run.sh there:
#
#   bash benchmarks/gpu_prepare.sh
#   run(command="OUT=$OUT bash benchmarks/gpu_run.sh", carry=[".whl", ".gpu"])
#
# GPU_PYTHON: the image's Python version (the lent H100/H200 image: 3.12); GPU_WHEELS: the
# packages to bring, pinned (the image has torch; it lacks these: transformers, and pydantic with
# its three needs). Existing wheels in .whl/ are replaced, so one version of each travels.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
GPU_PYTHON=${GPU_PYTHON:-3.12}
GPU_WHEELS=${GPU_WHEELS:-transformers==5.24.0 pydantic==2.13.4 pydantic_core==2.46.4 \
annotated-types==0.7.0 typing-inspection==0.4.2}
[ -x "$PY" ] || { echo "no $PY: run 'make install' first (or set PYTHON)" >&2; exit 2; }

rm -rf .whl
mkdir -p .whl
# shellcheck disable=SC2086  # GPU_WHEELS is a list of requirements
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$GPU_PYTHON" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d .whl $GPU_WHEELS

mkdir -p .gpu
HF_HUB_OFFLINE=1 "$PY" - <<'EOF'
from hpse_easyedit import HPSEHyperParams, load_model

# the shipped SmolLM2 file: the embedded model, on the CPU
_, tok = load_model(HPSEHyperParams.from_hparams("hparams/HPSE/smollm2-135m.yaml"))
tok.save_pretrained(".gpu/tokenizer")
EOF
ls .whl
du -sh .whl .gpu
