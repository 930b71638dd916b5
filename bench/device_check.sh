#!/usr/bin/env bash
# The engine's CUDA paths, checked in one short run on a GPU machine (see bench/gpu_check.py).
#
#   bash bench/device_check.sh                    # on the GPU machine: carry .whl and .devcheck
#   DEVICE=cpu SIZE=tiny OUT=/tmp/dcout PY=.venv/bin/python SKIP_WHEELS=1 bash bench/device_check.sh
#
# Before it can travel, once, here: `python bench/gpu_check.py prepare` (writes .devcheck/) and
# the wheels in .whl/ (packages the GPU image lacks). Steps run one after the other, each in its
# own process with its own time limit inside a total budget (BUDGET seconds); a failing step
# does not stop the others. Results: JSON lines in $OUT/results.jsonl, everything in $OUT/log.txt.
set -u
cd "$(dirname "$0")/.." || exit 1
START=$SECONDS
OUT=${OUT:-/tmp/dcout}
mkdir -p "$OUT"
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
SIZE=${SIZE:-1b}
BUDGET=${BUDGET:-400}
MODEL=${MODEL_DIR:-/tmp/dc-model}
SMALL=${SMALL_DIR:-/tmp/dc-model-small}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# The CPU runs here (the float32 CPU reference, pytest's CPU cases) use torch's paths: compiling
# the C++ CPU kernels would cost a minute of the budget and checks nothing on the GPU.
export FROTA_CPU_KERNELS=${FROTA_CPU_KERNELS:-0} FROTA_QUANT_KERNELS=${FROTA_QUANT_KERNELS:-torch}
exec > >(tee -a "$OUT/log.txt") 2>&1

note() { echo "[device_check +$((SECONDS - START))s] $*"; }

# step NAME CAP_SECONDS CMD...: run CMD under the smaller of CAP and what is left of BUDGET.
step() {
  local name=$1 cap=$2
  shift 2
  local left=$((BUDGET - (SECONDS - START) - 5))
  local limit=$((cap < left ? cap : left))
  if [ "$limit" -lt 15 ]; then
    note "SKIP $name: ${left}s left of the budget"
    echo "{\"step\": \"$name\", \"skipped\": \"budget\"}" >>"$OUT/results.jsonl"
    return
  fi
  note "BEGIN $name (limit ${limit}s)"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@"
  local rc=$?
  note "END $name rc=$rc in $((SECONDS - t0))s"
  echo "{\"step\": \"$name\", \"rc\": $rc, \"seconds\": $((SECONDS - t0))}" >>"$OUT/results.jsonl"
}

if [ -z "${SKIP_WHEELS:-}" ] && ls .whl/*.whl >/dev/null 2>&1; then
  note "installing $(ls .whl/*.whl | wc -l) wheels into /tmp/site"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || note "WHEEL INSTALL FAILED"
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# One source tree (src/frota): on the path, no install needed.
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
note "PYTHONPATH=$PYTHONPATH"

# 1. the machine
step nvidia-smi 30 bash -c 'nvidia-smi; nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.sm,clocks.max.sm,power.draw --format=csv'
step env 90 $PY bench/gpu_check.py env

# 2. the tests that take a CUDA path when there is one (tests/engine/parallel's needs two GPUs).
#    The one test that reads FROTA_QUANT_KERNELS's log line is left out (it is set above).
#    If pytest cannot start (rc 3/4: say the carried pytest-asyncio wants a newer pytest than
#    the image's), it runs again without that plugin; these tests are not async.
PYTEST=($PY -m pytest tests/engine/quant/test_linear.py -rs -q -p no:cacheprovider
  --deselect tests/engine/quant/test_linear.py::test_without_a_compiler_the_layers_use_torch)
step pytest-quant-linear 120 bash -c '"$@"; rc=$?; if [ $rc -eq 3 ] || [ $rc -eq 4 ]; then
  echo "pytest rc=$rc: again without pytest-asyncio"; "$@" -p no:asyncio; rc=$?; fi; exit $rc' _ "${PYTEST[@]}"

# the model: a random Llama-3.2-1B-shaped checkpoint, built on the device
step model 120 $PY bench/gpu_check.py model --size "$SIZE" --dir "$MODEL" --device "$DEVICE"

# 3. correctness against transformers, and float32 device vs CPU on a small model
step correctness 150 $PY bench/gpu_check.py correctness --dir "$MODEL" --small-dir "$SMALL" --device "$DEVICE"

# 4. quantized weights (and an int8 KV cache)
step quant 150 $PY bench/gpu_check.py quant --dir "$MODEL" --device "$DEVICE"

# 6. the OpenAI server with the official client
step server 120 $PY bench/gpu_check.py server --dir "$MODEL" --device "$DEVICE" --ready-timeout 90

# 5. speed: the engine_throughput workload on the random model (last: it takes what is left)
step engine-throughput 240 bash -c "set -o pipefail; $PY bench/engine_throughput.py --model '$MODEL' --device '$DEVICE' --dtypes \"\${BENCH_DTYPES:-bfloat16}\" --text .devcheck/GPL-3 \${BENCH_ARGS:-} | tee -a '$OUT/results.jsonl'"

note "done; results in $OUT/results.jsonl"
ls -la "$OUT"
echo "=== summary ==="
grep -E '"(check|rc|skipped|frota_tok_per_s)"' "$OUT/results.jsonl" | cut -c1-400
