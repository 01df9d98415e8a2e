#!/usr/bin/env bash
# The decomposed methods on cuBLASLt with timed algorithms, and gemm_rs's cuBLASLt fold
# (2 ranks), against the earlier paths, in one device call:
#   here:   bash tools/gpu/build.sh
#   device: bash tools/gpu/experiments/lt_check.sh .gpu        (kind nvidia-h200-x2, carry .gpu)
# GEMM+communication GPU tests, then `weft bench` of ag_gemm and gemm_rs (defaults), gemm_rs
# with --chunks 1 / 2 / 4, with the reduce pass (WEFT_RS_FOLD=0), with cuBLASLt's fold on every
# shape (lt), gemm_ar,
# and everything untuned (WEFT_GEMM_TUNE=0 WEFT_RS_FOLD=0: the earlier default).
# SKIP_TESTS=1 leaves the tests out; VARIANTS="default c1 c2 c4 nofold lt ar untuned" picks
# bench runs. One archive in $OUT.
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/../env.sh"
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-15000}
status=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  step "GPU tests (GEMM+communication)"
  WEFT_TEST_PROGRESS=$OUT/progress timeout -s KILL 240 "$BIN/weft_gpu_tests" --gtest_filter='*GemmOverlap*' \
    > "$OUT/gpu_tests.log" 2>&1 || status=1
  pkill -9 -x weft_gpu_tests 2>/dev/null || true
  grep -E "^\[ *(FAILED|PASSED)|\[gpu\]|Failure" "$OUT/gpu_tests.log" | head -30
fi
bench() {  # name op env... -- args...
  local name=$1 op=$2; shift 2
  local envs=() args=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  [ "${1:-}" = -- ] && shift
  args=("$@")
  step "weft bench $op ($name: ${envs[*]:-} ${args[*]:-})"
  mkdir -p "$OUT/$name"
  env "${envs[@]}" timeout 200 "$BIN/weft" bench "$op" --out "$OUT/$name" "${args[@]}" > "$OUT/$name/bench_$op.log" \
    2> "$OUT/$name/bench_${op}_progress.log" || status=1
  grep -E "^MxKxN|^[0-9]+x" "$OUT/$name/bench_$op.log"
}
for v in ${VARIANTS:-default c1 c2 c4 nofold lt ar untuned}; do
  case $v in
    default) bench default ag_gemm WEFT_X=1; bench default gemm_rs WEFT_X=1 ;;
    c1) bench c1 gemm_rs WEFT_X=1 -- --chunks 1 ;;
    c2) bench c2 gemm_rs WEFT_X=1 -- --chunks 2 ;;
    c4) bench c4 gemm_rs WEFT_X=1 -- --chunks 4 ;;
    nofold) bench nofold gemm_rs WEFT_RS_FOLD=0 ;;
    lt) bench lt gemm_rs WEFT_RS_FOLD=lt ;;
    ar) bench ar gemm_ar WEFT_X=1 ;;
    untuned) bench untuned ag_gemm WEFT_GEMM_TUNE=0 WEFT_RS_FOLD=0
             bench untuned gemm_rs WEFT_GEMM_TUNE=0 WEFT_RS_FOLD=0 ;;
  esac
done
tar czf /tmp/weft-lt.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/weft-lt.tgz "$OUT/"
exit $status
