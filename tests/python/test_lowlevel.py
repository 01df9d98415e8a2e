"""The low-level binding (weft's C API through ctypes) on the host backend, 1, 2 and 4 ranks:
every collective exact on integer data (symmetric and plain outputs), a GEMM op exact, bad
input refused with the message, a dead rank reported as PeerTimeout within the timeout.
No torch needed. Finds the library as weft._lib says (WEFT_BUILD_DIR for a build tree)."""

import ctypes
import os
import struct
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from _ranks import FileAllgather, run_ranks  # noqa: E402

import weft  # noqa: E402

F32 = weft.F32


def floats(ptr, n):
    return list((ctypes.c_float * n).from_address(ptr)) if n else []


def store(ptr, values):
    arr = (ctypes.c_float * len(values)).from_address(ptr)
    for i, v in enumerate(values):
        arr[i] = v


def val(rank, i, call=0):  # small integers: every sum is exact in f32
    return float((rank * 7 + i * 3 + call * 5) % 16 - 4)


def make_world(rank, size, d, **kw):
    kw.setdefault("backend", "host")
    kw.setdefault("heap_mib", 8)
    kw.setdefault("timeout_ms", 5000)
    # The exchange keeps its own deadline (the world's timeout is for weft's waits): the same here.
    return weft.World(rank, size, allgather=FileAllgather(d, rank, size, timeout_s=kw["timeout_ms"] / 1000), **kw)


class Buffers:
    """Plain ctypes arrays or heap blocks of the world."""

    def __init__(self, world, symmetric):
        self.w, self.sym, self.keep, self.blocks = world, symmetric, [], []

    def __call__(self, n):
        if self.sym:
            h, _, p = self.w.alloc(max(4 * n, 4))
            self.blocks.append(h)
            return p
        a = (ctypes.c_float * max(n, 1))()
        self.keep.append(a)
        return ctypes.addressof(a)


def collectives_body(rank, size, d, symmetric, method):
    counts = [1, 7, 300]
    with make_world(rank, size, d) as w:
        c = weft.Collectives(w)
        buf = Buffers(w, symmetric)
        checks = 0
        for call, n in enumerate(counts):
            # all_reduce
            a, o = buf(n), buf(n)
            store(a, [val(rank, i, call) for i in range(n)])
            m = method if method in (None, "baseline") else "one-shot"
            c.all_reduce(a, o, n, F32, method=m)
            assert floats(o, n) == [sum(val(r, i, call) for r in range(size)) for i in range(n)]
            # all_gather
            o = buf(n * size)
            c.all_gather(a, o, n, F32, method=method)
            assert floats(o, n * size) == [val(r, i, call) for r in range(size) for i in range(n)]
            # reduce_scatter: in[world][n]
            a2 = buf(n * size)
            store(a2, [val(rank, i, call) for i in range(n * size)])
            o = buf(n)
            c.reduce_scatter(a2, o, n, F32, method=method)
            assert floats(o, n) == [sum(val(r, rank * n + i, call) for r in range(size)) for i in range(n)]
            # all_to_all: block p of rank s goes to rank p
            o = buf(n * size)
            c.all_to_all(a2, o, n, F32, method=method)
            assert floats(o, n * size) == [val(s, rank * n + i, call) for s in range(size) for i in range(n)]
            checks += 4
        # all_to_all_v: rank s sends s + p + 1 elements to rank p
        send = [rank + p + 1 for p in range(size)]
        cap = sum(s + size for s in range(size)) + 3  # the same on every rank: the largest receive + 3
        total = sum(send)
        a = buf(cap)  # heap blocks: the same size on every rank
        store(a, [100.0 * rank + i for i in range(total)])
        sc = (ctypes.c_uint64 * size)(*send)
        rc = (ctypes.c_uint64 * size)()
        o = buf(cap)
        c.all_to_all_v(a, ctypes.addressof(sc), o, cap, ctypes.addressof(rc), F32,
                       method=method if method in (None, "baseline") else "direct")
        assert list(rc) == [s + rank + 1 for s in range(size)]
        want = []
        for s in range(size):
            off = sum(s + p + 1 for p in range(rank))
            want += [100.0 * s + off + i for i in range(s + rank + 1)]
        assert floats(o, len(want)) == want
        checks += 1
        c.close()
        for h in buf.blocks:
            w.free(h)
        assert w.heap_info()[1] == 0, w.heap_info()
        return checks


@pytest.mark.parametrize("size", [1, 2, 4])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("method", [None, "baseline", "direct"])
def test_collectives_exact(tmp_path, size, symmetric, method):
    res = run_ranks(collectives_body, size, str(tmp_path), symmetric, method)
    assert all(v == 13 for v in res.values()), res


def heap_body(rank, size, d):
    with make_world(rank, size, d, heap_mib=2) as w:
        assert (w.rank, w.size, w.backend) == (rank, size, "host")
        cap, used = w.heap_info()
        assert cap == 2 << 20 and used == 0
        h1, off1, p1 = w.alloc(1000)
        h2, off2, p2 = w.alloc(4096)
        assert floats(p2, 1024) == [0.0] * 1024  # zeroed
        assert w.heap_contains(p1, 1000) == off1 and w.heap_contains(p2 + 8, 16) == off2 + 8
        assert w.heap_contains(p1, cap + 1) is None
        plain = (ctypes.c_char * 16)()
        assert w.heap_contains(ctypes.addressof(plain), 16) is None
        w.free(h1)
        with pytest.raises(weft.InvalidArgument, match="not a live block"):
            w.free(h1)
        with pytest.raises(weft.InvalidArgument, match="heap"):
            w.alloc(cap + 1)
        w.free(h2)
        w.barrier()
        w.synchronize()
        return True


@pytest.mark.parametrize("size", [1, 2])
def test_heap(tmp_path, size):
    run_ranks(heap_body, size, str(tmp_path))


def bf16(x):  # exact for small integers
    return struct.unpack("<I", struct.pack("<f", x))[0] >> 16


def from_bf16(b):
    return struct.unpack("<f", struct.pack("<I", b << 16))[0]


def gemm_body(rank, size, d, op, method):
    M, N, K = 4 * size, 8, 16 * size
    with make_world(rank, size, d) as w:
        g = weft.GemmOverlap(w, op, M, N, K, weft.BF16, b_layout="nk")
        ar, ac, br, bc, cr, cc = g.shapes()
        assert g.auto_method() in ("baseline", "decomposed", "fused")

        def A(r, i, j):  # the global A [M, K] as rank r holds its part
            return float((r + 2 * i + j) % 5 - 2)

        def B(r, n, k):  # W [N, K_local] of rank r
            return float((3 * r + n + 2 * k) % 3 - 1)

        def a_of(r):
            if op == "ag_gemm":  # rows [r*M/world, ...) of A [M, K]
                return [[A(0, r * ar + i, j) for j in range(ac)] for i in range(ar)]
            return [[A(r, i, j) for j in range(ac)] for i in range(ar)]

        def b_of(r):
            if op == "ag_gemm":
                return [[B(0, n, k) for k in range(bc)] for n in range(br)]
            return [[B(r, n, k) for k in range(bc)] for n in range(br)]

        a = (ctypes.c_uint16 * (ar * ac))(*[bf16(x) for row in a_of(rank) for x in row])
        b = (ctypes.c_uint16 * (br * bc))(*[bf16(x) for row in b_of(rank) for x in row])
        c = (ctypes.c_uint16 * (cr * cc))()
        g.run(ctypes.addressof(a), ctypes.addressof(b), ctypes.addressof(c), method=method)
        got = [[from_bf16(c[i * cc + j]) for j in range(cc)] for i in range(cr)]
        if op == "ag_gemm":
            full = [row for r in range(size) for row in a_of(r)]
            want = [[sum(full[i][k] * b_of(0)[n][k] for k in range(K)) for n in range(N)] for i in range(M)]
        else:
            want = [[sum(sum(a_of(r)[i][k] * b_of(r)[n][k] for k in range(ac)) for r in range(size))
                     for n in range(N)] for i in range(M)]
            if op == "gemm_rs":
                want = want[rank * cr:(rank + 1) * cr]
        assert got == want, (got, want)
        return True


@pytest.mark.parametrize("size", [1, 2])
@pytest.mark.parametrize("op", ["ag_gemm", "gemm_rs", "gemm_ar"])
@pytest.mark.parametrize("method", [None, "baseline", "decomposed"])
def test_gemm_exact(tmp_path, size, op, method):
    run_ranks(gemm_body, size, str(tmp_path), op, method)


def gemv_body(rank, size, d, method):
    """weft.GemvAllReduce: M 1, 3 and m_max from one object, exact; the epilogue's residual."""
    N, KL, M_MAX = 16, 8, 4
    with make_world(rank, size, d) as w:
        g = weft.GemvAllReduce(w, N, KL * size, weft.BF16, m_max=M_MAX)
        e = weft.GemvAllReduce(w, N, KL * size, weft.BF16, m_max=M_MAX, epilogue=True)
        assert g.auto_method(1) in ("baseline", "decomposed", "fused")

        def X(r, i, k):
            return float((r + 2 * i + k) % 5 - 2)

        def W(r, n, k):
            return float((3 * r + n + 2 * k) % 3 - 1)

        x = (ctypes.c_uint16 * (M_MAX * KL))(*[bf16(X(rank, i, k)) for i in range(M_MAX) for k in range(KL)])
        wt = (ctypes.c_uint16 * (N * KL))(*[bf16(W(rank, n, k)) for n in range(N) for k in range(KL)])
        res = (ctypes.c_uint16 * (M_MAX * N))(*[bf16(float((i + n) % 3)) for i in range(M_MAX) for n in range(N)])
        gamma = (ctypes.c_uint16 * N)(*[bf16(1.0)] * N)
        for m in (1, 3, 0):  # 0: m_max
            rows = m or M_MAX
            y = (ctypes.c_uint16 * (M_MAX * N))(*[bf16(-7.0)] * (M_MAX * N))
            g.run(ctypes.addressof(x), ctypes.addressof(wt), ctypes.addressof(y), m=m, method=method)
            want = [[sum(X(r, i, k) * W(r, n, k) for r in range(size) for k in range(KL)) for n in range(N)]
                    for i in range(rows)]
            assert [[from_bf16(y[i * N + n]) for n in range(N)] for i in range(rows)] == want, m
            assert all(from_bf16(v) == -7.0 for v in y[rows * N:]), "rows past M written"
            out = (ctypes.c_uint16 * (M_MAX * N))()
            ro = (ctypes.c_uint16 * (M_MAX * N))()
            e.run(ctypes.addressof(x), ctypes.addressof(wt), ctypes.addressof(out), m=m, method=method,
                  residual_ptr=ctypes.addressof(res), gamma_ptr=ctypes.addressof(gamma),
                  residual_out_ptr=ctypes.addressof(ro))
            assert [[from_bf16(ro[i * N + n]) for n in range(N)] for i in range(rows)] == \
                [[want[i][n] + (i + n) % 3 for n in range(N)] for i in range(rows)], m
        with pytest.raises(weft.InvalidArgument):  # the epilogue's operands without the epilogue
            g.run(ctypes.addressof(x), ctypes.addressof(wt), ctypes.addressof(out), m=1, method=method,
                  residual_ptr=ctypes.addressof(res), gamma_ptr=ctypes.addressof(gamma),
                  residual_out_ptr=ctypes.addressof(ro))
        with pytest.raises(weft.InvalidArgument, match="5"):  # M above m_max
            g.run(ctypes.addressof(x), ctypes.addressof(wt), ctypes.addressof(y), m=5, method=method)
        g.close()
        e.close()
        return True


@pytest.mark.parametrize("size", [1, 2])
@pytest.mark.parametrize("method", [None, "baseline", "decomposed", "fused"])
def test_gemv_exact(tmp_path, size, method):
    run_ranks(gemv_body, size, str(tmp_path), method)


def errors_body(rank, size, d):
    with make_world(rank, size, d) as w:
        c = weft.Collectives(w)
        x = (ctypes.c_float * 8)()
        p = ctypes.addressof(x)
        with pytest.raises(weft.InvalidArgument, match="null pointer"):
            c.all_reduce(0, p, 8, F32)
        with pytest.raises(weft.InvalidArgument, match="dtype 9"):
            c.all_reduce(p, p, 8, 9)
        with pytest.raises(weft.InvalidArgument, match="unknown method 'fastest'"):
            c.all_gather(p, p, 2, F32, method="fastest")
        with pytest.raises(weft.InvalidArgument, match="unknown collective"):
            c.prepare("broadcast", 8, F32)
        with pytest.raises(weft.InvalidArgument, match="GEMM op"):
            weft.GemmOverlap(w, "gemm_xx", 8, 8, 8, weft.BF16)
        c.all_reduce(None, None, 0, F32)  # count 0: a no-op
        if size > 1:  # the count differs across ranks: refused on every rank, naming both
            with pytest.raises(weft.InvalidArgument) as e:
                c.all_reduce(p, p, 4 + rank, F32)
            assert "4" in str(e.value) and "5" in str(e.value) and "disagree" in str(e.value), str(e.value)
        c.close()
        c.close()  # idempotent
        with pytest.raises(weft.InvalidArgument, match="closed"):
            c.all_reduce(p, p, 8, F32)
        return True


@pytest.mark.parametrize("size", [1, 2])
def test_bad_input(tmp_path, size):
    run_ranks(errors_body, size, str(tmp_path))


def dead_rank_body(rank, size, d):
    w = make_world(rank, size, d, timeout_ms=1500)
    c = weft.Collectives(w)
    x = (ctypes.c_float * 64)()
    p = ctypes.addressof(x)
    c.all_reduce(p, p, 64, F32, method="one-shot")  # every rank, once
    if rank == size - 1:
        os._exit(0)  # dies before the next call
    start = time.monotonic()
    with pytest.raises(weft.PeerTimeout) as e:
        c.all_reduce(p, p, 64, F32, method="one-shot")
    took = time.monotonic() - start
    assert f"rank {size - 1}" in str(e.value), str(e.value)
    assert took < 10, took
    return str(e.value)


def test_dead_rank_raises_peer_timeout(tmp_path):
    run_ranks(dead_rank_body, 2, str(tmp_path), expect_dead=(1,))


def callback_timeout_body(rank, size, d):
    # The allgather itself times out (rank 1 never creates its world): PeerTimeout naming it.
    if rank == 1:
        return True
    with pytest.raises(weft.PeerTimeout, match="rank 1"):
        weft.World(rank, size, backend="host", heap_mib=2,
                   allgather=FileAllgather(d, rank, size, timeout_s=0.5))
    return True


def test_callback_timeout(tmp_path):
    run_ranks(callback_timeout_body, 2, str(tmp_path))


def test_callback_error_is_reported(tmp_path):
    def bad(_data):
        raise RuntimeError("the store is gone")

    with pytest.raises(weft.WeftError, match="the store is gone"):
        weft.World(0, 2, backend="host", heap_mib=2, allgather=bad)


def test_single_rank_without_allgather():
    with weft.World(0, 1, backend="host", heap_mib=2) as w:
        assert (w.rank, w.size, w.backend) == (0, 1, "host")
        c = weft.Collectives(w)
        x = (ctypes.c_float * 3)(1, 2, 3)
        c.all_reduce(ctypes.addressof(x), ctypes.addressof(x), 3, F32)
        assert list(x) == [1, 2, 3]
    assert w.closed
    w.close()
    with pytest.raises(weft.InvalidArgument, match="allgather"):
        weft.World(0, 2, backend="host", heap_mib=2)


def two_worlds_body(rank, size, d):
    # Two worlds in one process (e.g. a TP group and another), each with its own exchange.
    w1 = weft.World(rank, size, backend="host", heap_mib=2, allgather=FileAllgather(d, rank, size, tag="w1"))
    w2 = weft.World(rank, size, backend="host", heap_mib=2, allgather=FileAllgather(d, rank, size, tag="w2"))
    c1, c2 = weft.Collectives(w1), weft.Collectives(w2)
    x1 = (ctypes.c_float * 4)(*[rank + 1.0] * 4)
    x2 = (ctypes.c_float * 4)(*[10.0 * (rank + 1)] * 4)
    c1.all_reduce(ctypes.addressof(x1), ctypes.addressof(x1), 4, F32)
    c2.all_reduce(ctypes.addressof(x2), ctypes.addressof(x2), 4, F32)
    tot = size * (size + 1) / 2
    assert list(x1) == [tot] * 4 and list(x2) == [10 * tot] * 4
    w1.close()  # closes c1 first
    assert c1._handle is None
    w2.close()
    return True


def test_two_worlds_in_one_process(tmp_path):
    run_ranks(two_worlds_body, 2, str(tmp_path))


def test_version_and_library():
    assert weft.__version__.count(".") == 2
    assert isinstance(weft.has_cuda(), bool)
    assert os.path.exists(weft.library_path())
    assert issubclass(weft.InvalidArgument, ValueError) and issubclass(weft.PeerTimeout, TimeoutError)
