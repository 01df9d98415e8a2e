#!/usr/bin/env bash
# Every GPU measurement of issues 3, 5 and 6 in one call of the device tool (2 GPUs):
#   here:   bash tools/gpu/build.sh
#   device: bash tools/gpu/all.sh .gpu          (kind nvidia-h200-x2, carry .gpu)
# Collectives tests + benchmark, GEMM+communication tests + benchmarks (one traced fused
# ag_gemm), PyTorch's fused ops on the same shapes, then the GEMM benchmark on GPU 0.
# Prints a summary; full logs, JSON and traces in $OUT. Environment: WEFT_FUSED_RS=1 measures
# gemm_rs / gemm_ar's reduce chain as their fused method (comparisons); SKIP_GEMM=1 leaves out
# the GEMM benchmark.
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/env.sh"
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-15000}
status=0
step "every GPU test (1 and 2 GPUs)"
timeout 300 "$BIN/weft_gpu_tests" > "$OUT/gpu_tests.log" 2>&1 || status=1
grep -E "^\[ *(FAILED|PASSED)|\[gpu\]|Failure" "$OUT/gpu_tests.log" | head -30
step "compute-sanitizer memcheck (collectives in graphs)"
WEFT_TEST_TIMEOUT_MS=120000 timeout 200 compute-sanitizer --tool memcheck --report-api-errors no --target-processes all \
  "$BIN/weft_gpu_tests" --gtest_filter='CollectivesGpuGraph.*' > "$OUT/memcheck_collectives.log" 2>&1 || status=1
grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/memcheck_collectives.log" | head -4
step "collectives: benchmark"
timeout 120 "$BIN/weft" bench collectives --out "$OUT" > "$OUT/collectives_bench.log" 2> "$OUT/collectives_progress.log" || status=1
grep -E "^all_reduce|^all_gather|^reduce_scatter|^all_to_all|collective" "$OUT/collectives_bench.log" | head -80
for op in ag_gemm gemm_rs gemm_ar; do
  step "weft bench $op"
  timeout 150 "$BIN/weft" bench "$op" --out "$OUT" --trace-dir "$OUT/traces" > "$OUT/bench_$op.log" 2> "$OUT/bench_${op}_progress.log" || status=1
  grep -E "^MxKxN|^[0-9]+x" "$OUT/bench_$op.log"
done
# Keep one trace per op (the largest shape's fused, else decomposed) with its PNG.
mkdir -p "$OUT/keep"
for f in "$OUT"/traces/ag_gemm-8192x8192x14336-fused-*.json "$OUT"/traces/gemm_rs-8192x8192x14336-decomposed-*.json; do
  [ -e "$f" ] && cp "$f" "$OUT/keep/" && "$BIN/weft" trace "$f" --png "$OUT/keep/$(basename "${f%.json}").png" | tail -3
done
rm -rf "$OUT/traces"
step "PyTorch peer (2 ranks)"
timeout 200 torchrun --nproc-per-node 2 bench/torch_symm_mem_peer.py --out "$OUT/torch-symm-mem-2r.json" > "$OUT/torch_peer.log" 2>&1 || status=1
grep -vE "^\[peer\]|^W[0-9]|warn" "$OUT/torch_peer.log" | tail -14
if [ "${SKIP_GEMM:-0}" != 1 ]; then
  step "weft bench gemm (GPU 0)"
  CUDA_VISIBLE_DEVICES=0 timeout 200 "$BIN/weft" bench gemm --out "$OUT" > "$OUT/gemm_bench.log" 2> "$OUT/gemm_bench_progress.log" || status=1
  cat "$OUT/gemm_bench.log"
fi
# The device tool brings back a few files only: everything in one archive.
tar czf /tmp/weft-gpu-all.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/weft-gpu-all.tgz "$OUT/"
exit $status
