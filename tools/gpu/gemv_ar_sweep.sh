#!/usr/bin/env bash
# weft's GEMV and the fused gemv_ar at M > 16 under each value of one experimental tunable, on
# 2 GPUs, from `weft bench gemv_ar` (its "gemv wf", "decomposed" and "fused" columns):
#   device run: bash tools/gpu/gemv_ar_sweep.sh .gpu [shapes] [ms]   (carry .gpu)
# VAR: the tunable (default WEFT_GEMV_CLUSTER: weft's GEMV's cluster K split, which the fused
# call's shares), VALUES: its values (0: the chosen one).
# Defaults: shapes 4096:4096,14336:4096,8192:8192,28672:8192, ms 32,64,128. Logs in $OUT; a table last.
set -uo pipefail
BIN=${1:-.gpu}
SHAPES=${2:-4096:4096,14336:4096,8192:8192,28672:8192}
MS=${3:-32,64,128}
VAR=${VAR:-WEFT_GEMV_CLUSTER}
VALUES=${VALUES:-0 1 2 4 8}
source "$(dirname "$0")/env.sh"
unpack_to sweep
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1} WEFT_TIMEOUT_MS=30000
for v in $VALUES; do
  step "$VAR=$v"
  env "$VAR=$v" timeout -s KILL 200 "$d/weft" bench gemv_ar --shapes "$SHAPES" --ms "$MS" \
    --out "$OUT/sweep-$v" > "$OUT/sweep-$v.log" 2>&1 || echo "$VAR=$v failed"
done
step "gemv wf | decomposed | fused (us) by $VAR"
python3 - "$OUT" "$VALUES" <<'PY'
import json, glob, sys, os
out, values = sys.argv[1], sys.argv[2].split()
rows = {}
for v in values:
    files = glob.glob(os.path.join(out, f"sweep-{v}", "*.json"))
    if not files:
        continue
    for p in json.load(open(files[0]))["points"]:
        rows.setdefault((p["k"], p["n"], p["m"]), {}).setdefault(v, {})[p["method"]] = p["median_us"]
print("KxNxM".ljust(18) + "".join(f"{v}".rjust(22) for v in values))
for key in sorted(rows):
    cells = []
    for v in values:
        c = rows[key].get(v, {})
        g, dc, f = c.get("gemv_weft"), c.get("decomposed"), c.get("fused")
        cells.append((f"{g:.1f} | {dc:.1f} | {f:.1f}" if g and dc and f else "-").rjust(22))
    print(f"{key[0]}x{key[1]}x{key[2]}".ljust(18) + "".join(cells))
PY
