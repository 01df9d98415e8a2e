"""Bad input raises a Python exception with a clear message on every rank, never a hang or a
crash, and the ranks stay usable afterwards; a rank that dies makes the others raise within
WEFT_TIMEOUT_MS."""

import time

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402


def _still_in_step():
    import weft.torch as wt

    n = dist.get_world_size()
    assert torch.equal(wt.all_reduce(torch.ones(7)), torch.full((7,), float(n)))


def _rank_bad_inputs():
    import weft
    import weft.torch as wt

    n = dist.get_world_size()
    x = torch.ones(4 * n, 8)
    with pytest.raises(weft.InvalidArgument, match="dtype torch.int32"):
        wt.all_reduce(torch.ones(8, dtype=torch.int32))
    with pytest.raises(weft.InvalidArgument, match="dtype torch.float32"):
        wt.ag_gemm(torch.ones(16, 32), torch.ones(32, 32))
    with pytest.raises(weft.InvalidArgument, match="a is torch.bfloat16 but b is torch.float16"):
        wt.gemm_ar(torch.ones(16, 32, dtype=torch.bfloat16), torch.ones(32, 32, dtype=torch.float16))
    # The device check (a meta tensor stands for a CUDA one, which this machine may lack: the op
    # itself sends meta tensors to its fake implementation).
    from weft.torch._ops import _check_input

    with pytest.raises(weft.InvalidArgument, match="host backend: CPU tensors only"):
        _check_input(wt.world(), "all_reduce", "x", torch.ones(8, device="meta"), (torch.float32,))
    with pytest.raises(weft.InvalidArgument, match="disagree on K"):
        wt.ag_gemm(torch.ones(16, 32, dtype=torch.bfloat16), torch.ones(32, 16, dtype=torch.bfloat16))
    with pytest.raises(weft.InvalidArgument, match="unknown method 'fastest'"):
        wt.all_gather(x, "fastest")
    with pytest.raises(weft.InvalidArgument, match="unknown method 'one-shot'"):
        wt.gemm_rs(torch.ones(16, 32, dtype=torch.bfloat16), torch.ones(32, 32, dtype=torch.bfloat16), "one-shot")
    if n > 1:
        with pytest.raises(weft.InvalidArgument, match=r"x.shape\[0\] \(5\) is not divisible by the world size"):
            wt.reduce_scatter(torch.ones(5, 3))
        with pytest.raises(weft.InvalidArgument, match="not divisible by the world size"):
            wt.gemm_rs(torch.ones(2 * n + 1, 32, dtype=torch.bfloat16), torch.ones(32, 32, dtype=torch.bfloat16))
        with pytest.raises(weft.InvalidArgument, match="not divisible by the world size"):
            wt.nn.RowParallelLinear(33, 32)
    with pytest.raises(weft.InvalidArgument, match="ask for more rows than x has"):
        wt.all_to_all_v(torch.ones(3, 2), torch.full((n,), 4), 8)
    with pytest.raises(weft.InvalidArgument, match="one count per rank"):
        wt.all_to_all_v(torch.ones(3, 2), torch.ones(n + 1, dtype=torch.int64), 8)
    # Too large for the symmetric heap (32 MiB per rank in these tests).
    with pytest.raises(weft.InvalidArgument, match="symmetric heap"):
        wt.empty((64, 1024, 1024), dtype=torch.float32)
    with pytest.raises(weft.WeftError):
        wt.all_reduce(torch.ones(16 << 20))  # 64 MiB: no room to stage it
    _still_in_step()
    # Ops before init, or for a group without a world.
    with pytest.raises(RuntimeError, match=r"call weft.torch.init\(group\) first"):
        torch.ops.weft.all_reduce(x, "auto", "no-such-group")
    wt.shutdown()
    with pytest.raises(RuntimeError, match=r"call weft.torch.init\(\) first"):
        wt.all_reduce(x)
    with pytest.raises(RuntimeError, match=r"call weft.torch.init\(\) first"):
        wt.empty((4,))
    wt.init()
    _still_in_step()
    # A call in which a rank would receive more than out_capacity: refused by weft on every rank,
    # nothing written; the world goes on (the next call runs, exact).
    with pytest.raises(weft.InvalidArgument, match="would receive"):
        wt.all_to_all_v(torch.ones(4 * n, 2), torch.full((n,), 4), 1)
    _still_in_step()
    out, counts = wt.all_to_all_v(torch.ones(4 * n, 2), torch.full((n,), 4), 4 * n)
    assert counts.tolist() == [4] * n and torch.equal(out, torch.ones(4 * n, 2))
    return True


@pytest.mark.parametrize("size", [1, 2])
def test_bad_inputs(pools, size):
    pools.get(size).run(_rank_bad_inputs)


def _rank_disagree():
    import weft
    import weft.torch as wt

    r = dist.get_rank()
    # Shapes that differ across ranks: weft agrees every call's shape on the host backend and
    # names both values on every rank.
    with pytest.raises(weft.InvalidArgument, match="differ|disagree") as e:
        wt.all_reduce(torch.ones(4 + r))
    msg = str(e.value)
    assert "4" in msg and "5" in msg, msg
    with pytest.raises(weft.InvalidArgument, match="differ|disagree"):
        wt.ag_gemm(torch.ones(16 * (r + 1), 32, dtype=torch.bfloat16), torch.ones(32, 32, dtype=torch.bfloat16))
    _still_in_step()
    return True


def test_shapes_disagree(pools):
    pools.get(2).run(_rank_disagree)


def _rank_init_missing_peer():
    import weft.torch as wt

    r = dist.get_rank()
    g = dist.new_group([0, 1])
    if r == 0:  # rank 1 never joins this group's world
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="rank 1") as e:
            wt.init(g, timeout_ms=1500)
        elapsed = time.monotonic() - t0
        assert elapsed < 1.5 + 5, elapsed
        return str(e.value)
    return None


def test_init_names_the_missing_rank(pools):
    msg = pools.get(2).run(_rank_init_missing_peer)[0]
    assert "did not arrive" in msg, msg


TIMEOUT_MS = 3000


def _rank_dies():
    import os

    import weft
    import weft.torch as wt

    r = dist.get_rank()
    a = torch.ones(16, 64, dtype=torch.bfloat16)
    b = torch.ones(32, 64, dtype=torch.bfloat16)
    for _ in range(3):
        wt.ag_gemm(a, b)
        wt.all_reduce(torch.ones(64))
    if r == 1:
        os._exit(0)  # dies between two ops: the others wait in the next one
    t0 = time.monotonic()
    with pytest.raises(weft.PeerTimeout, match="rank 1") as e:
        wt.ag_gemm(a, b)
        wt.all_reduce(torch.ones(64))
    elapsed = time.monotonic() - t0
    return elapsed, str(e.value)


def test_dead_rank_raises_within_timeout():
    from conftest import RankPool

    pool = RankPool(2, env={"WEFT_TIMEOUT_MS": str(TIMEOUT_MS)})
    try:
        elapsed, msg = pool.run_answering([0], _rank_dies, timeout=60)[0]
    finally:
        pool.close(kill=True)
    assert elapsed < TIMEOUT_MS / 1000 + 2, (elapsed, msg)
