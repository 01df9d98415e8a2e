#!/usr/bin/env python3
"""The cost model against recorded runs, and its predictions where no run exists.

For every `weft bench ag_gemm|gemm_rs|gemm_ar|gemv_ar` JSON given, each shape's measured
methods beside what the model that `auto` uses predicts for them now (`weft plan --op`, the
same C++ formulas and device constants), and what `auto` would pick now with the measured time
of that pick. With --predict-world W the same shapes are predicted on W ranks instead (no
measured column): the predictions to check when W GPUs are lent.

    tools/model_check.py build/weft bench/results/gemm_rs-nccl-8r-*.json
    tools/model_check.py build/weft --predict-world 8 bench/results/ag_gemm-nccl-4r-*.json

Markdown on stdout (or --out). The script computes no time itself: every prediction is the CLI's.
"""
import argparse
import json
import math
import re
import statistics
import subprocess
import sys

GEMM_OPS = ("ag_gemm", "gemm_rs", "gemm_ar")
LINE = re.compile(r"^\s+(baseline|decomposed|fused)\s+([0-9.]+) us(.*)$")


class Predictor:
    """`weft plan --op` for one shape, parsed; cached."""

    def __init__(self, weft, constants):
        self.weft, self.constants, self.cache = weft, constants, {}

    def __call__(self, op, world, m, k, n, chunks=0, epilogue=False):
        key = (op, world, m, k, n, chunks, epilogue)
        if key in self.cache:
            return self.cache[key]
        cmd = [self.weft, "plan", "--op", op, "--world", str(world), "--m", str(m), "--k", str(k), "--n", str(n)]
        if chunks:
            cmd += ["--chunks", str(chunks)]
        if epilogue:
            cmd += ["--epilogue"]
        if self.constants:
            cmd += ["--constants", self.constants]
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise SystemExit(f"model_check: {' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
        out = {}
        for line in r.stdout.splitlines():
            if g := LINE.match(line):
                out[g.group(1)] = float(g.group(2))
                if g.group(1) == "baseline" and (b := re.search(r"GEMM ([0-9.]+) \+ .* ([0-9.]+)\)", g.group(3))):
                    out["gemm"], out["comm"] = float(b.group(1)), float(b.group(2))
                if g.group(1) == "decomposed" and (c := re.search(r"\((\d+) chunks", g.group(3))):
                    out["chunks"] = int(c.group(1))
                if g.group(1) == "decomposed" and (f := re.search(r"fold: ([a-z ]+)\)", g.group(3))):
                    out["fold"] = f.group(1)
            elif line.startswith("auto: "):
                out["auto"] = line.split()[1]
        self.cache[key] = out
        return out


def fmt_us(x):
    return "-" if x is None or x <= 0 else f"{x:.1f}"


def cell(pred, meas):
    """'measured / predicted (ratio)' with ratio = predicted / measured."""
    if not pred or not meas or meas <= 0:
        return f"{fmt_us(meas)} / {fmt_us(pred)}"
    return f"{meas:.1f} / {pred:.1f} ({pred / meas:.2f})"


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def summary(name, ratios):
    if not ratios:
        return f"{name}: no points"
    inside = sum(1 for r in ratios if 0.75 <= r <= 1.25)
    return (f"{name}: {len(ratios)} points, predicted / measured median {statistics.median(ratios):.2f}, "
            f"{min(ratios):.2f} … {max(ratios):.2f}, {inside} within 25 %")


def header(*cells):
    """A Markdown table's header and rule."""
    return ["| " + " | ".join(cells) + " |", "|" + "---|" * len(cells)]


def closing(ratios, picks, measured, what=""):
    """The lines under a table: the ratios' summary and auto's against the baseline."""
    out = [""]
    if measured:
        out.append("Cells: measured / predicted µs (predicted / measured). " +
                   "; ".join(summary(n, r) for n, r in ratios.items() if r) + ".")
        if picks:
            out.append(f"`auto` now, measured / baseline: geometric mean {geomean(picks):.3f}, worst {max(picks):.3f}"
                       f"{what}.")
    elif picks:
        out.append(f"Predicted `auto` / baseline: geometric mean {geomean(picks):.3f}, worst {max(picks):.3f}.")
    return out


def group(points, keys):
    shapes = {}
    for p in points:
        shapes.setdefault(tuple(p[k] for k in keys), {})[p["method"]] = p
    return shapes


def gemm_file(d, predict, world_override):
    op, world = d["bench"], d["world"] if world_override is None else world_override
    out, ratios = [], {"GEMM alone": [], "baseline": [], "decomposed": [], "fused": []}
    picks = []
    if world_override is None:
        out += header("M×K×N", "GEMM alone", "baseline", "decomposed (chunks)", "fused", "auto now",
                      "auto now / baseline", "fastest measured")
    else:
        out += header("M×K×N", "GEMM alone", "NCCL", "baseline", "decomposed (chunks, fold)", "fused", "auto",
                      "auto / baseline")
    for (m, k, n), ms in sorted(group(d["points"], ("m", "k", "n")).items()):
        unaligned = op != "ag_gemm" and (k // world) % 8 != 0
        if world_override is not None:
            p = predict(op, world, m, k, n)
            auto_us = p.get(p.get("auto", "baseline"), p["baseline"])
            out.append(f"| {m}×{k}×{n}{' (K/rank unaligned)' if unaligned else ''} | {fmt_us(p.get('gemm'))} | "
                       f"{fmt_us(p.get('comm'))} | {fmt_us(p['baseline'])} | {fmt_us(p.get('decomposed'))} "
                       f"({p.get('chunks', '-')}{', ' + p['fold'] if p.get('fold') else ''}) | {fmt_us(p.get('fused'))} | "
                       f"{p.get('auto')} | "
                       f"{auto_us / p['baseline']:.2f} |")
            picks.append(auto_us / p["baseline"])
            continue
        meas = {meth: pt["median_us"] for meth, pt in ms.items() if pt.get("median_us", 0) > 0}
        dec_chunks = ms.get("decomposed", {}).get("chunks", 0)
        p = predict(op, world, m, k, n)
        pc = predict(op, world, m, k, n, chunks=dec_chunks) if dec_chunks else p
        g = meas.get("gemm_only")
        if not unaligned:
            for name, pr, me in (("GEMM alone", p.get("gemm"), g), ("baseline", p["baseline"], meas.get("baseline")),
                                 ("decomposed", pc.get("decomposed"), meas.get("decomposed")),
                                 ("fused", p.get("fused"), meas.get("fused"))):
                if pr and me:
                    ratios[name].append(pr / me)
        compared = {x: meas[x] for x in ("baseline", "decomposed", "fused") if x in meas}
        fastest = min(compared, key=compared.get) if compared else "-"
        pick = p.get("auto", "baseline")
        pick_us = meas.get(pick)
        note = ""
        if pick == "decomposed" and dec_chunks and p.get("chunks") != dec_chunks:
            note = f" (measured at {dec_chunks} chunks)"
        if pick == "decomposed" and p.get("fold"):
            note += f", fold {p['fold']}"
        vs_base = f"{pick_us / meas['baseline']:.2f}" if pick_us and meas.get("baseline") else "-"
        if pick_us and meas.get("baseline") and not unaligned:
            picks.append(pick_us / meas["baseline"])
        out.append(f"| {m}×{k}×{n}{' (K/rank unaligned: not modelled)' if unaligned else ''} | {cell(p.get('gemm'), g)} | "
                   f"{cell(p['baseline'], meas.get('baseline'))} | {cell(pc.get('decomposed'), meas.get('decomposed'))} "
                   f"({dec_chunks or '-'}) | {cell(p.get('fused'), meas.get('fused'))} | {pick}{note} | {vs_base} | "
                   f"{fastest} |")
    return out + closing(ratios, picks, world_override is None, f" ({len(picks)} aligned shapes)")


def gemv_file(d, predict, world_override):
    world = d["world"] if world_override is None else world_override
    out, ratios = [], {"baseline": [], "decomposed": [], "fused": [], "baseline + epilogue": [],
                       "fused + epilogue": []}
    if world_override is None:
        out += header("K×N", "M", "baseline", "decomposed", "fused", "baseline + epilogue", "fused + epilogue",
                      "auto now", "fastest measured")
    else:
        out += header("K×N", "M", "baseline", "decomposed", "fused", "auto", "auto / baseline")
    picks = []
    for (k, n, m), ms in sorted(group(d["points"], ("k", "n", "m")).items()):
        p = predict("gemv_ar", world, m, k, n)
        if world_override is not None:
            a = p.get(p["auto"], p["baseline"])
            picks.append(a / p["baseline"])
            out.append(f"| {k}×{n} | {m} | {fmt_us(p['baseline'])} | {fmt_us(p.get('decomposed'))} | "
                       f"{fmt_us(p.get('fused'))} | {p['auto']} | {a / p['baseline']:.2f} |")
            continue
        pe = predict("gemv_ar", world, m, k, n, epilogue=True)
        meas = {meth: pt["median_us"] for meth, pt in ms.items() if pt.get("median_us", 0) > 0}
        pairs = (("baseline", p["baseline"], meas.get("baseline")),
                 ("decomposed", p.get("decomposed"), meas.get("decomposed")),
                 ("fused", p.get("fused"), meas.get("fused")),
                 ("baseline + epilogue", pe["baseline"], meas.get("unfused_rmsnorm")),
                 ("fused + epilogue", pe.get("fused"), meas.get("fused_rmsnorm")))
        for name, pr, me in pairs:
            if pr and me:
                ratios[name].append(pr / me)
        compared = {x: meas[x] for x in ("baseline", "decomposed", "fused") if x in meas}
        fastest = min(compared, key=compared.get) if compared else "-"
        if meas.get(p["auto"]) and meas.get("baseline"):
            picks.append(meas[p["auto"]] / meas["baseline"])
        out.append(f"| {k}×{n} | {m} | " + " | ".join(cell(pr, me) for _, pr, me in pairs) +
                   f" | {p['auto']} | {fastest} |")
    return out + closing(ratios, picks, world_override is None)


def gemm_bench_file(d, predict):
    """`weft bench gemm`: cuBLAS's bf16 GEMM alone against the model's library GEMM (the
    baseline of ag_gemm on one rank is exactly plan::gemm_us)."""
    out = header("M×K×N", "cuBLAS measured", "predicted", "predicted / measured")
    ratios = []
    for p in sorted(d["points"], key=lambda p: (p["m"], p["k"], p["n"])):
        if p.get("impl") != "cublas" or p.get("dtype") != "bf16" or p.get("b_layout") != "nk":
            continue
        pr = predict("ag_gemm", 1, p["m"], p["k"], p["n"])["baseline"]
        ratios.append(pr / p["median_us"])
        out.append(f"| {p['m']}×{p['k']}×{p['n']} | {p['median_us']:.1f} | {pr:.1f} | {pr / p['median_us']:.2f} |")
    out += ["", summary("GEMM alone", ratios) + f"; mean |log error| "
            f"{statistics.mean(abs(math.log(r)) for r in ratios):.3f}." if ratios else "no cuBLAS bf16 points"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("weft", help="the weft CLI (any build: `weft plan` needs no GPU)")
    ap.add_argument("files", nargs="+", help="weft bench JSON files (ag_gemm, gemm_rs, gemm_ar, gemv_ar, gemm)")
    ap.add_argument("--constants", default="", help="device constants JSON (default: the CLI's)")
    ap.add_argument("--predict-world", type=int, default=None, help="predict the files' shapes on this many ranks")
    ap.add_argument("--out", default="", help="write the Markdown here instead of stdout")
    a = ap.parse_args()
    if a.predict_world is not None and a.predict_world < 1:
        ap.error(f"--predict-world {a.predict_world}: expected a positive rank count")
    predict = Predictor(a.weft, a.constants)
    lines = []
    for f in a.files:
        try:
            with open(f, encoding="utf-8") as fh:
                d = json.load(fh)
        except (OSError, json.JSONDecodeError) as e:
            raise SystemExit(f"model_check: {f}: {e}") from e
        bench = d.get("bench")
        if bench not in GEMM_OPS + ("gemv_ar", "gemm"):
            raise SystemExit(f"model_check: {f}: bench '{bench}': expected one of {', '.join(GEMM_OPS)}, gemv_ar, gemm")
        if bench == "gemm":
            if a.predict_world is not None:
                raise SystemExit(f"model_check: {f}: --predict-world: not for `weft bench gemm` files (one GPU)")
            lines += [f"### gemm (cuBLAS alone), {d.get('device', '?')}, {d.get('date', '?')} (`{f.split('/')[-1]}`)", ""]
            lines += gemm_bench_file(d, predict) + [""]
            continue
        world = d.get("world", 0)
        head = f"### {bench}, {world} × {d.get('device', '?')}, {d.get('date', '?')} (`{f.split('/')[-1]}`)"
        if a.predict_world is not None:
            head = f"### {bench} on {a.predict_world} ranks, predicted (shapes of `{f.split('/')[-1]}`)"
        lines += [head, ""]
        lines += (gemv_file if bench == "gemv_ar" else gemm_file)(d, predict, a.predict_world)
        lines.append("")
    text = "\n".join(lines)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
