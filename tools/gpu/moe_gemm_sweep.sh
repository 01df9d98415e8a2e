#!/usr/bin/env bash
# The grouped GEMM's raster group (WEFT_GEMM_GROUP_M) swept inside `weft bench moe` on one GPU,
# and Nsight Compute's memory figures (L2 hit rate, DRAM bytes) of the layer's first grouped
# GEMM at the default group:
#   device run: bash tools/gpu/moe_gemm_sweep.sh .gpu [shape] [tokens] ["groups"]   (carry .gpu)
# Defaults: deepseek-v3-like, 4096, "16 8 4". Logs in $OUT.
set -uo pipefail
BIN=${1:-.gpu}
SHAPE=${2:-deepseek-v3-like}
T=${3:-4096}
GROUP_SIZES=${4:-16 8 4}
source "$(dirname "$0")/env.sh"
unpack_to moe-sweep
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} WEFT_TIMEOUT_MS=120000
status=0
for g in $GROUP_SIZES; do
  step "group_m $g: $SHAPE T $T, one GPU"
  WEFT_GEMM_GROUP_M=$g timeout -s KILL 150 "$d/weft" bench moe --shapes "$SHAPE" --ms "$T" --out /tmp/sweep-out \
    > "$OUT/sweep-g$g.log" 2>&1 || status=1
  grep -E "layer|experts-|^$SHAPE" "$OUT/sweep-g$g.log" | grep -vE "direct" | head -12
done
step "ncu memory: the layer's first grouped GEMM (default group)"
timeout -s KILL 200 ncu --clock-control none -k "regex:gemm_sm90" -c 1 --section MemoryWorkloadAnalysis \
  --section SpeedOfLight --metrics lts__t_sector_hit_rate.pct,dram__bytes_read.sum,lts__t_bytes.sum \
  "$d/weft" bench moe --shapes "$SHAPE" --ms "$T" --out /tmp/sweep-out > "$OUT/ncu-mem.txt" 2>&1 || status=1
grep -E "Duration|hit_rate|dram__bytes|lts__t_bytes|L2 Hit|DRAM Throughput|Mem Busy|Max Bandwidth" "$OUT/ncu-mem.txt" | head -20
exit $status
