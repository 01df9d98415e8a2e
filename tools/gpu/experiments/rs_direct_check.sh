#!/usr/bin/env bash
# The fused gemm_rs with direct stores (WEFT_FUSED_RS_DIRECT=1) on 2 GPUs, one device call:
#   here:   bash tools/gpu/build.sh
#   device: bash tools/gpu/experiments/rs_direct_check.sh .gpu   (kind nvidia-h200-x2, carry .gpu)
# The GEMM+communication GPU tests (direct stores in OtherPaths/3, graph replays and back-to-back
# calls), compute-sanitizer memcheck of the tests that run it, then `weft bench gemm_rs` with
# and without direct stores (interleaved protocol, random data).
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/../env.sh"
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-15000}
overlap_tests
if [ "${SKIP_MEMCHECK:-0}" != 1 ]; then
  step "memcheck: direct stores (OtherPaths/3), back-to-back calls"
  WEFT_GEMM_TUNE=0 WEFT_TEST_TIMEOUT_MS=200000 WEFT_TIMEOUT_MS=200000 timeout 200 compute-sanitizer --tool memcheck \
    --report-api-errors no --target-processes all "$BIN/weft_gpu_tests" \
    --gtest_filter='Paths/GemmOverlapGpuOtherPaths.EveryMethodIsExact/3:GemmOverlapGpuGraph.BackToBack*' \
    > "$OUT/memcheck_rs_direct.log" 2>&1
  grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck_rs_direct.log" | head -6
fi
for direct in 1 0; do
  step "weft bench gemm_rs, WEFT_FUSED_RS_DIRECT=$direct"
  WEFT_FUSED_RS_DIRECT=$direct timeout 150 "$BIN/weft" bench gemm_rs --out "$OUT" > "$OUT/bench_gemm_rs_direct$direct.log" \
    2> "$OUT/bench_gemm_rs_direct${direct}_progress.log"
  grep -E "^MxKxN|^[0-9]+x|WRONG" "$OUT/bench_gemm_rs_direct$direct.log"
done
