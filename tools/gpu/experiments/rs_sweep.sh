#!/usr/bin/env bash
# gemm_rs decomposed variants under the interleaved timing protocol (one device call, 2 GPUs):
#   here:   bash tools/gpu/build.sh
#   device: bash tools/gpu/experiments/rs_sweep.sh .gpu   (kind nvidia-h200-x2, carry .gpu)
# Chunks 1 / 2 / 4 with the cuBLASLt fold, weft's fold and the reduce pass (WEFT_RS_FOLD=lt|1|0),
# shapes SHAPES (default the two largest). Then, unless SKIP_TESTS=1, every GPU test and the
# memcheck of the GEMM+communication tests (overlap_check.sh with no bench).
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/../env.sh"
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-15000}
SHAPES=${SHAPES:-8192x8192x14336,4096x8192x8192}
mkdir -p "$OUT/sweep"
for fold in lt 1 0; do
  for chunks in 1 2 4; do
    step "gemm_rs WEFT_RS_FOLD=$fold --chunks $chunks"
    WEFT_RS_FOLD=$fold timeout 120 "$BIN/weft" bench gemm_rs --shapes "$SHAPES" --chunks $chunks \
      --out "$OUT/sweep" > "$OUT/sweep/gemm_rs-fold$fold-c$chunks.log" 2>&1
    grep -E "^[0-9]+x" "$OUT/sweep/gemm_rs-fold$fold-c$chunks.log"
  done
done
[ "${SKIP_TESTS:-0}" = 1 ] && exit 0
exec bash "$(dirname "$0")/../overlap_check.sh" "$BIN" none
