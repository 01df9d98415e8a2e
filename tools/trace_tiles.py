#!/usr/bin/env python3
"""Per-tile view of a weft Chrome trace (weft bench --trace-dir): for each rank, when tiles
start and end, how long they take (by wave), and what else (chunks, copies) ran beside them.
Usage: python3 tools/trace_tiles.py TRACE.json [...]"""
import json
import statistics as st
import sys
from collections import defaultdict


def summarize(path):
    d = json.load(open(path))
    ev = [e for e in d["traceEvents"] if e.get("ph") == "X"]
    print(f"== {path}  meta={ {k: v for k, v in d.items() if k != 'traceEvents'} }")
    by_rank = defaultdict(list)
    for e in ev:
        by_rank[e["pid"]].append(e)
    for r, es in sorted(by_rank.items()):
        cats = defaultdict(list)
        for e in es:
            cats[e.get("cat")].append(e)
        t0 = min(e["ts"] for e in es)
        t1 = max(e["ts"] + e["dur"] for e in es)
        print(f" rank {r}: events {len(es)}, first start {t0:.1f}, last end {t1:.1f}, span {t1 - t0:.1f} us")
        for c, xs in sorted(cats.items()):
            xs.sort(key=lambda e: e["ts"])
            durs = [e["dur"] for e in xs]
            print(f"   {c}: {len(xs)}; start {xs[0]['ts']:.1f}..{xs[-1]['ts']:.1f}; end max "
                  f"{max(e['ts'] + e['dur'] for e in xs):.1f}; dur min/med/max {min(durs):.1f}/{st.median(durs):.1f}/{max(durs):.1f}")
            if c == "compute":
                # waves: tiles grouped by their order on each SM track
                per_sm = defaultdict(list)
                for e in xs:
                    per_sm[e["tid"]].append(e)
                nw = max(len(v) for v in per_sm.values())
                for w in range(nw):
                    wave = [v[w] for v in per_sm.values() if len(v) > w]
                    s = [e["ts"] for e in wave]
                    en = [e["ts"] + e["dur"] for e in wave]
                    ids = sorted(e["args"].get("id", -1) for e in wave)
                    print(f"     wave {w}: {len(wave)} tiles (ids {ids[0]}..{ids[-1]}), start {min(s):.1f}..{max(s):.1f},"
                          f" end {min(en):.1f}..{max(en):.1f}, dur med {st.median([e['dur'] for e in wave]):.1f}")
            else:
                for e in xs[:12]:
                    print(f"     {e['name']:<28} {e['ts']:8.1f} +{e['dur']:7.1f}  {e.get('tid')}")


for p in sys.argv[1:]:
    summarize(p)
