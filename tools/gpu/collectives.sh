#!/usr/bin/env bash
# The collectives issue's GPU run, in one call of the device tool:
#   device run: bash tools/gpu/collectives.sh .gpu      (carry .gpu, built by tools/gpu/build.sh)
# Every GPU test (device API and collectives, graph replays included), compute-sanitizer
# memcheck on the graph test, then `weft bench collectives` beside NCCL (both modes), and with
# TORCH=1 PyTorch's collectives beside (bench/torch_collectives_peer.py, symmetric memory on
# NCCL and on CUDA). Logs, JSON in $OUT.
set -uo pipefail
BIN=${1:-.gpu}
ONLY=${2:-all}   # "bench": the benchmark alone; "quick": collectives tests, then the benchmark
if [ $# -ge 2 ]; then shift 2; else shift $#; fi
BENCH_ARGS=("$@")  # e.g. --only all_to_all
source "$(dirname "$0")/env.sh"
status=0

if [ "$ONLY" != bench ]; then
step "GPU tests"
FILTER='*'
[ "$ONLY" = quick ] && FILTER='*Collectives*'
"$BIN/weft_gpu_tests" --gtest_filter="$FILTER" 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "^\[ *(OK|FAILED|PASSED)|\[gpu\]|Failure" || status=1
grep -q "FAILED" "$OUT/gpu_tests.log" && status=1

fi
if [ "$ONLY" = all ]; then
step "compute-sanitizer memcheck (collectives in graphs)"
WEFT_TEST_TIMEOUT_MS=120000 compute-sanitizer --tool memcheck --report-api-errors no --target-processes all \
  "$BIN/weft_gpu_tests" --gtest_filter='CollectivesGpuGraph.*' > "$OUT/memcheck_collectives.log" 2>&1 || status=1
grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck_collectives.log"
fi

step "weft bench collectives"
"$BIN/weft" bench collectives --out "$OUT" "${BENCH_ARGS[@]}" 2>"$OUT/bench_progress.log" | tee "$OUT/bench.log" || status=1
tail -3 "$OUT/bench_progress.log"
if [ "${TORCH:-0}" = 1 ]; then  # PyTorch's collectives on the same sizes, both symmetric-memory backends
  NGPU=$(nvidia-smi -L | wc -l)
  for m in nccl cuda; do
    step "PyTorch collectives peer ($NGPU ranks, symmetric memory backend $m)"
    timeout 300 torchrun --nproc-per-node "$NGPU" bench/torch_collectives_peer.py --symm $m \
      --out "$OUT/torch-collectives-$m-${NGPU}r.json" > "$OUT/torch_coll_$m.log" 2>&1 || status=1
    grep -vE "^\[peer\]|^W[0-9]|[Ww]arn|capture_end" "$OUT/torch_coll_$m.log" | tail -40
  done
fi
exit $status
