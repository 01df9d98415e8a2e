#!/usr/bin/env python3
"""Draws a Chrome-trace JSON as a PNG timeline: one lane per (rank, thread). Works on the
simulated timelines of `weft plan --trace` (tid 0 chunks, tid 1 tiles) and on traced runs
of the GEMM ops (`weft bench ag_gemm --trace-dir DIR`: cat "comm"/"compute", thread names
from the "M" metadata events: workers, streams, engines or SMs).
Usage: tools/plot_timeline.py trace.json out.png   (also: weft trace trace.json --png out.png)"""
import json
import sys

try:
    import matplotlib
except ImportError:
    sys.exit(f"{sys.argv[0]}: matplotlib is missing: install it with `python3 -m pip install matplotlib`")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def is_compute(e):
    if "cat" in e:
        return e["cat"] == "compute"
    return e.get("tid", 0) == 1


def main(src, dst):
    with open(src) as f:
        trace = json.load(f)
    all_events = trace["traceEvents"]
    events = [e for e in all_events if e.get("ph", "X") == "X"]
    names = {}
    for e in all_events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e["tid"])] = e.get("args", {}).get("name", "")
    lanes = sorted({(e["pid"], e["tid"]) for e in events})
    index = {lane: i for i, lane in enumerate(lanes)}
    fig, ax = plt.subplots(figsize=(12, 0.6 + 0.4 * len(lanes)))
    for e in events:
        y = index[(e["pid"], e["tid"])]
        color = "tab:orange" if is_compute(e) else "tab:blue"
        ax.barh(y, max(e["dur"], 1e-3), left=e["ts"], height=0.8, color=color, edgecolor="black", linewidth=0.2)

    def label(p, t):
        if (p, t) in names:
            return f"rank {p} {names[(p, t)]}"
        return f"rank {p} {'tiles' if t == 1 else 'chunks'}"

    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([label(p, t) for p, t in lanes], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("µs")
    title = src
    meta = trace.get("weft")
    if isinstance(meta, dict):
        title = " ".join(f"{k}={v}" for k, v in meta.items())
    ax.set_title(f"{title}  (orange: computation, blue: communication)", fontsize=9)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print("wrote", dst)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
