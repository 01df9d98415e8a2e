#!/usr/bin/env bash
# weft's GEMM against cuBLAS at the small local GEMMs of gemm_rs / ag_gemm (one GPU):
#   device run: bash tools/gpu/experiments/gemm_small.sh .gpu      (carry .gpu, built by tools/gpu/build.sh)
# 1. `weft bench gemm` (sustained protocol) at the gemm_rs local shapes (K = the rank's half)
#    and two references; 2. ncu of both kernels at 2048x2048x4096 (M x K x N): duration,
#    tensor-pipe activity, SM clock -- where does weft's per-tile time go at short K?
# Env: SHAPES (bench shapes, MxKxN), NCU_SHAPE, SKIP_NCU=1, EXTRA_ENV (e.g. WEFT_GEMM_X=1).
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/../env.sh"
SHAPES=${SHAPES:-"2048x2048x4096 4096x4096x8192 2048x4096x4096 1024x2048x4096 8192x8192x8192"}
NCU_SHAPE=${NCU_SHAPE:-2048x2048x4096}
step "weft bench gemm: $SHAPES"
env ${EXTRA_ENV:-} "$BIN/weft" bench gemm --shapes $SHAPES --out "$OUT/gemm_small" 2>&1 | tail -30
if [ "${SKIP_NCU:-0}" != 1 ]; then
  M='gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg.per_second,launch__grid_size,launch__cluster_dim_x'
  step "ncu weft kernel at $NCU_SHAPE"
  env ${EXTRA_ENV:-} timeout 150 ncu --clock-control none -k regex:gemm_sm90 --launch-skip 3 --launch-count 1 --metrics "$M" \
    "$BIN/weft" bench gemm --quick --shapes "$NCU_SHAPE" --out "$OUT/ncu" > "$OUT/ncu_weft.log" 2>&1
  grep -E "gemm_sm90|duration|hmma|per_second|grid_size|cluster" "$OUT/ncu_weft.log" | head -12
  step "ncu cuBLAS kernel at $NCU_SHAPE"
  timeout 150 ncu --clock-control none -k 'regex:^(sm90|cutlass|nvjet|xmma)' --launch-skip 3 --launch-count 1 --metrics "$M" \
    "$BIN/weft" bench gemm --quick --shapes "$NCU_SHAPE" --out "$OUT/ncu" > "$OUT/ncu_cublas.log" 2>&1
  grep -E "^  [a-z_0-9]+.*\(|duration|hmma|per_second|grid_size|cluster" "$OUT/ncu_cublas.log" | head -12
fi
