#!/usr/bin/env bash
# Nsight Compute durations of the MoE layer's kernels inside `weft bench moe` on one GPU (world
# 1: no peer to wait for), in launch order: the baseline layer's first call (layout, permute,
# SwiGLU, permute; cuBLAS not matched), the decomposed layer's (layout, permute, grouped GEMM,
# SwiGLU, grouped GEMM, permute), then the experts' benchmark's first grouped GEMM:
#   device run: bash tools/gpu/moe_profile.sh .gpu [shape] [tokens] [count] [regex] [skip]   (carry .gpu)
# Defaults: deepseek-v3-like, 4096, 11, "gemm_sm90|swiglu|permute|layout", 0 (matching launches
# skipped first). The full report is in $OUT.
set -uo pipefail
BIN=${1:-.gpu}
SHAPE=${2:-deepseek-v3-like}
T=${3:-4096}
COUNT=${4:-11}
REGEX=${5:-gemm_sm90|swiglu|permute|layout}
SKIP=${6:-0}
source "$(dirname "$0")/env.sh"
unpack_to moe-profile
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} WEFT_TIMEOUT_MS=120000
step "ncu: the MoE layer's kernels, $SHAPE at T = $T, one GPU"
timeout -s KILL 400 ncu --clock-control none --target-processes all -k "regex:$REGEX" \
  --launch-skip "$SKIP" -c "$COUNT" --section SpeedOfLight --section LaunchStats \
  "$d/weft" bench moe --shapes "$SHAPE" --ms "$T" --out /tmp/profile-out > "$OUT/ncu-moe-$SHAPE-$T-$SKIP.txt" 2>&1
status=$?
grep -E "^  [a-z_].*\(|Duration|DRAM Throughput|Compute \(SM\) Throughput|Grid Size" "$OUT/ncu-moe-$SHAPE-$T-$SKIP.txt" |
  head -80
exit $status
