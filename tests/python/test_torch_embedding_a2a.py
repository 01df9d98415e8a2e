"""torch.ops.weft.embedding_a2a on CPU tensors over the host backend, 1, 2 and 4 ranks: exact
against torch.nn.functional.embedding_bag per table on the global batch, each rank's slice of
samples, the tables concatenated in global order (rank 0's first) -- sum and mean, per-sample
weights, f32/bf16/f16 weights and f32/bf16 outputs, tables of different dims, a rank with no
table, empty bags, batch 0, every method; bad inputs refused with the message naming the table
and the position; torch.compile and prepare. On GPUs (nccl backend; skipped without them): every
method exact, eagerly, replayed from a CUDA graph with new inputs and compiled. Every rank builds
every rank's tables and bags from seeds, so each knows what it must receive."""

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

METHODS = ("auto", "baseline", "decomposed", "fused")
# rank -> its tables' dims (rank 1 holds none: worlds 2 and 4 have a rank without tables).
DIMS = {0: (8, 16), 1: (), 2: (24,), 3: (8, 32, 16)}
BAG_SIZES = (0, 1, 2, 4)  # powers of two: a mean is exact whatever the order of its rounding


def _layout(n, dims=DIMS):
    """The global tables in order: (owner rank, rows, dim)."""
    out = []
    for r in range(n):
        for d in dims[r]:
            out.append((r, 5 + 3 * len(out), d))
    return out


def _table(g, rows, dim, bags, dtype, call=0):
    """Global table g's weight [rows, dim] (small integers), offsets [bags + 1] (bag 1 empty, the
    last of more than two full), indices and per-sample weights (halves): exact sums in every dtype."""
    gen = torch.Generator().manual_seed(1000 * call + g)
    weight = torch.randint(-3, 4, (rows, dim), generator=gen).to(dtype)
    sizes = torch.tensor(BAG_SIZES)[torch.randint(0, len(BAG_SIZES), (bags,), generator=gen)]
    if bags > 1:
        sizes[1] = 0
    if bags > 2:
        sizes[-1] = BAG_SIZES[-1]
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)])
    indices = torch.randint(0, rows, (int(offsets[-1]),), generator=gen)
    psw = torch.randint(-2, 4, indices.shape, generator=gen).float() / 2
    return weight, offsets, indices, psw


def _reference(tables, r, batch, pooling, weighted, out_dtype):
    """Rank r's out: each global table's embedding_bag over the global batch, r's rows, the tables
    side by side in global order (weighted: for every table, or a list of a flag a table)."""
    cols = []
    flags = weighted if isinstance(weighted, list) else [weighted] * len(tables)
    for (weight, offsets, indices, psw), weighted in zip(tables, flags):
        w = weight.float()
        if pooling == "mean" and weighted:  # embedding_bag weighs sums only: the mean by hand
            pooled = F.embedding_bag(indices, w, offsets, mode="sum", per_sample_weights=psw, include_last_offset=True)
            pooled = pooled / (offsets[1:] - offsets[:-1]).clamp(min=1).float()[:, None]
        else:
            pooled = F.embedding_bag(indices, w, offsets, mode=pooling, per_sample_weights=psw if weighted else None,
                                     include_last_offset=True)
        cols.append(pooled[r * batch:(r + 1) * batch])
    return torch.cat(cols, 1).to(out_dtype) if cols else torch.empty(batch, 0, dtype=out_dtype)


def _rank_exact(pooling, weighted, cases):
    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()
    layout = _layout(n)
    for k, (batch, wdtype, out_dtype) in enumerate(cases):
        method = METHODS[k % len(METHODS)]
        wdtype, out_dtype = getattr(torch, wdtype), getattr(torch, out_dtype)
        tables = [_table(g, rows, dim, n * batch, wdtype, k) for g, (_, rows, dim) in enumerate(layout)]
        mine = [t for g, t in enumerate(tables) if layout[g][0] == r]
        out = torch.ops.weft.embedding_a2a(
            [t[0] for t in mine], [t[1] for t in mine], [t[2] for t in mine], batch,
            [t[3] for t in mine] if weighted else [], pooling, out_dtype, method, "", 0, wdtype)
        total = sum(d for _, _, d in layout)
        want = _reference(tables, r, batch, pooling, weighted, out_dtype)
        assert out.shape == (batch, total) and out.dtype == out_dtype, (out.shape, out.dtype, k)
        assert torch.equal(out, want), (pooling, weighted, batch, wdtype, out_dtype, method)
    # The Python spelling (a ProcessGroup) and one op object per configuration: the op made above.
    batch = 3
    tables = [_table(g, rows, dim, n * batch, torch.float32, 99) for g, (_, rows, dim) in enumerate(layout)]
    mine = [t for g, t in enumerate(tables) if layout[g][0] == r]
    before = len(wt.world()._gemms)
    out = wt.embedding_a2a([t[0] for t in mine], [t[1] for t in mine], [t[2] for t in mine], batch,
                           [t[3] for t in mine] if weighted else None, pooling=pooling, group=dist.group.WORLD,
                           total_dim=sum(d for _, _, d in layout))
    assert torch.equal(out, _reference(tables, r, batch, pooling, weighted, torch.float32))
    assert len(wt.world()._gemms) == before
    # Per-sample weights for some tables only (None for the others): every other table of each rank.
    psws = [t[3] if k % 2 == 0 else None for k, t in enumerate(mine)]
    flags = [sum(1 for p, _, _ in layout[:g] if p == layout[g][0]) % 2 == 0 for g in range(len(layout))]
    out = torch.ops.weft.embedding_a2a([t[0] for t in mine], [t[1] for t in mine], [t[2] for t in mine], batch,
                                       psws, pooling)
    assert torch.equal(out, _reference(tables, r, batch, pooling, flags, torch.float32))
    # The op object's layout (weft.EmbeddingA2A, the C API's weft_embedding_a2a_layout).
    import weft

    e = next(o for o in wt.world()._gemms.values() if isinstance(o, weft.EmbeddingA2A))
    assert e.dims == [d for _, _, d in layout] and e.total_dim == sum(e.dims)
    assert e.first_table == sum(1 for p, _, _ in layout if p < r)
    assert e.local_dim == sum(d for p, _, d in layout if p == r)
    return True


_CASES = ((3, "float32", "float32"), (3, "bfloat16", "float32"), (2, "bfloat16", "bfloat16"),
          (3, "float16", "float32"), (1, "float32", "bfloat16"), (0, "float32", "float32"))


@pytest.mark.parametrize("size", [1, 2, 4])
@pytest.mark.parametrize("pooling", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_embedding_a2a_exact(pools, size, pooling, weighted):
    assert pools.get(size).run(_rank_exact, pooling, weighted, _CASES) == [True] * size


def _rank_errors():
    import weft

    r, n = dist.get_rank(), dist.get_world_size()
    ops = torch.ops.weft
    dims = {p: (8 * (p + 1),) for p in range(n)}  # every rank a table: every rank refuses a bad table alike
    layout = _layout(n, dims)
    batch = 2
    tables = [_table(g, rows, dim, n * batch, torch.float32) for g, (_, rows, dim) in enumerate(layout)]
    (w, o, i, psw), = [t for g, t in enumerate(tables) if layout[g][0] == r]

    def call(ws=(w,), offs=(o,), idx=(i,), psws=(), **kw):
        args = dict(pooling="sum", out_dtype=torch.float32, method="auto", group="", total_dim=0, weight_dtype=None)
        args.update(kw)
        return ops.embedding_a2a(list(ws), list(offs), list(idx), batch, list(psws), args["pooling"], args["out_dtype"],
                                 args["method"], args["group"], args["total_dim"], args["weight_dtype"])

    # An index outside its table, on the last rank only: refused on every rank, the last naming
    # its table (its first, global n - 1) and the position.
    bad = i.clone()
    if r == n - 1:
        bad[1] = 999
    rows = layout[n - 1][1]
    msg = rf"table 0 \(global {n - 1}\): indices\[1\] = 999 is outside 0 \.\.\. {rows - 1}" if r == n - 1 else \
        "disagree"
    with pytest.raises(weft.InvalidArgument, match=msg):
        call(idx=(bad,))
    with pytest.raises(weft.InvalidArgument, match=r"offsets\[0\] has dtype torch.int32"):
        call(offs=(o.int(),))
    with pytest.raises(weft.InvalidArgument, match=r"indices\[0\] has dtype torch.int32"):
        call(idx=(i.int(),))
    with pytest.raises(weft.InvalidArgument, match=r"weights\[0\] has dtype torch.float64"):
        call(ws=(w.double(),))
    with pytest.raises(weft.InvalidArgument, match=r"per_sample_weights\[0\] has dtype torch.bfloat16"):
        call(psws=[psw.bfloat16()])
    with pytest.raises(weft.InvalidArgument, match=r"weights\[0\] is torch.float32 but weight_dtype is "
                                                   r"torch.bfloat16"):
        call(weight_dtype=torch.bfloat16)
    with pytest.raises(weft.InvalidArgument, match="out_dtype torch.float16 is not one of"):
        call(out_dtype=torch.float16)
    with pytest.raises(weft.InvalidArgument, match=rf"offsets\[0\] has shape \({n * batch},\); it needs world \* "
                                                   rf"batch \+ 1 = {n * batch + 1} elements"):
        call(offs=(o[:-1],))
    with pytest.raises(weft.InvalidArgument, match=rf"offsets\[0\] ends at {int(o[-1])}, past the "
                                                   rf"{i.numel() - 1} indices"):
        call(idx=(i[:-1],))
    with pytest.raises(weft.InvalidArgument, match=r"per_sample_weights\[0\] has shape"):
        call(psws=[psw[:-1]])
    with pytest.raises(weft.InvalidArgument, match="got 1 weights, 2 offsets"):
        call(offs=(o, o))
    with pytest.raises(weft.InvalidArgument, match=r"weights\[0\] must be \[rows, dim\]"):
        call(ws=(w.reshape(-1),))
    with pytest.raises(weft.InvalidArgument, match="unknown method 'direct'"):
        call(method="direct")
    with pytest.raises(weft.InvalidArgument, match="unknown pooling 'max'"):
        call(pooling="max")
    with pytest.raises(weft.InvalidArgument, match=r"total_dim 7, but every rank's tables' dims"):
        call(total_dim=7)
    # Offsets that decrease: weft's own check, on every rank.
    dec = o.clone()
    dec[1], dec[2] = dec[2] + 1, dec[2]
    with pytest.raises(weft.InvalidArgument, match=r"table 0 \(global \d\): offsets decrease at bag 1"):
        call(offs=(dec,))
    with pytest.raises(RuntimeError, match="no backward yet"):
        call(ws=(w.clone().requires_grad_(),))
    # The op goes on after the refusals.
    want = _reference(tables, r, batch, "sum", False, torch.float32)
    assert torch.equal(call(), want)
    return r


def test_embedding_a2a_bad_inputs(pools):
    assert pools.get(2).run(_rank_errors) == [0, 1]


def _rank_weight_dtype_of_a_rank_without_tables():
    """bf16 tables: a rank without tables says weight_dtype, or the ranks disagree (every rank hears it)."""
    import weft

    r, n = dist.get_rank(), dist.get_world_size()
    layout = _layout(n)
    batch = 2
    tables = [_table(g, rows, dim, n * batch, torch.bfloat16, 7) for g, (_, rows, dim) in enumerate(layout)]
    mine = [t for g, t in enumerate(tables) if layout[g][0] == r]
    args = ([t[0] for t in mine], [t[1] for t in mine], [t[2] for t in mine], batch, [], "sum", torch.float32,
            "auto", "")
    with pytest.raises(weft.InvalidArgument, match="ranks disagree on the configuration: .*weights bf16.*weights f32"):
        torch.ops.weft.embedding_a2a(*args)
    out = torch.ops.weft.embedding_a2a(*args, 0, torch.bfloat16)
    assert torch.equal(out, _reference(tables, r, batch, "sum", False, torch.float32))
    return True


def test_embedding_a2a_weight_dtype_without_tables(pools):
    pools.get(2).run(_rank_weight_dtype_of_a_rank_without_tables)


def _rank_compile(backend):
    import torch._dynamo

    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()
    torch._dynamo.reset()
    layout = _layout(n)
    total = sum(d for _, _, d in layout)
    batch = 3

    def inputs(call):
        tables = [_table(g, rows, dim, n * batch, torch.float32, call) for g, (_, rows, dim) in enumerate(layout)]
        return tables, [t for g, t in enumerate(tables) if layout[g][0] == r]

    def f(ws, offs, idx, psws, total_dim):
        return torch.ops.weft.embedding_a2a(ws, offs, idx, batch, psws, "mean", torch.float32, "auto", "",
                                            total_dim) * 2 + 1

    compiled = torch.compile(f, fullgraph=True, backend=backend)
    for call in range(2):
        tables, mine = inputs(call)
        args = ([t[0] for t in mine], [t[1] for t in mine], [t[2] for t in mine], [t[3] for t in mine])
        want = _reference(tables, r, batch, "mean", True, torch.float32) * 2 + 1
        assert torch.equal(compiled(*args, total), want)
    # Without total_dim, the fake takes the op object that prepare() made (meta tensors do).
    wt.world().release_ops()
    wt.prepare("embedding_a2a", [torch.empty(rows, dim, device="meta") for p, rows, dim in layout if p == r],
               None, None, batch, pooling="mean")
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend=backend)
    tables, mine = inputs(5)
    args = ([t[0] for t in mine], [t[1] for t in mine], [t[2] for t in mine], [t[3] for t in mine])
    assert torch.equal(compiled(*args, 0), _reference(tables, r, batch, "mean", True, torch.float32) * 2 + 1)
    return True


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_embedding_a2a_compile_fullgraph(pools, backend):
    pools.get(2).run(_rank_compile, backend, timeout=300)


# ---- GPUs (nccl backend) ------------------------------------------------------------------------

def _gpus():
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _rank_gpu(method):
    """Every method exact against the CPU reference, eagerly (with bf16 tables of the DLRM sizes'
    kind), replayed from a CUDA graph with new indices and weights (the bags' shapes kept), and
    compiled (inductor); an index outside its table named by the eager call's check."""
    import torch._dynamo

    import weft

    r, n = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    dims = {0: (64, 128), 1: (), 2: (32,), 3: (128, 16, 64)}
    layout = _layout(n, dims)
    total = sum(d for _, _, d in layout)
    batch = 64

    def inputs(call, dtype):
        tables = [_table(g, rows + 1000, dim, n * batch, dtype, call) for g, (_, rows, dim) in enumerate(layout)]
        if call:  # the bags of call 0, new indices and weights: a graph replays the same shapes
            first = [_table(g, rows + 1000, dim, n * batch, dtype, 0) for g, (_, rows, dim) in enumerate(layout)]
            tables = [(w, o0, torch.randint(0, w.shape[0], i0.shape, generator=torch.Generator().manual_seed(call)),
                       p0) for (w, _, _, _), (_, o0, i0, p0) in zip(tables, first)]
        mine = [tuple(x.to(dev) for x in t) for g, t in enumerate(tables) if layout[g][0] == r]
        return tables, [[t[k] for t in mine] for k in range(4)]

    def op(ws, offs, idx, psws):
        return torch.ops.weft.embedding_a2a(ws, offs, idx, batch, psws, "sum", torch.float32, method, "", total,
                                            torch.bfloat16)

    tables, args = inputs(0, torch.bfloat16)
    out = op(*args)
    assert torch.equal(out.cpu(), _reference(tables, r, batch, "sum", True, torch.float32)), (method, "eager")
    static = [[t.clone() for t in a] for a in args]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_static = op(*static)
    for call in (1, 2):
        tables, args = inputs(call, torch.bfloat16)
        for s_list, a_list in zip(static, args):
            for s_, a in zip(s_list, a_list):
                s_.copy_(a)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y_static.cpu(), _reference(tables, r, batch, "sum", True, torch.float32)), \
            (method, "CUDA graph", call)
    torch._dynamo.reset()
    tables, args = inputs(3, torch.bfloat16)
    assert torch.equal(torch.compile(op, fullgraph=True)(*args).cpu(),
                       _reference(tables, r, batch, "sum", True, torch.float32)), (method, "compile")
    # An index outside its table on rank 0 (its table 1, global 1): named by rank 0's eager call.
    if r == 0:
        args[2][1] = args[2][1].clone()
        args[2][1][3] = 10 ** 6
        with pytest.raises(weft.InvalidArgument, match=r"table 1 \(global 1\): indices\[3\] = 1000000 is outside"):
            op(*args)
    else:
        op(*args)
    return True


needs2 = pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")


@needs2
@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("method", METHODS)
def test_gpu_embedding_a2a(pools, size, method):
    if _gpus() < size:
        pytest.skip(f"needs {size} GPUs")
    pools.get(size, gpu=True).run(_rank_gpu, method, timeout=600)
