#!/usr/bin/env bash
# weft's GEMV at M > 16 with each K split (WEFT_GEMV_CLUSTER = 1, 2, 4, 8) against the chosen one
# (0), on 2 GPUs, from `weft bench gemv_ar` (its "gemv wf" and "fused" columns):
#   device run: bash tools/gpu/gemv_ar_cluster_sweep.sh .gpu [shapes] [ms]   (carry .gpu)
# Defaults: shapes 4096:4096,14336:4096,8192:8192, ms 32,64,128. Logs in $OUT; a table last.
set -uo pipefail
BIN=${1:-.gpu}
SHAPES=${2:-4096:4096,14336:4096,8192:8192}
MS=${3:-32,64,128}
source "$(dirname "$0")/env.sh"
d=/tmp/weft-bin/sweep
unpack_bin "$BIN" "$d"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1} WEFT_TIMEOUT_MS=30000
for S in 0 1 2 4 8; do
  step "WEFT_GEMV_CLUSTER=$S"
  WEFT_GEMV_CLUSTER=$S timeout -s KILL 200 "$d/weft" bench gemv_ar --shapes "$SHAPES" --ms "$MS" \
    --out "$OUT/sweep-$S" > "$OUT/sweep-$S.log" 2>&1 || echo "S=$S failed"
done
step "gemv wf | fused (us) by WEFT_GEMV_CLUSTER"
python3 - "$OUT" <<'PY'
import json, glob, sys, os
out = sys.argv[1]
rows = {}
GEMV = "gemv_weft"
for S in (0, 1, 2, 4, 8):
    files = glob.glob(os.path.join(out, f"sweep-{S}", "*.json"))
    if not files:
        continue
    for p in json.load(open(files[0]))["points"]:
        key = (p["k"], p["n"], p["m"])
        cell = rows.setdefault(key, {}).setdefault(S, {})
        cell[p["method"]] = p["median_us"]
print("KxNxM".ljust(18) + "".join(f"S={S}".rjust(16) for S in (0, 1, 2, 4, 8)))
for key in sorted(rows):
    cells = []
    for S in (0, 1, 2, 4, 8):
        c = rows[key].get(S, {})
        g, f = c.get(GEMV), c.get("fused")
        cells.append((f"{g:.1f} | {f:.1f}" if g and f else "-").rjust(16))
    print(f"{key[0]}x{key[1]}x{key[2]}".ljust(18) + "".join(cells))
PY
