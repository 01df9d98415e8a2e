#!/usr/bin/env bash
# ncu of the lookup kernel (the quick sweep's first shape, D 128 pooling 10, one GPU) beside the
# gather probe's ideal kernel at the same rows and occupancy (D 128, 13 M rows, 16 warps an SM):
#   here:   build .gpu (tools/gpu/build.sh; pack.sh) and the probe into .probe/ (gather_probe.cu's
#           first lines)
#   device: bash tools/gpu/experiments/pool_ncu.sh .gpu      (kind nvidia-h200; carry .gpu, .probe)
set -uo pipefail
source "$(dirname "$0")/../env.sh"
unpack_bin "${1:-.gpu}" /tmp/wb
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy"
S="$S --section MemoryWorkloadAnalysis --section LaunchStats --section SourceCounters"
export CUDA_VISIBLE_DEVICES=0 WEFT_TIMEOUT_MS=120000
timeout -s KILL 200 ncu --clock-control none --target-processes all -k regex:pool_kernel -c 1 $S \
  /tmp/wb/weft bench embedding_a2a --shapes sweep --quick --out /tmp/po > "$OUT/ncu_pool.txt" 2>&1
# The probe's launches: 16 a configuration, D 64's 288 first.
timeout -s KILL 100 ncu --clock-control none -k regex:gather --launch-skip 288 -c 1 $S ./.probe/gather_probe \
  > "$OUT/ncu_probe.txt" 2>&1
for f in "$OUT/ncu_pool.txt" "$OUT/ncu_probe.txt"; do
  echo "== $f"
  grep -E "Duration|DRAM Throughput|No Eligible|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Mem Busy" "$f"
done
