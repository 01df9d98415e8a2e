"""torch.ops.weft.embedding_a2a on CPU tensors over the host backend, 1, 2 and 4 ranks: exact
against torch.nn.functional.embedding_bag per table on the global batch, each rank's slice of
samples, the tables concatenated in global order (rank 0's first) -- sum and mean, per-sample
weights, f32/bf16/f16 weights and f32/bf16 outputs, tables of different dims, a rank with no
table, empty bags, batch 0, every method; bad inputs refused with the message naming the table
and the position; torch.compile and prepare. The backward: the weights' gradients through autograd
against torch's autograd through embedding_bag (exact on small integers, allclose on normals), the
sparse kind against torch's coalesced sparse gradient, the fused SGD and Adagrad steps against
torch.optim's, bad arguments refused, compiled. On GPUs (nccl backend; skipped without them): every
method exact, eagerly, replayed from a CUDA graph with new inputs and compiled; the backward's kinds.
Every rank builds every rank's tables and bags from seeds, so each knows what it must receive (and
every rank's gradient of out)."""

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
    # Per-sample weights that require grad: refused (the op differentiates the weights only).
    with pytest.raises(RuntimeError, match=r"per_sample_weights\[0\] requires grad, but the op has no gradient"):
        call(ws=(w.clone().requires_grad_(),), psws=[psw.clone().requires_grad_()])
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


# ---- backward: autograd, the sparse gradient, the fused SGD and Adagrad steps ------------------

def _grad_out(r, batch, total, dtype=torch.float32, call=0, exact=True):
    """Rank r's gradient of out [batch, total]: small integers (exact), or normals."""
    gen = torch.Generator().manual_seed(5000 + 100 * call + r)
    if exact:
        return torch.randint(-3, 4, (batch, total), generator=gen).to(dtype)
    return torch.randn(batch, total, generator=gen).to(dtype)


def _ref_grads(tables, layout, n, batch, pooling, weighted, grads_out, sparse=False):
    """Every global table's weight gradient by torch's autograd through embedding_bag
    (nn.EmbeddingBag's function) in fp32: the loss sum over ranks r of (out_r * grads_out[r]).sum(),
    out_r rank r's slice of the samples. sparse: torch's sparse gradients, coalesced."""
    out = []
    col = 0
    for (weight, offsets, indices, psw), (_, _, dim) in zip(tables, layout):
        w = weight.float().detach().requires_grad_()
        p = psw if weighted else None
        if pooling == "mean" and weighted:  # embedding_bag weighs sums only: the mean by hand
            pooled = F.embedding_bag(indices, w, offsets, mode="sum", per_sample_weights=p, include_last_offset=True,
                                     sparse=sparse)
            pooled = pooled / (offsets[1:] - offsets[:-1]).clamp(min=1).float()[:, None]
        else:
            pooled = F.embedding_bag(indices, w, offsets, mode=pooling, per_sample_weights=p, include_last_offset=True,
                                     sparse=sparse)
        loss = sum((pooled[r * batch:(r + 1) * batch] * grads_out[r][:, col:col + dim].float()).sum() for r in range(n))
        loss.backward()
        out.append(w.grad.coalesce() if sparse else w.grad)
        col += dim
    return out


def _rank_autograd(pooling, weighted, cases):
    """weft.torch.embedding_a2a's weights' gradients (loss.backward()) against torch's autograd
    through embedding_bag: exact on small integers in every dtype (the fp32 gradient rounded once to
    the weight's dtype: what the reference's fp32 gradient cast gives), allclose on normals."""
    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()
    layout = _layout(n)
    total = sum(d for _, _, d in layout)
    for k, (batch, wdtype, out_dtype, exact) in enumerate(cases):
        method = METHODS[k % len(METHODS)]
        wdtype, out_dtype = getattr(torch, wdtype), getattr(torch, out_dtype)
        tables = [_table(g, rows, dim, n * batch, wdtype, k) for g, (_, rows, dim) in enumerate(layout)]
        if not exact:
            gen = torch.Generator().manual_seed(77 + k)
            tables = [(torch.randn(w.shape, generator=gen).to(wdtype), o, i, torch.rand(i.shape, generator=gen))
                      for w, o, i, _ in tables]
        mine = [t for g, t in enumerate(tables) if layout[g][0] == r]
        ws = [t[0].clone().requires_grad_() for t in mine]
        out = wt.embedding_a2a(ws, [t[1] for t in mine], [t[2] for t in mine], batch,
                               [t[3] for t in mine] if weighted else None, pooling=pooling, out_dtype=out_dtype,
                               method=method, weight_dtype=wdtype)
        assert out.requires_grad  # on a rank without tables too: the backward is collective
        grads_out = [_grad_out(q, batch, total, out_dtype, k, exact) for q in range(n)]
        (out.float() * grads_out[r].float()).sum().backward()
        want = [g for g, (p, _, _) in zip(_ref_grads(tables, layout, n, batch, pooling, weighted, grads_out), layout)
                if p == r]
        for t, (w, g) in enumerate(zip(ws, want)):
            what = (pooling, weighted, batch, wdtype, out_dtype, method, t)
            assert w.grad.dtype == wdtype and w.grad.shape == w.shape, what
            if exact:
                assert torch.equal(w.grad, g.to(wdtype)), what
            else:
                torch.testing.assert_close(w.grad, g.to(wdtype), rtol=1e-5, atol=1e-5, msg=str(what))
    return True


_GRAD_CASES = ((3, "float32", "float32", True), (2, "bfloat16", "float32", True), (3, "float32", "bfloat16", True),
               (2, "float16", "float32", True), (0, "float32", "float32", True), (3, "float32", "float32", False))


@pytest.mark.parametrize("size", [1, 2, 4])
@pytest.mark.parametrize("pooling", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_embedding_a2a_autograd(pools, size, pooling, weighted):
    assert pools.get(size).run(_rank_autograd, pooling, weighted, _GRAD_CASES) == [True] * size


def _rank_sparse_and_steps(pooling, weighted):
    """weft.torch.embedding_a2a_backward: kind "sparse" equal to torch's coalesced sparse gradient
    (rows ascending, distinct); "dense" to the dense one; "sgd" and "adagrad" (two steps: the state
    carries over) as torch.optim.SGD / Adagrad applied to a copy with torch's sparse gradient
    (allclose: torch's CPU kernels may contract a multiply-add). fp32 tables."""
    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()
    layout = _layout(n)
    total = sum(d for _, _, d in layout)
    batch = 3
    tables = [_table(g, rows, dim, n * batch, torch.float32, 40) for g, (_, rows, dim) in enumerate(layout)]
    mine_g = [g for g in range(len(layout)) if layout[g][0] == r]
    mine = [tables[g] for g in mine_g]
    args = ([t[0] for t in mine], [t[1] for t in mine], [t[2] for t in mine], batch)
    kw = dict(per_sample_weights=[t[3] for t in mine] if weighted else None, pooling=pooling)
    grads_out = [_grad_out(q, batch, total, call=40) for q in range(n)]
    sparse_want = _ref_grads(tables, layout, n, batch, pooling, weighted, grads_out, sparse=True)
    got = wt.embedding_a2a_backward(*args, grads_out[r], kind="sparse", method="decomposed", **kw)
    assert len(got) == len(mine)
    for g, s in zip(mine_g, got):
        want = sparse_want[g]
        assert s.is_sparse and s.is_coalesced() and s.shape == tables[g][0].shape and s.dtype == torch.float32
        rows = s.indices()[0]
        assert torch.equal(rows, torch.unique(tables[g][2])), g  # every row the bags index, ascending
        assert torch.equal(s.indices(), want.indices()) and torch.equal(s.values(), want.values()), g
    dense = wt.embedding_a2a_backward(*args, grads_out[r], kind="dense", method="fused", **kw)
    for g, d in zip(mine_g, dense):
        assert d.dtype == torch.float32 and torch.equal(d, sparse_want[g].to_dense()), g
    # The optimizers' steps, twice (new gradients of out the second time).
    for kind, lr in (("sgd", 0.5), ("adagrad", 0.3)):
        ws = [t[0].clone() for t in mine]
        states = [torch.zeros_like(w) for w in ws] if kind == "adagrad" else None
        refs = [tables[g][0].clone().requires_grad_() for g in range(len(layout))]
        opt = torch.optim.SGD(refs, lr=lr) if kind == "sgd" else torch.optim.Adagrad(refs, lr=lr, eps=1e-10)
        for step in range(2):
            go = [_grad_out(q, batch, total, call=41 + step) for q in range(n)]
            wt.embedding_a2a_backward(ws, *args[1:], go[r], kind=kind, lr=lr, states=states, **kw)
            for p, g in zip(refs, _ref_grads(tables, layout, n, batch, pooling, weighted, go, sparse=True)):
                p.grad = g
            opt.step()
            for w, g in zip(ws, mine_g):
                torch.testing.assert_close(w, refs[g].detach(), rtol=1e-6, atol=1e-6, msg=f"{kind} step {step} {g}")
            if kind == "adagrad":
                for st, g in zip(states, mine_g):
                    assert torch.equal(st, opt.state[refs[g]]["sum"]), (step, g)  # sums of squares: exact
    # The op itself: sgd on bf16 tables (weight_dtype: for the rank without tables), exact (lr 0.5).
    ws = [t[0].to(torch.bfloat16) for t in mine]
    want = [w.float() - 0.5 * sparse_want[g].to_dense() for w, g in zip(ws, mine_g)]
    torch.ops.weft.embedding_a2a_update(ws, [], *args[1:], kw["per_sample_weights"] or [], grads_out[r], "sgd", 0.5,
                                        1e-10, pooling, "baseline", "", torch.bfloat16)
    for w, wnt in zip(ws, want):
        assert torch.equal(w, wnt.to(torch.bfloat16))
    return True


@pytest.mark.parametrize("size", [1, 2, 4])
@pytest.mark.parametrize("pooling,weighted", [("sum", False), ("sum", True), ("mean", True)])
def test_embedding_a2a_sparse_sgd_adagrad(pools, size, pooling, weighted):
    assert pools.get(size).run(_rank_sparse_and_steps, pooling, weighted) == [True] * size


def _rank_backward_errors():
    import weft
    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()
    dims = {p: (8 * (p + 1),) for p in range(n)}  # every rank a table: every rank refuses alike
    layout = _layout(n, dims)
    total = sum(d for _, _, d in layout)
    batch = 2
    tables = [_table(g, rows, dim, n * batch, torch.float32) for g, (_, rows, dim) in enumerate(layout)]
    (w, o, i, psw), = [t for g, t in enumerate(tables) if layout[g][0] == r]
    go = _grad_out(r, batch, total)

    def bwd(kind="dense", ws=(w,), grad_out=go, **kw):
        return wt.embedding_a2a_backward(list(ws), [o], [i], batch, grad_out, kind=kind, **kw)

    with pytest.raises(weft.InvalidArgument, match="unknown kind 'momentum'"):
        bwd("momentum")
    with pytest.raises(weft.InvalidArgument, match="kind 'adagrad' needs states"):
        bwd("adagrad", lr=0.1)
    with pytest.raises(weft.InvalidArgument, match=r"states\[0\] must be a contiguous fp32"):
        bwd("adagrad", lr=0.1, states=[torch.zeros(3, 8)])
    with pytest.raises(weft.InvalidArgument, match="sgd takes no states"):
        bwd("sgd", lr=0.1, states=[torch.zeros_like(w)])
    with pytest.raises(weft.InvalidArgument, match=r"weights\[0\] must be contiguous \(updated in place\)"):
        bwd("sgd", ws=(torch.zeros(w.shape[1], w.shape[0]).t(),), lr=0.1)
    with pytest.raises(weft.InvalidArgument, match="unknown kind 'dense' \\(sgd or adagrad"):
        torch.ops.weft.embedding_a2a_update([w], [], [o], [i], batch, [], go, "dense", 0.1)
    with pytest.raises(weft.InvalidArgument, match=rf"grad_out has {total + 1} columns, but every rank's tables"):
        bwd(grad_out=torch.zeros(batch, total + 1))
    with pytest.raises(weft.InvalidArgument, match=r"grad_out must be \[batch = 2, total_dim\]"):
        bwd(grad_out=torch.zeros(batch + 1, total))
    with pytest.raises(weft.InvalidArgument, match="grad_out has dtype torch.float16"):
        bwd(grad_out=go.half())
    with pytest.raises(weft.InvalidArgument, match="lr must be finite"):  # weft's own check, on every rank
        bwd("sgd", lr=float("nan"))
    # The backward goes on after the refusals (and leaves the weights alone on kind dense).
    w0 = w.clone()
    want = _ref_grads(tables, layout, n, batch, "sum", False, [_grad_out(q, batch, total) for q in range(n)])[r]
    assert torch.equal(bwd()[0], want) and torch.equal(w, w0)
    return True


def test_embedding_a2a_backward_bad_inputs(pools):
    assert pools.get(2).run(_rank_backward_errors) == [True, True]


def _rank_compile_backward(backend):
    """The autograd rule and the fused step under torch.compile (fullgraph): the backward op's fake
    keeps it in the graph; gradients and steps equal to the eager ones."""
    import torch._dynamo

    r, n = dist.get_rank(), dist.get_world_size()
    torch._dynamo.reset()
    layout = _layout(n)
    total = sum(d for _, _, d in layout)
    batch = 3
    tables = [_table(g, rows, dim, n * batch, torch.float32, 60) for g, (_, rows, dim) in enumerate(layout)]
    mine = [t for g, t in enumerate(tables) if layout[g][0] == r]
    go = [_grad_out(q, batch, total, call=60) for q in range(n)]
    anchor = torch.empty(0, requires_grad=True)  # rank 1 holds no table: its out is tracked through it

    def f(ws, offs, idx, psws, grad_out):
        out = torch.ops.weft.embedding_a2a(ws, offs, idx, batch, psws, "mean", torch.float32, "auto", "", total,
                                           None, True, anchor)
        return (out * grad_out).sum()

    compiled = torch.compile(f, fullgraph=True, backend=backend)
    ws = [t[0].clone().requires_grad_() for t in mine]
    compiled(ws, [t[1] for t in mine], [t[2] for t in mine], [t[3] for t in mine], go[r]).backward()
    want = _ref_grads(tables, layout, n, batch, "mean", True, go)
    for w, g in zip(ws, [g for g, (p, _, _) in zip(want, layout) if p == r]):
        assert torch.equal(w.grad, g)

    def step(ws, states, offs, idx, grad_out):
        torch.ops.weft.embedding_a2a_update(ws, states, offs, idx, batch, [], grad_out, "adagrad", 0.1, 1e-10)
        return [w * 1 for w in ws]

    ws_c, ws_e = [t[0].clone() for t in mine], [t[0].clone() for t in mine]
    st_c, st_e = [torch.zeros_like(w) for w in ws_c], [torch.zeros_like(w) for w in ws_e]
    got = torch.compile(step, fullgraph=True, backend=backend)(ws_c, st_c, [t[1] for t in mine],
                                                               [t[2] for t in mine], go[r])
    step(ws_e, st_e, [t[1] for t in mine], [t[2] for t in mine], go[r])
    for a, b, c, s1, s2 in zip(got, ws_c, ws_e, st_c, st_e):
        assert torch.equal(a, c) and torch.equal(b, c) and torch.equal(s1, s2)
    return True


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_embedding_a2a_compile_backward(pools, backend):
    pools.get(2).run(_rank_compile_backward, backend, timeout=300)


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


def _rank_gpu_backward(method):
    """The backward on GPUs, every method: the weights' gradients through autograd exact against
    torch's on the CPU (integer bf16 tables, fp32 gradients of out), the sparse kind equal to the
    coalesced sparse gradient, Adagrad's step (twice) as torch.optim.Adagrad's on the CPU."""
    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    dims = {0: (64, 128), 1: (), 2: (32,), 3: (128, 16, 64)}
    layout = _layout(n, dims)
    total = sum(d for _, _, d in layout)
    batch = 64
    tables = [_table(g, rows + 1000, dim, n * batch, torch.bfloat16, 7) for g, (_, rows, dim) in enumerate(layout)]
    mine_g = [g for g in range(len(layout)) if layout[g][0] == r]
    mine = [tuple(x.to(dev) for x in tables[g]) for g in mine_g]
    offs, idx, psws = [t[1] for t in mine], [t[2] for t in mine], [t[3] for t in mine]
    grads_out = [_grad_out(q, batch, total, call=7) for q in range(n)]
    ws = [t[0].clone().requires_grad_() for t in mine]
    out = wt.embedding_a2a(ws, offs, idx, batch, psws, method=method, total_dim=total, weight_dtype=torch.bfloat16)
    (out * grads_out[r].to(dev)).sum().backward()
    want = _ref_grads(tables, layout, n, batch, "sum", True, grads_out)
    for w, g in zip(ws, mine_g):
        assert torch.equal(w.grad.cpu(), want[g].to(torch.bfloat16)), (method, "autograd", g)
    sparse_want = _ref_grads(tables, layout, n, batch, "sum", True, grads_out, sparse=True)
    got = wt.embedding_a2a_backward([t[0] for t in mine], offs, idx, batch, grads_out[r].to(dev), kind="sparse",
                                    per_sample_weights=psws, method=method, weight_dtype=torch.bfloat16)
    for s_, g in zip(got, mine_g):
        s_ = s_.cpu()
        assert s_.is_coalesced() and torch.equal(s_.indices(), sparse_want[g].indices()), (method, "sparse", g)
        assert torch.equal(s_.values(), sparse_want[g].values()), (method, "sparse", g)
    # Adagrad on fp32 tables (a configuration of its own), twice.
    tables32 = [(w.float(), o, i, p) for w, o, i, p in tables]
    ws = [tables32[g][0].to(dev) for g in mine_g]
    states = [torch.zeros_like(w) for w in ws]
    refs = [t[0].clone().requires_grad_() for t in tables32]
    opt = torch.optim.Adagrad(refs, lr=0.1, eps=1e-10)
    for step in range(2):
        go = [_grad_out(q, batch, total, call=8 + step) for q in range(n)]
        wt.embedding_a2a_backward(ws, offs, idx, batch, go[r].to(dev), kind="adagrad", lr=0.1, states=states,
                                  per_sample_weights=psws, method=method)
        for p, g in zip(refs, _ref_grads(tables32, layout, n, batch, "sum", True, go, sparse=True)):
            p.grad = g
        opt.step()
        for w, st, g in zip(ws, states, mine_g):
            torch.testing.assert_close(w.cpu(), refs[g].detach(), rtol=1e-6, atol=1e-6)
            assert torch.equal(st.cpu(), opt.state[refs[g]]["sum"]), (method, "adagrad state", step, g)
    return True


needs2 = pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")


@needs2
@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("method", METHODS)
def test_gpu_embedding_a2a(pools, size, method):
    if _gpus() < size:
        pytest.skip(f"needs {size} GPUs")
    pools.get(size, gpu=True).run(_rank_gpu, method, timeout=600)


@needs2
@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("method", METHODS)
def test_gpu_embedding_a2a_backward(pools, size, method):
    if _gpus() < size:
        pytest.skip(f"needs {size} GPUs")
    pools.get(size, gpu=True).run(_rank_gpu_backward, method, timeout=600)
