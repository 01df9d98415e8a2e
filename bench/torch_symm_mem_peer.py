#!/usr/bin/env python3
"""The PyTorch peer of `weft bench ag_gemm | gemm_rs`: PyTorch's symmetric-memory fused ops
side by side with NCCL + torch.matmul and torch.matmul alone, on the shapes of
docs/anchors.md (bf16, M x K x N):

  ag_gemm: A_shard [M/world, K], W [N, K] (torch linear layout), C = all_gather(A) @ W^T [M, N]
           - torch.ops.symm_mem.fused_all_gather_matmul(A_shard, [W^T], gather_dim=0, group_name)
           - baseline: dist.all_gather_into_tensor + torch.matmul
           - matmul alone: gathered A @ W^T (the overlap ceiling)
  gemm_rs: A [M, K/world], W [N, K/world], C = reduce_scatter(A @ W^T) [M/world, N]
           - torch.ops.symm_mem.fused_matmul_reduce_scatter(A, W^T, "sum", scatter_dim=0, group_name)
           - baseline: torch.matmul + dist.reduce_scatter_tensor
           - matmul alone: A @ W^T

Launch (2 GPUs):  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 torchrun --nproc-per-node 2 bench/torch_symm_mem_peer.py
Timing: CUDA events around `--iters` back-to-back eager calls after `--warmup` calls, ranks
lined up by a barrier before each repetition; the median over `--reps` repetitions of the
per-call time, the slowest rank's. Prints a table; writes JSON (--out).
"""
import argparse
import os
import sys

# Multicast (NVLS) can take the host's GPUs down on the device machine: keep it off.
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from peer_util import median_us, slowest, write_result  # noqa: E402

SHAPES = ["8192x8192x14336", "4096x8192x8192", "16384x8192x3584", "2048x4096x4096"]


def parse_shape(s):
    m, k, n = (int(x) for x in s.lower().split("x"))
    return m, k, n


def timed(fn, warmup, iters, reps):
    """Median per-call time in us on this rank (eager calls between two CUDA events)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()

    def run():
        for _ in range(iters):
            fn()

    return median_us(run, reps, iters)


def rel_err(x, ref):
    x, ref = x.float(), ref.float()
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


def bench_ag(m, k, n, group_name, args, world, rank):
    a_shard = torch.randn(m // world, k, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / (k**0.5)
    gathered = torch.empty(m, k, dtype=torch.bfloat16, device="cuda")
    out = {}

    def baseline():
        dist.all_gather_into_tensor(gathered, a_shard)
        return torch.matmul(gathered, w.t())

    def matmul_only():
        return torch.matmul(gathered, w.t())

    def fused():
        try:
            _, outs = torch.ops.symm_mem.fused_all_gather_matmul(a_shard, [w.t()], 0, group_name, return_A=False)
        except (TypeError, RuntimeError) as e:  # releases without return_A
            if "return_A" not in str(e):
                raise
            _, outs = torch.ops.symm_mem.fused_all_gather_matmul(a_shard, [w.t()], 0, group_name)
        return outs[0]

    ref = baseline()
    got = fused()
    out["check_rel_err"] = rel_err(got, ref)
    for name, fn in (("nccl+matmul", baseline), ("matmul_only", matmul_only), ("torch_fused", fused)):
        out[name] = slowest(timed(fn, args.warmup, args.iters, args.reps))
    return out


def bench_rs(m, k, n, group_name, args, world, rank):
    a = torch.randn(m, k // world, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(n, k // world, dtype=torch.bfloat16, device="cuda") / (k**0.5)
    c = torch.empty(m // world, n, dtype=torch.bfloat16, device="cuda")
    out = {}

    def baseline():
        partial = torch.matmul(a, w.t())
        dist.reduce_scatter_tensor(c, partial)
        return c

    def matmul_only():
        return torch.matmul(a, w.t())

    def fused():
        return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, w.t(), "sum", 0, group_name)

    ref = baseline().clone()
    got = fused()
    out["check_rel_err"] = rel_err(got, ref)
    for name, fn in (("nccl+matmul", baseline), ("matmul_only", matmul_only), ("torch_fused", fused)):
        out[name] = slowest(timed(fn, args.warmup, args.iters, args.reps))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default="ag_gemm,gemm_rs", help="ag_gemm, gemm_rs (comma-separated)")
    p.add_argument("--shapes", default=",".join(SHAPES), help="MxKxN,... (docs/anchors.md's four)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="2 warm-up calls, 3 calls x 3 repetitions")
    p.add_argument("--out", default="", help="JSON path (default bench/results/torch-symm-mem-<world>r-<stamp>.json)")
    args = p.parse_args()
    if args.quick:
        args.warmup, args.iters, args.reps = 2, 3, 3

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    world, rank = dist.get_world_size(), dist.get_rank()
    group_name = dist.group.WORLD.group_name
    import torch.distributed._symmetric_memory as symm_mem

    if hasattr(symm_mem, "enable_symm_mem_for_group"):
        symm_mem.enable_symm_mem_for_group(group_name)

    results = []
    for op in [o.strip() for o in args.ops.split(",") if o.strip()]:
        if op not in ("ag_gemm", "gemm_rs"):
            raise SystemExit(f"unknown op {op!r}: expected ag_gemm or gemm_rs")
        for shape in [s.strip() for s in args.shapes.split(",") if s.strip()]:
            m, k, n = parse_shape(shape)
            if m % world or (op == "gemm_rs" and k % world):
                raise SystemExit(f"{op} {shape}: M (and K for gemm_rs) must divide among {world} ranks")
            r = (bench_ag if op == "ag_gemm" else bench_rs)(m, k, n, group_name, args, world, rank)
            r.update({"op": op, "m": m, "k": k, "n": n})
            results.append(r)
            if rank == 0:
                print(f"[peer] {op} {shape}: " + ", ".join(f"{key} {r[key]:.1f} us" for key in
                                                          ("nccl+matmul", "matmul_only", "torch_fused")),
                      file=sys.stderr, flush=True)

    if rank == 0:
        print(f"PyTorch {torch.__version__}, {torch.cuda.get_device_name()} x {world}, bf16, W[N,K]; "
              "us per call (median, slowest rank)")
        print(f"{'op':<8} {'MxKxN':<18} {'nccl+matmul':>12} {'matmul only':>12} {'torch fused':>12} "
              f"{'fused/base':>10} {'rel err':>9}")
        for r in results:
            print(f"{r['op']:<8} {r['m']}x{r['k']}x{r['n']:<8} {r['nccl+matmul']:>12.1f} {r['matmul_only']:>12.1f} "
                  f"{r['torch_fused']:>12.1f} {r['torch_fused'] / r['nccl+matmul']:>10.2f} {r['check_rel_err']:>9.1e}")
        write_result(args.out, f"bench/results/torch-symm-mem-{world}r",
                     {"bench": "torch_symm_mem_peer", "torch": torch.__version__,
                      "device": torch.cuda.get_device_name(), "world": world, "dtype": "bf16", "b_layout": "nk",
                      "timing": f"eager, CUDA events around {args.iters} calls after {args.warmup} warm-up calls, "
                                f"median of {args.reps} repetitions, slowest rank",
                      "points": results})
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
