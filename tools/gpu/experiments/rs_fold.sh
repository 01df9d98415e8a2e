#!/usr/bin/env bash
# gemm_rs decomposed with the reduction folded into the own block's GEMM epilogue (default on
# sm_90) against the cuBLAS + reduce-pass path (WEFT_RS_FOLD=0), with traces (one device call):
#   here:   bash tools/gpu/build.sh
#   device: bash tools/gpu/experiments/rs_fold.sh .gpu        (kind nvidia-h200-x2, carry .gpu)
# GEMM and GEMM+communication GPU tests, then `weft bench gemm_rs` (auto chunks, traced),
# `--chunks 4`, and WEFT_RS_FOLD=0; `weft trace` of each decomposed trace. One archive in $OUT.
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/../env.sh"
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-15000}
status=0
step "GPU tests (GEMM, GEMM+communication)"
timeout 200 "$BIN/weft_gpu_tests" --gtest_filter='GemmGpu*:*GemmOverlap*' > "$OUT/gpu_tests.log" 2>&1 || status=1
grep -E "^\[ *(FAILED|PASSED)|\[gpu\]|Failure|failed" "$OUT/gpu_tests.log" | head -30
run_bench() {  # name, env..., -- args...
  local name=$1; shift
  step "weft bench gemm_rs ($name)"
  env "$@" timeout 150 "$BIN/weft" bench gemm_rs --out "$OUT/$name" --trace-dir "$OUT/$name/traces" \
    > "$OUT/bench_$name.log" 2> "$OUT/bench_${name}_progress.log" || status=1
  grep -E "^MxKxN|^[0-9]+x" "$OUT/bench_$name.log"
}
mkdir -p "$OUT/fold" "$OUT/fold4" "$OUT/nofold"
run_bench fold WEFT_X=1
step "traces (fold)"
for t in "$OUT"/fold/traces/*decomposed*.json; do echo "--- $(basename "$t")"; "$BIN/weft" trace "$t" | tail -4; done
if [ "${QUICK:-0}" != 1 ]; then
  step "weft bench gemm_rs --chunks 4"
  timeout 150 "$BIN/weft" bench gemm_rs --chunks 4 --out "$OUT/fold4" > "$OUT/bench_fold4.log" 2>/dev/null || status=1
  grep -E "^MxKxN|^[0-9]+x" "$OUT/bench_fold4.log"
  run_bench nofold WEFT_RS_FOLD=0
fi
tar czf /tmp/weft-rs.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/weft-rs.tgz "$OUT/"
exit $status
