#!/usr/bin/env bash
# The GEMM+communication benches on random bf16 inputs (the default) beside the same benches on
# small-integer inputs (`--data ints`, what every run before 2026-11-22 12:30 used): random
# data draws more power, so GEMMs run at a lower clock. One device call, 2 GPUs:
#   here:   bash tools/gpu/build.sh
#   device: bash tools/gpu/experiments/data_check.sh .gpu   (kind nvidia-h200-x2, carry .gpu)
# Then the full overlap_check.sh (every GPU test, memcheck, benches on random data, traces,
# PyTorch's fused ops) unless SKIP_CHECK=1; its options (SKIP_TESTS, SKIP_MEMCHECK, TRACE,
# TORCH) pass through.
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/../env.sh"
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-15000}
mkdir -p "$OUT/ints"
for op in ${DATA_OPS:-ag_gemm gemm_rs}; do
  step "weft bench $op --data ints"
  timeout 150 "$BIN/weft" bench "$op" --data ints --out "$OUT/ints" > "$OUT/ints/bench_$op.log" \
    2> "$OUT/ints/bench_${op}_progress.log"
  grep -E "^MxKxN|^[0-9]+x" "$OUT/ints/bench_$op.log"
done
[ "${SKIP_CHECK:-0}" = 1 ] && exit 0
exec bash "$(dirname "$0")/../overlap_check.sh" "$BIN" ag_gemm gemm_rs gemm_ar
