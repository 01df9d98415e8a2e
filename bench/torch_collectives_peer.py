#!/usr/bin/env python3
"""The PyTorch peer of `weft bench collectives`: torch.distributed's NCCL collectives on plain
tensors, and PyTorch's symmetric memory, on the same sizes (bf16, bytes = one rank's input, as
the weft bench counts them: the all-gather's output is world x that, the reduce-scatter's and
the all-to-all's input splits in world blocks). One symmetric-memory backend a process
(torch's set_backend is global), so one launch a mode:

  --symm none : torch_nccl only (dist.all_reduce / all_gather_into_tensor /
                reduce_scatter_tensor / all_to_all_single on plain tensors)
  --symm nccl : also torch_nccl_symm: the same calls on tensors from symm_mem.empty() with the
                NCCL backend (ncclMemAlloc'd, registered as symmetric windows: NCCL's symmetric
                kernels, weft bench's nccl_symm column's PyTorch equivalent)
  --symm cuda : also PyTorch's own symmetric-memory kernels where torch exposes one without
                multicast: symm_mem.one_shot_all_reduce_out, two_shot_all_reduce_out,
                reduce_scatter_out (no all-gather or all-to-all there without multicast or
                NVSHMEM)

Launch (2 GPUs):  torchrun --nproc-per-node 2 bench/torch_collectives_peer.py --symm nccl
Timing: each method's calls captured in a CUDA graph (`per` calls: 20 up to 1 MiB, 5 up to
16 MiB, else 2), replayed after a barrier, CUDA events around each replay; the median of the
replays, the slowest rank's (weft bench collectives' timing). Where a capture fails the method
is timed eagerly (the JSON says which). Every method's output is checked against torch_nccl's
(small integers: exact). Prints a table; writes JSON (--out).
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

COLLS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]


def sizes_default(quick):
    if quick:
        return [8 << 10, 256 << 10, 4 << 20, 64 << 20]
    out, s = [], 8 << 10
    while s <= 256 << 20:
        out.append(s)
        s *= 2
    return out


def timed(fn, nbytes, reps):
    """Median us per call of `fn` (CUDA-graph replays; eager where capture fails), this rank."""
    per = 20 if nbytes <= 1 << 20 else 5 if nbytes <= 16 << 20 else 2
    fn()  # first call: lazy state outside the capture
    torch.cuda.synchronize()
    mode = "graph"
    try:
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            with torch.cuda.graph(g, stream=s):
                for _ in range(per):
                    fn()
        torch.cuda.current_stream().wait_stream(s)
        run = g.replay
    except Exception as e:  # noqa: BLE001 -- a method that cannot be captured is timed eagerly
        mode = f"eager ({type(e).__name__})"
        torch.cuda.synchronize()

        def run():
            for _ in range(per):
                fn()

    run()
    torch.cuda.synchronize()
    return median_us(run, reps, per), mode


def same_everywhere(ok):
    t = torch.tensor([0 if ok else 1], dtype=torch.int32, device="cuda")
    dist.all_reduce(t)
    return int(t.item()) == 0


def filled(n, rank, alloc):
    x = alloc(n)
    x.copy_(((torch.arange(n, device="cuda") * 7 + rank) % 13 - 6).to(torch.bfloat16))
    return x


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--symm", choices=["none", "nccl", "cuda"], default="nccl")
    p.add_argument("--colls", default=",".join(COLLS), help="comma-separated: " + ", ".join(COLLS))
    p.add_argument("--sizes", default="", help="bytes a rank, comma-separated (default 8 KiB ... 256 MiB, x2)")
    p.add_argument("--quick", action="store_true", help="4 sizes, 3 replays each")
    p.add_argument("--out", default="", help="JSON path (default bench/results/torch-collectives-<symm>-<world>r-<stamp>.json)")
    args = p.parse_args()
    colls = [c.strip() for c in args.colls.split(",") if c.strip()]
    for c in colls:
        if c not in COLLS:
            raise SystemExit(f"unknown collective {c!r}: expected one of {', '.join(COLLS)}")
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()] or sizes_default(args.quick)

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    world, rank = dist.get_world_size(), dist.get_rank()
    group_name = dist.group.WORLD.group_name
    symm_mem = None
    if args.symm != "none":
        import torch.distributed._symmetric_memory as symm_mem

        if args.symm == "nccl":  # (CUDA is the default; torch 2.11 refuses to set it by name)
            symm_mem.set_backend("NCCL")

    def plain(n):
        return torch.empty(n, dtype=torch.bfloat16, device="cuda")

    def symmetric(n):
        t = symm_mem.empty(n, dtype=torch.bfloat16, device="cuda")
        symm_mem.rendezvous(t, group_name)
        return t

    def calls(coll, x, out):
        """(timed, check) calls of `coll` from x into out; the all-reduce in place on out (the
        timed calls' sums grow without bound; the check starts from x)."""
        if coll == "all_reduce":
            return (lambda: dist.all_reduce(out)), (lambda: (out.copy_(x), dist.all_reduce(out)))
        if coll == "all_gather":
            f = lambda: dist.all_gather_into_tensor(out, x)  # noqa: E731
        elif coll == "reduce_scatter":
            f = lambda: dist.reduce_scatter_tensor(out, x)  # noqa: E731
        else:
            f = lambda: dist.all_to_all_single(out, x)  # noqa: E731
        return f, f

    reps = 3 if args.quick else 15
    results = []
    for coll in colls:
        for nbytes in sizes:
            n = nbytes // 2
            if coll in ("reduce_scatter", "all_to_all") and n % world:
                continue
            out_n = n * world if coll == "all_gather" else n // world if coll == "reduce_scatter" else n
            methods = {}  # name: (timed call, checked call, its output)
            x = filled(n, rank, plain)
            ref = plain(out_n)
            methods["torch_nccl"] = (*calls(coll, x, ref), ref)
            if args.symm == "nccl" and coll != "all_to_all":
                # (weft's nccl_symm column leaves all-to-all out too: NCCL has no symmetric kernel for it.)
                xs, os_ = filled(n, rank, symmetric), symmetric(out_n)
                methods["torch_nccl_symm"] = (*calls(coll, xs, os_), os_)
            if args.symm == "cuda" and coll in ("all_reduce", "reduce_scatter"):
                xs = filled(n, rank, symmetric)
                if coll == "all_reduce":
                    o1, o2, w2 = plain(n), plain(n), filled(n, rank, symmetric)

                    def one(xs=xs, o1=o1):
                        return torch.ops.symm_mem.one_shot_all_reduce_out(xs, "sum", group_name, o1)

                    def two(w2=w2, o2=o2):  # its input is its scratch: the check refills it
                        return torch.ops.symm_mem.two_shot_all_reduce_out(w2, "sum", group_name, o2)

                    methods["torch_symm_one_shot"] = (one, one, o1)
                    methods["torch_symm_two_shot"] = (two, lambda xs=xs, w2=w2: (w2.copy_(xs), two()), o2)
                else:
                    o3 = plain(out_n)

                    def rs(xs=xs, o3=o3):
                        return torch.ops.symm_mem.reduce_scatter_out(xs, group_name, False, o3)

                    methods["torch_symm_reduce_scatter"] = (rs, rs, o3)
            point = {"coll": coll, "bytes": nbytes}
            expect = None
            for name, (fn, check, out) in methods.items():
                try:
                    us, mode = timed(fn, nbytes, reps)
                    check()
                    torch.cuda.synchronize()
                    if expect is None:
                        expect = out.clone()  # torch_nccl's, the reference
                    ok = bool(torch.equal(out, expect))
                except Exception as e:  # noqa: BLE001 -- recorded, the other methods go on
                    us, mode, ok = float("nan"), f"failed: {type(e).__name__}: {e}"[:200], False
                if not same_everywhere(ok) and not mode.startswith("failed"):
                    mode = "wrong result"
                worst = slowest(us if us == us else float("inf"))  # every rank joins, failed or not
                point[name] = None if worst == float("inf") else worst
                point[name + "_mode"] = mode
            results.append(point)
            if rank == 0:
                print(f"[peer] {coll} {nbytes >> 10} KiB: " + ", ".join(
                    f"{k} {point[k]:.1f} us" if point[k] is not None else f"{k} -" for k in methods),
                      file=sys.stderr, flush=True)

    if rank == 0:
        names = sorted({k for r in results for k in r if k.startswith("torch_") and not k.endswith("_mode")})
        print(f"PyTorch {torch.__version__}, {torch.cuda.get_device_name()} x {world}, bf16, symmetric memory "
              f"backend {args.symm}; us per call (CUDA-graph replays, median, slowest rank)")
        print(f"{'collective':<15} {'KiB':>8} " + " ".join(f"{n:>26}" for n in names))
        for r in results:
            cells = []
            for n in names:
                v = r.get(n)
                tag = "" if r.get(n + "_mode", "graph") == "graph" else " *"
                cells.append(f"{'-' if v is None else f'{v:.1f}'}{tag:>2}".rjust(26))
            print(f"{r['coll']:<15} {r['bytes'] >> 10:>8} " + " ".join(cells))
        print("(* not a CUDA-graph time, or a wrong result: the JSON's <method>_mode says which)")
        write_result(args.out, f"bench/results/torch-collectives-{args.symm}-{world}r",
                     {"bench": "torch_collectives_peer", "torch": torch.__version__,
                      "device": torch.cuda.get_device_name(), "world": world, "dtype": "bf16",
                      "symm_backend": args.symm,
                      "timing": "CUDA graphs of 20 / 5 / 2 calls (<= 1 MiB / <= 16 MiB / above), "
                                f"median of {reps} replays after a barrier, slowest rank",
                      "points": results})
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
