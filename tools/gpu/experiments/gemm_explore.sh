#!/usr/bin/env bash
# GEMM experiments on one GPU (issue 5), one call of the device tool:
#   device run: bash tools/gpu/experiments/gemm_explore.sh .gpu       (kind nvidia-h200, carry .gpu)
# 1. the raster group (WEFT_GEMM_GROUP_M) against cuBLAS on the benchmark shapes, with the
#    GPU's power draw and SM clock sampled during each run (nvidia-smi, 50 ms);
# 2. ncu speed-of-light, memory and warp stalls of weft (single CTAs, CTA pairs) and cuBLAS on
#    4096x8192x8192 bf16 nk (cuBLAS runs nvjet_sm90_tst_256x128_64x4_1x2: our pairs' design).
# Logs in $OUT (tarred: the device tool brings back a few files only).
set -uo pipefail
BIN=${1:-.gpu}
RASTER_GROUPS=${2:-"8 16 4"}  # (not GROUPS: bash keeps the user's groups there)
NCU=${3:-ncu}                 # "noncu": the benchmarks alone
# WEFT_BENCH_SUSTAIN_MS=t in the environment: each timing after t ms of back-to-back calls.
source "$(dirname "$0")/../env.sh"
for g in $RASTER_GROUPS; do
  step "raster group $g"
  nvidia-smi --query-gpu=power.draw,clocks.sm,temperature.gpu --format=csv,noheader,nounits -lms 50 > "$OUT/power-g$g.csv" &
  smi=$!
  WEFT_GEMM_GROUP_M=$g timeout 150 "$BIN/weft" bench gemm --out "$OUT/g$g" > "$OUT/gemm-g$g.log" 2>&1
  kill $smi
  grep -E "^ +[0-9]+x" "$OUT/gemm-g$g.log" | grep -E "bf16  nk|pairs" 
  awk -F', ' '$1>100 {p+=$1; c+=$2; n++} END {if (n) printf "  mean while busy: %.0f W, %.0f MHz (%d samples)\n", p/n, c/n, n}' "$OUT/power-g$g.csv"
done
step "ncu: 4096x8192x8192 bf16 nk, weft then cuBLAS"
[ "$NCU" = noncu ] || for k in gemm_sm90 pairs nvjet; do
  cl=1; [ $k = pairs ] && cl=2
  WEFT_GEMM_CLUSTER=$cl timeout 150 ncu --clock-control none -k "regex:${k/pairs/gemm_sm90}" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section ComputeWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats \
    "$BIN/weft" bench gemm --quick --shapes 4096x8192x8192 --out "$OUT/ncu" > "$OUT/ncu-$k.log" 2>&1
  grep -E "^  [a-zA-Z_0-9]+.*\(|Duration|SM Frequency|DRAM Throughput|L2 Cache Throughput|Compute \(SM\)|Registers Per|Cluster Size|Grid Size|Block Size|L2 Hit|Mem Pipes|Executed Ipc A|Dynamic Shared|Stall|Warp Cycles Per Issued|Eligible Warps" "$OUT/ncu-$k.log" | head -50
done
tar czf /tmp/gemm-explore.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/gemm-explore.tgz "$OUT/"
