"""weft.torch.nn's parallel linears and the ops' autograd rules, forward and backward, against a
single-process dense reference (the full weights, on every rank). bf16 on small integers: every
product and sum is an integer far below 256, so the comparisons are exact."""

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

SIZES = [1, 2, 4]
S, H, F = 16, 32, 64  # tokens, hidden (in), ffn (out)


def ints(shape, seed, dtype=torch.bfloat16, lo=-1, hi=2):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, tuple(shape), generator=g).to(dtype)


def dense(x, w, g):
    """Reference: y = x · wᵀ, loss = sum(y * g) (so dy = g), grads in float32."""
    x = x.float().requires_grad_()
    w = w.float().requires_grad_()
    y = x @ w.t()
    (y * g.float()).sum().backward()
    return y, x.grad, w.grad


def _rank_column(sequence_parallel, bias):
    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()
    x_full, w_full, g_full = ints((S, H), 1), ints((F, H), 2), ints((S, F), 3)
    b_full = ints((F,), 4)
    y_ref, dx_ref, dw_ref = dense(x_full, w_full, g_full)
    y_ref = y_ref + b_full.float()
    lin = wt.nn.ColumnParallelLinear(H, F, bias=bias, sequence_parallel=sequence_parallel)
    lin.load_full_weight(w_full, b_full)
    assert lin.weight.shape == (F // n, H)
    cols = slice(r * F // n, (r + 1) * F // n)
    rows = slice(r * S // n, (r + 1) * S // n)
    x = (x_full[rows] if sequence_parallel else x_full).clone().requires_grad_()
    y = lin(x)
    assert y.shape == (S, F // n)
    want = y_ref[:, cols] if bias else (y_ref - b_full.float())[:, cols]
    assert torch.equal(y.float(), want)
    (y.float() * g_full[:, cols].float()).sum().backward()
    # Every rank's loss is its columns' part of the dense loss: the sum over ranks is the dense
    # loss, so each rank's gradients are its shard of the dense gradients.
    assert torch.equal(x.grad.float(), dx_ref[rows] if sequence_parallel else dx_ref)
    assert torch.equal(lin.weight.grad.float(), dw_ref[cols])
    if bias:
        assert torch.equal(lin.bias.grad.float(), g_full[:, cols].float().sum(0))
    return True


@pytest.mark.parametrize("size", SIZES)
def test_column_parallel(pools, size):
    pools.get(size).run(_rank_column, True, False)


@pytest.mark.parametrize("sequence_parallel,bias", [(False, False), (True, True)])
def test_column_parallel_variants(pools, sequence_parallel, bias):
    pools.get(2).run(_rank_column, sequence_parallel, bias)


def _rank_row(reduce, bias):
    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()
    # A RowParallelLinear F -> H (the MLP's down projection).
    x_full, w_full, g_full = ints((S, F), 5), ints((H, F), 6), ints((S, H), 7)
    b_full = ints((H,), 8)
    y_ref, dx_ref, dw_ref = dense(x_full, w_full, g_full)
    lin = wt.nn.RowParallelLinear(F, H, bias=bias, reduce=reduce)
    lin.load_full_weight(w_full, b_full)
    assert lin.weight.shape == (H, F // n)
    cols = slice(r * F // n, (r + 1) * F // n)
    rows = slice(r * S // n, (r + 1) * S // n) if reduce == "scatter" else slice(0, S)
    x = x_full[:, cols].clone().requires_grad_()
    y = lin(x)
    want = y_ref[rows] + (b_full.float() if bias else 0)
    assert y.shape == want.shape and torch.equal(y.float(), want)
    # scatter: each rank's loss is its rows' part of the dense loss. all_reduce: the output is
    # the same on every rank and so is the loss (Megatron's convention): dy = g everywhere.
    (y.float() * g_full[rows].float()).sum().backward()
    assert torch.equal(x.grad.float(), dx_ref[:, cols])
    assert torch.equal(lin.weight.grad.float(), dw_ref[:, cols])
    if bias:
        assert torch.equal(lin.bias.grad.float(), g_full[rows].float().sum(0))
    return True


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("reduce", ["scatter", "all_reduce"])
def test_row_parallel(pools, size, reduce):
    pools.get(size).run(_rank_row, reduce, False)


def test_row_parallel_bias(pools):
    pools.get(2).run(_rank_row, "scatter", True)


def _rank_mlp():
    """The sequence-parallel MLP block (gate/up fused, SiLU·up, down with reduce-scatter) against
    the dense block: float data through bf16 GEMMs, compared with a bf16 tolerance."""
    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(11)
    x_full = torch.randn(S, H, generator=g)
    w_gate, w_up = torch.randn(F, H, generator=g) / H ** 0.5, torch.randn(F, H, generator=g) / H ** 0.5
    w_down = torch.randn(H, F, generator=g) / F ** 0.5
    fs = F // n
    # The fused gate/up weight holds, per rank, its gate rows then its up rows.
    w_gu = torch.cat([torch.cat([w_gate[p * fs:(p + 1) * fs], w_up[p * fs:(p + 1) * fs]]) for p in range(n)])
    gate_up = wt.nn.ColumnParallelLinear(H, 2 * F).load_full_weight(w_gu.bfloat16())
    down = wt.nn.RowParallelLinear(F, H).load_full_weight(w_down.bfloat16())
    rows = slice(r * S // n, (r + 1) * S // n)
    x = x_full[rows].bfloat16().requires_grad_()
    h = gate_up(x)
    y = down(torch.nn.functional.silu(h[:, :fs]) * h[:, fs:])
    y.float().square().sum().backward()

    xr = x_full.bfloat16().float().requires_grad_()
    wg, wu, wd = (t.bfloat16().float().requires_grad_() for t in (w_gate, w_up, w_down))
    yr = (torch.nn.functional.silu(xr @ wg.t()) * (xr @ wu.t())) @ wd.t()
    yr.square().sum().backward()
    tol = dict(atol=0.1, rtol=0.05)
    torch.testing.assert_close(y.float(), yr[rows].detach(), **tol)
    torch.testing.assert_close(x.grad.float(), xr.grad[rows], **tol)
    cols = slice(r * fs, (r + 1) * fs)
    torch.testing.assert_close(gate_up.weight.grad[:fs].float(), wg.grad[cols], **tol)
    torch.testing.assert_close(gate_up.weight.grad[fs:].float(), wu.grad[cols], **tol)
    torch.testing.assert_close(down.weight.grad.float(), wd.grad[:, cols], **tol)
    return True


@pytest.mark.parametrize("size", [2, 4])
def test_mlp_block(pools, size):
    pools.get(size).run(_rank_mlp)


def _rank_collective_grads():
    """The collectives' backward rules (docs/python.md): all_gather -> reduce_scatter,
    reduce_scatter -> all_gather, all_to_all and all_to_all_v -> the reverse exchange,
    all_reduce -> identity (its output, and so its gradient, is the same on every rank)."""
    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()
    xs = [ints((2, 3), 20 + p, torch.float32, -3, 4) for p in range(n)]
    gs = [ints((2 * n, 3), 30 + p, torch.float32, -3, 4) for p in range(n)]
    gsum = sum(gs)
    x = xs[r].clone().requires_grad_()
    (wt.all_gather(x) * gs[r]).sum().backward()
    assert torch.equal(x.grad, gsum[2 * r:2 * r + 2])
    y = gs[r].clone().requires_grad_()
    (wt.reduce_scatter(y) * xs[r]).sum().backward()
    assert torch.equal(y.grad, torch.cat(xs))
    y = gs[r].clone().requires_grad_()
    (wt.all_to_all(y) * gs[r]).sum().backward()
    assert torch.equal(y.grad, torch.cat([gs[s][2 * r:2 * r + 2] for s in range(n)]))
    x = xs[r].clone().requires_grad_()
    (wt.all_reduce(x) * gs[r][:2]).sum().backward()
    assert torch.equal(x.grad, gs[r][:2])
    # all_to_all_v: rank r sends (r + p) % 2 + 1 rows to rank p; the gradient of each received
    # row is 100 * source + row: it must come back to the row that was sent.
    counts = [(r + p) % 2 + 1 for p in range(n)]
    x = torch.zeros(sum(counts) + 1, 3, requires_grad=True)
    out, recv = wt.all_to_all_v(x, torch.tensor(counts), 2 * n)
    weight = torch.zeros(2 * n, 3)
    at = 0
    for s, c in enumerate(recv.tolist()):
        for i in range(c):
            weight[at] = 100 * s + 10 * r + i
            at += 1
    (out * weight).sum().backward()
    want = torch.zeros_like(x)
    at = 0
    for p, c in enumerate(counts):
        for i in range(c):
            want[at] = 100 * r + 10 * p + i
            at += 1
    assert torch.equal(x.grad, want)
    return True


@pytest.mark.parametrize("size", [1, 2, 4])
def test_collective_autograd(pools, size):
    pools.get(size).run(_rank_collective_grads)
