#!/usr/bin/env bash
# The GPUs' SM clock and power draw beside each column of a GEMM+communication bench (one
# device call, 2 GPUs): does a method cost time because the GEMM runs at a lower clock under
# the power cap (energy), or at the same clock (waiting)?
#   here:   bash tools/gpu/build.sh
#   device: OP=gemm_rs SHAPES=4096x8192x8192 PER_GRAPH=300 bash tools/gpu/experiments/power_probe.sh .gpu
#           (kind nvidia-h200-x2, carry .gpu)
# Runs `weft bench OP --sequential` with PER_GRAPH calls per timed run, so each column's 16
# runs last seconds back to back, samples nvidia-smi every 50 ms, and prints per column the
# median SM clock and power of each GPU over the column's timed window (the bench's progress
# lines "METHOD: timing" ... "METHOD: timed"), beside its time per call. Reads only.
set -uo pipefail
BIN=${1:-.gpu}
source "$(dirname "$0")/../env.sh"
OP=${OP:-gemm_rs}
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 50 \
  > "$OUT/smi.csv" &
smi=$!
WEFT_BENCH_PER_GRAPH=${PER_GRAPH:-300} timeout 400 "$BIN/weft" bench "$OP" --sequential \
  --shapes "${SHAPES:-4096x8192x8192}" --out "$OUT" 2>&1 > "$OUT/bench.log" |
  while IFS= read -r l; do echo "$(date +%s.%N) $l"; done > "$OUT/progress_ts.log"
kill "$smi"
cat "$OUT/bench.log"
python3 - "$OUT" <<'PY'
import csv, datetime, glob, json, re, statistics as st, sys
out = sys.argv[1]
smi = []
for row in csv.reader(open(out + "/smi.csv")):
    try:
        t = datetime.datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
        smi.append((t, int(row[1]), float(row[2]), float(row[3]), float(row[4])))
    except (ValueError, IndexError):
        pass
wins, start = [], {}
for line in open(out + "/progress_ts.log"):
    m = re.match(r"(\S+) \[weft bench\s+\S+\] (\S+) (\S+) (\S+): (timing|timed)$", line.strip())
    if not m:
        continue
    t, op, shape, col, what = float(m[1]), m[2], m[3], m[4], m[5]
    if what == "timing":
        start[(shape, col)] = t
    elif (shape, col) in start:
        wins.append((shape, col, start.pop((shape, col)), t))
us = {}
for f in glob.glob(out + "/*-nccl-*.json"):
    for p in json.load(open(f))["points"]:
        us[("%dx%dx%d" % (p["m"], p["k"], p["n"]), p["method"])] = p["median_us"]
print("\nper column: us per call; median SM clock (MHz) / power (W) / temperature (C) of GPU 0 and GPU 1")
print("%-16s %-15s %9s %6s | %5s %6s %4s | %5s %6s %4s" % ("shape", "column", "us", "secs", "clk0", "W0", "T0",
                                                          "clk1", "W1", "T1"))
for shape, col, t0, t1 in wins:
    a = t0 + 0.2 * (t1 - t0)  # past the warm-up run
    cells = []
    for g in (0, 1):
        xs = [s for s in smi if s[1] == g and a <= s[0] <= t1]
        cells += [st.median(s[2] for s in xs), st.median(s[3] for s in xs), st.median(s[4] for s in xs)] if xs else [0, 0, 0]
    print("%-16s %-15s %9.1f %6.1f | %5.0f %6.1f %4.0f | %5.0f %6.1f %4.0f" % (shape, col, us.get((shape, col), 0),
                                                                        t1 - t0, *cells))
PY
