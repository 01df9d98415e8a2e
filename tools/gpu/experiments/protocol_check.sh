#!/usr/bin/env bash
# The GEMM+communication benches under both timing protocols, one device call, 2 GPUs:
#   here:   bash tools/gpu/build.sh
#   device: bash tools/gpu/experiments/protocol_check.sh .gpu   (kind nvidia-h200-x2, carry .gpu)
# 1. the GEMM+communication GPU tests (exact on 1 and 2 GPUs, graph replays);
# 2. `weft bench OP --sequential` (each column's replays back to back, then its check: the
#    protocol of every run before 2026-11-22 12:40) for ag_gemm and gemm_rs, random data;
# 3. the reduce chain (WEFT_FUSED_RS=1) at 2048x4096x4096, sequential: a probe of tiles stored
#    straight into the owner (its waits scale by the host's call count, so in graph replays they
#    are met by earlier replays: a lower bound, not a valid figure);
# 4. overlap_check.sh with SKIP_TESTS=1 (interleaved benches of ag_gemm, gemm_rs, gemm_ar on
#    random data, TRACE, TORCH as given).
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/../env.sh"
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-15000}
overlap_tests
mkdir -p "$OUT/sequential"
for op in ag_gemm gemm_rs; do
  step "weft bench $op --sequential"
  timeout 150 "$BIN/weft" bench "$op" --sequential --out "$OUT/sequential" > "$OUT/sequential/bench_$op.log" \
    2> "$OUT/sequential/bench_${op}_progress.log"
  grep -E "^MxKxN|^[0-9]+x" "$OUT/sequential/bench_$op.log"
done
step "reduce chain probe (WEFT_FUSED_RS=1), gemm_rs 2048x4096x4096, sequential"
WEFT_FUSED_RS=1 timeout 60 "$BIN/weft" bench gemm_rs --sequential --shapes 2048x4096x4096 --out "$OUT/sequential" \
  > "$OUT/sequential/bench_gemm_rs_chain.log" 2>&1
grep -E "^MxKxN|^[0-9]+x|WRONG|rror" "$OUT/sequential/bench_gemm_rs_chain.log" | head -5
SKIP_TESTS=1 SKIP_MEMCHECK=1 exec bash "$(dirname "$0")/../overlap_check.sh" "$BIN" ag_gemm gemm_rs gemm_ar
