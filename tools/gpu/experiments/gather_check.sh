#!/usr/bin/env bash
# gemm_rs's gathered inputs (RsFold::kGather) after a change, one device call (2 GPUs):
#   here:   bash tools/gpu/build.sh
#   device: bash tools/gpu/experiments/gather_check.sh .gpu   (kind nvidia-h200-x2, carry .gpu)
# The GEMM+communication GPU tests (incl. the fault test: a peer that never comes is named),
# compute-sanitizer memcheck of the reduce-pass path (MEMCHECK_FILTER to change), then one
# round of gemm_rs benches at the three large shapes with the gathered inputs (the model's
# chunk counts) against the cuBLASLt fold (tools/gpu/ab.sh).
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/../env.sh"
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-15000}
status=0
overlap_tests || status=1
grep -E "fault test|\[  FAILED|OK \] GemmOverlapGpuFaults" "$OUT/gpu_tests_overlap.log"
step "compute-sanitizer memcheck (${MEMCHECK_FILTER:=Paths/GemmOverlapGpuOtherPaths.EveryMethodIsExact/4})"
WEFT_GEMM_TUNE=0 WEFT_TEST_TIMEOUT_MS=200000 WEFT_TIMEOUT_MS=200000 timeout 240 compute-sanitizer --tool memcheck \
  --report-api-errors no --target-processes all "$BIN/weft_gpu_tests" --gtest_filter="$MEMCHECK_FILTER" \
  > "$OUT/memcheck.log" 2>&1 || status=1
grep -E "ERROR SUMMARY|PASSED|FAILED|exact checks" "$OUT/memcheck.log" | head -6
mkdir -p "$OUT/ab"
OUT=$OUT/ab OP=gemm_rs CASES="${CASES:-8192x8192x14336 4096x8192x8192 16384x8192x3584}" \
  VARIANTS="${VARIANTS:-WEFT_RS_FOLD=lt WEFT_RS_FOLD=gather}" ROUNDS=${ROUNDS:-1} \
  bash "$(dirname "$0")/../ab.sh" "$BIN" 2>&1 | tail -8
exit $status
