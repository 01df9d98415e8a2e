#!/usr/bin/env bash
# The foundation issue's GPU run, in one call of the device tool:
#   device run: bash tools/gpu/foundation.sh .gpu      (carry .gpu, built by tools/gpu/build.sh)
# GPU semantics tests on 1 and all GPUs, the fault test, compute-sanitizer (memcheck,
# racecheck) on the semantics tests, then `weft bench`. Logs and JSON land in $OUT.
set -uo pipefail
BIN=${1:-.gpu}
ONLY=${2:-all}   # "bench": the benchmark alone
source "$(dirname "$0")/env.sh"
status=0

step "machine"
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm --format=csv
nvidia-smi topo -m | head -5
"$BIN/weft" info

if [ "$ONLY" != bench ]; then
step "GPU tests"
"$BIN/weft_gpu_tests" 2>&1 | tee "$OUT/gpu_tests.log" || status=1

step "compute-sanitizer memcheck"
WEFT_TEST_TIMEOUT_MS=120000 compute-sanitizer --tool memcheck --report-api-errors no --target-processes all \
  "$BIN/weft_gpu_tests" --gtest_filter='*Semantics*' > "$OUT/memcheck.log" 2>&1 || status=1
grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck.log"

step "compute-sanitizer racecheck"
WEFT_TEST_TIMEOUT_MS=120000 compute-sanitizer --tool racecheck --report-api-errors no --target-processes all \
  "$BIN/weft_gpu_tests" --gtest_filter='*Semantics/0' > "$OUT/racecheck.log" 2>&1 || status=1
grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" "$OUT/racecheck.log"

fi

step "weft bench"
"$BIN/weft" bench --out "$OUT" 2>&1 | tee "$OUT/bench.log" || status=1
exit $status
