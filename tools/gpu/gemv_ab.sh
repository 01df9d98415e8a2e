#!/usr/bin/env bash
# A/B of two builds on `weft bench gemv_ar`, alternating (A B B A ...), in one device call; the
# GEMV GPU tests of build B first. On every GPU of the machine (one is enough for the kernels'
# own costs: with one rank the exchange is a local one).
#   here:   bash tools/gpu/build.sh && bash tools/gpu/pack.sh .gpu; the other build packed into,
#           e.g., .gpu-old the same way (built from the other commit)
#   device: bash tools/gpu/gemv_ab.sh .gpu-old .gpu        (carry both)
# Environment: BENCH_ARGS (default: three decode shapes, M 1 to 128), ROUNDS (default 2: A B B A).
# Last: per build and round, fused | fused + RMSNorm | unfused (baseline + RMSNorm) per shape and M (us).
set -uo pipefail
A=${1:?usage: gemv_ab.sh BUILD_A BUILD_B}
B=${2:?usage: gemv_ab.sh BUILD_A BUILD_B}
source "$(dirname "$0")/env.sh"
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-30000}
BIN=$A unpack_to a
da=$d
BIN=$B unpack_to b
db=$d
status=0
step "GEMV GPU tests (build B: $B)"
timeout -s KILL 300 "$db/weft_gpu_tests" --gtest_filter='*Gemv*' > "$OUT/gemv_tests_b.log" 2>&1 || status=1
pkill -9 -x weft_gpu_tests 2>/dev/null || true
grep -E "^\[ *(FAILED|PASSED)|tests? from .* ran|Failure" "$OUT/gemv_tests_b.log" | head -20
grep -q "FAILED" "$OUT/gemv_tests_b.log" && status=1
order=()
for ((r = 0; r < ${ROUNDS:-2}; r++)); do
  if ((r % 2 == 0)); then order+=(a b); else order+=(b a); fi
done
i=0
for v in "${order[@]}"; do
  i=$((i + 1))
  bin=$da
  [ "$v" = b ] && bin=$db
  mkdir -p "$OUT/run$i-$v"
  timeout -s KILL "${BENCH_LIMIT:-240}" "$bin/weft" bench gemv_ar --out "$OUT/run$i-$v" \
    ${BENCH_ARGS:---shapes 4096:4096,8192:8192,14336:4096 --ms 1,8,16,64,128} > "$OUT/run$i-$v/table.log" 2>/dev/null ||
    status=1
  rm -f "$OUT/run$i-$v"/*.png
done
step "fused | fused + RMSNorm | unfused (us), per run"
for dir in "$OUT"/run*; do
  echo "$(basename "$dir"): $(awk '$1 ~ /^[0-9]+x[0-9]+x[0-9]+$/ {printf "%s %s|%s|%s  ", $1, $8, $14, $15}' "$dir/table.log")"
done
exit $status
