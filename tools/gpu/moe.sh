#!/usr/bin/env bash
# The MoE exchange (issue 25) on the device machine, in one call of the device tool:
#   here:        bash tools/gpu/build.sh && bash tools/gpu/pack.sh .gpu
#   device run:  bash tools/gpu/moe.sh .gpu          (carry .gpu)
# The C++ GPU tests of ops::MoeDispatchCombine and the grouped GEMM (1 and all GPUs; memcheck of
# the graph, grouped-GEMM and layer tests with MEMCHECK=1, MEMCHECK_FILTER to choose; SKIP_TESTS=1: none), `weft bench moe` on the first 2, then 4
# GPUs (WORLDS; JSON in $OUT/results; BENCH_ARGS, e.g. "--shapes mixtral --ms 128"), then
# torch._grouped_mm on the same per-rank expert GEMMs (bench/torch_grouped_mm_peer.py, GPU 0;
# SKIP_GROUPED_PEER=1: not), then the PyTorch MoE layer (tools/gpu/moe_peer.sh) unless
# SKIP_PEER=1. Logs in $OUT; the tables last.
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/env.sh"
unpack_to moe
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-30000}
status=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  step "C++ GPU tests (moe)"
  timeout -s KILL 300 "$d/weft_gpu_tests" --gtest_filter='*Moe*:GemmGpu.Grouped*:GemmGpu.Swiglu*:GemmGpu.RowDest*' > "$OUT/moe_tests.log" 2>&1 || status=1
  pkill -9 -x weft_gpu_tests 2>/dev/null || true
  grep -E "^\[ *(OK|FAILED|PASSED|SKIPPED)|tests? from .* ran|Failure|checks passed|rank [0-9]+:" "$OUT/moe_tests.log" |
    head -40
fi
if [ "${MEMCHECK:-0}" = 1 ]; then
  mfilter=${MEMCHECK_FILTER:-'MoeGpuGraph.*:*MoeGpu.*/0:GemmGpu.Grouped*:GemmGpu.Swiglu*:GemmGpu.RowDest*:*MoeLayerGpu*/0'}
  step "compute-sanitizer memcheck: $mfilter"
  WEFT_TEST_TIMEOUT_MS=120000 timeout -s KILL 300 compute-sanitizer --tool memcheck --report-api-errors no \
    --target-processes all "$d/weft_gpu_tests" \
    --gtest_filter="$mfilter" > "$OUT/moe_memcheck.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/moe_memcheck.log" | head -10
fi
NGPU=$(nvidia-smi -L | wc -l)
for n in ${WORLDS:-2 4}; do
  [ "$n" -le "$NGPU" ] || continue
  step "weft bench moe on $n GPUs"
  mkdir -p "$OUT/results"
  CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) timeout -s KILL "${BENCH_LIMIT:-240}" "$d/weft" bench moe \
    --out "$OUT/results" ${BENCH_ARGS:-} > "$OUT/bench_moe_${n}.log" 2> "$OUT/bench_moe_progress_${n}.log" || status=1
  tail -3 "$OUT/bench_moe_progress_${n}.log"
  grep -v "^wrote" "$OUT/bench_moe_${n}.log"
done
if [ "${SKIP_GROUPED_PEER:-0}" != 1 ]; then
  step "torch._grouped_mm on the same experts' GEMMs (GPU 0)"
  CUDA_VISIBLE_DEVICES=0 timeout -s KILL 240 python3 bench/torch_grouped_mm_peer.py --worlds "$(echo ${WORLDS:-2 4} | tr ' ' ,)" \
    ${GROUPED_PEER_ARGS:-} --out "$OUT/results/torch-grouped-mm.json" > "$OUT/grouped_peer.log" 2>&1 || status=1
  cat "$OUT/grouped_peer.log"
fi
[ "${SKIP_PEER:-0}" = 1 ] || bash "$(dirname "$0")/moe_peer.sh" || status=1
exit $status
