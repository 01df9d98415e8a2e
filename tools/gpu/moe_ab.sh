#!/usr/bin/env bash
# `weft bench moe` side by side under each value of one switch, in one call of the device tool
# (the same machine and clocks for every value):
#   here:        bash tools/gpu/build.sh && bash tools/gpu/pack.sh .gpu
#   device run:  AB_VAR=WEFT_MOE_DISPATCH_ONCE AB_VALUES="0 1" WORLDS="2" \
#                BENCH_ARGS="--parts exchange" bash tools/gpu/moe_ab.sh .gpu      (carry .gpu)
# For each world in WORLDS (default "2") and each value in AB_VALUES, the bench with AB_VAR set
# to it; JSON in $OUT/results/<var>-<value>/, the tables last.
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/env.sh"
unpack_to moe
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-30000}
: "${AB_VAR:?name the switch: AB_VAR=WEFT_...}"
: "${AB_VALUES:?give its values: AB_VALUES=\"0 1\"}"
status=0
NGPU=$(nvidia-smi -L | wc -l)
for n in ${WORLDS:-2}; do
  [ "$n" -le "$NGPU" ] || continue
  for v in $AB_VALUES; do
    step "weft bench moe on $n GPUs, $AB_VAR=$v"
    dir="$OUT/results/$AB_VAR-$v"
    mkdir -p "$dir"
    log="$OUT/bench_moe_${n}_$v.log" progress="$OUT/bench_moe_progress_${n}_$v.log"
    env "$AB_VAR=$v" CUDA_VISIBLE_DEVICES="$(seq -s, 0 $((n - 1)))" timeout -s KILL "${BENCH_LIMIT:-240}" \
      "$d/weft" bench moe --out "$dir" ${BENCH_ARGS:-} > "$log" 2> "$progress" || status=1
    tail -2 "$progress"
  done
done
for n in ${WORLDS:-2}; do
  for v in $AB_VALUES; do
    [ -f "$OUT/bench_moe_${n}_$v.log" ] || continue
    step "$n GPUs, $AB_VAR=$v"
    grep -v "^wrote" "$OUT/bench_moe_${n}_$v.log"
  done
done
exit $status
