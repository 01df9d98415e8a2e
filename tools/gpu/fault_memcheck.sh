#!/usr/bin/env bash
# The GPU fault tests (a peer that never comes must be named within the wait deadline, never a
# hang) under compute-sanitizer memcheck, where device work runs serialised. The deadline is
# raised to 60 s for the healthy first calls' waits (the sanitizer slows start-up unevenly);
# each test must still end well inside its 300 s harness deadline. memcheck reports each
# deliberate trap of a timed-out wait as an error ("Trace/breakpoint trap"): those are the
# expected failures; any other error is a finding.
#   device: bash tools/gpu/fault_memcheck.sh .gpu       (nvidia-h100-x2; carry .gpu)
set -uo pipefail
BIN=${1:?bin dir}
source "$(dirname "$0")/env.sh"
d=/tmp/weft-bin/fault
mkdir -p "$d"
for f in "$BIN"/weft_gpu_tests*; do
  case "$f" in
    *.xz) python3 -c 'import lzma,sys; open(sys.argv[2],"wb").write(lzma.open(sys.argv[1]).read())' "$f" "$d/weft_gpu_tests" ;;
    *) cp "$f" "$d/weft_gpu_tests" ;;
  esac
done
chmod +x "$d/weft_gpu_tests"
# The tests run side by side (each its own pair of ranks on GPUs 0 and 1): the sanitizer's
# start-up dominates, not the GPUs.
TESTS=${FAULT_TESTS:-GemmOverlapGpuFaults.GatheredInputsNameARankThatNeverComes GemmOverlapGpuFaults.ReducePassNamesARankThatNeverComes GemmOverlapGpuFaults.GemmArSumNamesARankThatNeverComes DevapiGpuFaults.RankThatExitsEarlyIsNamedWithinTheDeadline}
step "memcheck, side by side: $TESTS"
for t in $TESTS; do
  WEFT_GEMM_TUNE=0 WEFT_TEST_TIMEOUT_MS=${FAULT_TIMEOUT_MS:-60000} timeout -s KILL "${TEST_LIMIT:-420}" \
    compute-sanitizer --tool memcheck --report-api-errors no --target-processes all "$d/weft_gpu_tests" \
    --gtest_filter="$t" > "$OUT/memcheck-$t.log" 2>&1 &
done
wait
status=0
for t in $TESTS; do
  log="$OUT/memcheck-$t.log"
  traps=$(grep -c "Trace/breakpoint trap" "$log")
  others=$(grep -E "^========= +(Invalid|Out of bounds|Misaligned|Address|Program hit|Malloc|Leaked)" "$log" | wc -l)
  res=$(grep -E "^\[ *(OK|FAILED) *\]" "$log" | head -1)
  summary=$(grep -E "ERROR SUMMARY" "$log" | tail -1)
  echo "$t: ${res:-no result (killed?)}; deliberate traps $traps; other memcheck errors $others; $summary"
  grep -E "\[gpu\] fault test" "$log"
  { [ -n "$res" ] && [ "${res#*FAILED}" = "$res" ] && [ "$others" = 0 ]; } || status=1
done
exit $status
