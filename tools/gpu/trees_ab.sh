#!/usr/bin/env bash
# Two builds of weft side by side in one device call: is the second (AFTER) no slower than the
# first (BEFORE)? For each op, `weft bench OP` of each build, alternating BEFORE/AFTER for
# ROUNDS rounds (even rounds AFTER first), then per point the best weft method's median of
# each build and AFTER/BEFORE (< 1: faster). The baselines (NCCL, cuBLAS) are timed by both
# builds: their ratio is the run's noise.
#   here:   build each tree's weft CLI (tools/gpu/build.sh) and copy the binaries into two
#           folders of this repository, e.g. .gpu-before/ and .gpu/ (git-ignored)
#   device: OPS="collectives ag_gemm gemm_rs gemm_ar" ROUNDS=2 bash tools/gpu/trees_ab.sh .gpu-before .gpu
#           (2 GPUs; carry both folders)
set -uo pipefail
BEFORE=${1:?BEFORE bin dir}
AFTER=${2:?AFTER bin dir}
source "$(dirname "$0")/env.sh"
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-15000}
status=0
for r in $(seq 1 "${ROUNDS:-2}"); do
  order=(before after)
  [ $((r % 2)) = 0 ] && order=(after before)
  for op in ${OPS:-collectives ag_gemm gemm_rs gemm_ar}; do
    for tree in "${order[@]}"; do
      bin=$BEFORE
      [ "$tree" = after ] && bin=$AFTER
      d="$OUT/ab/$op/$tree-r$r"
      mkdir -p "$d"
      step "round $r: $op ($tree)"
      timeout "${BENCH_TIMEOUT:-200}" "$bin/weft" bench "$op" --out "$d" ${BENCH_ARGS:-} > "$d/bench.log" 2> "$d/progress.log" \
        || { status=1; echo "FAILED: $op $tree round $r"; tail -3 "$d/progress.log"; }
    done
  done
done
step "summary: per point, the median over rounds of each build's time (us), AFTER/BEFORE"
python3 - "$OUT/ab" <<'PY'
import glob, json, os, statistics, sys
root = sys.argv[1]
# times[(op, point, column)][tree] = [us per round]
times = {}
for f in glob.glob(root + "/*/*/*.json"):
    op = f.split("/")[-3]
    tree = f.split("/")[-2].split("-")[0]
    j = json.load(open(f))
    for p in j["points"]:
        if "coll" in p:  # collectives: per size, each method
            key = (op, "%s %d" % (p["coll"], p["bytes"]), p["method"])
        else:  # GEMM + communication: per shape, each method
            key = (op, "%dx%dx%d" % (p["m"], p["k"], p["n"]), p["method"])
        times.setdefault(key, {}).setdefault(tree, []).append(p["median_us"])
base = ("nccl", "baseline", "gemm_only", "gemm_only_weft", "gemm_tuned", "reference")
points = sorted({k[:2] for k in times})
worst = 0.0
print("%-10s %-26s %-12s %10s %10s %7s   %-10s %7s" % ("op", "point", "best", "before", "after", "ratio", "baseline", "ratio"))
for op, pt in points:
    cols = {k[2]: v for k, v in times.items() if k[:2] == (op, pt)}
    def med(c, t):
        v = cols.get(c, {}).get(t)
        return statistics.median(v) if v else None
    weft = [c for c in cols if c not in base and c != "auto" and med(c, "before") and med(c, "after")]
    if not weft:
        continue
    b_best = min(weft, key=lambda c: med(c, "before"))
    a_best = min(weft, key=lambda c: med(c, "after"))
    tb, ta = med(b_best, "before"), med(a_best, "after")
    bl = next((c for c in base if c in cols and med(c, "before") and med(c, "after")), None)
    blr = med(bl, "after") / med(bl, "before") if bl else float("nan")
    worst = max(worst, ta / tb)
    print("%-10s %-26s %-12s %10.2f %10.2f %7.3f   %-10s %7.3f" % (op, pt, a_best, tb, ta, ta / tb, bl or "-", blr))
print("worst AFTER/BEFORE of the best weft method: %.3f" % worst)
PY
tar czf /tmp/weft-trees-ab.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/weft-trees-ab.tgz "$OUT/"
exit $status
