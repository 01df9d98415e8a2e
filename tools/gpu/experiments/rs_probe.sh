#!/usr/bin/env bash
# Why gemm_rs's overlapped methods miss their bars at 2048x4096x4096 and 16384x8192x3584 (one
# device call, 2 GPUs):
#   here:   bash tools/gpu/build.sh && nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a \
#             tools/gpu/experiments/store_probe.cu -o .gpu/store_probe -lcublas
#   device: bash tools/gpu/experiments/rs_probe.sh .gpu   (kind nvidia-h200-x2, carry .gpu)
# 1. store_probe: TMA bulk / plain stores into the peer against weft's push loop, alone and beside
#    a GEMM (is the epilogue's store rate into a peer the limit?);
# 2. weft bench gemm_rs on SHAPES (SKIP_PROBE=1: this only) under each of VARIANTS (one
#    VAR=value[,VAR=value...] each; default: the fused method's copy-engine fold, then direct stores), every
#    method traced once (JSON traces kept for per-tile analysis:
#    tools/trace_tiles.py) (BENCH_ARGS: more bench options, e.g. --chunks 4), SM clock and power sampled every 100 ms beside it (is it the clock?).
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/../env.sh"
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-15000}
SHAPES=${SHAPES:-2048x4096x4096,16384x8192x3584}
if [ -x "$BIN/store_probe" ] && [ "${SKIP_PROBE:-0}" != 1 ]; then
  step "store probe"
  timeout 120 "$BIN/store_probe" > "$OUT/store_probe.log" 2>&1
  cat "$OUT/store_probe.log"
fi
nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader \
  -lms 100 > "$OUT/smi.csv" 2>&1 &
smi=$!
VARIANTS=${VARIANTS:-WEFT_FUSED_RS_DIRECT=0 WEFT_FUSED_RS_DIRECT=1}
i=0
for v in $VARIANTS; do
  step "weft bench gemm_rs $v ($SHAPES)"
  echo "$(date +%T.%N) start $v" >> "$OUT/marks.log"
  env ${v//,/ } timeout 150 "$BIN/weft" bench gemm_rs --shapes "$SHAPES" ${BENCH_ARGS:-} --out "$OUT" \
    --trace-dir "$OUT/traces-$i" > "$OUT/bench-$i.log" 2> "$OUT/bench-${i}_progress.log"
  echo "$(date +%T.%N) end $v" >> "$OUT/marks.log"
  echo "$v" > "$OUT/traces-$i/variant"
  grep -E "^MxKxN|^[0-9]+x" "$OUT/bench-$i.log"
  grep -E -A3 "\] trace " "$OUT/bench-${i}_progress.log" | grep -v "^--" | sed "s/.*traces-[0-9]*.//"
  i=$((i + 1))
done
kill $smi 2>/dev/null
step "SM clock / power while the benches ran (per GPU: min / median / max)"
python3 - "$OUT/smi.csv" <<'PY'
import sys, statistics as st
rows = [l.split(", ") for l in open(sys.argv[1]) if l.count(",") >= 5]
for g in sorted({r[1] for r in rows}):
    clk = [float(r[2].split()[0]) for r in rows if r[1] == g]
    pw = [float(r[4].split()[0]) for r in rows if r[1] == g and r[4].split()[0][0].isdigit()]
    print(f"GPU {g}: SM MHz {min(clk):.0f}/{st.median(clk):.0f}/{max(clk):.0f}  W {min(pw):.0f}/{st.median(pw):.0f}/{max(pw):.0f}  ({len(clk)} samples)")
PY
# Everything as one archive (a device call returns at most 8 files).
tar czf /tmp/weft-rs-probe.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/weft-rs-probe.tgz "$OUT/"
