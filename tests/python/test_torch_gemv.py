"""torch.ops.weft.gemv_ar / gemv_ar_rmsnorm on CPU tensors over the host backend, 1, 2 and 4
ranks: exact on integer data against a torch reference for every decode M from one op object,
with and without the residual + RMSNorm epilogue; bad inputs refused; torch.compile; prepare.
Every rank builds every rank's input from a seed, so each knows the exact expected output."""

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

N, K_LOCAL = 32, 16
MS = (1, 5, 16, 128)


def ints(shape, seed, dtype, lo=-1, hi=2):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, tuple(shape), generator=g).to(dtype)


def _operands(n, dtype):
    xs = [ints((128, K_LOCAL), 10 + p, dtype) for p in range(n)]
    ws = [ints((N, K_LOCAL), 20 + p, dtype) for p in range(n)]
    return xs, ws


def _y(xs, ws, m):
    return sum(x[:m].float() @ w.float().t() for x, w in zip(xs, ws))


def _rmsnorm(r, gamma, eps):
    rf = r.float()
    return rf * torch.rsqrt(rf.pow(2).mean(-1, keepdim=True) + eps) * gamma.float()


def _gemv_objects(w, n=None, k=None, dtype=None, epilogue=None):
    """The world's cached gemv_ar objects (of this configuration where given)."""
    return [key for key in w._gemms if key[0] == "gemv_ar" and all(
        want is None or got == want for got, want in zip(key[1:5], (n, k, dtype, epilogue)))]


def _rank_gemv(dtype_name, methods):
    import weft.torch as wt

    dtype = getattr(torch, dtype_name)
    r, n = dist.get_rank(), dist.get_world_size()
    wd = wt.world()
    xs, ws = _operands(n, dtype)
    for method in methods:
        for m in MS:
            y = torch.ops.weft.gemv_ar(xs[r][:m], ws[r], method, "")
            assert y.shape == (m, N) and y.dtype == dtype
            assert torch.equal(y, _y(xs, ws, m).to(dtype)), (method, m)
    # Every M and method above ran on one op object.
    assert len(_gemv_objects(wd, N, K_LOCAL * n, dtype, False)) == 1
    # Leading dimensions are flattened into M; the Python spelling.
    x3 = xs[r][:6].reshape(2, 3, K_LOCAL)
    assert torch.equal(wt.gemv_ar(x3, ws[r]), _y(xs, ws, 6).to(dtype).reshape(2, 3, N))
    assert len(_gemv_objects(wd, N, K_LOCAL * n, dtype, False)) == 1
    # The epilogue: residual_out exact, out within the rounding of the dtype.
    eps = 1e-6
    gamma = ints((N,), 30, dtype, 1, 3)
    for method in methods:
        for m in MS:
            res = ints((m, N), 40 + m, dtype, -3, 4)
            out, res_out = torch.ops.weft.gemv_ar_rmsnorm(xs[r][:m], ws[r], res, gamma, eps, method, "")
            want_res = (_y(xs, ws, m) + res.float()).to(dtype)
            assert torch.equal(res_out, want_res), (method, m)
            want = _rmsnorm(want_res, gamma, eps)
            assert out.dtype == dtype and out.shape == (m, N)
            torch.testing.assert_close(out.float(), want, rtol=1e-2, atol=1e-2)
    assert len(_gemv_objects(wd, N, K_LOCAL * n, dtype, True)) == 1
    out2, res2 = wt.gemv_ar(xs[r][:5], ws[r], residual=ints((5, N), 45, dtype), gamma=gamma)
    assert torch.equal(res2, (_y(xs, ws, 5) + ints((5, N), 45, dtype).float()).to(dtype))
    return True


@pytest.mark.parametrize("size", [1, 2, 4])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gemv_ar_exact(pools, size, dtype):
    assert pools.get(size).run(_rank_gemv, dtype, ("auto",)) == [True] * size


def test_gemv_ar_methods(pools):
    pools.get(2).run(_rank_gemv, "bfloat16", ("baseline", "decomposed", "fused"))


def _rank_gemv_errors():
    import weft
    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()
    bf = torch.bfloat16
    w = ints((N, K_LOCAL), 1, bf)
    ops = torch.ops.weft
    with pytest.raises(weft.InvalidArgument, match="M = 129 tokens, more than the op's maximum 128"):
        ops.gemv_ar(ints((129, K_LOCAL), 2, bf), w, "auto", "")
    with pytest.raises(weft.InvalidArgument, match="dtype torch.float32"):
        ops.gemv_ar(ints((4, K_LOCAL), 2, torch.float32), w.float(), "auto", "")
    with pytest.raises(weft.InvalidArgument, match="x is torch.bfloat16 but w is torch.float16"):
        ops.gemv_ar(ints((4, K_LOCAL), 2, bf), w.half(), "auto", "")
    with pytest.raises(weft.InvalidArgument, match=r"K/world \(12\)"):  # K not divisible into multiples of 8
        ops.gemv_ar(ints((4, 12), 2, bf), ints((N, 12), 3, bf), "auto", "")
    with pytest.raises(weft.InvalidArgument, match="disagree on K/world"):
        ops.gemv_ar(ints((4, K_LOCAL + 8), 2, bf), w, "auto", "")
    with pytest.raises(weft.InvalidArgument, match="unknown method 'll'"):
        ops.gemv_ar(ints((4, K_LOCAL), 2, bf), w, "ll", "")
    x = ints((4, K_LOCAL), 2, bf)
    with pytest.raises(weft.InvalidArgument, match="residual has shape"):
        ops.gemv_ar_rmsnorm(x, w, ints((5, N), 3, bf), ints((N,), 4, bf), 1e-6, "auto", "")
    with pytest.raises(weft.InvalidArgument, match="gamma has shape"):
        ops.gemv_ar_rmsnorm(x, w, ints((4, N), 3, bf), ints((N + 8,), 4, bf), 1e-6, "auto", "")
    with pytest.raises(weft.InvalidArgument, match="residual has dtype torch.float16"):
        ops.gemv_ar_rmsnorm(x, w, ints((4, N), 3, torch.float16), ints((N,), 4, bf), 1e-6, "auto", "")
    with pytest.raises(ValueError, match="both residual and gamma"):
        wt.gemv_ar(x, w, residual=ints((4, N), 3, bf))
    # No autograd (decode): refused at the forward with the way out; fine under no_grad.
    wg = w.clone().requires_grad_()
    with pytest.raises(RuntimeError, match="no backward"):
        ops.gemv_ar(x, wg, "auto", "")
    with torch.no_grad():
        assert ops.gemv_ar(x, wg, "auto", "").shape == (4, N)
    # The ranks still agree after the refusals (every refusal above happened before any exchange).
    y = ops.gemv_ar(x, w, "auto", "")
    assert torch.equal(y, (n * (x.float() @ w.float().t())).to(bf))
    return r


def test_gemv_ar_bad_inputs(pools):
    assert pools.get(2).run(_rank_gemv_errors) == [0, 1]


def _rank_gemv_compile(backend):
    import torch._dynamo

    import weft.torch as wt

    r, n = dist.get_rank(), dist.get_world_size()
    torch._dynamo.reset()
    bf = torch.bfloat16
    xs, ws = _operands(n, bf)
    gamma = ints((N,), 30, bf, 1, 3)

    def f(x, w, res):
        y = torch.ops.weft.gemv_ar(x, w, "auto", "")
        out, res_out = torch.ops.weft.gemv_ar_rmsnorm(x, w, res, gamma, 1e-6, "auto", "")
        return y * 2, out, res_out + 1

    compiled = torch.compile(f, fullgraph=True, backend=backend)
    for m in (1, 16):
        res = ints((m, N), 50 + m, bf, -3, 4)
        for got, want in zip(compiled(xs[r][:m], ws[r], res), f(xs[r][:m], ws[r], res)):
            assert torch.equal(got, want)
    # prepare makes the op object ahead (for capture on GPUs), from meta tensors alone.
    wd = wt.world()
    meta_x = torch.empty((1, 24), dtype=torch.float16, device="meta")
    meta_w = torch.empty((40, 24), dtype=torch.float16, device="meta")
    wt.prepare("gemv_ar", meta_x, meta_w)
    wt.prepare("gemv_ar_rmsnorm", meta_x, meta_w, None, None, 1e-5)
    wt.prepare("gemv_ar", meta_x, meta_w, "fused")  # the same object: every M and method share it
    assert len(_gemv_objects(wd, 40, 24 * n, torch.float16, False)) == 1
    assert len(_gemv_objects(wd, 40, 24 * n, torch.float16, True)) == 1
    return True


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_gemv_ar_compile_fullgraph(pools, backend):
    pools.get(2).run(_rank_gemv_compile, backend, timeout=300)


def test_gemv_ar_schema():
    import weft.torch  # noqa: F401

    for name in ("gemv_ar", "gemv_ar_rmsnorm"):
        op = getattr(torch.ops.weft, name).default
        assert not any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments), name
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(3, 7, K_LOCAL, dtype=torch.bfloat16)
        w = torch.empty(N, K_LOCAL, dtype=torch.bfloat16)
        assert torch.ops.weft.gemv_ar(x, w, "auto", "").shape == (3, 7, N)
        out, res = torch.ops.weft.gemv_ar_rmsnorm(x, w, torch.empty(3, 7, N, dtype=torch.bfloat16),
                                                  torch.empty(N, dtype=torch.bfloat16), 1e-6, "auto", "")
        assert out.shape == res.shape == (3, 7, N)
