#!/usr/bin/env bash
# Where the folded gemm_rs's own-block GEMM loses time (timing experiments, wrong results):
#   device: bash tools/gpu/experiments/rs_fold_diag.sh .gpu      (kind nvidia-h200-x2, carry .gpu)
# weft vs cuBLAS on the own-block shapes alone (GPU 0, short timings), then `weft bench gemm_rs`
# traced with WEFT_RS_FOLD_DEBUG = (unset) | nosrc | nowait | none; prints each trace's GEMM spans.
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/../env.sh"
step "own-block GEMMs alone (GPU 0): weft vs cuBLAS"
CUDA_VISIBLE_DEVICES=0 WEFT_BENCH_SUSTAIN_MS=${SUSTAIN:-0} timeout 120 "$BIN/weft" bench gemm \
  --shapes 4096x4096x14336,2048x4096x8192,8192x4096x3584,1024x2048x4096 > "$OUT/gemm_own.log" 2>/dev/null
cat "$OUT/gemm_own.log" | tail -12
for d in fold nosrc nowait none; do
  mkdir -p "$OUT/$d"
  step "gemm_rs, WEFT_RS_FOLD_DEBUG=$d"
  env WEFT_RS_FOLD_DEBUG=$d timeout 120 "$BIN/weft" bench gemm_rs --out "$OUT/$d" --trace-dir "$OUT/$d/traces" \
    > "$OUT/bench_$d.log" 2>/dev/null
  grep -E "^[0-9]+x" "$OUT/bench_$d.log"
  python3 - "$OUT/$d/traces" <<'PY'
import json, glob, sys
for f in sorted(glob.glob(sys.argv[1] + "/*decomposed*.json")):
    ev = json.load(open(f))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    own = [e for e in ev if e.get("ph") == "X" and "(own)" in e.get("name", "")]
    print("  %-28s own GEMM us: %s" % (f.split("/")[-1].split("-decomposed")[0], " ".join("%.1f" % e["dur"] for e in own)))
PY
done
tar czf /tmp/weft-diag.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/weft-diag.tgz "$OUT/"
