"""torch.ops.weft.* on GPUs (nccl backend), 2 and 4 ranks where as many GPUs are present: every op
against a torch reference, exact on integer data and within bf16 tolerance on random data,
eagerly, replayed from a CUDA graph, and under torch.compile(fullgraph=True); the MLP block's
modules forward and backward; gemv_ar / gemv_ar_rmsnorm (decode) for several M from one object;
moe_dispatch / moe_combine by every method, eagerly and from a CUDA graph. Skipped without enough
GPUs."""

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402


def _gpus():
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def ints(shape, seed, dtype, lo=-2, hi=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, tuple(shape), generator=g).to(dtype).cuda()


def rand(shape, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(tuple(shape), generator=g).to(dtype).cuda()


def _cases(n, r, make, dtype):
    """(name, fn, inputs of every rank, reference of this rank); fn takes this rank's inputs."""
    ops = torch.ops.weft
    m, k, nn = 256 * n, 512, 384
    xs = [make((1024, 64), 10 + p, dtype) for p in range(n)]
    ys = [make((64 * n, 96), 20 + p, dtype) for p in range(n)]
    a = [make((m // n, k), 30 + p, torch.bfloat16) for p in range(n)]
    b = [make((nn, k), 40 + p, torch.bfloat16) for p in range(n)]
    a2 = [make((m, k // n), 50 + p, torch.bfloat16) for p in range(n)]
    b2 = [make((nn, k // n), 60 + p, torch.bfloat16) for p in range(n)]
    f32 = [t.float() for t in xs]
    full2 = sum(a2[p].float() @ b2[p].float().t() for p in range(n))
    # The ops whose output shape depends on the group's size get it (group_size): compiled graphs
    # are cached by their arguments, and the 2- and 4-rank runs share the cache.
    return [
        ("all_reduce", lambda x: ops.all_reduce(x), [xs], sum(f32)),
        ("all_gather", lambda x: ops.all_gather(x, "auto", "", n), [xs], torch.cat(xs).float()),
        ("reduce_scatter", lambda y: ops.reduce_scatter(y, "auto", "", n), [ys],
         sum(t.float() for t in ys)[64 * r:64 * (r + 1)]),
        ("all_to_all", lambda y: ops.all_to_all(y), [ys], torch.cat([ys[s][64 * r:64 * (r + 1)] for s in range(n)]).float()),
        ("ag_gemm", lambda x, w: ops.ag_gemm(x, w, "auto", "", "nk", n), [a, [b[r]] * n],
         torch.cat(a).float() @ b[r].float().t()),
        ("gemm_rs", lambda x, w: ops.gemm_rs(x, w, "auto", "", "nk", n), [a2, b2], full2[r * m // n:(r + 1) * m // n]),
        ("gemm_ar", lambda x, w: ops.gemm_ar(x, w), [a2, b2], full2),
    ]


def _check(got, want, exact, what):
    if exact:
        assert torch.equal(got.float(), want.to(got.dtype).float()), what
    else:
        err = (got.float() - want).abs().max().item() / max(want.abs().max().item(), 1e-6)
        assert err < 2e-2, f"{what}: max relative error {err}"


def _rank_gpu_ops(data, dtype_name):
    import torch._dynamo

    r, n = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, dtype_name)
    exact = data == "ints"
    make = ints if exact else rand
    for name, fn, inputs, want in _cases(n, r, make, dtype):
        args = [per_rank[r] for per_rank in inputs]
        # Eager (the first call of the shape creates the op's state).
        _check(fn(*args), want, exact, f"{name} eager")
        # A CUDA graph: captured on zeroed inputs (capture runs nothing), the data copied into the
        # static inputs and the output cleared before the replay, so only the replay can make it.
        static = [torch.zeros_like(t) for t in args]
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(*static)
        for s, t in zip(static, args):
            s.copy_(t)
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        _check(out, want, exact, f"{name} CUDA graph")
        # torch.compile without graph breaks.
        torch._dynamo.reset()
        _check(torch.compile(fn, fullgraph=True)(*args), want, exact, f"{name} torch.compile")
    return True


needs2 = pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")


@needs2
@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("data,dtype", [("ints", "bfloat16"), ("ints", "float32"), ("random", "bfloat16")])
def test_gpu_ops(pools, size, data, dtype):
    if _gpus() < size:
        pytest.skip(f"needs {size} GPUs")
    pools.get(size, gpu=True).run(_rank_gpu_ops, data, dtype, timeout=600)


def _rank_gpu_prepare_then_capture():
    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()
    x = ints((3000, 8), 70 + r, torch.bfloat16)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="eager call"):  # a shape never run: refused in capture
        with torch.cuda.graph(g):
            torch.ops.weft.all_gather(x)
    wt.prepare("all_gather", torch.empty((3000, 8), dtype=torch.bfloat16, device="meta"))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = torch.ops.weft.all_gather(x)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, torch.cat([ints((3000, 8), 70 + p, torch.bfloat16) for p in range(n)]))
    return True


@needs2
def test_gpu_prepare_for_capture(pools):
    pools.get(2, gpu=True).run(_rank_gpu_prepare_then_capture, timeout=300)


def _rank_gpu_symmetric():
    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()
    x = wt.empty((1024, 64), dtype=torch.bfloat16)
    assert x.is_cuda and x.device.index == torch.cuda.current_device() and wt.is_symmetric(x)
    assert torch.count_nonzero(x) == 0
    x.copy_(ints((1024, 64), 80 + r, torch.bfloat16))
    want = sum(ints((1024, 64), 80 + p, torch.bfloat16).float() for p in range(n))
    assert torch.equal(wt.all_reduce(x).float(), want)
    return True


@needs2
def test_gpu_symmetric_tensors(pools):
    pools.get(2, gpu=True).run(_rank_gpu_symmetric, timeout=300)


def _rank_gpu_mlp():
    """The MLP block (weft's modules) against the eager block, forward and backward, random bf16."""
    from weft.torch.bench import EagerMLP, WeftMLP

    r, n = dist.get_rank(), dist.get_world_size()
    hidden, ffn, seq = 1024, 4096, 2048
    w_gu = rand((2 * ffn // n, hidden), 90 + r, torch.bfloat16) * hidden ** -0.5
    w_down = rand((hidden, ffn // n), 91 + r, torch.bfloat16) * ffn ** -0.5
    x = rand((seq // n, hidden), 92 + r, torch.bfloat16)
    dy = rand((seq // n, hidden), 93 + r, torch.bfloat16)
    outs = []
    for cls in (EagerMLP, WeftMLP):
        impl = cls(w_gu.clone().requires_grad_(), w_down.clone().requires_grad_(), None)
        xi = x.clone().requires_grad_()
        y = impl(xi)
        y.backward(dy)
        outs.append([y, xi.grad] + [w.grad for w in impl.weights])
    for got, want, what in zip(outs[1], outs[0], ("y", "dx", "dw_gate_up", "dw_down")):
        _check(got, want.float(), False, what)
    return True


@needs2
@pytest.mark.parametrize("size", [2, 4])
def test_gpu_mlp_block(pools, size):
    if _gpus() < size:
        pytest.skip(f"needs {size} GPUs")
    pools.get(size, gpu=True).run(_rank_gpu_mlp, timeout=300)


# ---- GEMV + AllReduce (decode) ---------------------------------------------------------------------

def _rank_gpu_gemv(method):
    """gemv_ar and gemv_ar_rmsnorm for several M from one op object: exact on integer data and
    within bf16 tolerance of an fp32 reference on random data, eagerly, replayed from CUDA graphs
    (the first capture of each M after prepare, no eager call of it before), and compiled."""
    import torch._dynamo

    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()
    bf = torch.bfloat16
    nn, k_local = 1024, 512
    gamma = rand((nn,), 5, bf)
    wt.prepare("gemv_ar", torch.empty((1, k_local), dtype=bf, device="meta"),
               torch.empty((nn, k_local), dtype=bf, device="meta"))
    wt.prepare("gemv_ar_rmsnorm", torch.empty((1, k_local), dtype=bf, device="meta"),
               torch.empty((nn, k_local), dtype=bf, device="meta"), None, None, 1e-6)
    # Integers in [-1, 1]: every rank's partial sum and the total stay exact in bf16.
    for exact, make in ((True, lambda shape, seed, dtype: ints(shape, seed, dtype, -1, 2)), (False, rand)):
        xs = [make((128, k_local), 10 + p, bf) for p in range(n)]
        ws = [make((nn, k_local), 20 + p, bf) for p in range(n)]
        for m in (1, 7, 16, 128):
            y_ref = sum(xs[p][:m].float() @ ws[p].float().t() for p in range(n))
            res = make((m, nn), 30 + m, bf)
            ro_ref = (y_ref.to(bf) + res).float() if exact else y_ref + res.float()
            out_ref = ro_ref * torch.rsqrt(ro_ref.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma.float()

            def f(x, w, res_):
                y = torch.ops.weft.gemv_ar(x, w, method, "")
                out, ro = torch.ops.weft.gemv_ar_rmsnorm(x, w, res_, gamma, 1e-6, method, "")
                return y, out, ro

            def check(outs, what):
                y, out, ro = outs
                _check(y, y_ref, exact, f"gemv_ar {what} M={m}")
                _check(ro, ro_ref, exact, f"gemv_ar_rmsnorm residual_out {what} M={m}")
                _check(out, out_ref, False, f"gemv_ar_rmsnorm out {what} M={m}")

            args = [xs[r][:m].contiguous(), ws[r], res]
            static = [torch.zeros_like(t) for t in args]
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs = f(*static)
            for s, t in zip(static, args):
                s.copy_(t)
            for o in outs:
                o.zero_()
            graph.replay()
            torch.cuda.synchronize()
            check(outs, "CUDA graph")
            check(f(*args), "eager")
            if m in (1, 16):
                torch._dynamo.reset()
                check(torch.compile(f, fullgraph=True)(*args), "torch.compile")
    return True


@needs2
@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("method", ["auto", "baseline", "decomposed", "fused"])
def test_gpu_gemv_ar(pools, size, method):
    if _gpus() < size:
        pytest.skip(f"needs {size} GPUs")
    pools.get(size, gpu=True).run(_rank_gpu_gemv, method, timeout=600)


def _rank_gpu_moe(method):
    """moe_dispatch + moe_combine with experts that scale their rows by (local expert + 1): exact
    on integer data, eagerly and replayed from a CUDA graph with new inputs (decomposed and
    direct: no host synchronisation), and compiled."""
    import torch._dynamo

    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()
    bf = torch.bfloat16
    hidden, top_k, t, experts = 256, 2, 64, 4 * n
    local = experts // n

    def inputs(seed):
        g = torch.Generator().manual_seed(seed * 100 + r)
        x = torch.randint(-4, 5, (t, hidden), generator=g).to(bf)
        ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(t)]).to(torch.int32)
        w = torch.randint(1, 3, (t, top_k), generator=g).float() / 2
        return x.cuda(), ids.cuda(), w.cuda()

    def layer(x, ids, w):
        recv, counts = torch.ops.weft.moe_dispatch(x, ids, experts, t, 0, method, "")
        # The expert of every received row from the counts, on the device (no host sync): row i
        # belongs to chunk c where i < cumsum(counts)[c] first.
        ends = counts.reshape(-1).cumsum(0)
        chunk = torch.searchsorted(ends, torch.arange(recv.shape[0], device=x.device), right=True)
        scale = (chunk % local + 1).clamp(max=local).to(torch.float32)
        out = (recv.float() * scale[:, None]).to(bf)
        return torch.ops.weft.moe_combine(out, w, experts, t, 0, method, "")

    def want(x, ids, w):
        return (x.float() * ((ids.long() % local + 1).float() * w).sum(1, keepdim=True)).to(bf)

    x, ids, w = inputs(0)
    y = layer(x, ids, w)
    assert torch.equal(y, want(x, ids, w)), (method, "eager")
    if method in ("decomposed", "direct", "auto"):
        static = [torch.zeros_like(a) for a in (x, ids, w)]
        for s_, a in zip(static, (x, ids, w)):
            s_.copy_(a)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y_static = layer(*static)
        for call in range(1, 4):
            x, ids, w = inputs(call)
            for s_, a in zip(static, (x, ids, w)):
                s_.copy_(a)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(y_static, want(x, ids, w)), (method, "CUDA graph", call)
    torch._dynamo.reset()
    x, ids, w = inputs(9)
    assert torch.equal(torch.compile(layer, fullgraph=True)(x, ids, w), want(x, ids, w)), (method, "compile")
    return True


@needs2
@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("method", ["auto", "baseline", "decomposed", "direct"])
def test_gpu_moe(pools, size, method):
    if _gpus() < size:
        pytest.skip(f"needs {size} GPUs")
    pools.get(size, gpu=True).run(_rank_gpu_moe, method, timeout=600)

def _rank_gpu_moe_layer(method):
    """moe_layer against a per-token fp32 reference (bf16 tolerance), eagerly, replayed from a
    CUDA graph with new inputs (decomposed, fused, auto), and compiled."""
    import torch._dynamo

    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()
    bf = torch.bfloat16
    hidden, ffn, top_k, t, experts = 256, 136, 2, 64, 4 * n
    local = experts // n

    def expert(e):
        g = torch.Generator().manual_seed(7000 + e)
        return (torch.randn(2 * ffn, hidden, generator=g) / hidden**0.5).to(bf), \
            (torch.randn(hidden, ffn, generator=g) / ffn**0.5).to(bf)

    up = torch.stack([expert(r * local + le)[0] for le in range(local)]).cuda()
    down = torch.stack([expert(r * local + le)[1] for le in range(local)]).cuda()

    def inputs(seed):
        g = torch.Generator().manual_seed(seed * 100 + r)
        x = torch.randn(t, hidden, generator=g).to(bf)
        ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(t)]).to(torch.int32)
        w = torch.rand(t, top_k, generator=g)
        return x.cuda(), ids.cuda(), w.cuda()

    def want(x, ids, w):
        y = torch.zeros(t, hidden, device=x.device)
        for j in range(top_k):
            for e in range(experts):
                sel = ids[:, j] == e
                if not bool(sel.any()):
                    continue
                wu, wd_ = (a.cuda().float() for a in expert(e))
                h = x[sel].float() @ wu.t()
                a = torch.nn.functional.silu(h[:, :ffn]) * h[:, ffn:]
                y[sel] += w[sel, j, None] * (a @ wd_.t())
        return y

    def layer(x, ids, w):
        return torch.ops.weft.moe_layer(x, ids, w, up, down, experts, t, 0, method, "")

    def close(got, ref, what):
        err = (got.float() - ref).abs().max().item()
        assert err <= 3e-2 * max(ref.abs().max().item(), 1e-2), (method, what, err)

    x, ids, w = inputs(0)
    close(layer(x, ids, w), want(x, ids, w), "eager")
    if method in ("decomposed", "fused", "auto"):
        static = [a.clone() for a in (x, ids, w)]
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y_static = layer(*static)
        for call in range(1, 3):
            x, ids, w = inputs(call)
            for s_, a in zip(static, (x, ids, w)):
                s_.copy_(a)
            graph.replay()
            torch.cuda.synchronize()
            close(y_static, want(x, ids, w), f"CUDA graph {call}")
            assert torch.equal(y_static, layer(x, ids, w)), (method, "graph replay equals eager", call)
    torch._dynamo.reset()
    x, ids, w = inputs(9)
    assert torch.equal(torch.compile(layer, fullgraph=True)(x, ids, w), layer(x, ids, w)), (method, "compile")
    return True


@pytest.mark.parametrize("size", [1, 2, 4])
@pytest.mark.parametrize("method", ["auto", "baseline", "decomposed", "fused"])
def test_gpu_moe_layer(pools, size, method):
    if _gpus() < size:
        pytest.skip(f"needs {size} GPUs")
    pools.get(size, gpu=True).run(_rank_gpu_moe_layer, method, timeout=600)
