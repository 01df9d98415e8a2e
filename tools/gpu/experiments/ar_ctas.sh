#!/usr/bin/env bash
# All-reduce up to 4 MiB against the CTA count of the LL and LL128 kernels (WEFT_COLL_CTAS),
# beside NCCL, on 2 GPUs:   device run: bash tools/gpu/experiments/ar_ctas.sh .gpu "64 96 128"   (carry .gpu)
# Prints time/NCCL per size and CTA count for each method.
set -uo pipefail
BIN=${1:-.gpu}
CTAS=${2:-"64 96 128 132"}
source "$(dirname "$0")/../env.sh"
for c in default $CTAS; do
  mkdir -p "$OUT/ctas-$c"
  if [ "$c" = default ]; then unset WEFT_COLL_CTAS; else export WEFT_COLL_CTAS=$c; fi
  timeout 100 "$BIN/weft" bench collectives --only all_reduce --out "$OUT/ctas-$c" > "$OUT/ctas-$c/bench.log" 2>&1
done
unset WEFT_COLL_CTAS
python3 - "$OUT" $CTAS <<'PY'
import json, glob, sys, collections
out = sys.argv[1]
print(f"{'KiB':>6} {'nccl':>7}", *[f"{c:>9}" for c in ['default'] + sys.argv[2:]])
for method in ('ll', 'll128'):
    print(method)
    rows = collections.defaultdict(dict)
    for c in ['default'] + sys.argv[2:]:
        f = glob.glob(f"{out}/ctas-{c}/collectives-*.json")
        if not f: continue
        for p in json.load(open(f[0]))['points']:
            if p['coll'] != 'all_reduce' or p['bytes'] > (4 << 20): continue
            if p['method'] == 'nccl' and c == 'default': rows[p['bytes']]['nccl'] = p['median_us']
            if p['method'] == method: rows[p['bytes']][c] = p['median_us']
    for b in sorted(rows):
        r = rows[b]; n = r.get('nccl', 0)
        if len(r) < 2: continue
        print(f"{b>>10:>6} {n:7.2f}", *[f"{r.get(c,0):5.2f}/{r.get(c,0)/n if n else 0:.2f}" for c in ['default'] + sys.argv[2:]])
PY
