#!/usr/bin/env bash
# GEMV + AllReduce for decode (issue 23) on every GPU of the machine (2 or 4), in one call of the
# device tool:
#   here:        bash tools/gpu/build.sh && bash tools/gpu/pack.sh .gpu   (.gpu/weft, weft_gpu_tests,
#                libweft_c.so; pytest wheels in .whl for the Python GPU tests: see the device README)
#   device run:  bash tools/gpu/gemv_ar.sh .gpu [all|tests|bench]          (carry .gpu and .whl)
# The C++ GPU tests of gemv_ar, the Python GPU tests of torch.ops.weft.gemv_ar(_rmsnorm), then
# `weft bench gemv_ar` on all GPUs (JSON + PNG) and its PyTorch peer (bench/torch_gemv_ar_peer.py:
# torch.matmul + NCCL all_reduce in CUDA graphs, weft's fused op beside). Logs, JSON, PNGs in
# $OUT (copy them to bench/results/); a short table last.
# Environment: BENCH_ARGS (e.g. "--ms 1,16 --shapes 8192:8192"), PEER_ARGS, SKIP_PYTEST=1, SKIP_PEER=1,
# WORLDS (e.g. "2 4": the first 2 GPUs, then 4), BENCH_LIMIT / PEER_LIMIT (seconds per run),
# TUNE=1 (per world a `weft bench gemv_ar --tune` first, into $OUT/gemv_ar-tune.json, which the
# timed run's `auto` then reads).
set -uo pipefail
BIN=${1:-.gpu}
ONLY=${2:-all}
source "$(dirname "$0")/env.sh"
# The binaries, unpacked (pack.sh compresses them as .xz).
unpack_to gemv
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} WEFT_LIBRARY=$d/libweft_c.so PYTHONUNBUFFERED=1
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-30000}
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
NGPU=$(nvidia-smi -L | wc -l)
status=0

if [ "$ONLY" != bench ]; then
  step "C++ GPU tests (gemv_ar)"
  timeout -s KILL 300 "$d/weft_gpu_tests" --gtest_filter='*Gemv*' > "$OUT/gemv_ar_tests.log" 2>&1 || status=1
  pkill -9 -x weft_gpu_tests 2>/dev/null || true  # ranks of a killed run must not hold the GPUs
  grep -E "^\[ *(OK|FAILED|PASSED|SKIPPED)|tests? from .* ran|Failure" "$OUT/gemv_ar_tests.log" | head -40
  grep -q "FAILED" "$OUT/gemv_ar_tests.log" && status=1
  if [ "${SKIP_PYTEST:-0}" != 1 ]; then
    step "Python GPU tests (gemv_ar)"
    timeout -s KILL 420 python3 -m pytest -q -k gemv tests/python/test_torch_gpu.py > "$OUT/pytest_gemv_gpu.log" 2>&1 ||
      status=1
    tail -15 "$OUT/pytest_gemv_gpu.log"
  fi
fi
if [ "$ONLY" != tests ]; then
  # WORLDS: the GPU counts to run on (the first N GPUs each; default: all of them).
  for n in ${WORLDS:-$NGPU}; do
    export CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1)))
    step "weft bench gemv_ar on $n GPUs"
    mkdir -p "$OUT/results"
    if [ "${TUNE:-0}" = 1 ]; then
      export WEFT_TUNE_CACHE="$OUT/gemv_ar-tune.json"
      timeout -s KILL "${BENCH_LIMIT:-480}" "$d/weft" bench gemv_ar --tune --out "$OUT/tune-results" ${BENCH_ARGS:-} \
        2>"$OUT/bench_gemv_ar_tune_${n}.log" > /dev/null || status=1
      grep -c "tuned" "$OUT/bench_gemv_ar_tune_${n}.log" | sed 's/^/tuned entries: /'
    fi
    # weft bench launches one rank per visible GPU itself; its exit status is 1 when a column disagrees.
    timeout -s KILL "${BENCH_LIMIT:-480}" "$d/weft" bench gemv_ar --out "$OUT/results" ${BENCH_ARGS:-} \
      2>"$OUT/bench_gemv_ar_progress_${n}.log" > "$OUT/bench_gemv_ar_${n}.log" || status=1
    tail -4 "$OUT/bench_gemv_ar_progress_${n}.log"
    if [ "${SKIP_PEER:-0}" != 1 ]; then
      step "PyTorch peer on $n GPUs (matmul + NCCL all_reduce in CUDA graphs)"
      timeout -s KILL "${PEER_LIMIT:-420}" torchrun --standalone --nproc-per-node "$n" bench/torch_gemv_ar_peer.py \
        --out "$OUT/results/torch-gemv_ar-${n}r.json" ${PEER_ARGS:-} > "$OUT/torch_gemv_ar_peer_${n}.log" 2>&1 || status=1
    fi
    json=$(ls -t "$OUT"/results/gemv_ar-*-${n}r-*.json 2>/dev/null | head -1)
    if [ -n "$json" ] && python3 -c 'import matplotlib' 2>/dev/null; then
      peer=()
      [ -f "$OUT/results/torch-gemv_ar-${n}r.json" ] && peer=(--torch "$OUT/results/torch-gemv_ar-${n}r.json")
      python3 tools/plot_gemm_overlap.py "$json" "${peer[@]}" || status=1
    fi
    step "tables ($n GPUs)"
    grep -vE "^(gemv cb|note:)" "$OUT/bench_gemv_ar_${n}.log" | grep -v "^wrote"
    grep -E "^note:" "$OUT/bench_gemv_ar_${n}.log" | head -10
    [ -f "$OUT/torch_gemv_ar_peer_${n}.log" ] && grep -vE "^\[|Warning|warn\(" "$OUT/torch_gemv_ar_peer_${n}.log" | tail -30
  done
  unset CUDA_VISIBLE_DEVICES
fi
exit $status
