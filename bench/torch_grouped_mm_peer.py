#!/usr/bin/env python3
"""The PyTorch peer of weft's grouped GEMM (issue 25; docs/moe.md "Grouped GEMM"): the experts'
two GEMMs of one rank of expert parallelism, by torch._grouped_mm, on one GPU, bf16:

  up    [rows, H] x W_up[e] ([2F, H], transposed)  for each of the rank's E / world experts
  down  [rows, F] x W_down[e] ([H, F], transposed)

Each local expert g receives T * top_k * world * (96 + (g * 37) % 64) // (E * 128) rows
(uniform routing's mean spread over 0.75 ... 1.24 of it by a fixed pattern): exactly the counts
of `weft bench moe`'s experts parts (tools/weft/bench/moe_bench.cpp, expert_rows). The rows are
contiguous, offs the groups' cumulative ends (int32), as torch._grouped_mm takes them.
Timing: a CUDA graph of 5 calls, replayed after warm-up, median of --reps replays (CUDA events).
Prints a table; writes JSON (--out).

Run:  python3 bench/torch_grouped_mm_peer.py --worlds 2,4 --out torch-grouped-mm.json
"""
import argparse
import datetime
import json
import statistics
import sys

import torch

# name: (hidden, expert ffn, experts, top-k)
SHAPES = {
    "mixtral": (4096, 14336, 8, 2),
    "qwen3-30b-a3b": (2048, 768, 128, 8),
    "deepseek-v3-like": (7168, 2048, 64, 8),
}


def expert_rows(tokens, top_k, world, experts, g):
    return tokens * top_k * world * (96 + (g * 37) % 64) // (experts * 128)


def time_graph(fn, reps):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(5):
            fn()
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    us = []
    for _ in range(reps):
        torch.cuda._sleep(100_000)  # the replay is enqueued before the GPU reaches it
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        us.append(e0.elapsed_time(e1) * 1e3 / 5)
    return statistics.median(us)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokens", default="128,4096")
    ap.add_argument("--worlds", default="2,4", help="the expert-parallel world sizes whose per-rank shapes to run")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    dev = torch.device("cuda")
    points = []
    print(f"torch._grouped_mm on {torch.cuda.get_device_name()} (torch {torch.__version__}), bf16; us (TFLOP/s)")
    print(f"{'shape':18} {'W':>2} {'T':>5} {'rows':>6} {'part':>5} {'us':>9} {'TFLOP/s':>8}")
    for name in a.shapes.split(","):
        H, F, E, k = SHAPES[name]
        for world in (int(w) for w in a.worlds.split(",")):
            L = E // world
            for T in (int(t) for t in a.tokens.split(",")):
                rows = [expert_rows(T, k, world, E, g) for g in range(L)]
                offs = torch.tensor(rows, device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)
                total = sum(rows)
                for part, K, N in (("up", H, 2 * F), ("down", F, H)):
                    x = torch.randn(total, K, device=dev, dtype=torch.bfloat16)
                    w = torch.randn(L, N, K, device=dev, dtype=torch.bfloat16) / K**0.5
                    wt = w.transpose(-2, -1)
                    out = torch._grouped_mm(x, wt, offs=offs)
                    # one expert checked against a plain matmul
                    g = max(range(L), key=lambda i: rows[i])
                    lo = sum(rows[:g])
                    ref = x[lo:lo + rows[g]].float() @ w[g].float().t()
                    err = (out[lo:lo + rows[g]].float() - ref).abs().max().item()
                    assert err <= 2e-2 * max(ref.abs().max().item(), 1e-3), f"{name} {part}: error {err}"
                    us = time_graph(lambda: torch._grouped_mm(x, wt, offs=offs), a.reps)
                    tf = 2.0 * total * K * N / (us * 1e6)
                    print(f"{name:18} {world:>2} {T:>5} {total:>6} {part:>5} {us:9.1f} {tf:8.0f}")
                    points.append(dict(shape=name, world=world, tokens=T, rows=total, part="experts-" + part,
                                       method="torch._grouped_mm", median_us=us, tflops=tf))
                    del x, w, wt, out
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(bench="grouped_mm_peer", device=torch.cuda.get_device_name(), torch=torch.__version__,
                           date=datetime.datetime.now().isoformat(timespec="seconds"),
                           timing="CUDA graph of 5 calls, median of the replays", points=points), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
