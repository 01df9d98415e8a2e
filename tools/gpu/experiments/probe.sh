#!/usr/bin/env bash
# GEMM probe (tools/gpu/experiments/gemm_probe.cu): cuBLAS vs cublasLt's candidates, beta = 1, and the
# GEMM beside copy-engine traffic. Build here:
#   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a tools/gpu/experiments/gemm_probe.cu -o .gpu/gemm_probe -lcublasLt -lcublas
# There (nvidia-h200-x2, carry .gpu): bash tools/gpu/experiments/probe.sh .gpu
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/../env.sh"
step "gemm probe"
timeout 240 "$BIN/gemm_probe" > "$OUT/gemm_probe.log" 2>&1
cat "$OUT/gemm_probe.log"
