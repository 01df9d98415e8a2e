#!/usr/bin/env bash
# A/B of lookup-kernel builds on `weft bench embedding_a2a`, alternating, in one device call:
#   here:    build each variant's binaries into its own folder (tools/gpu/build.sh, then copy
#            build-gpu/{weft,tests/weft_gpu_tests,libweft_c.so} and tools/gpu/pack.sh DIR)
#   device:  BINS=".gpu .gpu_a" bash tools/gpu/embedding_ab.sh      (carry every folder of BINS)
# An entry DIR@VAR=VALUE runs DIR's build with VAR=VALUE set (one build, settings A/B'd: e.g.
# BINS=".gpu .gpu@WEFT_EMBEDDING_X=1").
# WORLD GPUs (default 1), ROUNDS rounds (default 2; even rounds in reverse order), BENCH_ARGS
# (default "--shapes sweep"); TESTS=1 first runs the embedding GPU tests of every build after the
# first. Last: per shape and build, the medians over rounds of the lookup (µs, % of the copy), fused
# (µs) and fused / baseline.
set -uo pipefail
source "$(dirname "$0")/env.sh"
read -r -a bins <<< "${BINS:-.gpu .gpu_a}"
WORLD=${WORLD:-1}
export WEFT_TIMEOUT_MS=${WEFT_TIMEOUT_MS:-30000} CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((WORLD - 1)))
status=0
dir_of() { echo "${1%%@*}"; }
env_of() { [[ "$1" == *@* ]] && echo "${1#*@}"; }
tag_of() { echo "${1#.}" | tr -c 'A-Za-z0-9_\n-' '_'; }
for d in $(for b in "${bins[@]}"; do dir_of "$b"; done | sort -u); do unpack_bin "$d" "/tmp/weft-bin/ab/$d"; done
if [ "${TESTS:-0}" = 1 ]; then
  for b in "${bins[@]:1}"; do
    step "embedding GPU tests ($b, $WORLD GPUs)"
    env $(env_of "$b") timeout -s KILL 300 "/tmp/weft-bin/ab/$(dir_of "$b")/weft_gpu_tests" --gtest_filter='*EmbeddingA2A*' \
      > "$OUT/tests-$(tag_of "$b").log" 2>&1 || status=1
    pkill -9 -x weft_gpu_tests 2>/dev/null || true
    grep -E "^\[ *(FAILED|PASSED)|Failure|checks passed" "$OUT/tests-$(tag_of "$b").log" | head -10
  done
fi
for r in $(seq 1 "${ROUNDS:-2}"); do
  order=("${bins[@]}")
  [ $((r % 2)) = 0 ] && order=($(printf '%s\n' "${bins[@]}" | tac))
  for b in "${order[@]}"; do
    step "round $r: $b"
    o="$OUT/ab/$r-$(tag_of "$b")"
    mkdir -p "$o"
    env $(env_of "$b") timeout -s KILL "${BENCH_LIMIT:-200}" "/tmp/weft-bin/ab/$(dir_of "$b")/weft" bench embedding_a2a \
      --out "$o" ${BENCH_ARGS:---shapes sweep} > "$o/bench.log" 2>/dev/null || status=1
  done
done
python3 - "$OUT/ab" "${bins[@]}" <<'PY'
import glob, json, re, statistics, sys, collections
root, bins = sys.argv[1], sys.argv[2:]
t = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(list)))
for b in bins:
    tag = re.sub(r"[^A-Za-z0-9_-]", "_", b[1:] if b.startswith(".") else b)
    for f in glob.glob(f"{root}/*-{tag}/embedding_a2a-*.json"):
        j = json.load(open(f))
        for p in j["points"]:
            key = (p["shape"], p["batch"], p["dim"], round(p["pooling"], 1))
            t[key][b][p["method"]].append(p["median_us"])
            if p["method"] == "lookup": t[key][b]["pct"].append(100 * p["gbps"] / j["copy_gbps"])
med = lambda v: statistics.median(v) if v else float("nan")
print(f"{'shape':28}", *[f"{b:>34}" for b in bins])
print(f"{'':28}", *[f"{'lookup (% copy)  fused  fused/base':>34}" for b in bins])
for k in sorted(t):
    cells = []
    for b in bins:
        m = t[k][b]
        cells.append(f"{med(m['lookup']):7.1f} ({med(m['pct']):3.0f}%) {med(m['fused']):8.1f} {med(m['fused']) / med(m['baseline']):6.3f}")
    print(f"{str(k):28}", *[f"{c:>34}" for c in cells])
PY
exit $status
