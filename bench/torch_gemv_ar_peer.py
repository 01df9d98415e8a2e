#!/usr/bin/env python3
"""The PyTorch peer of `weft bench gemv_ar`: decode's row-parallel linear done by PyTorch, on the
same shapes (K total, N; M tokens; bf16; W [N, K/world] per rank), every column in a CUDA graph:

  matmul       x [M, K/world] @ W^T alone (torch.matmul: cuBLAS)
  all_reduce   dist.all_reduce of the [M, N] result alone (NCCL)
  torch        matmul + dist.all_reduce (what a PyTorch TP model runs for the layer)
  torch_norm   torch + the residual add + RMSNorm (the unfused sequence in PyTorch ops)
  weft_fused   torch.ops.weft.gemv_ar(x, w, "fused") and, as weft_fused_norm,
               torch.ops.weft.gemv_ar_rmsnorm(..., "fused"), in the same process (--no-weft: off)

Launch:  torchrun --nproc-per-node 2 bench/torch_gemv_ar_peer.py --out torch-gemv_ar-2r.json
Timing: one CUDA graph per column of `--per-graph` back-to-back calls, replayed after a barrier
(ranks lined up) between CUDA events; warm-up replay first; rounds interleave the columns; the
median over `--reps` rounds of the per-call time, the slowest rank's (MAX all-reduce). W is
rotated over copies totalling >= 160 MiB per rank, as the weft bench does (read from HBM).
Checks torch's and weft's results agree (bf16 tolerance). Prints a table; writes JSON (--out).
"""
import argparse
import datetime
import json
import math
import os
import statistics
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # multicast off on the device machine

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

SHAPES = [(4096, 4096), (14336, 4096), (8192, 8192), (28672, 8192)]  # (K total, N)
MS = [1, 8, 16, 64, 128]


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(f"{k}:{n}" for k, n in SHAPES), help="K:N,... (K total)")
    ap.add_argument("--ms", default=",".join(str(m) for m in MS), help="tokens per call, 1 ... 128")
    ap.add_argument("--per-graph", type=int, default=10)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--no-weft", action="store_true", help="PyTorch only (no torch.ops.weft columns)")
    ap.add_argument("--out", default=None, help="JSON path")
    a = ap.parse_args(argv)
    a.shapes = [tuple(int(v) for v in s.split(":")) for s in a.shapes.split(",")]
    a.ms = [int(m) for m in a.ms.split(",")]
    return a


def timed_graph(fn, per_graph, stream):
    """A CUDA graph of per_graph calls of fn(i) (i: the call's index), and a timer of one replay."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        fn(0)  # eager warm-up (NCCL's, cuBLAS's and weft's first-call setup)
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=stream):
            for i in range(per_graph):
                fn(i)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def replay():
        dist.barrier()
        torch.cuda.synchronize()
        with torch.cuda.stream(stream):
            torch.cuda._sleep(200_000)  # the replay's launch lands before the GPU reaches it
            e0.record(stream)
            g.replay()
            e1.record(stream)
        e1.synchronize()
        return e0.elapsed_time(e1) * 1e3 / per_graph

    return g, replay


def rel_err(got, want):
    return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6)).item()


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    r, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    use_weft = not args.no_weft
    if use_weft:
        import weft.torch as wt

        wt.init()
    stream = torch.cuda.Stream()
    bf = torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(1 + r)
    rows = []
    for k, n in args.shapes:
        kl = k // world
        w_bytes = n * kl * 2
        copies = max(1, min(args.per_graph, math.ceil(160 * 2**20 / w_bytes)))
        w0 = (torch.rand((n, kl), generator=gen, device=dev) * 2 - 1).to(bf)
        ws = [w0.clone() for _ in range(copies)]
        x_all = (torch.rand((max(args.ms), kl), generator=gen, device=dev) * 2 - 1).to(bf)
        gamma = (torch.rand((n,), device=dev, generator=torch.Generator(device=dev).manual_seed(7)) + 0.5).to(bf)
        if use_weft:
            wt.prepare("gemv_ar", x_all[:1], w0)
            wt.prepare("gemv_ar_rmsnorm", x_all[:1], w0, None, None, 1e-6)
        for m in args.ms:
            x = x_all[:m].contiguous()
            res = (torch.rand((m, n), device=dev, generator=torch.Generator(device=dev).manual_seed(9)) * 2 - 1).to(bf)
            y = torch.empty((m, n), dtype=bf, device=dev)
            y_ar = torch.zeros((m, n), dtype=bf, device=dev)
            outs = {}

            def mm(i):
                torch.matmul(x, ws[i % copies].t(), out=y)

            def ar(i):
                dist.all_reduce(y_ar)

            def both(i):
                yy = torch.matmul(x, ws[i % copies].t())
                dist.all_reduce(yy)
                outs["torch"] = yy

            def both_norm(i):
                yy = torch.matmul(x, ws[i % copies].t())
                dist.all_reduce(yy)
                ro = yy + res
                rf = ro.float()
                outs["torch_norm"] = ((rf * torch.rsqrt(rf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(bf) * gamma, ro)

            cols = {"matmul": mm, "all_reduce": ar, "torch": both, "torch_norm": both_norm}
            if use_weft:
                def wf(i):
                    outs["weft_fused"] = torch.ops.weft.gemv_ar(x, ws[i % copies], "fused", "")

                def wfn(i):
                    outs["weft_fused_norm"] = torch.ops.weft.gemv_ar_rmsnorm(x, ws[i % copies], res, gamma, 1e-6,
                                                                             "fused", "")

                cols.update({"weft_fused": wf, "weft_fused_norm": wfn})
            graphs, times, notes = {}, {c: [] for c in cols}, {}
            for c, fn in cols.items():
                try:
                    graphs[c] = timed_graph(fn, args.per_graph, stream)
                except Exception as e:  # noqa: BLE001 -- reported in the table, the rest still run
                    notes[c] = f"{type(e).__name__}: {e}"[:200]
            order = [c for c in cols if c in graphs]
            for rep in range(-1, args.reps):
                for c in (order if rep % 2 == 0 else order[::-1]):
                    us = graphs[c][1]()
                    if rep >= 0:
                        times[c].append(us)
            torch.cuda.synchronize()
            row = {"k": k, "n": n, "m": m, "world": world}
            for c in cols:
                t = torch.tensor([statistics.median(times[c]) if times[c] else 0.0], device=dev)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                row[c] = t.item() if c in graphs else None
            # The results agree (the graphs' last replay wrote them).
            if "weft_fused" in outs and "torch" in outs:
                row["err_weft_vs_torch"] = rel_err(outs["weft_fused"], outs["torch"])
            if "weft_fused_norm" in outs and "torch_norm" in outs:
                row["err_weft_norm_vs_torch"] = max(rel_err(a, b) for a, b in
                                                    zip(outs["weft_fused_norm"], outs["torch_norm"]))
            row["notes"] = notes
            rows.append(row)
            del graphs
            torch.cuda.synchronize()
        if use_weft:
            wt.world().release_ops()
        del ws
        torch.cuda.empty_cache()
    tol = 2e-2 * max(1.0, world / 2)
    bad = [row for row in rows if row.get("err_weft_vs_torch", 0) > tol or row.get("err_weft_norm_vs_torch", 0) > tol]
    if r == 0:
        hdr = f"{'KxNxM':<17} {'matmul':>8} {'allreduce':>10} {'torch':>8} {'torch+norm':>11} {'weft fused':>11} " \
              f"{'weft f+norm':>12} {'weft/torch':>11} {'max err':>8}"
        print(f"PyTorch peer of weft bench gemv_ar on {torch.cuda.get_device_name()} x{world}, bf16; us per call "
              "(CUDA graphs, median, slowest rank)")
        print(hdr)

        def cell(v):
            return f"{v:.1f}" if v else "-"

        for row in rows:
            ratio = f"{row['weft_fused'] / row['torch']:.2f}" if row.get("weft_fused") and row.get("torch") else "-"
            err = max(row.get("err_weft_vs_torch", -1), row.get("err_weft_norm_vs_torch", -1))
            print(f"{row['k']}x{row['n']}x{row['m']:<8} {cell(row['matmul']):>8} {cell(row['all_reduce']):>10} "
                  f"{cell(row['torch']):>8} {cell(row['torch_norm']):>11} {cell(row.get('weft_fused')):>11} "
                  f"{cell(row.get('weft_fused_norm')):>12} {ratio:>11} {(f'{err:.1e}' if err >= 0 else '-'):>8}")
            for c, why in row["notes"].items():
                print(f"  note: {c}: {why}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"bench": "torch_gemv_ar_peer", "device": torch.cuda.get_device_name(), "world": world,
                           "dtype": "bf16", "torch": torch.__version__,
                           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                           "timing": f"CUDA graphs of {args.per_graph} calls, barrier before each replay, interleaved "
                                     f"rounds, median of {args.reps}, slowest rank",
                           "tolerance": tol, "points": rows}, f, indent=1)
            print("wrote", args.out)
    if use_weft:
        wt.shutdown()
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
