"""torch.ops.weft.moe_dispatch / moe_combine on CPU tensors over the host backend, 1, 2 and 4
ranks: recv's rows and counts exactly as docs/moe.md lays them out (rank-major, expert-grouped,
each chunk in (token, slot) order), combine's weighted sums exact on integer data with experts
that scale their rows, every method, T changing per rank and call; bad inputs refused;
torch.compile. Every rank builds every rank's input from a seed, so each knows what it must
receive."""

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

H, TOP_K, MAX_T = 16, 2, 8


def _inputs(p, call, t, experts, dtype):
    """Rank p's x [t, H] (small integers), ids [t, TOP_K] (distinct experts a token) and
    weights [t, TOP_K] (halves and ones) of call `call`."""
    g = torch.Generator().manual_seed(1000 * call + p)
    x = torch.randint(-4, 5, (t, H), generator=g).to(dtype)
    ids = torch.stack([torch.randperm(experts, generator=g)[:TOP_K] for _ in range(t)]) if t else \
        torch.empty(0, TOP_K, dtype=torch.int64)
    w = torch.randint(1, 3, (t, TOP_K), generator=g).float() / 2
    return x, ids.to(torch.int32), w


def _tokens(p, call):
    return (3 * p + call) % (MAX_T + 1)


def _rank_moe(dtype_name, methods):
    import weft.torch as wt

    dtype = getattr(torch, dtype_name)
    r, n = dist.get_rank(), dist.get_world_size()
    experts = 2 * n
    local = experts // n
    for method in methods:
        for call in range(4):
            ins = [_inputs(p, call, _tokens(p, call), experts, dtype) for p in range(n)]
            x, ids, w = ins[r]
            recv, counts = torch.ops.weft.moe_dispatch(x, ids, experts, MAX_T, 0, method, "")
            cap = n * MAX_T * min(TOP_K, local)
            assert recv.shape == (cap, H) and recv.dtype == dtype and counts.shape == (n, local)
            # The layout: source-major, local expert, then the source's (token, slot) order.
            want_rows, want_counts = [], torch.zeros(n, local, dtype=torch.int64)
            for s in range(n):
                xs, ids_s, _ = ins[s]
                for le in range(local):
                    for t in range(xs.shape[0]):
                        for j in range(TOP_K):
                            if int(ids_s[t, j]) == r * local + le:
                                want_rows.append(xs[t])
                                want_counts[s, le] += 1
            assert torch.equal(counts, want_counts), (method, call)
            rows = int(counts.sum())
            if rows:
                assert torch.equal(recv[:rows], torch.stack(want_rows)), (method, call)
            # Experts that scale their rows by (local expert + 1): y = sum_j w_j (e_j % local + 1) x.
            scale = torch.repeat_interleave(torch.arange(local).repeat(n) + 1, counts.reshape(-1), output_size=rows)
            out = recv.clone()
            out[:rows] = (recv[:rows].float() * scale[:, None].float()).to(dtype)
            y = torch.ops.weft.moe_combine(out, w, experts, MAX_T, 0, method, "")
            f = (ids.long() % local + 1).float() * w
            want = (x.float() * f.sum(1, keepdim=True)).to(dtype)
            assert y.shape == x.shape and torch.equal(y, want), (method, call)
    return True


@pytest.mark.parametrize("size", [1, 2, 4])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_moe_exact(pools, size, dtype):
    assert pools.get(size).run(_rank_moe, dtype, ("auto",)) == [True] * size


def test_moe_methods(pools):
    pools.get(2).run(_rank_moe, "bfloat16", ("baseline", "decomposed", "direct"))


def _rank_moe_errors():
    import weft
    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()
    experts = 2 * n
    ops = torch.ops.weft
    x, ids, w = _inputs(r, 0, 4, experts, torch.bfloat16)
    with pytest.raises(weft.InvalidArgument, match="experts must be a positive multiple of the world size"):
        ops.moe_dispatch(x, ids, 3, MAX_T, 0, "auto", "")
    with pytest.raises(weft.InvalidArgument, match="more than max_tokens 2"):
        ops.moe_dispatch(x, ids, experts, 2, 0, "auto", "")
    with pytest.raises(weft.InvalidArgument, match="unknown method 'll'"):
        ops.moe_dispatch(x, ids, experts, MAX_T, 0, "ll", "")
    with pytest.raises(weft.InvalidArgument, match="ids has dtype torch.float32"):
        ops.moe_dispatch(x, ids.float(), experts, MAX_T, 0, "auto", "")
    with pytest.raises(weft.InvalidArgument, match=r"x must be \[T, hidden\] and ids \[T, top_k\]"):
        ops.moe_dispatch(x, ids[:3], experts, MAX_T, 0, "auto", "")
    # An id outside the experts, on one rank only: refused on every rank (the op agrees first).
    bad = ids.clone()
    if r == 0:
        bad[1, 1] = experts + 5
    with pytest.raises(weft.InvalidArgument, match="is not an expert" if r == 0 else "disagree"):
        ops.moe_dispatch(x, bad, experts, MAX_T, 0, "auto", "")
    recv, counts = ops.moe_dispatch(x, ids, experts, MAX_T, 0, "auto", "")
    with pytest.raises(weft.InvalidArgument, match="expert_out has 5 rows"):
        ops.moe_combine(recv[:5], w, experts, MAX_T, 0, "auto", "")
    with pytest.raises(weft.InvalidArgument, match="weights has dtype torch.bfloat16"):
        ops.moe_combine(recv, w.bfloat16(), experts, MAX_T, 0, "auto", "")
    with pytest.raises(RuntimeError, match="no backward yet"):
        ops.moe_dispatch(x.float().requires_grad_(), ids, experts, MAX_T, 0, "auto", "")
    # int64 ids (torch.topk's) are taken; the op goes on after the refusals.
    recv2, counts2 = wt.moe_dispatch(x, ids.long(), experts, MAX_T)
    assert torch.equal(recv2, recv) and torch.equal(counts2, counts)
    y = wt.moe_combine(recv2, w, experts, MAX_T)
    assert torch.equal(y, (x.float() * w.sum(1, keepdim=True)).bfloat16())
    return r


def test_moe_bad_inputs(pools):
    assert pools.get(2).run(_rank_moe_errors) == [0, 1]


def _rank_moe_compile(backend):
    import torch._dynamo

    r, n = dist.get_rank(), dist.get_world_size()
    torch._dynamo.reset()
    experts = 2 * n

    def f(x, ids, w):
        recv, counts = torch.ops.weft.moe_dispatch(x, ids, experts, MAX_T, 0, "auto", "")
        return torch.ops.weft.moe_combine(recv * 2, w, experts, MAX_T, 0, "auto", "") + 1, counts

    compiled = torch.compile(f, fullgraph=True, backend=backend)
    for call in range(2):
        x, ids, w = _inputs(r, call, 5, experts, torch.bfloat16)
        for got, want in zip(compiled(x, ids, w), f(x, ids, w)):
            assert torch.equal(got, want)
    return True


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_moe_compile_fullgraph(pools, backend):
    pools.get(2).run(_rank_moe_compile, backend, timeout=300)


# ---- the layer ------------------------------------------------------------------------------

FFN = 8


def _expert_weights(e, dtype):
    """Expert e's w_up [2 FFN, H] and w_down [H, FFN] (quarters: exact in bf16), known to every rank."""
    g = torch.Generator().manual_seed(5000 + e)
    up = (torch.randint(-2, 3, (2 * FFN, H), generator=g).float() / 4).to(dtype)
    down = (torch.randint(-2, 3, (H, FFN), generator=g).float() / 4).to(dtype)
    return up, down


def _layer_reference(x, ids, w, dtype):
    """Each token through its experts' SwiGLU FFNs with the op's rounding points (h, SiLU * up and
    the expert's output rounded to the dtype), summed with its weights in fp32."""
    y = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            up, down = _expert_weights(int(ids[t, j]), dtype)
            h = (x[t].float() @ up.float().t()).to(dtype).float()
            a = (torch.nn.functional.silu(h[:FFN]) * h[FFN:]).to(dtype).float()
            y[t] += w[t, j] * (a @ down.float().t()).to(dtype).float()
    return y.to(dtype)


def _rank_moe_layer(dtype_name, methods):
    import weft.torch as wt

    dtype = getattr(torch, dtype_name)
    r, n = dist.get_rank(), dist.get_world_size()
    experts = 2 * n
    local = experts // n
    w_up = torch.stack([_expert_weights(r * local + le, dtype)[0] for le in range(local)])
    w_down = torch.stack([_expert_weights(r * local + le, dtype)[1] for le in range(local)])
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    for method in methods:
        for call in range(3):
            x, ids, w = _inputs(r, call, _tokens(r, call), experts, dtype)
            y = wt.moe_layer(x, ids, w, w_up, w_down, experts, MAX_T, method=method)
            assert y.shape == x.shape and y.dtype == dtype
            torch.testing.assert_close(y.float(), _layer_reference(x, ids, w, dtype).float(), rtol=tol, atol=tol)
    return True


@pytest.mark.parametrize("size", [1, 2, 4])
def test_moe_layer_matches_reference(pools, size):
    assert pools.get(size).run(_rank_moe_layer, "bfloat16", ("auto", "baseline")) == [True] * size


def test_moe_layer_f32(pools):
    pools.get(2).run(_rank_moe_layer, "float32", ("decomposed", "fused"))


def _rank_moe_layer_errors():
    import weft
    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()
    experts = 2 * n
    local = experts // n
    ops = torch.ops.weft
    x, ids, w = _inputs(r, 0, 4, experts, torch.bfloat16)
    up = torch.zeros(local, 2 * FFN, H, dtype=torch.bfloat16)
    down = torch.zeros(local, H, FFN, dtype=torch.bfloat16)
    with pytest.raises(weft.InvalidArgument, match=r"w_up must be \[experts / world = 2, 2 \* ffn, hidden = 16\]"):
        ops.moe_layer(x, ids, w, up[:1], down, experts, MAX_T, 0, "auto", "")
    with pytest.raises(weft.InvalidArgument, match=r"w_down must be \[2, 16, 8\]"):
        ops.moe_layer(x, ids, w, up, down[:, :, :4], experts, MAX_T, 0, "auto", "")
    with pytest.raises(weft.InvalidArgument, match="w_up has dtype torch.float32"):
        ops.moe_layer(x, ids, w, up.float(), down, experts, MAX_T, 0, "auto", "")
    with pytest.raises(weft.InvalidArgument, match="unknown method 'direct'"):
        ops.moe_layer(x, ids, w, up, down, experts, MAX_T, 0, "direct", "")
    with pytest.raises(weft.InvalidArgument, match=r"ids and weights \[T, top_k\]"):
        ops.moe_layer(x, ids, w[:2], up, down, experts, MAX_T, 0, "auto", "")
    with pytest.raises(RuntimeError, match="no backward yet"):
        ops.moe_layer(x.float().requires_grad_(), ids, w, up.float(), down.float(), experts, MAX_T, 0, "auto", "")
    # The layer goes on after the refusals; zero weights give zero.
    y = wt.moe_layer(x, ids, w, up, down, experts, MAX_T)
    assert torch.equal(y, torch.zeros_like(x))
    return r


def test_moe_layer_bad_inputs(pools):
    assert pools.get(2).run(_rank_moe_layer_errors) == [0, 1]


def _rank_moe_layer_compile():
    import torch._dynamo

    r, n = dist.get_rank(), dist.get_world_size()
    torch._dynamo.reset()
    experts = 2 * n
    local = experts // n
    up = torch.stack([_expert_weights(r * local + le, torch.bfloat16)[0] for le in range(local)])
    down = torch.stack([_expert_weights(r * local + le, torch.bfloat16)[1] for le in range(local)])

    def f(x, ids, w):
        return torch.ops.weft.moe_layer(x * 1, ids, w, up, down, experts, MAX_T, 0, "auto", "") + 1

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for call in range(2):
        x, ids, w = _inputs(r, call, 5, experts, torch.bfloat16)
        assert torch.equal(compiled(x, ids, w), f(x, ids, w))
    return True


def test_moe_layer_compile_fullgraph(pools):
    pools.get(2).run(_rank_moe_layer_compile, timeout=300)
