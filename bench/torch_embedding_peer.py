#!/usr/bin/env python3
"""The PyTorch peer of `weft bench embedding_a2a` (issue 24; docs/embedding_a2a.md): DLRM's
embedding-bag lookups + all-to-all as PyTorch users run it -- tables model-parallel (global table
t on rank t % world, a rank's tables in increasing t), samples data-parallel (B a rank) -- on the
weft benchmark's workload exactly: 26 tables of --rows rows, bags of exactly pooling[t] indices
from weft's seeded 64-bit LCG (the same indices), offsets = arange(world * B + 1) * pooling[t],
sum pooling, no per-sample weights, weights torch.randn (seeded by t; --dtype), pooled rows fp32.

  lookup      every local table's nn.EmbeddingBag forward over the global batch -> [world * B, D]
  all_to_all  dist.all_to_all_single of the pooled rows alone: send [world * B, Dm] (Dm: the local
              dims' sum; rows rank-major) flat, input splits B * Dm, output splits B * D_s (D_s:
              source s's local dims' sum)
  path        the lookups, torch.cat along dim 1 -> send, the all-to-all, then the re-layout:
              source s's [B, D_s] blocks, torch.cat along dim 1 -> out [B, sum of all D], the
              tables in global order (rank 0's first: TorchRec's pooled layout)
  backward    what autograd and torch.optim.SGD run after the path for a grad_out [B, sum of all
              D] (fixed, seeded): the re-layout's and the all-to-all's transposes (each source's
              columns, torch.cat, all_to_all_single with the splits swapped), then every local
              table's nn.EmbeddingBag backward with sparse=True (aten._embedding_bag_backward on
              the forward's saved offset2bag and bag sizes, taken once) and SGD's sparse step
              (weight.add_(grad, alpha=-lr)); weft's bwd_fused does the same with lr in place

Shapes: `dlrm` -- MLPerf DLRM-DCNv2's 26 pooling factors, D = 128, every --batch; `sweep` -- 26
tables of one D (64, 128, 256) and one pooling (1, 10, 100), B = 4096. Also the HBM reference: a
1 GiB device-to-device copy on each GPU (read + write bytes / time). Lookup GB/s = row bytes read
(the busiest rank's) / lookup time. TorchRec (EmbeddingBagCollection, sharded table-wise) is
tried and, where it is not installed (it needs fbgemm_gpu), reported as skipped.

Timing: one CUDA graph per column of --per-graph back-to-back calls, replayed after a barrier
(ranks lined up) between CUDA events; a warm-up replay first; rounds interleave the columns; the
median over --reps rounds of the per-call time, the slowest rank's (MAX all-reduce). A column
whose capture fails on any rank is timed eagerly on every rank (the same events), and says so.
Checks: sampled bags against a direct sum of their rows, and the path's out against the senders'
pooled rows (per-block column sums, exchanged: exact). Prints a table; writes JSON (--out).

Launch:   torchrun --nproc-per-node 2 bench/torch_embedding_peer.py --out torch-embedding-2r.json
CPU check (no GPU, no torchrun): python3 bench/torch_embedding_peer.py --cpu-check -- worlds 2
and 3 on gloo, tiny tables: the path's out against a per-sample reference over every table.
"""
import argparse
import dataclasses
import datetime
import json
import os
import statistics
import sys

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # multicast off on the device machine

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

TABLES = 26
# MLPerf DLRM-DCNv2's 26 tables' pooling factors (multi-hot sizes), as weft's kDlrmPooling.
DLRM_POOLING = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
DLRM_DIM = 128
BATCHES = [2048, 4096, 16384, 65536]
SWEEP_DIMS, SWEEP_POOLING, SWEEP_BATCH = (64, 128, 256), (1, 10, 100), 4096
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
COLUMNS = ("lookup", "all_to_all", "path", "backward")
LR = 1e-6  # the backward column's SGD step (small: the tables barely move between columns)


@dataclasses.dataclass
class Case:
    name: str  # "dlrm B=4096", "sweep D=128 p=10"
    shape: str
    batch: int  # samples a rank owns
    dim: int
    pooling: list  # [TABLES]


def make_cases(shapes, batches):
    cases = []
    for sh in shapes:
        if sh == "dlrm":
            cases += [Case(f"dlrm B={b}", "dlrm", b, DLRM_DIM, list(DLRM_POOLING)) for b in batches]
        else:
            cases += [Case(f"sweep D={d} p={p}", "sweep", SWEEP_BATCH, d, [p] * TABLES)
                      for d in SWEEP_DIMS for p in SWEEP_POOLING]
    return cases


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="dlrm,sweep", help="of: dlrm, sweep")
    ap.add_argument("--batch", default=",".join(str(b) for b in BATCHES), help="dlrm: samples per GPU, comma-separated")
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of every table")
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="fp32", help="the weights' (pooled rows: fp32)")
    ap.add_argument("--per-graph", type=int, default=3, help="calls captured in one CUDA graph")
    ap.add_argument("--reps", type=int, default=10, help="timed replays of every column")
    ap.add_argument("--out", default=None, help="JSON path")
    ap.add_argument("--cpu-check", action="store_true", help="check the workload and path on CPU (gloo), then exit")
    a = ap.parse_args(argv)
    a.shapes = a.shapes.split(",")
    for s in a.shapes:
        if s not in ("dlrm", "sweep"):
            ap.error(f"unknown shape {s} (dlrm, sweep)")
    a.batch = [int(b) for b in a.batch.split(",")]
    return a


# ---- the workload (device-agnostic: the CPU check runs the same code) ----

_M64 = (1 << 64) - 1
_LCG_A, _LCG_C = 6364136223846793005, 1442695040888963407


def _i64(x):
    """x mod 2^64 as the int64 with those bits."""
    x &= _M64
    return x - (1 << 64) if x >> 63 else x


def bag_indices_py(t, n, rows):
    """tools/weft/bench/embedding_bench.cpp's bag_indices(): table t's n indices, plain Python."""
    s = (0x9E3779B97F4A7C15 * (t + 1)) & _M64
    out = []
    for _ in range(n):
        s = (s * _LCG_A + _LCG_C) & _M64
        out.append((s >> 33) % rows)
    return out


def bag_indices(t, n, rows, dev):
    """bag_indices_py, vectorised: the LCG's states s_1 .. s_n by doubling (s_{k+m} = a_m s_k + c_m,
    int64 arithmetic wrapping mod 2^64), then (s >> 33) % rows (bits 33..63: the shift masked
    to 31 bits, torch's >> being arithmetic)."""
    if n == 0:
        return torch.empty(0, dtype=torch.int64, device=dev)
    s0 = (0x9E3779B97F4A7C15 * (t + 1)) & _M64
    s = torch.tensor([_i64(s0 * _LCG_A + _LCG_C)], dtype=torch.int64, device=dev)
    a, c = _LCG_A, _LCG_C  # the jump of s.numel() steps
    while s.numel() < n:
        s = torch.cat([s, s * _i64(a) + _i64(c)])
        a, c = (a * a) & _M64, (a * c + c) & _M64
    return ((s[:n] >> 33) & 0x7FFFFFFF) % rows


def table_weight(t, rows, dim, dtype, dev):
    """Global table t's weights: torch.randn seeded by t (the same on any world), then dtype."""
    gen = torch.Generator(device=dev).manual_seed(1000 + t)
    return torch.randn((rows, dim), generator=gen, device=dev).to(dtype)


class Workload:
    """One rank's tables, bags and buffers for one case."""

    def __init__(self, case, world, rank, rows, weights, dev):
        """weights: global table -> its [rows, dim] weights, for this rank's tables."""
        self.case, self.world, self.rank, self.B = case, world, rank, case.batch
        self.local = [t for t in range(TABLES) if t % world == rank]
        self.dims_of = [sum(case.dim for t in range(TABLES) if t % world == s) for s in range(world)]
        self.dm, self.total = self.dims_of[rank], sum(self.dims_of)
        bags = world * self.B
        self.bags = nn.ModuleList(nn.EmbeddingBag.from_pretrained(weights[t], freeze=True, mode="sum",
                                                                  include_last_offset=True) for t in self.local)
        self.offsets = [torch.arange(bags + 1, dtype=torch.int64, device=dev) * case.pooling[t] for t in self.local]
        self.indices = [bag_indices(t, bags * case.pooling[t], rows, dev) for t in self.local]
        self.in_splits = [self.B * self.dm] * world
        self.out_splits = [self.B * d for d in self.dims_of]
        # The all-to-all alone: its own buffers (the path allocates its own, as PyTorch code does).
        self.a2a_send = torch.zeros(bags * self.dm, dtype=torch.float32, device=dev)
        self.a2a_recv = torch.empty(self.B * self.total, dtype=torch.float32, device=dev)
        esize = weights[self.local[0]].element_size() if self.local else 4
        self.lookup_bytes = sum(bags * case.pooling[t] * case.dim * esize for t in self.local)
        self.link_bytes = self.B * self.dm * 4 * (world - 1)  # pooled rows this rank sends to others

    def lookup(self):
        return [bag(idx, off) for bag, idx, off in zip(self.bags, self.indices, self.offsets)]

    def all_to_all(self):
        dist.all_to_all_single(self.a2a_recv, self.a2a_send, self.out_splits, self.in_splits)

    def relayout(self, recv):
        blocks = recv.split(self.out_splits)
        return torch.cat([blk.view(self.B, d) for blk, d in zip(blocks, self.dims_of)], dim=1)

    def path(self):
        send = torch.cat(self.lookup(), dim=1).float()  # [world * B, Dm], rank q's samples rows qB .. (q+1)B-1
        recv = send.new_empty(self.B * self.total)
        dist.all_to_all_single(recv, send.view(-1), self.out_splits, self.in_splits)
        return self.relayout(recv)

    def setup_backward(self, seed=7):
        """The forward's state autograd saves for nn.EmbeddingBag's backward (offset2bag, bag sizes,
        taken once), and a grad_out [B, total] of small seeded values."""
        self.saved = []
        for bag, idx, off in zip(self.bags, self.indices, self.offsets):
            _, o2b, size, most = torch.ops.aten._embedding_bag(bag.weight, idx, off, False, 0, True, None, True, -1)
            self.saved.append((o2b, size, most))
        gen = torch.Generator(device=self.a2a_send.device).manual_seed(seed + self.rank)
        self.grad_out = torch.randn((self.B, self.total), generator=gen, device=self.a2a_send.device) * 1e-3

    def sparse_grads(self):
        """The gradients autograd gives this rank's tables for grad_out: sparse, uncoalesced (as
        nn.EmbeddingBag(sparse=True)'s)."""
        cols = torch.cumsum(torch.tensor([0] + self.dims_of), 0).tolist()
        send = torch.cat([self.grad_out[:, cols[s]:cols[s + 1]].reshape(-1) for s in range(self.world)])
        recv = send.new_empty(self.world * self.B * self.dm)
        dist.all_to_all_single(recv, send, self.in_splits, self.out_splits)
        g = recv.view(self.world * self.B, self.dm)
        out, col = [], 0
        for bag, idx, off, (o2b, size, most) in zip(self.bags, self.indices, self.offsets, self.saved):
            d = bag.weight.shape[1]
            out.append(torch.ops.aten._embedding_bag_backward(g[:, col:col + d], idx, off, o2b, size, most,
                                                              bag.weight.shape[0], False, 0, True, None, -1))
            col += d
        return out

    def backward(self):
        for bag, grad in zip(self.bags, self.sparse_grads()):
            bag.weight.add_(grad, alpha=-LR)


def lookup_err(wl, pooled, per_table=8):
    """Max relative error of sampled bags (per_table a table) against a direct sum of their rows."""
    gen = torch.Generator().manual_seed(5)
    err = 0.0
    for bag, idx, row, t in zip(wl.bags, wl.indices, pooled, wl.local):
        p = wl.case.pooling[t]
        for g in torch.randint(0, wl.world * wl.B, (per_table,), generator=gen).tolist():
            want = bag.weight[idx[g * p:(g + 1) * p]].float().sum(0)
            e = (row[g].float() - want).abs().max() / want.abs().max().clamp_min(1e-6)
            err = max(err, e.item())
    return err


def transport_err(wl, out):
    """Max |difference| between the column sums (fp64) of each of out's source blocks and the same
    sums its sender took of the rows it sent, relative to the largest sum: the same contiguous
    [B, D_s] values summed by the same kernel, so 0 where the all-to-all and the re-layout moved
    every row where it belongs (a row out of place: ~1 / sqrt(B) or more)."""
    send = torch.cat(wl.lookup(), dim=1).float()
    dmax = max(wl.dims_of)
    mine = torch.zeros((wl.world, dmax), dtype=torch.float64, device=send.device)
    for q in range(wl.world):
        mine[q, :wl.dm] = send[q * wl.B:(q + 1) * wl.B].contiguous().double().sum(0)
    sums = [torch.empty_like(mine) for _ in range(wl.world)]
    dist.all_gather(sums, mine)
    err, col = 0.0, 0
    for s, d in enumerate(wl.dims_of):
        got, want = out[:, col:col + d].contiguous().double().sum(0), sums[s][wl.rank, :d]
        if d:
            err = max(err, ((got - want).abs().max() / want.abs().max().clamp_min(1e-12)).item())
        col += d
    return err


def torchrec_status():
    """(JSON value, why) for TorchRec: it is not timed here -- its sharded EmbeddingBagCollection needs
    fbgemm_gpu, which the device machine has not and cannot install (no network there, and the wheel
    is far larger than what travels with a run)."""
    try:
        import torchrec  # noqa: F401
    except Exception as e:  # noqa: BLE001 -- any failure to import means: not there
        return "not installed", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
    ver = getattr(torchrec, "__version__", "?")
    return f"installed {ver}, not timed", "this script times the plain PyTorch path only"


# ---- timing (CUDA graphs; the idiom of bench/torch_gemv_ar_peer.py) ----

def make_timer(fn, per_graph, stream):
    """A timer of one replay of a CUDA graph of per_graph calls of fn, or of per_graph eager calls
    where the capture fails on any rank (every rank then times eagerly: the same collectives).
    Returns (timer, graph or None, note or None)."""
    g, note = torch.cuda.CUDAGraph(), None
    with torch.cuda.stream(stream):
        fn()  # eager warm-up: NCCL's and the kernels' first-call set-up, outside the capture
    torch.cuda.synchronize()
    try:
        with torch.cuda.graph(g, stream=stream):
            for _ in range(per_graph):
                fn()
    except Exception as e:  # noqa: BLE001 -- reported in the table; timed eagerly instead
        note = f"capture failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"[:200]
    torch.cuda.synchronize()
    ok = torch.tensor([0 if note else 1], device=torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if not ok.item():
        g = None
        note = (note or "capture failed on another rank") + "; timed eagerly"
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def replay():
        dist.barrier()
        torch.cuda.synchronize()
        with torch.cuda.stream(stream):
            torch.cuda._sleep(200_000)  # the replay's launch lands before the GPU reaches it
            e0.record(stream)
            if g is not None:
                g.replay()
            else:
                for _ in range(per_graph):
                    fn()
            e1.record(stream)
        e1.synchronize()
        return e0.elapsed_time(e1) * 1e3 / per_graph

    return replay, g, note


def slowest(x, dev):
    t = torch.tensor([float(x)], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def copy_gbps(args, stream, dev):
    """A 1 GiB device-to-device copy (tensor.copy_) on this GPU: (read + write bytes) / time, GB/s."""
    n = 1 << 30
    x = torch.ones(n, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    replay, g, _ = make_timer(lambda: y.copy_(x), args.per_graph, stream)
    replay()
    us = statistics.median(replay() for _ in range(args.reps))
    del replay, g, x, y  # the caller empties the cache
    mine = torch.tensor([2.0 * n / (us * 1e3)], dtype=torch.float64, device=dev)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [v.item() for v in every]


def progress(rank, msg):
    if rank == 0:
        print(f"[peer] {msg}", file=sys.stderr, flush=True)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.cpu_check:
        return cpu_check()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    r, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    if world > TABLES:
        raise SystemExit(f"torch_embedding_peer: {world} ranks for {TABLES} tables: a rank would hold none")
    torchrec, why = torchrec_status()
    progress(r, f"TorchRec: skipped -- {torchrec} ({why})")
    stream = torch.cuda.Stream()
    dtype = DTYPES[args.dtype]
    progress(r, "HBM reference: a 1 GiB device copy")
    copies = copy_gbps(args, stream, dev)
    torch.cuda.empty_cache()
    points, weights, weights_dim = [], {}, None
    with torch.no_grad():
        for case in make_cases(args.shapes, args.batch):
            if weights_dim != case.dim:  # the tables of one D serve every case of that D
                weights = {}
                torch.cuda.empty_cache()
                progress(r, f"{case.name}: tables ({args.rows} x {case.dim}, {args.dtype})")
                weights = {t: table_weight(t, args.rows, case.dim, dtype, dev) for t in range(r, TABLES, world)}
                weights_dim = case.dim
            progress(r, f"{case.name}: bags")
            wl = Workload(case, world, r, args.rows, weights, dev)
            for t, idx in zip(wl.local, wl.indices):  # the vectorised LCG is weft's, on this device
                n = min(1000, idx.numel())
                if idx[:n].tolist() != bag_indices_py(t, n, args.rows):
                    raise SystemExit(f"torch_embedding_peer: table {t}'s indices differ from weft's LCG")
            progress(r, f"{case.name}: checks")
            l_err = lookup_err(wl, wl.lookup())
            a_err = transport_err(wl, wl.path())
            wl.setup_backward()
            progress(r, f"{case.name}: capture")
            timers, graphs, notes = {}, [], {}
            for col in COLUMNS:
                timers[col], g, note = make_timer(getattr(wl, col), args.per_graph, stream)
                graphs.append(g)
                if note:
                    notes[col] = note
            progress(r, f"{case.name}: timing")
            times = {c: [] for c in COLUMNS}
            for rep in range(-1, args.reps):
                for c in (COLUMNS if rep % 2 == 0 else COLUMNS[::-1]):
                    us = timers[c]()
                    if rep >= 0:
                        times[c].append(us)
            row = {"name": case.name, "shape": case.shape, "batch": case.batch, "dim": case.dim,
                   "pooling": case.pooling if case.shape == "dlrm" else case.pooling[0],
                   "pooling_mean": sum(case.pooling) / TABLES, "world": world}
            for c in COLUMNS:
                row[f"{c}_us"] = slowest(statistics.median(times[c]), dev)
            row["lookup_bytes"] = slowest(wl.lookup_bytes, dev)  # the busiest rank's
            row["lookup_gbps"] = row["lookup_bytes"] / (row["lookup_us"] * 1e3) if row["lookup_us"] else 0.0
            row["link_bytes"] = slowest(wl.link_bytes, dev)
            row["all_to_all_gbps"] = row["link_bytes"] / (row["all_to_all_us"] * 1e3) if row["all_to_all_us"] else 0.0
            row["lookup_err"] = slowest(l_err, dev)
            row["transport_err"] = slowest(a_err, dev)
            row["notes"] = notes
            points.append(row)
            del timers, graphs, wl
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        del weights
        torch.cuda.empty_cache()
    tol = 1e-4 if args.dtype == "fp32" else 1e-2
    bad = [p["name"] for p in points if p["lookup_err"] > tol or p["transport_err"] > 1e-9]
    if r == 0:
        name = torch.cuda.get_device_name()
        ref = min(copies)
        print(f"PyTorch embedding-bag lookups + all-to-all on {name} x{world}, {TABLES} tables of {args.rows} rows, "
              f"{args.dtype} weights, fp32 out, sum; us per call (CUDA graphs of {args.per_graph}, median of "
              f"{args.reps}, slowest rank)")
        print(f"HBM reference: 1 GiB device copy {ref:.0f} GB/s (read + write; slowest GPU; every GPU: "
              f"{', '.join(f'{c:.0f}' for c in copies)})")
        print(f"TorchRec: skipped -- {torchrec} ({why})")
        print(f"{'shape':<20} {'lookup':>9} {'a2a':>9} {'path':>9} {'backward':>9} {'lookup GB/s':>11} {'of copy':>7} "
              f"{'a2a GB/s':>8} {'check':>5}")
        for p in points:
            ok = "FAIL" if p["name"] in bad else "ok"
            print(f"{p['name']:<20} {p['lookup_us']:>9.1f} {p['all_to_all_us']:>9.1f} {p['path_us']:>9.1f} "
                  f"{p['backward_us']:>9.1f} {p['lookup_gbps']:>11.0f} {p['lookup_gbps'] / ref if ref else 0:>7.2f} "
                  f"{p['all_to_all_gbps']:>8.0f} {ok:>5}")
            for c, why_c in p["notes"].items():
                print(f"  note: {c}: {why_c}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"bench": "torch_embedding_peer", "device": name, "world": world, "torch": torch.__version__,
                           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                           "timing": f"CUDA graphs of {args.per_graph} calls, barrier before each replay, "
                                     f"interleaved rounds, median of {args.reps}, slowest rank",
                           "tables": TABLES, "rows": args.rows, "weight_dtype": args.dtype, "out_dtype": "fp32",
                           "pooling_mode": "sum", "indices": "weft's LCG (tools/weft/bench/embedding_bench.cpp)",
                           "copy_gbps": ref, "copy_gbps_per_gpu": copies, "torchrec": torchrec,
                           "torchrec_why": why, "lookup_tolerance": tol, "transport_tolerance": 1e-9,
                           "points": points}, f, indent=1)
            print("wrote", args.out)
    dist.barrier()
    dist.destroy_process_group()
    return 1 if bad else 0


# ---- the CPU check (gloo, tiny tables): the path against a per-sample reference ----

def _cpu_check_rank(rank, world, port, results):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dev, rows = torch.device("cpu"), 1000
    cases = [Case("dlrm B=5", "dlrm", 5, 8, list(DLRM_POOLING)), Case("sweep D=16 p=3", "sweep", 4, 16, [3] * TABLES),
             Case("sweep D=8 p=1 B=1", "sweep", 1, 8, [1] * TABLES)]
    fails = []
    with torch.no_grad():
        for t in (0, 20):  # the vectorised LCG against the plain one, every index
            n = world * 5 * DLRM_POOLING[t]
            if bag_indices(t, n, rows, dev).tolist() != bag_indices_py(t, n, rows):
                fails.append(f"table {t}: the vectorised LCG differs")
        for dname, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            tol = 1e-5 if dtype == torch.float32 else 1e-2
            for case in cases:
                every = {t: table_weight(t, rows, case.dim, dtype, dev) for t in range(TABLES)}
                wl = Workload(case, world, rank, rows, {t: every[t] for t in range(rank, TABLES, world)}, dev)
                out = wl.path()
                wl.all_to_all()
                # The reference: this rank's samples, every table in global order (rank 0's tables first).
                order = [t for s in range(world) for t in range(s, TABLES, world)]
                ref = torch.zeros((case.batch, case.dim * TABLES))
                for k, t in enumerate(order):
                    p = case.pooling[t]
                    idx = bag_indices(t, world * case.batch * p, rows, dev)
                    for b in range(case.batch):
                        g = rank * case.batch + b
                        ref[b, k * case.dim:(k + 1) * case.dim] = every[t][idx[g * p:(g + 1) * p]].float().sum(0)
                err = ((out - ref).abs().max() / ref.abs().max()).item()
                l_err, a_err = lookup_err(wl, wl.lookup()), transport_err(wl, out)
                if dtype == torch.float32:  # the backward column's gradients against autograd's, every table
                    wl.setup_backward()
                    want = {}
                    with torch.enable_grad():
                        for k, t in enumerate(order):
                            w = every[t].clone().requires_grad_(True)
                            p = case.pooling[t]
                            idx = bag_indices(t, world * case.batch * p, rows, dev)
                            pooled = nn.functional.embedding_bag(idx, w, torch.arange(world * case.batch + 1) * p,
                                                                 mode="sum", include_last_offset=True)
                            go = [torch.empty_like(wl.grad_out) for _ in range(world)]
                            dist.all_gather(go, wl.grad_out)
                            g = torch.cat([x[:, k * case.dim:(k + 1) * case.dim] for x in go])
                            want[t] = torch.autograd.grad(pooled, w, g)[0]
                    for t, got in zip(wl.local, wl.sparse_grads()):
                        e = (got.to_dense() - want[t]).abs().max().item()
                        if e > 1e-6:
                            fails.append(f"{label}: table {t}'s backward differs from autograd's by {e:.2e}")
                label = f"W={world} r={rank} {dname} {case.name}"
                if tuple(out.shape) != (case.batch, case.dim * TABLES) or out.dtype != torch.float32:
                    fails.append(f"{label}: out {tuple(out.shape)} {out.dtype}")
                if err > tol or l_err > tol or a_err > 1e-9:
                    fails.append(f"{label}: out err {err:.2e}, lookup err {l_err:.2e}, transport err {a_err:.2e}")
    results[rank] = fails
    dist.barrier()
    dist.destroy_process_group()


def cpu_check():
    import socket

    import torch.multiprocessing as mp

    status = 0
    for world in (2, 3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with mp.Manager() as m:
            results = m.dict()
            mp.spawn(_cpu_check_rank, args=(world, port, results), nprocs=world)
            fails = [f for r in range(world) for f in results.get(r, ["no result"])]
        for f in fails:
            print(f"[peer] cpu-check FAIL: {f}", file=sys.stderr)
        print(f"[peer] cpu-check world {world}: {'FAIL' if fails else 'ok'} (dlrm and sweep cases, fp32 and bf16; "
              "out against a per-sample reference, sampled bags, transport sums, the LCG)", file=sys.stderr)
        status |= bool(fails)
    return status


if __name__ == "__main__":
    sys.exit(main())
