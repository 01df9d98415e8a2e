#!/usr/bin/env bash
# The GEMM issue's GPU run, in one call of the device tool (one GPU is enough):
#   device run: bash tools/gpu/gemm.sh .gpu [all|fast|tests|bench|profile|stalls] [bench args]   (carry .gpu, built by tools/gpu/build.sh)
# GEMM GPU tests, compute-sanitizer memcheck + racecheck on the small cases, then
# `weft bench gemm` beside cuBLAS (fast: no sanitizers). Logs and JSON in $OUT.
set -uo pipefail
BIN=${1:-.gpu}
ONLY=${2:-all}
if [ $# -ge 2 ]; then shift 2; else shift $#; fi
BENCH_ARGS=("$@")
source "$(dirname "$0")/env.sh"
status=0
if [ "$ONLY" != bench ] && [ "$ONLY" != stalls ]; then
  step "GEMM GPU tests"
  "$BIN/weft_gpu_tests" --gtest_filter='GemmGpu.*' 2>&1 | tee "$OUT/gemm_tests.log" | grep -E "^\[ *(OK|FAILED|PASSED)|\[gpu\]|Failure|rank 0|what" || status=1
  grep -q "FAILED" "$OUT/gemm_tests.log" && status=1
fi
if [ "$ONLY" = all ]; then
  for tool in memcheck racecheck; do
    step "compute-sanitizer $tool (GEMM: exact small shapes of every kernel, hooks, waits)"
    timeout 150 compute-sanitizer --tool $tool --report-api-errors no --target-processes all \
      "$BIN/weft_gpu_tests" --gtest_filter='GemmGpu.Exact*:GemmGpu.Hooks*:GemmGpu.Waits*' > "$OUT/gemm_$tool.log" 2>&1 || status=1
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$OUT/gemm_$tool.log" | head -5
  done
fi
if [ "$ONLY" = stalls ]; then
  # Where the 8192^3 kernel's warps wait (single CTAs), and its main-loop SASS.
  timeout 150 ncu --clock-control none -k regex:gemm_sm90 --launch-skip 2 --launch-count 1 \
    --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section SpeedOfLight \
    --section SourceCounters --section MemoryWorkloadAnalysis \
    "$BIN/weft" bench gemm --quick --shapes 8192x8192x8192 --out "$OUT/ncu" > "$OUT/ncu_stalls.log" 2>&1
  grep -E "Stall|Warp Cycles|Issued|Eligible|Active Warps|Pipe|Throughput|Duration|SM Frequency|L2 Hit|Bank" "$OUT/ncu_stalls.log" | head -60
  timeout 150 ncu --clock-control none -k regex:gemm_sm90 --launch-skip 2 --launch-count 1 \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio',sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg.per_second \
    "$BIN/weft" bench gemm --quick --shapes 8192x8192x8192 --out "$OUT/ncu" > "$OUT/ncu_stall_reasons.log" 2>&1
  grep -E "stalled|hmma|per_second" "$OUT/ncu_stall_reasons.log" | awk '$NF+0 > 0.05 || /hmma|per_second/' | head -40
  # cuBLAS's kernel for the same shape (its name says its tile, cluster and stages), same metrics.
  timeout 150 ncu --clock-control none -k 'regex:^(sm90|cutlass|nvjet|xmma)' --launch-count 1 \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio',sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg.per_second,launch__grid_size,launch__block_size,launch__shared_mem_per_block_dynamic \
    "$BIN/weft" bench gemm --quick --shapes 8192x8192x8192 --out "$OUT/ncu" > "$OUT/ncu_cublas.log" 2>&1
  grep -E "^  [a-zA-Z_0-9]+.*\(|stalled|hmma|per_second|launch__" "$OUT/ncu_cublas.log" | awk '$NF+0 > 0.05 || /hmma|per_second|launch__|\(/' | head -40
  cuobjdump -sass "$BIN/weft" 2>/dev/null | awk '/Function :/{f=($0 ~ /gemm_sm90_kernelI13__nv_bfloat16Li0ELi1ELi64E/)} f' > "$OUT/sass_gemm_bf16_nk_single.txt"
  echo "SASS lines: $(wc -l < "$OUT/sass_gemm_bf16_nk_single.txt"), HGMMA: $(grep -c HGMMA "$OUT/sass_gemm_bf16_nk_single.txt")"
fi
if [ "$ONLY" = profile ]; then
  # Speed of light + memory workload of one 8192^3 launch, CTA pairs then single CTAs.
  for c in 2 1; do
    step "ncu: 8192^3 bf16, clusters of $c"
    WEFT_GEMM_CLUSTER=$c timeout 120 ncu --clock-control none -k regex:gemm_sm90 --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
      "$BIN/weft" bench gemm --quick --shapes 8192x8192x8192 --out "$OUT/ncu" > "$OUT/ncu_cluster$c.log" 2>&1
    grep -E "Duration|Throughput|Busy|Grid Size|Cluster|L2 Hit|Mem Pipes|Achieved Occupancy|Waves" "$OUT/ncu_cluster$c.log" | head -30
  done
fi
if [ "$ONLY" != tests ] && [ "$ONLY" != profile ] && [ "$ONLY" != stalls ]; then
  step "weft bench gemm"
  "$BIN/weft" bench gemm --out "$OUT" "${BENCH_ARGS[@]}" 2>"$OUT/gemm_bench_progress.log" | tee "$OUT/gemm_bench.log" || status=1
  tail -3 "$OUT/gemm_bench_progress.log"
fi
exit $status
