#!/usr/bin/env bash
# Store probe (tools/gpu/experiments/store_probe.cu): stores issued the way a GEMM epilogue issues them
# (TMA bulk, plain 16-byte) into a peer over NVLink, against weft's push loop; then beside a
# cuBLAS GEMM. The test of the leading hypothesis of the direct stores (docs/gemm_overlap.md).
# Build here:
#   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a tools/gpu/experiments/store_probe.cu -o .gpu/store_probe -lcublas
# There (nvidia-h200-x2, carry .gpu): bash tools/gpu/experiments/store_probe.sh .gpu
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/../env.sh"
step "store probe"
timeout 120 "$BIN/store_probe" > "$OUT/store_probe.log" 2>&1
cat "$OUT/store_probe.log"
