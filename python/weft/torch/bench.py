"""Benchmarks of weft's PyTorch layer against PyTorch's own tensor parallelism.

    torchrun --nproc-per-node 2 -m weft.torch.bench mlp [--quick] [--out DIR]

`mlp`: a Llama-style sequence-parallel MLP block, bf16, per rank:
    x [S/world, H] -> gate/up (one fused [2F/world, H] weight, all-gather + GEMM) -> SiLU(gate) * up
    -> down ([H, F/world], GEMM + reduce-scatter) -> y [S/world, H]
forward, and forward + backward, with three implementations side by side:
  weft       weft.torch.nn.ColumnParallelLinear / RowParallelLinear (ag_gemm, gemm_rs; their backward)
  eager      PyTorch eager + NCCL: all_gather_into_tensor, matmul; matmul, reduce_scatter_tensor
  async_tp   PyTorch's async TP: torch.ops.symm_mem.fused_all_gather_matmul /
             fused_matmul_reduce_scatter (symmetric memory), "unavailable" where this torch lacks them
  compute    the bound: the same GEMMs on local tensors of the gathered shapes, no communication
Shapes: hidden/ffn 8192/28672 and 4096/14336, S = 4096 and 16384 tokens (--quick on CPU: tiny).
Every implementation's outputs (and, with backward, the gradients of x and the weights) are
checked against eager's. Times: CUDA events around each call, calls of the implementations
interleaved, warm-up first, the median of --iters per rank, the slowest rank's reported. JSON
(+ a PNG where matplotlib is present) to --out, default $XDG_DATA_HOME/weft/results (as the CLI).
On CPU (gloo, the host backend) it runs as a smoke test: times are CPU figures, not performance.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import weft.torch as wt

FULL_SHAPES = [(8192, 28672), (4096, 14336)]  # (hidden, ffn)
FULL_SEQS = [4096, 16384]
QUICK_SHAPES = [(64, 128)]
QUICK_SEQS = [64]


# ---- the three implementations ------------------------------------------------------------------

class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        n = dist.get_world_size(group)
        out = x.new_empty((x.shape[0] * n,) + tuple(x.shape[1:]))
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, g):
        n = dist.get_world_size(ctx.group)
        out = g.new_empty((g.shape[0] // n,) + tuple(g.shape[1:]))
        dist.reduce_scatter_tensor(out, g.contiguous(), group=ctx.group)
        return out, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        n = dist.get_world_size(group)
        out = x.new_empty((x.shape[0] // n,) + tuple(x.shape[1:]))
        dist.reduce_scatter_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, g):
        n = dist.get_world_size(ctx.group)
        out = g.new_empty((g.shape[0] * n,) + tuple(g.shape[1:]))
        dist.all_gather_into_tensor(out, g.contiguous(), group=ctx.group)
        return out, None


def _swiglu(h, f_local):
    return torch.nn.functional.silu(h[:, :f_local]) * h[:, f_local:]


class EagerMLP:
    name = "eager"

    def __init__(self, w_gu, w_down, group):
        self.w_gu, self.w_down, self.group = w_gu, w_down, group
        self.weights = (w_gu, w_down)

    def __call__(self, x):
        h = _AllGather.apply(x, self.group) @ self.w_gu.t()
        return _ReduceScatter.apply(_swiglu(h, self.w_down.shape[1]) @ self.w_down.t(), self.group)


class _AgMatmulSymm(torch.autograd.Function):
    """all_gather(x) · wᵀ with PyTorch's fused op; backward: the fused matmul + reduce-scatter for
    dx, the gathered x (returned by the forward) for dw."""

    @staticmethod
    def forward(ctx, x, w, group_name):
        x_full, (y,) = torch.ops.symm_mem.fused_all_gather_matmul(x.contiguous(), [w.t()], 0, group_name)
        ctx.save_for_backward(x_full, w)
        ctx.group_name = group_name
        return y

    @staticmethod
    def backward(ctx, g):
        x_full, w = ctx.saved_tensors
        g = g.contiguous()
        dx = torch.ops.symm_mem.fused_matmul_reduce_scatter(g, w, "sum", 0, ctx.group_name)
        return dx, g.t() @ x_full, None


class _MatmulRsSymm(torch.autograd.Function):
    """reduce_scatter(x · wᵀ) with PyTorch's fused op; backward: the fused all-gather + matmul for
    dx, whose gathered gradient also gives dw."""

    @staticmethod
    def forward(ctx, x, w, group_name):
        x = x.contiguous()
        ctx.save_for_backward(x, w)
        ctx.group_name = group_name
        return torch.ops.symm_mem.fused_matmul_reduce_scatter(x, w.t(), "sum", 0, group_name)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        g_full, (dx,) = torch.ops.symm_mem.fused_all_gather_matmul(g.contiguous(), [w], 0, ctx.group_name)
        return dx, g_full.t() @ x, None


class AsyncTpMLP:
    name = "async_tp"

    def __init__(self, w_gu, w_down, group):
        self.w_gu, self.w_down = w_gu, w_down
        self.weights = (w_gu, w_down)
        self.group_name = (group or dist.group.WORLD).group_name

    def __call__(self, x):
        h = _AgMatmulSymm.apply(x, self.w_gu, self.group_name)
        return _MatmulRsSymm.apply(_swiglu(h, self.w_down.shape[1]), self.w_down, self.group_name)


def async_tp_unavailable(device):
    """Why PyTorch's async TP cannot run here, or None."""
    if device.type != "cuda":
        return "needs CUDA"
    try:  # registers the torch.ops.symm_mem ops
        import torch.distributed._symmetric_memory as symm_mem  # noqa: F401
    except ImportError as e:
        return f"torch.distributed._symmetric_memory: {e}"
    ops = getattr(torch.ops, "symm_mem", None)
    for name in ("fused_all_gather_matmul", "fused_matmul_reduce_scatter"):
        if ops is None or not hasattr(ops, name):
            return f"torch.ops.symm_mem.{name} is missing in torch {torch.__version__}"
    return None


def enable_async_tp(group):
    import torch.distributed._symmetric_memory as symm_mem

    if hasattr(symm_mem, "enable_symm_mem_for_group"):  # newer torch enables it on first use
        symm_mem.enable_symm_mem_for_group((group or dist.group.WORLD).group_name)


class ComputeOnlyMLP:
    """The bound: the same GEMMs and SwiGLU on local tensors of the gathered shapes, no
    communication at all (the all-gather's output and the reduce-scatter's input stand in,
    never exchanged). No implementation that communicates can beat it; eager's time minus this
    is what overlap can hide. Not checked against eager (its result is not the block's)."""

    name = "compute"
    checked = False

    def __init__(self, w_gu, w_down, group):
        n = dist.get_world_size(group)
        self.w_gu, self.w_down = w_gu, w_down
        self.weights = (w_gu, w_down)
        self.n = n
        self.x_full = None

    def __call__(self, x):
        if self.x_full is None or self.x_full.shape[0] != x.shape[0] * self.n:
            self.x_full = x.detach().repeat(self.n, 1).requires_grad_(x.requires_grad)
        y_full = _swiglu(self.x_full @ self.w_gu.t(), self.w_down.shape[1]) @ self.w_down.t()
        return y_full[: x.shape[0]]


class WeftMLP:
    name = "weft"

    def __init__(self, w_gu, w_down, group):
        h, f_local = w_gu.shape[1], w_down.shape[1]
        n = dist.get_world_size(group)
        kw = dict(group=group, dtype=w_gu.dtype, device=w_gu.device)
        self.gate_up = wt.nn.ColumnParallelLinear(h, 2 * f_local * n, **kw)
        self.down = wt.nn.RowParallelLinear(f_local * n, h, reduce="scatter", **kw)
        # The same shards as the other implementations (parameters sharing their storage).
        self.gate_up.weight = torch.nn.Parameter(w_gu.detach())
        self.down.weight = torch.nn.Parameter(w_down.detach())
        self.weights = (self.gate_up.weight, self.down.weight)
        self.f_local = f_local

    def __call__(self, x):
        return self.down(_swiglu(self.gate_up(x), self.f_local))


# ---- timing ---------------------------------------------------------------------------------------

class Timer:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def time_ms(self, fn):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3


def _rel_err(got, want):
    want = want.float()
    scale = want.abs().max().item() or 1.0
    return (got.float() - want).abs().max().item() / scale


def run_case(hidden, ffn, seq, impls, args, device, group):
    n = dist.get_world_size(group)
    rank = dist.get_rank(group)
    f_local = ffn // n
    dtype = torch.bfloat16
    gen = torch.Generator(device="cpu").manual_seed(1234 + rank)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)

    # This rank's shards; every implementation uses these same tensors.
    w_gu = rand(2 * f_local, hidden, scale=hidden ** -0.5).requires_grad_()
    w_down = rand(hidden, f_local, scale=ffn ** -0.5).requires_grad_()
    x = rand(seq // n, hidden).requires_grad_()
    dy = rand(seq // n, hidden)
    built = {}
    for name, cls in impls.items():
        built[name] = cls(w_gu, w_down, group)

    def fwd(impl):
        with torch.no_grad():
            return impl(x)

    def fwd_bwd(impl):
        x.grad = None
        for w in impl.weights:
            w.grad = None
        y = impl(x)
        y.backward(dy)
        return y

    results = []
    for mode, step in (("forward", fwd), ("forward+backward", fwd_bwd)):
        # Correctness: each implementation against eager.
        checks = {}
        outs = {}
        for name, impl in built.items():
            y = step(impl)
            if not getattr(impl, "checked", True):
                checks[name] = {"max_rel_err": None, "ok": True}
                continue
            grads = [t.grad.clone() for t in (x,) + impl.weights] if mode != "forward" else []
            outs[name] = [y.detach().clone()] + grads
        ref = outs["eager"]
        for name, got in outs.items():
            err = max(_rel_err(g, r) for g, r in zip(got, ref))
            checks[name] = {"max_rel_err": err, "ok": err < args.tolerance}
        del outs, ref
        # Timing: warm-up, then rounds of one call per implementation (interleaved).
        timer = Timer(device)
        for _ in range(args.warmup):
            for impl in built.values():
                step(impl)
        samples = {name: [] for name in built}
        for _ in range(args.iters):
            for name, impl in built.items():
                if device.type == "cuda":
                    torch.cuda.synchronize()
                dist.barrier(group=group)
                samples[name].append(timer.time_ms(lambda: step(impl)))
        medians = torch.tensor([statistics.median(samples[name]) for name in built], dtype=torch.float64)
        slowest = medians.to(device) if device.type == "cuda" else medians
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
        slowest = slowest.cpu().tolist()
        for name, ms in zip(built, slowest):
            results.append({"impl": name, "mode": mode, "hidden": hidden, "ffn": ffn, "seq": seq, "world": n,
                            "median_ms": ms, **checks[name]})
    return results


# ---- output -----------------------------------------------------------------------------------------

def default_out():
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "weft", "results")


def write_results(rows, unavailable, args, device, n):
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"torch_mlp_{device.type}_{n}r")
    doc = {
        "bench": "weft.torch.bench mlp", "command": " ".join(sys.argv), "world": n,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (host backend: not performance)",
        "torch": torch.__version__, "dtype": "bfloat16", "iters": args.iters, "warmup": args.warmup,
        "unavailable": unavailable, "results": rows,
    }
    with open(stem + ".json", "w") as f:
        json.dump(doc, f, indent=1)
    paths = [stem + ".json"]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return paths
    cases = sorted({(r["hidden"], r["ffn"], r["seq"]) for r in rows})
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, mode in zip(axes, ("forward", "forward+backward")):
        width = 0.8 / max(len(impls), 1)
        for i, impl in enumerate(impls):
            ys = []
            for c in cases:
                base = next(r["median_ms"] for r in rows if r["mode"] == mode and r["impl"] == "eager" and
                            (r["hidden"], r["ffn"], r["seq"]) == c)
                mine = next(r["median_ms"] for r in rows if r["mode"] == mode and r["impl"] == impl and
                            (r["hidden"], r["ffn"], r["seq"]) == c)
                ys.append(base / mine)
            ax.bar([k + i * width for k in range(len(cases))], ys, width, label=impl)
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(cases))])
        ax.set_xticklabels([f"H{h}/F{f}\nS{s}" for h, f, s in cases], fontsize=8)
        ax.set_ylabel("speed-up over eager + NCCL")
        ax.set_title(f"TP MLP {mode}, {n} ranks, {doc['device']}", fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=120)
    paths.append(stem + ".png")
    return paths


def print_table(rows, unavailable):
    print(f"{'hidden':>6} {'ffn':>6} {'seq':>6} {'mode':<17} {'impl':<9} {'median ms':>10} {'x eager':>8} "
          f"{'max rel err':>11}")
    for r in rows:
        base = next(b["median_ms"] for b in rows if b["impl"] == "eager" and b["mode"] == r["mode"] and
                    (b["hidden"], b["ffn"], b["seq"]) == (r["hidden"], r["ffn"], r["seq"]))
        flag = "" if r["ok"] else "  MISMATCH"
        err = "bound" if r["max_rel_err"] is None else f"{r['max_rel_err']:.2e}"
        print(f"{r['hidden']:>6} {r['ffn']:>6} {r['seq']:>6} {r['mode']:<17} {r['impl']:<9} {r['median_ms']:>10.3f} "
              f"{base / r['median_ms']:>8.3f} {err:>11}{flag}")
    for name, why in unavailable.items():
        print(f"{name}: unavailable ({why})")


# ---- main -------------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m weft.torch.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("bench", choices=["mlp"])
    p.add_argument("--quick", action="store_true", help="tiny shapes, few iterations (a smoke test)")
    p.add_argument("--out", default=None, help="directory of the JSON and PNG (default: %(default)s -> "
                                               "$XDG_DATA_HOME/weft/results)")
    p.add_argument("--shapes", default=None, help="hidden:ffn,... (default 8192:28672,4096:14336)")
    p.add_argument("--seqs", default=None, help="tokens,... (default 4096,16384)")
    p.add_argument("--iters", type=int, default=None, help="timed calls per implementation (default 20)")
    p.add_argument("--warmup", type=int, default=None, help="untimed rounds first (default 5)")
    p.add_argument("--impls", default="weft,eager,async_tp,compute",
                   help="implementations to run (eager always runs; compute: the GEMMs without communication, "
                        "the bound no implementation can beat)")
    p.add_argument("--heap-mib", type=int, default=0, help="weft's symmetric heap per rank (0: sized for the shapes)")
    p.add_argument("--tolerance", type=float, default=3e-2, help="max relative error against eager")
    args = p.parse_args(argv)
    args.out = args.out or default_out()
    if args.iters is None:
        args.iters = 3 if args.quick else 20
    if args.warmup is None:
        args.warmup = 1 if args.quick else 5
    if args.iters < 1 or args.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    try:
        args.shapes = ([tuple(int(v) for v in s.split(":")) for s in args.shapes.split(",")] if args.shapes
                       else QUICK_SHAPES if args.quick else FULL_SHAPES)
        args.seqs = [int(s) for s in args.seqs.split(",")] if args.seqs else QUICK_SEQS if args.quick else FULL_SEQS
    except ValueError:
        p.error("--shapes takes hidden:ffn,... and --seqs tokens,... (integers)")
    if any(len(s) != 2 for s in args.shapes):
        p.error("--shapes takes hidden:ffn pairs")
    args.impls = [s for s in args.impls.split(",") if s]
    for s in args.impls:
        if s not in ("weft", "eager", "async_tp", "compute"):
            p.error(f"--impls: unknown implementation {s!r}")
    return args


def _heap_mib(args, n):
    """Room for weft's workspaces at the largest shape: the gathered input and the staged outputs of
    the forward and backward ops, with slack."""
    most = 0
    for hidden, ffn in args.shapes:
        for seq in args.seqs:
            most = max(most, 2 * seq * (hidden + 2 * ffn // n + hidden))
    return max(2048, math.ceil(3 * most / 2 ** 20))


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cuda = torch.cuda.is_available()
    if not dist.is_initialized():
        if "RANK" not in os.environ:  # a single process without torchrun: a world of one
            os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    n = dist.get_world_size()
    for hidden, ffn in args.shapes:
        if ffn % n or hidden % n or any(s % n for s in args.seqs):
            raise SystemExit(f"weft.torch.bench: hidden {hidden}, ffn {ffn} and the sequences must divide by {n}")
    wt.init(heap_mib=args.heap_mib or (_heap_mib(args, n) if cuda else 0))
    impls = {"eager": EagerMLP}
    unavailable = {}
    if "weft" in args.impls:
        impls["weft"] = WeftMLP
    if "compute" in args.impls:
        impls["compute"] = ComputeOnlyMLP
    if "async_tp" in args.impls:
        why = async_tp_unavailable(device)
        if why is None:
            try:
                enable_async_tp(None)
                impls["async_tp"] = AsyncTpMLP
            except Exception as e:  # noqa: BLE001 -- reported, the others still run
                why = f"{type(e).__name__}: {e}"
        if why is not None:
            unavailable["async_tp"] = why
    rows = []
    for hidden, ffn in args.shapes:
        for seq in args.seqs:
            rows += run_case(hidden, ffn, seq, impls, args, device, None)
            wt.world().release_ops()  # free this shape's workspaces before the next
            if cuda:
                torch.cuda.empty_cache()
    if dist.get_rank() == 0:
        paths = write_results(rows, unavailable, args, device, n)
        print(f"wrote {', '.join(paths)}")
        print_table(rows, unavailable)
    bad = [r for r in rows if not r["ok"]]
    wt.shutdown()
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
