#!/usr/bin/env bash
# Issue 26's generality measure in one device call: `weft bench ag_gemm|gemm_rs|gemm_ar --random N`
# (a seeded set of N shapes, M, K, N multiples of 16 in 256 ... 8192) on the first 2, then 4 GPUs.
#   device run: N=12 WORLDS="2 4" bash tools/gpu/random_shapes.sh .gpu     (kind nvidia-h200-x4, carry .gpu)
# OPS (default "ag_gemm gemm_rs gemm_ar"), SEED (default: the bench's), LIMIT seconds a bench (default 150).
# JSON in $OUT/random/WORLD (logs in /tmp/random-logs, so that few files come back); per op and
# world: auto / baseline (geometric mean, worst and its shape).
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/env.sh"
unpack_to random
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-15000}
NGPU=$(nvidia-smi -L | wc -l)
status=0
for n in ${WORLDS:-2 4}; do
  [ "$n" -le "$NGPU" ] || continue
  for op in ${OPS:-ag_gemm gemm_rs gemm_ar}; do
    step "weft bench $op --random ${N:-12} on $n GPUs"
    mkdir -p "$OUT/random/$n" /tmp/random-logs
    log=/tmp/random-logs/$op-$n
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) timeout -s KILL "${LIMIT:-150}" "$d/weft" bench "$op" \
      --random "${N:-12}" ${SEED:+--seed "$SEED"} --out "$OUT/random/$n" > "$log.log" 2> "$log.err" || status=1
    pkill -9 -x weft 2>/dev/null || true
    grep -E "auto / baseline" "$log.log" || tail -3 "$log.err"
  done
done
exit $status
