#!/usr/bin/env bash
# Quick check of the GEMM+communication ops after a change (one device call, 2 GPUs):
#   here:   bash tools/gpu/build.sh
#   device: bash tools/gpu/overlap_check.sh .gpu [bench ops...]   (kind nvidia-h200-x2, carry .gpu)
# Every GPU test, compute-sanitizer memcheck of the GEMM+communication tests, then
# `weft bench OP` for each op named (default: ag_gemm gemm_rs), then (TORCH=1) PyTorch's fused
# ops on the same shapes (bench/torch_symm_mem_peer.py). Extra environment for the
# benches: BENCH_ENV (e.g. "WEFT_AG_OWN_IN_PLACE=0"); TRACE=1 keeps one traced call (fused
# ag_gemm, decomposed gemm_rs, largest shape) with its PNG; SKIP_TESTS=1, SKIP_MEMCHECK=1 leave
# those out; TUNE=1 first runs `weft bench OP --tune` for each of TUNE_OPS (default gemm_rs) into
# a fresh tuning cache ($OUT/tuning.json, which the benches then read: auto's choice and
# decomposed's chunk count). Everything lands in $OUT as one archive.
set -uo pipefail
BIN=${1:-.gpu}
shift || true
OPS=${*:-ag_gemm gemm_rs}
source "$(dirname "$0")/env.sh"
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-15000}
status=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  step "every GPU test (1 and 2 GPUs)"
  WEFT_TEST_PROGRESS=$OUT/progress timeout -s KILL 300 "$BIN/weft_gpu_tests" > "$OUT/gpu_tests.log" 2>&1 || status=1
  pkill -9 -x weft_gpu_tests 2>/dev/null || true  # ranks of a killed run must not hold the GPUs for the benches
  grep -E "^\[ *(FAILED|PASSED)|\[gpu\]|Failure" "$OUT/gpu_tests.log" | head -40
fi
if [ "${SKIP_MEMCHECK:-0}" != 1 ]; then
  step "compute-sanitizer memcheck (GEMM+communication tests)"
  # WEFT_GEMM_TUNE=0: cuBLAS's candidates timed under memcheck would take minutes (the tuning
  # only launches cuBLAS; the paths it picks among run with candidate 0).
  WEFT_GEMM_TUNE=0 WEFT_TEST_TIMEOUT_MS=200000 WEFT_TIMEOUT_MS=200000 timeout 480 compute-sanitizer --tool memcheck --report-api-errors no \
    --target-processes all "$BIN/weft_gpu_tests" --gtest_filter='*GemmOverlap*:GemmGpu.Epilogue*:GemmGpu.Waits*:GemmGpu.Sources*:GemmGpu.Rows*' > "$OUT/memcheck_gemm_overlap.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck_gemm_overlap.log" | head -6
fi
if [ "${TUNE:-0}" = 1 ]; then
  export WEFT_TUNE_CACHE=$OUT/tuning.json
  rm -f "$WEFT_TUNE_CACHE"
  for op in ${TUNE_OPS:-gemm_rs}; do
    step "weft bench $op --tune (decomposed at 1, 2, 3, 4, 6 chunks; into $WEFT_TUNE_CACHE)"
    # (The sweep's extra ops stay on the symmetric heap for the run: the overlap benches' 8 GiB
    # default heap holds them for the four shapes.)
    env ${BENCH_ENV:-} timeout 200 "$BIN/weft" bench "$op" --tune --out "$OUT/tune" \
      > "$OUT/tune_$op.log" 2> "$OUT/tune_${op}_progress.log" || status=1
    grep -E "^MxKxN|^[0-9]+x" "$OUT/tune_$op.log"
    python3 - "$OUT"/tune/"$op"-*.json <<'PY'
import json, sys
for f in sys.argv[1:]:
    pts = json.load(open(f))["points"]
    by = {}
    for p in pts:
        by.setdefault((p["m"], p["k"], p["n"]), {})[p["method"]] = p
    for shp, ms in by.items():
        dec = sorted((p["chunks"], p["median_us"]) for m, p in ms.items() if m.startswith("decomposed"))
        print("%dx%dx%d decomposed by chunks:" % shp, "  ".join("%d: %.1f" % d for d in dec))
PY
  done
  cat "$WEFT_TUNE_CACHE"
fi
for op in $OPS; do
  [ "$op" = none ] && continue
  step "weft bench $op ${BENCH_ENV:-}"
  trace_args=()
  [ "${TRACE:-0}" = 1 ] && trace_args=(--trace-dir "$OUT/traces")
  env ${BENCH_ENV:-} timeout 150 "$BIN/weft" bench "$op" --out "$OUT" "${trace_args[@]}" > "$OUT/bench_$op.log" \
    2> "$OUT/bench_${op}_progress.log" || status=1
  grep -E "^MxKxN|^[0-9]+x" "$OUT/bench_$op.log"
done
if [ "${TRACE:-0}" = 1 ]; then  # keep the largest shape's fused ag_gemm and decomposed gemm_rs, with PNGs
  step "traces"
  mkdir -p "$OUT/keep"
  for f in "$OUT"/traces/ag_gemm-8192x8192x14336-fused-*.json "$OUT"/traces/gemm_rs-8192x8192x14336-decomposed-*.json; do
    [ -e "$f" ] && cp "$f" "$OUT/keep/" && "$BIN/weft" trace "$f" --png "$OUT/keep/$(basename "${f%.json}").png" | tail -4
  done
  rm -rf "$OUT/traces"
fi
if [ "${TORCH:-0}" = 1 ]; then
  step "PyTorch peer (2 ranks)"
  timeout 200 torchrun --nproc-per-node 2 bench/torch_symm_mem_peer.py --out "$OUT/torch-symm-mem-2r.json" > "$OUT/torch_peer.log" 2>&1 || status=1
  grep -vE "^\[peer\]|^W[0-9]|warn" "$OUT/torch_peer.log" | tail -14
fi
tar czf /tmp/weft-check.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/weft-check.tgz "$OUT/"
exit $status
