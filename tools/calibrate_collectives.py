#!/usr/bin/env python3
"""Compares the cost model with measured collectives (`weft bench collectives` JSON).

For every point of weft's own methods (one-shot, two-shot, direct, ll) it writes a plan that does
what the op does (src/ops/collectives.cpp, include/weft/kernels/collective_algos.hpp), has the
C++ model predict it (`weft plan --file ... --ctas N [--entry-barrier]`, constants from
bench/constants/), and prints a markdown table of predicted vs measured time. Nothing here
computes a time: the numbers are the model's.

Usage: tools/calibrate_collectives.py WEFT RESULTS.json [--constants F] [--kib-per-cta 32]
           [--cap 64] [--one-shot-cap 32] [--wide-cap 128] [--check] [--keep-plans DIR] [--wide] [--fit]
       tools/calibrate_collectives.py WEFT --predict-world N [--wide-cap 128] [--constants F]
  WEFT: the built CLI (e.g. build-h1/weft). --kib-per-cta/--cap/--one-shot-cap/--wide-cap: the
  CTA rule of the build that was measured (ops::Collectives::ctas_for): one CTA per 32 KiB of
  the call, at most 64, one-shot 32; from commit 5950c90 (the 20261122 files) all-gather,
  all-to-all, reduce-scatter and two-shot take up to 128 from 32 MiB of call (--wide-cap 128;
  default: --cap, the rule of the 20261121 files); the first tuning, in the 4-rank file, was
  256 KiB per CTA. LL methods: one CTA per --ll-lines-per-cta lines (8 data bytes a line) of one
  peer's payload, 1..128 (8; 512 in the builds of the files up to 20261122-012048); LL128 (all-
  reduce): one CTA per 4 lines of 120 data bytes. --predict-world N: no measurement; print the model's
  time for every weft method at 8 KiB..256 MiB on N ranks (the sizes and methods the bench
  runs: one-shot up to 4 MiB, ll up to 1 MiB). --check: exit 1 when a point
  is outside 25%. --fit: instead of the table, solve the two fitted constants from their one
  measurement each (launch_us: reduce-scatter 8 KiB; cta_reduce_gbps: one-shot all-reduce
  4 MiB), each with every other constant as it is in the constants file, and print them.

How each method becomes a plan (per rank r, every peer p; bf16 rows of 16 bytes, so a size
of S bytes is S/16 rows; every chunk signals the rank that consumes it; no worker limit, so
only dependencies, the rank's link and its HBM order the work):
  reduce-scatter direct  push in[block p] -> p:stage[slot r]; copy in[block r] -> out; then
                         out += stage[slot q] for each peer q, after q's push has arrived.
  all-reduce one-shot    the same with the whole input: push in -> p:stage[slot r]; copy
                         in -> out; out += stage[slot q].
  all-reduce two-shot    push in[shard p] -> p:stage[slot r]; copy in[shard r] -> out; out[shard
                         r] += stage[slot q][shard r]; push out[shard r] -> p:stage[slot r]
                         [shard r]; p copies it to out[shard r].
  all-gather direct      entry barrier (the handshake); copy in -> out[block r], then push in
                         -> p:out[block r].
  all-to-all direct      entry barrier; copy in[block r] -> out[block r], then push in[block
                         p] -> p:out[block r].
  ll (all four)          no entry barrier, no signal chunk, no fence: push lines[payload p] ->
                         p:stage[slot r], where `lines` (elem=4) is the payload as 16-byte
                         lines of 8 data bytes, so the link carries 2 x the bytes; then the
                         receiver copies its own payload (in[block r] -> out[block r]) and,
                         after q's lines arrived, reduces (all-reduce, reduce-scatter:
                         out += stage[slot q]) or copies (all-gather, all-to-all: stage[slot
                         q] -> out[block q]) them. The flag rides in each line, so a line is
                         usable one signal_latency_us after it is written: these plans are
                         predicted with write_ack_us = 0 (a copy of the constants file with
                         that one key changed; `weft plan` has no per-plan switch for it).
                         Payload: the whole input (all-reduce, all-gather) or one block
                         (reduce-scatter, all-to-all).
Where the plan differs from the kernel (it cannot say more):
  - a plan reduce has one source (dst += src), so the kernel's one-pass sum of the world's
    slots becomes a copy of the rank's own part plus world-1 reduces. The copy has no
    dependencies and runs while the pushes are on the link; with 2 ranks there is one reduce
    (3 x bytes of traffic, as the kernel's 2 reads and 1 write); with more ranks each extra
    reduce re-reads the accumulator, which the kernel does not.
  - two-shot's kernel writes the sum to its output and to the peers' staging in one loop;
    the plan reduces first, then pushes, so the model does not overlap the two.
  - all-gather/all-to-all push first and copy afterwards; the plan copies first, then pushes
    (the copy signals the rank itself, the push its peer): the same sum of times.
  - ll: the staging is declared at the data's size (elem=2), so the receive side counts the
    data it sums or copies, not the 2 x bytes of lines it reads (the kernel reads 2x lines +
    1x own payload and writes 1x: 4x for a reduce, where the plan counts a 2x copy, which
    overlaps the push, plus a 3x reduce). The kernel's per-thread batches of polls are not
    modelled: a CTA's share of the lines streams at the per-CTA rates.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

COLS, ELEM = 8, 2  # 16-byte rows
ROW = COLS * ELEM


class Plan:
    def __init__(self, name, world):
        self.name, self.world = name, world
        self.tensors, self.signals, self.chunks = [], [], []
        self.next_signal = [0] * world

    def tensor(self, name, rows, role, total=False):
        self.tensors.append(f"tensor {name} {rows}x{COLS} {role} elem={ELEM}" + (" sum" if total else ""))

    def chunk(self, on, kind, src, dst, consumer, deps=()):
        """src, dst: (rank, tensor, row0, row1). Returns the chunk id."""
        cid = len(self.chunks)
        sig = self.next_signal[consumer]
        self.next_signal[consumer] += 1
        self.signals.append(f"signal {consumer}.{sig} expect 1")
        end = lambda e: f"{e[0]}:{e[1]}[{e[2]}:{e[3]},0:{COLS}]"
        line = f"on {on} chunk {cid} {kind} sm {end(src)} -> {end(dst)} signal {consumer}.{sig}+1"
        if deps:
            line += " deps " + ",".join(str(d) for d in deps)
        self.chunks.append(line)
        return cid

    def text(self):
        return "\n".join([f"plan {self.name}", f"world {self.world}"] + self.tensors + self.signals + self.chunks) + "\n"


def peers(r, w):
    return [(r + d) % w for d in range(1, w)]


def reduce_into_out(pl, r, w, own_src, stage_rows, out_rows, arrived):
    """copy own_src -> out, then out += stage[stage_rows(q)] for each peer q after arrived[q]."""
    prev = pl.chunk(r, "copy", own_src, (r, "out") + out_rows, r)
    for q in peers(r, w):
        prev = pl.chunk(r, "reduce", (r, "stage") + stage_rows(q), (r, "out") + out_rows, r, [prev, arrived[q]])
    return prev


def reduce_scatter(w, s):
    rows = s // ROW // w  # per block
    pl = Plan("weft.reduce_scatter.direct", w)
    pl.tensor("in", w * rows, "input")
    pl.tensor("stage", w * rows, "scratch")
    pl.tensor("out", rows, "output", total=True)
    push = {(r, p): pl.chunk(r, "push", (r, "in", p * rows, (p + 1) * rows), (p, "stage", r * rows, (r + 1) * rows), p)
            for r in range(w) for p in peers(r, w)}
    for r in range(w):
        reduce_into_out(pl, r, w, (r, "in", r * rows, (r + 1) * rows), lambda q: (q * rows, (q + 1) * rows),
                        (0, rows), {q: push[(q, r)] for q in peers(r, w)})
    return pl, rows, False


def one_shot(w, s):
    rows = s // ROW
    pl = Plan("weft.all_reduce.one_shot", w)
    pl.tensor("in", rows, "input")
    pl.tensor("stage", w * rows, "scratch")
    pl.tensor("out", rows, "output", total=True)
    push = {(r, p): pl.chunk(r, "push", (r, "in", 0, rows), (p, "stage", r * rows, (r + 1) * rows), p)
            for r in range(w) for p in peers(r, w)}
    for r in range(w):
        reduce_into_out(pl, r, w, (r, "in", 0, rows), lambda q: (q * rows, (q + 1) * rows), (0, rows),
                        {q: push[(q, r)] for q in peers(r, w)})
    return pl, rows, False


def two_shot(w, s):
    rows = s // ROW
    shard = rows // w
    sh = lambda j: (j * shard, (j + 1) * shard)
    pl = Plan("weft.all_reduce.two_shot", w)
    pl.tensor("in", rows, "input")
    pl.tensor("stage", w * rows, "scratch")  # slot q: rows [q*rows, (q+1)*rows)
    pl.tensor("out", rows, "output", total=True)
    slot = lambda q, j: (q * rows + sh(j)[0], q * rows + sh(j)[1])
    push = {(r, p): pl.chunk(r, "push", (r, "in") + sh(p), (p, "stage") + slot(r, p), p)
            for r in range(w) for p in peers(r, w)}
    summed = {r: reduce_into_out(pl, r, w, (r, "in") + sh(r), lambda q, r=r: slot(q, r), sh(r),
                                 {q: push[(q, r)] for q in peers(r, w)}) for r in range(w)}
    back = {(r, p): pl.chunk(r, "push", (r, "out") + sh(r), (p, "stage") + slot(r, r), p, [summed[r]])
            for r in range(w) for p in peers(r, w)}
    for p in range(w):
        for q in peers(p, w):
            pl.chunk(p, "copy", (p, "stage") + slot(q, q), (p, "out") + sh(q), p, [back[(q, p)]])
    return pl, rows, False


def direct_exchange(w, s, all_to_all):
    rows = s // ROW // w if all_to_all else s // ROW  # per block of the output
    pl = Plan("weft.all_to_all.direct" if all_to_all else "weft.all_gather.direct", w)
    pl.tensor("in", w * rows if all_to_all else rows, "input")
    pl.tensor("out", w * rows, "output")
    src = lambda r, p: (r, "in", p * rows, (p + 1) * rows) if all_to_all else (r, "in", 0, rows)
    for r in range(w):
        c = pl.chunk(r, "copy", src(r, r), (r, "out", r * rows, (r + 1) * rows), r)
        for p in peers(r, w):
            pl.chunk(r, "push", src(r, p), (p, "out", r * rows, (r + 1) * rows), p, [c])
    return pl, w * rows, True


def ll(w, s, coll):
    """The LL methods (ll_exchange): see the module docstring."""
    reduce = coll in ("all_reduce", "reduce_scatter")
    per_peer = coll in ("reduce_scatter", "all_to_all")  # a different block to every peer
    rows = s // ROW // w if per_peer else s // ROW  # one peer's payload
    nin = w * rows if per_peer else rows
    pl = Plan(f"weft.{coll}.ll", w)
    pl.tensor("in", nin, "input")
    pl.tensors.append(f"tensor lines {nin}x{COLS} input elem={2 * ELEM}")  # 16-byte lines, 8 data bytes each
    pl.tensor("stage", w * rows, "scratch")  # slot q: rows [q*rows, (q+1)*rows)
    out_rows = rows if reduce else w * rows
    pl.tensor("out", out_rows, "output", total=reduce)
    pay = lambda r, p: (p * rows, (p + 1) * rows) if per_peer else (0, rows)
    slot = lambda q: (q * rows, (q + 1) * rows)
    push = {(r, p): pl.chunk(r, "push", (r, "lines") + pay(r, p), (p, "stage") + slot(r), p)
            for r in range(w) for p in peers(r, w)}
    for r in range(w):
        arrived = {q: push[(q, r)] for q in peers(r, w)}
        if reduce:
            reduce_into_out(pl, r, w, (r, "in") + pay(r, r), slot, (0, rows), arrived)
        else:
            pl.chunk(r, "copy", (r, "in") + pay(r, r), (r, "out") + slot(r), r)
            for q in peers(r, w):
                pl.chunk(r, "copy", (r, "stage") + slot(q), (r, "out") + slot(q), r, [arrived[q]])
    return pl, out_rows, False


def ll128(w, s):
    """all-reduce LL128 (all_reduce_ll128): as ll, but a 128-byte line carries 120 data bytes,
    so the link carries 16/15 x the bytes: the lines tensor (and each staging slot) has
    ceil(16/15 x rows) rows of the data's width; the receiver sums the data rows of a slot."""
    rows = s // ROW
    lrows = -(-rows * 16 // 15)
    pl = Plan("weft.all_reduce.ll128", w)
    pl.tensor("in", rows, "input")
    pl.tensor("lines", lrows, "input")
    pl.tensor("stage", w * lrows, "scratch")  # slot q: rows [q*lrows, q*lrows + lrows)
    pl.tensor("out", rows, "output", total=True)
    push = {(r, p): pl.chunk(r, "push", (r, "lines", 0, lrows), (p, "stage", r * lrows, (r + 1) * lrows), p)
            for r in range(w) for p in peers(r, w)}
    for r in range(w):
        reduce_into_out(pl, r, w, (r, "in", 0, rows), lambda q: (q * lrows, q * lrows + rows), (0, rows),
                        {q: push[(q, r)] for q in peers(r, w)})
    return pl, rows, False


def ctas(call_bytes, per_cta, cap):
    """ops::Collectives::ctas_for: one CTA per `per_cta` bytes of the call, 1..cap."""
    return max(1, min(cap, -(-call_bytes // per_cta)))


LL_LINES_PER_CTA = [8]  # --ll-lines-per-cta


def ctas_ll(payload_bytes):
    """ops::Collectives::ctas_for for LL: one CTA per 8 lines of 8 data bytes (from the 20261122-0241 files;
    512 lines before: the files up to 20261122-012048), 1..128."""
    lines = -(-payload_bytes // 8)
    return max(1, min(128, -(-lines // LL_LINES_PER_CTA[0])))


def ctas_ll128(payload_bytes):
    """ops::Collectives::ctas_for for LL128: one CTA per 4 lines of 120 data bytes, 1..128."""
    return max(1, min(128, -(-(-(-payload_bytes // 120)) // 4)))


# (bench collective, method) -> (plan builder, CTA count for (size, world, caps), LL: no write ack).
# Sizes are the bench's: bytes of each rank's input. The non-LL rule sees the call's bytes
# (unit x elem in Collectives::instance: all-gather w x size, the others size); LL sees one
# peer's payload (all-reduce, all-gather: size; reduce-scatter, all-to-all: size / w).
def rule(call_bytes, cap, wide):
    def n(s, w, c):
        b = call_bytes(s, w)
        return ctas(b, c["per_cta"], c["wide_cap"] if wide and b >= 32 << 20 else c[cap])
    return n


METHODS = {
    ("reduce_scatter", "direct"): (reduce_scatter, rule(lambda s, w: s, "cap", True), False),
    ("all_reduce", "one-shot"): (one_shot, rule(lambda s, w: s, "one_shot_cap", False), False),
    ("all_reduce", "two-shot"): (two_shot, rule(lambda s, w: s, "cap", True), False),
    ("all_gather", "direct"): (lambda w, s: direct_exchange(w, s, False), rule(lambda s, w: w * s, "cap", True), False),
    ("all_to_all", "direct"): (lambda w, s: direct_exchange(w, s, True), rule(lambda s, w: s, "cap", True), False),
    ("reduce_scatter", "ll"): (lambda w, s: ll(w, s, "reduce_scatter"), lambda s, w, c: ctas_ll(s // w), True),
    ("all_reduce", "ll"): (lambda w, s: ll(w, s, "all_reduce"), lambda s, w, c: ctas_ll(s), True),
    ("all_gather", "ll"): (lambda w, s: ll(w, s, "all_gather"), lambda s, w, c: ctas_ll(s), True),
    ("all_to_all", "ll"): (lambda w, s: ll(w, s, "all_to_all"), lambda s, w, c: ctas_ll(s // w), True),
    ("all_reduce", "ll128"): (ll128, lambda s, w, c: ctas_ll128(s), True),
}


def no_ack_constants(path, plan_dir):
    """A copy of the constants with write_ack_us = 0 (LL: the flag rides in the line, no fence)."""
    c = json.load(open(path or default_constants()))
    c["write_ack_us"] = 0
    out = os.path.join(plan_dir, "constants-no-ack.json")
    json.dump(c, open(out, "w"))
    return out


def predict(weft, plan_text, path, n, entry_barrier, tile, constants):
    with open(path, "w") as f:
        f.write(plan_text)
    cmd = [weft, "plan", "--file", path, "--ctas", str(n), "--tile", str(tile)]
    if entry_barrier:
        cmd.append("--entry-barrier")
    if constants:
        cmd += ["--constants", constants]
    r = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"predicted on .*?: ([0-9.]+) us", r.stdout)
    if r.returncode != 0 or not m:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return float(m.group(1))


def default_constants():
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "constants", "h200x2.json")


def fit(a, run, caps, plan_dir):
    """Solves launch_us (reduce-scatter 8 KiB) and cta_reduce_gbps (one-shot 4 MiB) so that the
    model reproduces those two measurements; the two interact a little, so it alternates."""
    world = run["world"]
    meas = {(p["coll"], p["method"], p["bytes"]): p["median_us"] for p in run["points"]}
    consts = json.load(open(a.constants or default_constants()))
    path = os.path.join(plan_dir, "fit.json")

    def model(key, size, **override):
        c = dict(consts, **override)
        json.dump(c, open(path, "w"))
        build, n_ctas, _ = METHODS[key]
        pl, tile, barrier = build(world, size)
        n = n_ctas(size, world, caps)
        return predict(a.weft, pl.text(), os.path.join(plan_dir, "fit.plan"), n, barrier, tile, path)

    rs, os_ = (("reduce_scatter", "direct"), 8 << 10), (("all_reduce", "one-shot"), 4 << 20)
    for key, size in (rs, os_):
        if key + (size,) not in meas:
            sys.exit(f"--fit needs {key[0]} {key[1]} {size_name(size)} in {a.results}")
    for _ in range(4):
        consts["launch_us"] = round(meas[rs[0] + (rs[1],)] - model(*rs, launch_us=0), 3)
        lo, hi = 1.0, 1000.0  # GB/s per CTA; the prediction falls as the rate rises
        target = meas[os_[0] + (os_[1],)]
        for _ in range(40):
            mid = (lo * hi) ** 0.5
            lo, hi = (mid, hi) if model(*os_, cta_reduce_gbps=mid) > target else (lo, mid)
        consts["cta_reduce_gbps"] = round(mid, 2)
    print(f"launch_us = {consts['launch_us']} (reduce_scatter direct 8 KiB: {meas[rs[0] + (rs[1],)]:.2f} us measured)")
    print(f"cta_reduce_gbps = {consts['cta_reduce_gbps']} (all_reduce one-shot 4 MiB: {target:.2f} us measured)")
    return 0


def predict_world(a, caps, plan_dir):
    """The model's time of every weft method on N ranks, the bench's sizes and methods."""
    w = a.predict_world
    no_ack = no_ack_constants(a.constants, plan_dir)
    sizes = [8 << 10 << i for i in range(16)]  # 8 KiB .. 256 MiB
    runs = lambda key, b: (key[1] not in ("one-shot", "ll128") or b <= 4 << 20) and (key[1] != "ll" or b <= 1 << 20)
    keys = sorted(METHODS, key=lambda k: (["all_reduce", "reduce_scatter", "all_gather", "all_to_all"].index(k[0]),
                                          ["ll", "ll128", "one-shot", "two-shot", "direct"].index(k[1])))
    print(f"Predicted µs on {w} ranks (CTAs in brackets); size = each rank's input, bf16.")
    print()
    print("| size | " + " | ".join(f"{c} {m}" for c, m in keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for b in sizes:
        out = []
        for key in keys:
            if not runs(key, b):
                out.append("-")
                continue
            build, n_ctas, is_ll = METHODS[key]
            n = n_ctas(b, w, caps)
            pl, tile, barrier = build(w, b)
            path = os.path.join(plan_dir, f"{key[0]}.{key[1]}.{b}.plan")
            out.append(f"{predict(a.weft, pl.text(), path, n, barrier, tile, no_ack if is_ll else a.constants):.1f} ({n})")
        print(f"| {size_name(b)} | " + " | ".join(out) + " |")
    return 0


def size_name(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("weft")
    ap.add_argument("results", nargs="?", default="")
    ap.add_argument("--constants", default="", help="device constants (default: the CLI's, bench/constants/h200x2.json)")
    ap.add_argument("--kib-per-cta", type=int, default=32)
    ap.add_argument("--cap", type=int, default=64)
    ap.add_argument("--one-shot-cap", type=int, default=32)
    ap.add_argument("--wide-cap", type=int, default=0,
                    help="CTA cap of all-gather/all-to-all/reduce-scatter/two-shot from 32 MiB of call "
                         "(0: --cap; the build of the 20261122 files: 128)")
    ap.add_argument("--ll-lines-per-cta", type=int, default=8,
                    help="LL CTA rule of the build that was measured: lines per CTA (512 up to the 20261122-012048 file)")
    ap.add_argument("--predict-world", type=int, default=0,
                    help="no measurement: print the model's times for N ranks, 8 KiB..256 MiB")
    ap.add_argument("--check", action="store_true", help="exit 1 when a point is outside 25%%")
    ap.add_argument("--keep-plans", default="", help="write the generated plans into this folder")
    ap.add_argument("--wide", action="store_true",
                    help="one row per size, a column per method (measured / predicted (ratio), in us)")
    ap.add_argument("--fit", action="store_true", help="solve launch_us and cta_reduce_gbps from their measurements")
    a = ap.parse_args()
    LL_LINES_PER_CTA[0] = a.ll_lines_per_cta
    caps = {"cap": a.cap, "one_shot_cap": a.one_shot_cap, "wide_cap": a.wide_cap or a.cap,
            "per_cta": a.kib_per_cta << 10}
    plan_dir = a.keep_plans or tempfile.mkdtemp(prefix="weft-calibrate-")
    os.makedirs(plan_dir, exist_ok=True)
    if a.predict_world:
        try:
            return predict_world(a, caps, plan_dir)
        finally:
            if not a.keep_plans:
                shutil.rmtree(plan_dir)
    if not a.results:
        ap.error("RESULTS.json is required (or --predict-world N)")
    run = json.load(open(a.results))
    world = run["world"]
    if a.fit:
        try:
            return fit(a, run, caps, plan_dir)
        finally:
            if not a.keep_plans:
                shutil.rmtree(plan_dir)

    rows, outside = [], []
    no_ack = no_ack_constants(a.constants, plan_dir)
    for p in run["points"]:
        key = (p["coll"], p["method"])
        if key not in METHODS:
            continue
        build, n_ctas, is_ll = METHODS[key]
        n = n_ctas(p["bytes"], world, caps)
        pl, tile, barrier = build(world, p["bytes"])
        path = os.path.join(plan_dir, f"{p['coll']}.{p['method']}.{p['bytes']}.plan")
        pred = predict(a.weft, pl.text(), path, n, barrier, tile, no_ack if is_ll else a.constants)
        ratio = pred / p["median_us"]
        bad = abs(ratio - 1) > 0.25
        rows.append((p["coll"], p["method"], p["bytes"], n, p["median_us"], pred, ratio, bad))
        if bad:
            outside.append(rows[-1])
    if not a.keep_plans:
        shutil.rmtree(plan_dir)

    order = list(METHODS)
    rows.sort(key=lambda x: (order.index((x[0], x[1])), x[2]))
    if a.wide:  # one row per size, one column per method: "measured / predicted (ratio)"
        keys = [k for k in order if any((x[0], x[1]) == k for x in rows)]
        print("| size | " + " | ".join(f"{c} {m}" for c, m in keys) + " |")
        print("|---" * (len(keys) + 1) + "|")
        cell = {(x[0], x[1], x[2]): x for x in rows}
        for b in sorted({x[2] for x in rows}):
            out = []
            for c, m in keys:
                x = cell.get((c, m, b))
                out.append("-" if not x else f"{x[4]:.1f} / {x[5]:.1f} ({'**' if x[7] else ''}{x[6]:.2f}{'**' if x[7] else ''})")
            print(f"| {size_name(b)} | " + " | ".join(out) + " |")
    else:
        print("| collective | method | size | CTAs | measured µs | predicted µs | predicted/measured |")
        print("|---|---|---|---|---|---|---|")
        for c, m, b, n, meas, pred, ratio, bad in rows:
            print(f"| {c} | {m} | {size_name(b)} | {n} | {meas:.1f} | {pred:.1f} | {ratio:.2f}"
                  f"{' **outside 25%**' if bad else ''} |")
    print()
    ratios = [x[6] for x in rows]
    lo = min(rows, key=lambda x: x[6])
    hi = max(rows, key=lambda x: x[6])
    print(f"{len(rows) - len(outside)} of {len(rows)} points within 25% "
          f"(lowest {lo[6]:.2f}: {lo[0]} {lo[1]} {size_name(lo[2])}; highest {hi[6]:.2f}: {hi[0]} {hi[1]} "
          f"{size_name(hi[2])}; median {sorted(ratios)[len(ratios) // 2]:.2f}).")
    if outside:
        print("Outside 25%: " + ", ".join(f"{c} {m} {size_name(b)} ({r:.2f})" for c, m, b, _, _, _, r, _ in outside) + ".")
    return 1 if a.check and outside else 0


if __name__ == "__main__":
    sys.exit(main())
