#!/usr/bin/env bash
# Where weft's GEMM and cuBLAS's spend their cycles at given shapes (one GPU, ncu, one launch
# each, clocks not locked): duration, tensor-pipe activity, issue activity, warp stall reasons.
#   device run: SHAPES="2048x2048x4096 8192x8192x8192" bash tools/gpu/experiments/gemm_stalls.sh .gpu   (carry .gpu)
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/../env.sh"
M='gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg.per_second,smsp__issue_active.avg.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
for shape in ${SHAPES:-2048x2048x4096 8192x8192x8192}; do
  for who in weft cublas; do
    k='regex:gemm_sm90'
    [ $who = cublas ] && k='regex:^(sm90|cutlass|nvjet|xmma)'
    step "ncu $who at $shape"
    env ${EXTRA_ENV:-} timeout 150 ncu --clock-control none -k "$k" --launch-skip 3 --launch-count 1 --metrics "$M" \
      "$BIN/weft" bench gemm --quick --shapes "$shape" --out "$OUT/ncu" > "$OUT/ncu_${who}_$shape.log" 2>&1
    grep -E "^  [a-zA-Z_ :<>,0-9]+\(|duration|hmma|per_second|issue_active|stalled" "$OUT/ncu_${who}_$shape.log" |
      awk '!/stalled/ || $NF+0 > 0.05' | sed -e 's/smsp__average_warps_issue_stalled_//' -e 's/_per_issue_active.ratio//' | head -24
  done
done
