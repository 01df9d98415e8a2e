#!/usr/bin/env bash
# Nsight Compute durations of embedding_a2a's kernels inside `weft bench embedding_a2a` on one GPU
# (world 1: the backward's sort and sums without an exchange), in launch order, from the bench's
# first backward (its sparse check): the keys, CUB's sort, runs and scan, and the sums.
#   device run: bash tools/gpu/embedding_profile.sh .gpu [samples] [count] [regex] [skip]   (carry .gpu)
# Defaults: 4096 samples (dlrm), 16 launches, "grad_|Radix|Onesweep|Histogram|ReduceByKey|Scan|
# Select|pool_kernel", 0 skipped. The full report is in $OUT.
set -uo pipefail
BIN=${1:-.gpu}
B=${2:-4096}
COUNT=${3:-16}
REGEX=${4:-grad_|Radix|Onesweep|Histogram|ReduceByKey|Scan|Select|pool_kernel}
SKIP=${5:-0}
source "$(dirname "$0")/env.sh"
unpack_to embedding-profile
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} WEFT_TIMEOUT_MS=120000
step "ncu: embedding_a2a's kernels, dlrm at B = $B, one GPU"
timeout -s KILL 400 ncu --clock-control none --target-processes all -k "regex:$REGEX" \
  --launch-skip "$SKIP" -c "$COUNT" --section SpeedOfLight --section LaunchStats --section Occupancy \
  "$d/weft" bench embedding_a2a --shapes dlrm --ms "$B" --out /tmp/profile-out > "$OUT/ncu-embedding-$B.txt" 2>&1
status=$?
python3 - "$OUT/ncu-embedding-$B.txt" <<'PY'
import re, sys
name = None
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"^  (\S.*?) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", line)
    if m:
        name = re.sub(r"<.*", "", m.group(1))[:60]
        continue
    for key in ("Duration", "DRAM Throughput", "Registers Per Thread", "Achieved Occupancy"):
        if name and line.strip().startswith(key):
            print(f"{name:60} {key:22} {line.split()[-1]} {line.split()[-2]}")
PY
exit $status
