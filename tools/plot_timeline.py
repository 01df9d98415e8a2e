#!/usr/bin/env python3
"""Draws a Chrome-trace JSON written by `weft plan --trace` (or a traced run) as a PNG:
one lane per (rank, transfers|tiles). Usage: tools/plot_timeline.py trace.json out.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    with open(src) as f:
        events = json.load(f)["traceEvents"]
    lanes = sorted({(e["pid"], e["tid"]) for e in events})
    index = {lane: i for i, lane in enumerate(lanes)}
    fig, ax = plt.subplots(figsize=(10, 0.5 + 0.45 * len(lanes)))
    for e in events:
        y = index[(e["pid"], e["tid"])]
        color = "tab:orange" if e["tid"] == 1 else "tab:blue"
        ax.barh(y, max(e["dur"], 1e-3), left=e["ts"], height=0.8, color=color, edgecolor="black", linewidth=0.2)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"rank {p} {'tiles' if t == 1 else 'chunks'}" for p, t in lanes])
    ax.invert_yaxis()
    ax.set_xlabel("µs")
    ax.set_title(src)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print("wrote", dst)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
