"""torch.ops.weft.* on CPU tensors over the host backend, 1, 2 and 4 ranks, exact on integer data
against torch references. Every rank builds every rank's input from a seed, so each knows the
exact expected output."""

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

SIZES = [1, 2, 4]
COLL_DTYPES = ["float32", "bfloat16", "float16"]


def ints(shape, seed, dtype, lo=-4, hi=5):
    """Small integers: sums over 4 ranks stay exact in bf16 (|x| <= 256)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, tuple(shape), generator=g).to(dtype)


def _rank_collectives(dtype_name, method):
    import weft.torch as wt

    dtype = getattr(torch, dtype_name)
    r, n = dist.get_rank(), dist.get_world_size()
    xs = [ints((6, 5), 100 + p, dtype) for p in range(n)]
    total = sum(t.float() for t in xs).to(dtype)
    assert torch.equal(wt.all_reduce(xs[r], method), total)
    assert torch.equal(torch.ops.weft.all_reduce(xs[r], method, ""), total)
    assert torch.equal(wt.all_gather(xs[r], method), torch.cat(xs))
    ys = [ints((n * 3, 2, 5), 200 + p, dtype) for p in range(n)]
    ysum = sum(t.float() for t in ys).to(dtype)
    assert torch.equal(wt.reduce_scatter(ys[r], method), ysum[r * 3:(r + 1) * 3])
    assert torch.equal(wt.all_to_all(ys[r], method), torch.cat([ys[s][r * 3:(r + 1) * 3] for s in range(n)]))
    # Non-contiguous inputs are made contiguous.
    xt = xs[r].t()
    assert torch.equal(wt.all_reduce(xt, method), total.t())
    return True


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dtype", COLL_DTYPES)
def test_collectives_exact(pools, size, dtype):
    assert pools.get(size).run(_rank_collectives, dtype, "auto") == [True] * size


def _rank_methods():
    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()
    xs = [ints((64,), 300 + p, torch.bfloat16) for p in range(n)]
    total = sum(t.float() for t in xs).to(torch.bfloat16)
    for method in ("baseline", "one-shot", "two-shot", "ll", "ll128"):
        assert torch.equal(wt.all_reduce(xs[r], method), total), method
    ys = [ints((2 * n, 8), 310 + p, torch.bfloat16) for p in range(n)]
    ysum = sum(t.float() for t in ys).to(torch.bfloat16)
    for method in ("baseline", "direct", "ll"):
        assert torch.equal(wt.all_gather(xs[r], method), torch.cat(xs)), method
        assert torch.equal(wt.reduce_scatter(ys[r], method), ysum[2 * r:2 * r + 2]), method
        assert torch.equal(wt.all_to_all(ys[r], method), torch.cat([ys[s][2 * r:2 * r + 2] for s in range(n)])), method
    with pytest.raises(ValueError, match="has no method 'direct'"):  # weft's own refusal surfaces
        wt.all_reduce(xs[r], "direct")
    return True


@pytest.mark.parametrize("size", [2])
def test_collective_methods(pools, size):
    pools.get(size).run(_rank_methods)


def _rank_all_to_all_v():
    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()

    def counts(src):  # rows rank src sends to each rank (some zero)
        return [(src + 2 * p) % 3 for p in range(n)]

    def rows(src):  # packed by destination; each row names (source, destination, index)
        out = []
        for dst, c in enumerate(counts(src)):
            out += [[1000.0 * src + 100 * dst + i, -float(i)] for i in range(c)]
        return torch.tensor(out, dtype=torch.float32).reshape(-1, 2)

    x = torch.cat([rows(r), torch.full((2, 2), -7.0)])  # rows past the counts are not sent
    cap = 3 * n
    out, recv = wt.all_to_all_v(x, torch.tensor(counts(r)), cap)
    expect_counts = [counts(s)[r] for s in range(n)]
    assert recv.dtype == torch.int64 and recv.tolist() == expect_counts
    expect = torch.cat([rows(s)[sum(counts(s)[:r]):sum(counts(s)[:r + 1])] for s in range(n)])
    assert out.shape == (cap, 2)
    assert torch.equal(out[:expect.shape[0]], expect)
    # bf16, 1-D rows.
    xb = ints((sum(counts(r)),), 50 + r, torch.bfloat16)
    outb, recvb = torch.ops.weft.all_to_all_v(xb, torch.tensor(counts(r)), cap, "auto", "")
    assert recvb.tolist() == expect_counts
    got = []
    for s in range(n):
        xs = ints((sum(counts(s)),), 50 + s, torch.bfloat16)
        got.append(xs[sum(counts(s)[:r]):sum(counts(s)[:r + 1])])
    assert torch.equal(outb[:sum(expect_counts)], torch.cat(got))
    return True


@pytest.mark.parametrize("size", SIZES)
def test_all_to_all_v(pools, size):
    pools.get(size).run(_rank_all_to_all_v)


# ---- GEMM + communication ---------------------------------------------------------------------

M_LOCAL, N, K = 16, 32, 64


def _mm(a, b_nk):
    return (a.float() @ b_nk.float().t())


def _rank_gemms(dtype_name, method):
    import weft.torch as wt

    dtype = getattr(torch, dtype_name)
    r, n = dist.get_rank(), dist.get_world_size()
    # ag_gemm: A [M/world, K] per rank, B [N, K] this rank's (column shard of a linear's output).
    a = [ints((M_LOCAL, K), 10 + p, dtype, -1, 2) for p in range(n)]
    b = [ints((N, K), 20 + p, dtype, -1, 2) for p in range(n)]
    c = wt.ag_gemm(a[r], b[r], method)
    assert c.shape == (M_LOCAL * n, N) and c.dtype == dtype
    assert torch.equal(c, _mm(torch.cat(a), b[r]).to(dtype))
    # B as [K, N] ("kn").
    assert torch.equal(wt.ag_gemm(a[r], b[r].t().contiguous(), method, b_layout="kn"), c)
    # ag_gemm_gathered: the same C, and the gathered A beside it.
    cg, a_full = torch.ops.weft.ag_gemm_gathered(a[r], b[r], method, "", "nk", n)
    assert torch.equal(cg, c) and torch.equal(a_full, torch.cat(a))
    # gemm_rs / gemm_ar: A [M, K/world], B [N, K/world].
    k_local = K // 2
    m = M_LOCAL * n
    a2 = [ints((m, k_local), 30 + p, dtype, -1, 2) for p in range(n)]
    b2 = [ints((N, k_local), 40 + p, dtype, -1, 2) for p in range(n)]
    full = sum(_mm(a2[p], b2[p]) for p in range(n))
    c2 = wt.gemm_rs(a2[r], b2[r], method)
    assert c2.shape == (M_LOCAL, N)
    assert torch.equal(c2, full[r * M_LOCAL:(r + 1) * M_LOCAL].to(dtype))
    c3 = torch.ops.weft.gemm_ar(a2[r], b2[r], method, "")
    assert torch.equal(c3, full.to(dtype))
    assert torch.equal(wt.gemm_ar(a2[r], b2[r].t().contiguous(), method, b_layout="kn"), c3)
    return True


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gemm_ops_exact(pools, size, dtype):
    pools.get(size).run(_rank_gemms, dtype, "auto")


@pytest.mark.parametrize("method", ["baseline", "decomposed", "fused"])
def test_gemm_methods(pools, method):
    pools.get(2).run(_rank_gemms, "bfloat16", method)


# ---- symmetric tensors ----------------------------------------------------------------------------

def _rank_symmetric():
    import gc

    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()
    w = wt.world()
    _, used0 = w.heap_info()
    x = wt.empty((8, 4), dtype=torch.float32)
    assert x.shape == (8, 4) and x.dtype == torch.float32 and x.device.type == "cpu"
    assert torch.count_nonzero(x) == 0  # zeroed
    assert wt.is_symmetric(x) and not wt.is_symmetric(torch.zeros(8, 4))
    x.copy_(ints((8, 4), 60 + r, torch.float32))
    out = wt.all_reduce(x)
    assert torch.equal(out, sum(ints((8, 4), 60 + p, torch.float32) for p in range(n)))
    # A symmetric bf16 input of a GEMM op.
    a = wt.empty((M_LOCAL, K), dtype=torch.bfloat16)
    a.copy_(ints((M_LOCAL, K), 10 + r, torch.bfloat16, -1, 2))
    bw = ints((N, K), 20 + r, torch.bfloat16, -1, 2)
    ref = _mm(torch.cat([ints((M_LOCAL, K), 10 + p, torch.bfloat16, -1, 2) for p in range(n)]), bw)
    assert torch.equal(wt.ag_gemm(a, bw), ref.to(torch.bfloat16))
    # A block returns to the heap when the tensor's storage dies; views keep it.
    assert w.heap_info()[1] > used0
    used1 = w.heap_info()[1]  # the ops' own state (allocated at their first call) stays
    del a
    gc.collect()
    used2 = w.heap_info()[1]
    assert used2 < used1
    v = x[2:4]
    del x, out
    gc.collect()
    assert w.heap_info()[1] == used2  # v still holds x's block
    del v
    gc.collect()
    assert w.heap_info()[1] < used2
    return True


@pytest.mark.parametrize("size", [1, 2])
def test_symmetric_tensors(pools, size):
    pools.get(size).run(_rank_symmetric)


# ---- torch.compile -------------------------------------------------------------------------------

def _rank_compile(backend):
    import torch._dynamo

    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()
    torch._dynamo.reset()

    def f(x, a, b):
        h = torch.ops.weft.all_reduce(x * 2, "auto", "") + 1
        g = torch.ops.weft.all_gather(h, "auto", "")
        c = torch.ops.weft.ag_gemm(a, b, "auto", "", "nk")
        return g.sum(0), torch.ops.weft.reduce_scatter(g, "auto", ""), c * 2

    x = ints((4 * n, 3), 70 + r, torch.float32)
    a = ints((M_LOCAL, K), 71 + r, torch.bfloat16, -1, 2)
    b = ints((N, K), 72 + r, torch.bfloat16, -1, 2)
    compiled = torch.compile(f, fullgraph=True, backend=backend)
    for got, want in zip(compiled(x, a, b), f(x, a, b)):
        assert torch.equal(got, want)
    # A module (both linears) forward and backward under compile.
    col = wt.nn.ColumnParallelLinear(K, N * n, dtype=torch.bfloat16)
    row = wt.nn.RowParallelLinear(N * n, K, dtype=torch.bfloat16)
    with torch.no_grad():
        col.weight.copy_(ints(col.weight.shape, 80 + r, torch.bfloat16, -1, 2))
        row.weight.copy_(ints(row.weight.shape, 81 + r, torch.bfloat16, -1, 2))

    def block(inp):
        return row(col(inp) * 0.5)

    cblock = torch.compile(block, fullgraph=True, backend=backend)
    a1 = a.clone().requires_grad_()
    a2 = a.clone().requires_grad_()
    y1, y2 = block(a1), cblock(a2)
    assert torch.equal(y1, y2)
    y1.float().sum().backward()
    gw1 = col.weight.grad.clone()
    col.weight.grad = None
    y2.float().sum().backward()
    assert torch.equal(a1.grad, a2.grad)
    assert torch.equal(gw1, col.weight.grad)
    return True


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_fullgraph(pools, backend):
    pools.get(2).run(_rank_compile, backend, timeout=300)


def test_fake_and_schema():
    """The ops are registered with their schemas (no ranks needed for this)."""
    import weft.torch  # noqa: F401

    for name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_v", "ag_gemm",
                 "ag_gemm_gathered", "gemm_rs", "gemm_ar"):
        op = getattr(torch.ops.weft, name).default
        assert not any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments), name
    assert "str method=\"auto\"" in str(torch.ops.weft.all_reduce.default._schema)


# ---- several groups in one process ------------------------------------------------------------------

def _rank_groups():
    import weft.torch as wt

    r = dist.get_rank()
    # Tensor-parallel pairs {0,1},{2,3} and data-parallel pairs {0,2},{1,3}: every rank is in the
    # default world and in two sub-groups, three weft worlds per process.
    tp = [dist.new_group([0, 1]), dist.new_group([2, 3])][r // 2]
    dp = [dist.new_group([0, 2]), dist.new_group([1, 3])][r % 2]
    wtp, wdp = wt.init(tp), wt.init(dp)
    assert (wtp.rank, wtp.size, wdp.rank, wdp.size) == (r % 2, 2, r // 2, 2)
    assert wt.world(tp) is wtp and wt.world(dp) is wdp and wt.world() is not wtp
    x = torch.full((5,), float(r + 1))
    tp_peers = [r - r % 2, r - r % 2 + 1]
    dp_peers = [r % 2, r % 2 + 2]
    assert torch.equal(wt.all_reduce(x, group=tp), torch.full((5,), float(sum(p + 1 for p in tp_peers))))
    assert torch.equal(wt.all_reduce(x, group=dp), torch.full((5,), float(sum(p + 1 for p in dp_peers))))
    assert torch.equal(wt.all_reduce(x), torch.full((5,), 10.0))
    assert torch.equal(torch.ops.weft.all_gather(x, "auto", tp.group_name),
                       torch.cat([torch.full((5,), float(p + 1)) for p in tp_peers]))
    a = ints((M_LOCAL, K), 90 + r, torch.bfloat16, -1, 2)
    b = ints((N, K), 91, torch.bfloat16, -1, 2)
    ref = _mm(torch.cat([ints((M_LOCAL, K), 90 + p, torch.bfloat16, -1, 2) for p in dp_peers]), b)
    assert torch.equal(wt.ag_gemm(a, b, group=dp), ref.to(torch.bfloat16))
    s = wt.empty((4,), dtype=torch.float32, group=tp)
    s.fill_(r)
    assert torch.equal(wt.all_reduce(s, group=tp), torch.full((4,), float(sum(tp_peers))))
    del s
    wt.shutdown(tp)
    wt.shutdown(dp)
    with pytest.raises(RuntimeError, match="init"):
        wt.all_reduce(x, group=tp)
    return True


def test_two_groups_in_one_process(pools):
    pools.get(4).run(_rank_groups)


def _rank_group_size():
    import weft

    n = dist.get_world_size()
    x = torch.ones(4, 3)
    # group_size passed (what a compiled graph is keyed on) must be the group's.
    assert torch.ops.weft.all_gather(x, "auto", "", n).shape == (4 * n, 3)
    with pytest.raises(weft.InvalidArgument, match="group_size 7"):
        torch.ops.weft.all_gather(x, "auto", "", 7)
    with pytest.raises(weft.InvalidArgument, match="group_size"):
        torch.ops.weft.gemm_rs(torch.ones(4 * n, 8, dtype=torch.bfloat16), torch.ones(8, 8, dtype=torch.bfloat16),
                               "auto", "", "nk", n + 1)
    # The fake (meta) output takes its size from group_size, not from the world looked up.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fx = torch.empty(4, 3)
        assert torch.ops.weft.all_gather(fx, "auto", "", 5).shape == (20, 3)
        assert torch.ops.weft.reduce_scatter(torch.empty(20, 3), "auto", "", 5).shape == (4, 3)
    return True


def test_group_size(pools):
    pools.get(2).run(_rank_group_size)
