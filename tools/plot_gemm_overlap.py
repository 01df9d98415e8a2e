#!/usr/bin/env python3
"""Bar charts of `weft bench ag_gemm|gemm_rs|gemm_ar` JSON (one PNG per op), with PyTorch's
fused ops from bench/torch_symm_mem_peer.py's JSON beside them when given; for `weft bench
gemv_ar` JSON, time against M per (K, N), one panel each, with PyTorch's matmul + all_reduce
from bench/torch_gemv_ar_peer.py's JSON beside it when given.

  python3 tools/plot_gemm_overlap.py bench/results/ag_gemm-*.json [--torch bench/results/torch-*.json]
  python3 tools/plot_gemm_overlap.py bench/results/gemv_ar-*.json [--torch torch-gemv_ar-*.json]
Writes <json without .json>.png next to each input."""
import argparse
import json
import sys

try:
    import matplotlib
except ImportError:
    sys.exit(f"{sys.argv[0]}: matplotlib is missing: install it with `python3 -m pip install matplotlib`")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

METHODS = ["baseline", "gemm_only", "gemm_only_tuned", "gemm_only_weft", "decomposed", "fused", "auto"]
LABELS = {"baseline": "NCCL + cuBLAS", "gemm_only": "GEMM alone (cuBLAS)",
          "gemm_only_tuned": "GEMM alone (cuBLASLt tuned)", "gemm_only_weft": "GEMM alone (weft)",
          "decomposed": "weft decomposed",
          "fused": "weft fused", "auto": "weft auto", "torch": "PyTorch fused"}


GEMV_SERIES = ["baseline", "decomposed", "fused", "gemv_weft", "gemv_cublas", "roofline", "unfused_rmsnorm",
               "fused_rmsnorm"]
GEMV_LABELS = {"baseline": "cuBLAS + NCCL", "decomposed": "weft decomposed", "fused": "weft fused",
               "gemv_weft": "GEMV alone (weft)", "gemv_cublas": "GEMV alone (cuBLAS)",
               "roofline": "roofline (W bytes / HBM bandwidth)", "unfused_rmsnorm": "unfused + RMSNorm",
               "fused_rmsnorm": "weft fused + RMSNorm", "torch": "PyTorch matmul + all_reduce"}
GEMV_STYLE = {"roofline": ":", "gemv_weft": "--", "gemv_cublas": "--", "unfused_rmsnorm": "-.",
              "fused_rmsnorm": "-.", "torch": (0, (1, 1))}


def plot_gemv(path, j, torch_path):
    """One panel per (K, N): µs per call against M for each column."""
    torch_pts = {}
    if torch_path:
        for p in json.load(open(torch_path))["points"]:
            if p.get("torch"):
                torch_pts[(p["k"], p["n"], p["m"])] = p["torch"]
    shapes, times = [], {}
    for p in j["points"]:
        if (p["k"], p["n"]) not in shapes:
            shapes.append((p["k"], p["n"]))
        if p["median_us"] > 0:
            times[(p["k"], p["n"], p["m"], p["method"])] = p["median_us"]
    fig, axes = plt.subplots(1, len(shapes), figsize=(max(6.0, 4.2 * len(shapes)), 4), squeeze=False)
    for ax, (k, n) in zip(axes[0], shapes):
        ms = sorted({p["m"] for p in j["points"] if (p["k"], p["n"]) == (k, n)})
        for m_name in GEMV_SERIES + ["torch"]:
            if m_name == "torch":
                ys = [torch_pts.get((k, n, m)) for m in ms]
            else:
                ys = [times.get((k, n, m, m_name)) for m in ms]
            pts = [(m, y) for m, y in zip(ms, ys) if y]
            if pts:
                ax.plot([a for a, _ in pts], [b for _, b in pts], marker="o", markersize=3,
                        linestyle=GEMV_STYLE.get(m_name, "-"), label=GEMV_LABELS.get(m_name, m_name))
        ax.set_xscale("log", base=2)
        ax.set_xticks(ms)
        ax.set_xticklabels([str(m) for m in ms])
        ax.set_xlabel("M (tokens)")
        ax.set_title(f"K {k} x N {n}", fontsize=9)
        ax.set_ylim(bottom=0)
    axes[0][0].set_ylabel("µs per call (lower is better)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(f"gemv_ar on {j.get('device', '')} x{j.get('world', '')} ({j.get('dtype', '')})")
    out = path[:-5] + ".png"
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("wrote", out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+")
    ap.add_argument("--torch", default=None)
    args = ap.parse_args()
    torch_pts = {}
    if args.torch and json.load(open(args.torch)).get("bench") != "torch_gemv_ar_peer":
        for p in json.load(open(args.torch))["points"]:
            torch_pts[(p["op"], p["m"], p["k"], p["n"])] = p
    for path in args.results:
        j = json.load(open(path))
        if j.get("bench") == "gemv_ar":
            plot_gemv(path, j, args.torch)
            continue
        shapes, times = [], {}
        for p in j["points"]:
            key = (p["m"], p["k"], p["n"])
            if key not in shapes:
                shapes.append(key)
            times[(key, p["method"])] = p["median_us"]
        op = j["points"][0]["op"]
        series = [m for m in METHODS if any((s, m) in times for s in shapes)]
        if any((op, *s) in torch_pts for s in shapes):
            series.append("torch")
        fig, ax = plt.subplots(figsize=(10, 4.5))
        width = 0.8 / len(series)
        for i, m in enumerate(series):
            ys = []
            for s in shapes:
                if m == "torch":
                    tp = torch_pts.get((op, *s))
                    t = tp.get("torch_fused") if tp else None
                else:
                    t = times.get((s, m))
                # The faster GEMM alone (cuBLAS default or tuned) is the ceiling.
                base = min([t for t in (times.get((s, "gemm_only")), times.get((s, "gemm_only_tuned"))) if t],
                           default=None)
                ys.append(t / base if t and base else 0)
            ax.bar([x + i * width for x in range(len(shapes))], ys, width, label=LABELS.get(m, m))
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(shapes))])
        ax.set_xticklabels([f"{m}x{k}x{n}" for m, k, n in shapes])
        ax.set_ylabel("time / faster GEMM alone (lower is better)")
        ax.set_title(f"{op} on {j.get('device', '')} x{j.get('world', '')} ({j.get('dtype', '')})")
        ax.legend(fontsize=8)
        out = path[:-5] + ".png"
        fig.tight_layout()
        fig.savefig(out, dpi=110)
        print("wrote", out)


if __name__ == "__main__":
    main()
