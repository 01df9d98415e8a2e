#!/usr/bin/env bash
# gemm_rs's fused method (the copy-engine fold) on 2 GPUs: a traced call of every method per
# anchor shape (docs/anchors.md) (JSON kept, `weft trace` summaries printed), then the piece count swept.
#   here:   bash tools/gpu/build.sh
#   device: bash tools/gpu/experiments/rs_fused.sh .gpu   (kind nvidia-h200-x2, carry .gpu)
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/../env.sh"
step "weft bench gemm_rs, traced"
timeout 200 "$BIN/weft" bench gemm_rs --trace-dir "$OUT/traces" --out "$OUT" > "$OUT/bench.log" 2>&1
grep -E "^MxKxN|^[0-9]+x" "$OUT/bench.log"
for f in "$OUT"/traces/*fused*.json; do
  echo "--- $(basename "$f")"
  "$BIN/weft" trace "$f" | tail -3
done
step "pieces per peer block (WEFT_FUSED_RS_PIECES)"
for p in ${PIECES:-1 2 4 8}; do
  echo "pieces $p"
  WEFT_FUSED_RS_PIECES=$p timeout 120 "$BIN/weft" bench gemm_rs --out "$OUT/pieces$p" 2>/dev/null | grep -E "^[0-9]+x"
done
tar czf /tmp/rs-fused.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/rs-fused.tgz "$OUT/"
