#!/usr/bin/env python3
"""Compares the cost model (`weft plan`, constants in bench/constants/) with measured
collectives (`weft bench collectives` JSON). Prints a markdown table of predicted vs
measured time for weft's own methods.
Usage: tools/calibrate_collectives.py build/weft bench/results/collectives-nccl-2r-*.json"""
import json
import re
import subprocess
import sys

COLS = 1024  # bf16 elements per row: 2 KiB rows
PLAN = {  # (bench collective, method) -> (plan collective, plan algo, rows from bytes and world)
    ("all_reduce", "one-shot"): ("all_reduce", "one-shot", lambda b, w: b // (2 * COLS)),
    ("all_reduce", "two-shot"): ("all_reduce", "two-shot", lambda b, w: b // (2 * COLS)),
    ("all_gather", "direct"): ("all_gather", "direct", lambda b, w: b // (2 * COLS)),
    ("reduce_scatter", "direct"): ("reduce_scatter", "direct", lambda b, w: b // (2 * COLS * w)),
    ("all_to_all", "direct"): ("all_to_all", "direct", lambda b, w: b // (2 * COLS * w)),
}


def predict(weft, coll, algo, world, rows):
    out = subprocess.run([weft, "plan", "--collective", coll, "--algo", algo, "--world", str(world), "--rows",
                          str(max(rows, 1)), "--cols", str(COLS), "--tile", str(max(rows, 1))],
                         check=True, capture_output=True, text=True).stdout
    return float(re.search(r"predicted on .*?: ([0-9.]+) us", out).group(1))


def main(weft, path):
    run = json.load(open(path))
    world = run["world"]
    print(f"| collective | method | size | measured µs | predicted µs | predicted/measured |")
    print("|---|---|---|---|---|---|")
    for p in run["points"]:
        key = (p["coll"], p["method"])
        if key not in PLAN:
            continue
        coll, algo, rows = PLAN[key]
        pred = predict(weft, coll, algo, world, rows(p["bytes"], world))
        size = f"{p['bytes'] >> 20} MiB" if p["bytes"] >= 1 << 20 else f"{p['bytes'] >> 10} KiB"
        print(f"| {p['coll']} | {p['method']} | {size} | {p['median_us']:.1f} | {pred:.1f} | {pred / p['median_us']:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
