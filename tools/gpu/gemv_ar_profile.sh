#!/usr/bin/env bash
# Nsight Compute on weft's local GEMV inside `weft bench gemv_ar` (2 ranks; only the first
# matching launch is replayed, the other rank waits in its next collective meanwhile):
#   device run: bash tools/gpu/gemv_ar_profile.sh .gpu [m] [K:N] [kernel regex]   (carry .gpu)
# Defaults: m = 128, 28672:8192, gemv_local_kernel (m > 16; gemv_reg_local for m <= 16).
# Prints the speed-of-light, warp-state and tensor-pipe figures; the full report is in $OUT.
set -uo pipefail
BIN=${1:-.gpu}
M=${2:-128}
SHAPE=${3:-28672:8192}
KERNEL=${4:-gemv_local_kernel}
source "$(dirname "$0")/env.sh"
unpack_to profile
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1} WEFT_TIMEOUT_MS=120000
step "ncu: $KERNEL at m = $M, K:N = $SHAPE"
timeout -s KILL 240 ncu --clock-control none --target-processes all -k "regex:$KERNEL" -c 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
  --section LaunchStats --section ComputeWorkloadAnalysis \
  --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active,smsp__average_warp_latency_issue_stalled_mio_throttle,smsp__average_warp_latency_issue_stalled_long_scoreboard,smsp__average_warp_latency_issue_stalled_short_scoreboard,smsp__average_warp_latency_issue_stalled_math_pipe_throttle,smsp__average_warp_latency_issue_stalled_barrier,smsp__average_warp_latency_issue_stalled_wait \
  "$d/weft" bench gemv_ar --ms "$M" --shapes "$SHAPE" --out /tmp/profile-out > "$OUT/ncu-gemv-m$M.txt" 2>&1
status=$?
grep -E "Duration|Elapsed Cycles|SM Active Cycles|DRAM Throughput|Compute \(SM\)|Issue Slots Busy|Eligible Warps|Warp Cycles Per Issued|Registers Per|Grid Size|Cluster Size|Achieved Occupancy|hmma|stalled" \
  "$OUT/ncu-gemv-m$M.txt" | head -40
exit $status
