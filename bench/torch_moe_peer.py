#!/usr/bin/env python3
"""The PyTorch peer of the MoE layer (issue 25; docs/moe.md): expert parallelism as a PyTorch
model runs it in eager mode, on the issue's shapes, E / world experts per rank, bf16:

  dispatch  sort the (token, slot) pairs by expert, exchange the per-expert counts
            (all_to_all_single, then .tolist(): the host must know the splits), move the rows
            (all_to_all_single with those splits) -- the rows arrive rank-major, expert-grouped
  experts   regroup the received rows expert-major, gate/up projection (torch._grouped_mm),
            SiLU(gate) * up, down projection (torch._grouped_mm), back to the received order
  combine   the rows back (all_to_all_single, splits reversed), un-sort, weighted sum over top-k
  layer     all three, back to back

Routing (--routing): `weft` (default) -- exactly `weft bench moe`'s: rank r's top_k distinct
uniform experts per token from the same seeded 64-bit LCG, weights 1/top_k; `logits` -- seeded
random router logits, top-k by value, softmax weights over the chosen k. Timing: eager calls between CUDA events after a barrier, warm-up first;
the median over --reps of the slowest rank's time (MAX all-reduce). Also the bytes of rows that
cross the link (rows sent to other ranks, both directions summed over ranks, / world) and the
bandwidth of dispatch and combine they give. Prints a table; writes JSON (--out).

Launch:  torchrun --nproc-per-node 2 bench/torch_moe_peer.py --out torch-moe-2r.json
"""
import argparse
import datetime
import json
import os
import statistics
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # multicast off on the device machine

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# name: (hidden, expert ffn, experts, top-k)
SHAPES = {
    "mixtral": (4096, 14336, 8, 2),
    "qwen3-30b-a3b": (2048, 768, 128, 8),
    "deepseek-v3-like": (7168, 2048, 64, 8),
}
TOKENS = [128, 4096]


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES), help="of: " + ", ".join(SHAPES))
    ap.add_argument("--tokens", default=",".join(str(t) for t in TOKENS), help="tokens per rank, comma-separated")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--routing", choices=("weft", "logits"), default="weft",
                    help="weft: weft bench moe's routing exactly; logits: a random router's top-k")
    ap.add_argument("--out", default=None, help="JSON path")
    a = ap.parse_args(argv)
    a.shapes = a.shapes.split(",")
    for s in a.shapes:
        if s not in SHAPES:
            ap.error(f"unknown shape {s}")
    a.tokens = [int(t) for t in a.tokens.split(",")]
    return a


GROUPED = {"how": "torch._grouped_mm" if hasattr(torch, "_grouped_mm") else "per-expert matmul"}


def grouped_mm(a, b_t, offs):
    """a [R, K] rows grouped by expert (offs: int32 cumulative ends), b_t [G, K, N] (a transposed
    view of nn.Linear-style [G, N, K] weights, as torchtitan passes them) -> [R, N]."""
    if GROUPED["how"] == "torch._grouped_mm":
        try:
            return torch._grouped_mm(a, b_t, offs=offs)
        except RuntimeError as e:  # say so in the results rather than stop
            GROUPED["how"] = f"per-expert matmul (torch._grouped_mm refused: {str(e).splitlines()[0][:120]})"
    out, start = [], 0
    for g, end in enumerate(offs.tolist()):
        out.append(a[start:end] @ b_t[g])
        start = end
    return torch.cat(out)


_M64 = (1 << 64) - 1


def weft_routing(rank, tokens, experts, k):
    """tools/weft/bench/moe_bench.cpp's routing(): top_k distinct uniform experts per token from
    a 64-bit LCG seeded by the rank (the same ids, in the same order)."""
    s = (0x9E3779B97F4A7C15 * (rank + 1)) & _M64
    ids = []
    for _ in range(tokens):
        row = []
        for _ in range(k):
            while True:
                s = (s * 6364136223846793005 + 1442695040888963407) & _M64
                e = (s >> 33) % experts
                if e not in row:
                    break
            row.append(e)
        ids.append(row)
    return ids


class Layer:
    def __init__(self, shape, tokens, world, rank, dev, routing="weft"):
        self.H, self.F, self.E, self.k = SHAPES[shape]
        self.T, self.world, self.rank, self.L = tokens, world, rank, SHAPES[shape][2] // world
        gen = torch.Generator(device=dev).manual_seed(11 + rank)
        bf = torch.bfloat16
        self.x = (torch.randn((self.T, self.H), generator=gen, device=dev) * 0.1).to(bf)
        logits = torch.randn((self.T, self.E), generator=gen, device=dev)
        top, self.ids = logits.topk(self.k, dim=1)
        self.w = torch.softmax(top, dim=1)
        if routing == "weft":
            self.ids = torch.tensor(weft_routing(rank, self.T, self.E, self.k), dtype=torch.int64,
                                    device=dev).view(self.T, self.k)
            self.w = torch.full((self.T, self.k), 1.0 / self.k, device=dev)
        scale = self.H ** -0.5
        # nn.Linear layout per expert: [out, in].
        self.w_gu = (torch.randn((self.L, 2 * self.F, self.H), generator=gen, device=dev) * scale).to(bf)
        self.w_down = (torch.randn((self.L, self.H, self.F), generator=gen, device=dev) * self.F ** -0.5).to(bf)

    def dispatch(self):
        k, L, world = self.k, self.L, self.world
        flat = self.ids.flatten()
        self.order = flat.argsort(stable=True)  # send order: by expert = by (rank, local expert)
        send = self.x[self.order // k]
        counts = torch.bincount(flat, minlength=self.E)
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts)  # [world src][L] for this rank's experts
        self.in_splits = counts.view(world, L).sum(1).tolist()
        self.recv_counts = recv_counts.view(world, L)
        self.out_splits = self.recv_counts.sum(1).tolist()
        self.recv = send.new_empty((sum(self.out_splits), self.H))
        dist.all_to_all_single(self.recv, send, self.out_splits, self.in_splits)
        return self.recv

    def experts(self):
        rc = self.recv_counts.flatten()  # chunk sizes, rank-major: chunk c = source * L + expert
        chunk = torch.repeat_interleave(torch.arange(rc.numel(), device=rc.device), rc,
                                        output_size=self.recv.shape[0])
        # Expert-major order of the received rows (by expert, then source; stable within a chunk).
        perm = ((chunk % self.L) * self.world + chunk // self.L).argsort(stable=True)
        offs = torch.cumsum(self.recv_counts.sum(0), 0).to(torch.int32)
        gu = grouped_mm(self.recv[perm], self.w_gu.transpose(-2, -1), offs)
        h = F.silu(gu[:, :self.F]) * gu[:, self.F:]
        ye = grouped_mm(h, self.w_down.transpose(-2, -1), offs)
        out = torch.empty_like(ye)
        out[perm] = ye
        self.out = out
        return out

    def combine(self):
        back = self.out.new_empty((self.T * self.k, self.H))
        dist.all_to_all_single(back, self.out, self.in_splits, self.out_splits)
        rows = torch.empty_like(back)
        rows[self.order] = back
        return (rows.view(self.T, self.k, self.H).float() * self.w[..., None]).sum(1).to(torch.bfloat16)

    def layer(self):
        self.dispatch()
        self.experts()
        return self.combine()

    def link_bytes(self):
        """Bytes of rows this rank sends to other ranks in one dispatch (combine: the same back)."""
        return sum(n for p, n in enumerate(self.in_splits) if p != self.rank) * self.H * 2


def timed(fn, reps, dev):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        dist.barrier()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        t = torch.tensor([e0.elapsed_time(e1) * 1000.0], device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times.append(t.item())
    return statistics.median(times)


def main(argv=None):
    args = parse_args(argv)
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    r, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    rows = []
    for shape in args.shapes:
        if SHAPES[shape][2] % world:
            continue
        for T in args.tokens:
            if r == 0:
                print(f"[peer] {shape} T={T}", file=sys.stderr, flush=True)
            lay = Layer(shape, T, world, r, dev, args.routing)
            lay.dispatch()  # the routing's splits; then identity experts: combine must give x back
            lay.out = lay.recv
            err = (lay.combine().float() - lay.x.float()).abs().max().item() if T else 0.0
            lay.layer()
            d = timed(lay.dispatch, args.reps, dev)
            ex = timed(lay.experts, args.reps, dev)
            c = timed(lay.combine, args.reps, dev)
            total = timed(lay.layer, args.reps, dev)
            nbytes = torch.tensor([lay.link_bytes()], device=dev, dtype=torch.float64)
            dist.all_reduce(nbytes)
            per_rank = nbytes.item() / world
            rows.append({"shape": shape, "hidden": lay.H, "ffn": lay.F, "experts": lay.E, "top_k": lay.k,
                         "tokens": T, "dispatch_us": d, "experts_us": ex, "combine_us": c, "layer_us": total,
                         "link_bytes_per_rank": per_rank,
                         "dispatch_gbps": per_rank / d / 1e3 if d else 0.0,
                         "combine_gbps": per_rank / c / 1e3 if c else 0.0,
                         "identity_roundtrip_max_err": err, "grouped_mm": GROUPED["how"]})
            del lay
            torch.cuda.empty_cache()
    if r == 0:
        print(f"PyTorch MoE layer (eager) on {torch.cuda.get_device_name()} x{world}, bf16; us, median of "
              f"{args.reps}, slowest rank; GB/s = row bytes crossing the link per rank / time")
        print(f"grouped GEMM: {GROUPED['how']}")
        print(f"{'shape':18} {'T':>5} {'dispatch':>9} {'experts':>9} {'combine':>9} {'layer':>9} {'disp GB/s':>9} "
              f"{'comb GB/s':>9} {'id err':>7}")
        for x in rows:
            print(f"{x['shape']:18} {x['tokens']:>5} {x['dispatch_us']:>9.1f} {x['experts_us']:>9.1f} "
                  f"{x['combine_us']:>9.1f} {x['layer_us']:>9.1f} {x['dispatch_gbps']:>9.1f} {x['combine_gbps']:>9.1f} "
              f"{x['identity_roundtrip_max_err']:>7.3f}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"bench": "torch_moe_peer", "device": torch.cuda.get_device_name(), "world": world,
                           "torch": torch.__version__, "date": datetime.datetime.now().isoformat(timespec="seconds"),
                           "reps": args.reps, "routing": args.routing, "rows": rows}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
