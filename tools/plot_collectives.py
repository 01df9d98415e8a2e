#!/usr/bin/env python3
"""Plots `weft bench collectives` JSON: time against size, weft's methods and NCCL, one PNG
per collective. Usage: tools/plot_collectives.py bench/results/collectives-nccl-2r-*.json"""
import json
import os
import sys

try:
    import matplotlib
except ImportError:
    sys.exit(f"{sys.argv[0]}: matplotlib is missing: install it with `python3 -m pip install matplotlib`")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(paths):
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        pts = run["points"]
        stem = os.path.splitext(path)[0]
        for coll in sorted({p["coll"] for p in pts}):
            fig, ax = plt.subplots(figsize=(7, 4.5))
            for method in sorted({p["method"] for p in pts if p["coll"] == coll}):
                rows = sorted((p["bytes"], p["median_us"]) for p in pts if p["coll"] == coll and p["method"] == method)
                nccl = {"nccl": ("NCCL", "k--"), "nccl_symm": ("NCCL, symmetric windows", "k:")}
                label, style = nccl.get(method, (f"weft {method}", "-o"))
                ax.plot([r[0] for r in rows], [r[1] for r in rows], style, label=label, markersize=3)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("bytes of each rank's input")
            ax.set_ylabel("time per call (µs, median, CUDA graphs)")
            ax.set_title(f"{coll}, {run['world']} × {run['device']}, {run['dtype']} ({run['date'][:10]})")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
            out = f"{stem}-{coll}.png"
            fig.tight_layout()
            fig.savefig(out, dpi=110)
            plt.close(fig)
            print("wrote", out)


if __name__ == "__main__":
    main(sys.argv[1:])
