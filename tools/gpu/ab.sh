#!/usr/bin/env bash
# A/B of environment variants on one op's bench, alternating, in one device call (2 GPUs):
#   here:   bash tools/gpu/build.sh
#   device: OP=gemm_rs CASES="4096x8192x8192:2 16384x8192x3584:3" \
#           VARIANTS="WEFT_RS_PRIO=0 WEFT_RS_PRIO=1" ROUNDS=2 bash tools/gpu/ab.sh .gpu
#           (kind nvidia-h200-x2, carry .gpu)
# CASES: shape[:chunks] each (chunks: `--chunks`, decomposed's count; none: the op's choice).
# VARIANTS: VAR=value[,VAR=value...] each; every round runs every case under every variant
# (even rounds in reverse variant order). BENCH_ARGS: more bench options (e.g. --eager).
# TRACE=1: each run also writes its traced calls (--trace-dir; tools/trace_tiles.py reads them).
# TESTS=1 first runs the GEMM+communication GPU tests under each of TEST_ENVS (default: one
# run, no extra environment; e.g. TEST_ENVS="WEFT_RS_FOLD=lt WEFT_RS_FOLD=lt,WEFT_RS_PRIO=0").
# Last: per case and variant, each method's median and best overlapped / GEMM alone, per round.
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/env.sh"
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-15000}
OP=${OP:-gemm_rs}
status=0
if [ "${TESTS:-0}" = 1 ]; then
  for te in ${TEST_ENVS:-NONE=1}; do
    step "GEMM+communication GPU tests ($te)"
    env ${te//,/ } WEFT_TEST_PROGRESS=$OUT/progress timeout -s KILL 240 "$BIN/weft_gpu_tests" \
      --gtest_filter='*GemmOverlap*' > "$OUT/tests-${te//[=,]/_}.log" 2>&1 || status=1
    pkill -9 -x weft_gpu_tests 2>/dev/null || true
    grep -E "^\[ *(FAILED|PASSED)|Failure|rror" "$OUT/tests-${te//[=,]/_}.log" | grep -v "gemm random" | head -20
  done
fi
VARIANTS=${VARIANTS:-NONE=1}
read -r -a vs <<< "$VARIANTS"
for r in $(seq 1 "${ROUNDS:-2}"); do
  order=("${vs[@]}")
  if [ $((r % 2)) = 0 ]; then order=(); for ((i = ${#vs[@]} - 1; i >= 0; i--)); do order+=("${vs[$i]}"); done; fi
  for c in ${CASES:?CASES: shape[:chunks] ...}; do
    shape=${c%%:*}
    chunk_args=()
    [ "$shape" != "$c" ] && chunk_args=(--chunks "${c#*:}")
    for v in "${order[@]}"; do
      d="$OUT/r$r/${v//[=,]/_}/${c//:/_c}"
      mkdir -p "$d"
      echo "$v" > "$d/variant"
      trace_args=()
      [ "${TRACE:-0}" = 1 ] && trace_args=(--trace-dir "$d/traces")
      env ${v//,/ } timeout 150 "$BIN/weft" bench "$OP" --shapes "$shape" "${chunk_args[@]}" "${trace_args[@]}" ${BENCH_ARGS:-} \
        --out "$d" > "$d/bench.log" 2> "$d/progress.log" || { status=1; echo "FAILED: round $r $c $v"; tail -3 "$d/progress.log"; }
    done
  done
done
step "summary (us; best = fastest of decomposed / fused; ratio = best / GEMM alone)"
python3 - "$OUT" <<'PY'
import glob, json, os, sys
rows = []
for f in sorted(glob.glob(sys.argv[1] + "/r*/*/*/*.json")):
    d = os.path.dirname(f)
    v = open(d + "/variant").read().strip()
    rnd = os.path.relpath(f, sys.argv[1]).split("/")[0][1:]
    pts = json.load(open(f))["points"]
    by = {p["method"]: p for p in pts}
    g = by.get("gemm_only", {}).get("median_us")
    best = min(p["median_us"] for m, p in by.items() if m in ("decomposed", "fused"))
    shp = "%dx%dx%d" % (pts[0]["m"], pts[0]["k"], pts[0]["n"])
    dec = by.get("decomposed", {})
    rows.append((shp, v, rnd, g, dec.get("median_us"), dec.get("chunks"), by.get("fused", {}).get("median_us"),
                 best, best / g if g else float("nan"), max(p.get("rel_err_vs_baseline", 0) for p in pts)))
rows.sort()
print("%-18s %-34s %3s %9s %11s %3s %9s %7s %6s" % ("shape", "variant", "rnd", "gemm", "decomposed", "ch", "fused", "ratio", "err"))
for r in rows:
    print("%-18s %-34s %3s %9.1f %11.1f %3s %9s %7.3f %6.4f" % (r[0], r[1], r[2], r[3], r[4] or 0, r[5],
          "%.1f" % r[6] if r[6] else "-", r[8], r[9]))
PY
tar czf /tmp/weft-ab.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/weft-ab.tgz "$OUT/"
exit $status
