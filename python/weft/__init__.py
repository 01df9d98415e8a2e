"""weft: multi-GPU ops that overlap communication with computation.

This module is the torch-free, low-level binding of weft's C API (include/weft/c_api.h)
through ctypes: worlds (ranks, bootstrap, backend, symmetric heap), symmetric memory,
collectives, GEMM+communication ops, the decode GEMV + AllReduce, the MoE token exchange and the embedding-bag
lookups + all-to-all, all on raw pointers (ints) and streams (ints). The
PyTorch frontend (weft.torch) is built on it.

Errors: every failing call raises WeftError or one of its kinds: InvalidArgument (also a
ValueError: bad input, ranks that disagree, a buffer too small) and PeerTimeout (also a
TimeoutError: a peer did not arrive within the world's timeout; the message names it).
"""

import ctypes
import weakref

from . import _lib

__all__ = [
    "F32", "F16", "BF16", "WeftError", "InvalidArgument", "PeerTimeout", "World", "Collectives", "GemmOverlap",
    "GemvAllReduce", "MoeDispatchCombine", "MoeLayer", "EmbeddingA2A",
    "has_cuda", "library_path",
]

# dtypes (enum weft_dtype)
F32, F16, BF16 = 0, 1, 2


class WeftError(RuntimeError):
    """A failure in weft (WEFT_EFAIL: CUDA, NCCL, system errors), or the base of the others."""


class InvalidArgument(WeftError, ValueError):
    """Bad input (WEFT_EINVAL): null or misaligned pointers, shapes, dtypes, method names, ranks
    that disagree (the message names both), a buffer too small."""


class PeerTimeout(WeftError, TimeoutError):
    """A wait passed the world's deadline (WEFT_ETIMEOUT): the message names the rank that did
    not arrive."""


_ERRORS = {_lib.EINVAL: InvalidArgument, _lib.ETIMEOUT: PeerTimeout, _lib.EFAIL: WeftError}


def _check(status):
    if status != _lib.OK:
        raise _ERRORS.get(status, WeftError)(_lib.last_error() or f"weft: status {status}")


def _text(s):
    return None if s is None else s.encode()


def _ptr(p):
    """An int (or None) as the C API's pointer argument."""
    if p is None or p == 0:
        return None
    if not isinstance(p, int):
        raise InvalidArgument(f"weft: a pointer must be an int, not {type(p).__name__}")
    return p


def has_cuda():
    """Whether the library was built with CUDA (the nccl backend)."""
    return bool(_lib.lib().weft_has_cuda())


def library_path():
    """The path of the loaded libweft_c.so."""
    return str(_lib.lib().path)


def __getattr__(name):
    if name == "__version__":  # the library's, loaded on first use
        return _lib.lib().weft_version().decode()
    raise AttributeError(f"module 'weft' has no attribute '{name}'")


def _make_allgather(fn, size):
    """The C callback around a Python allgather(data: bytes) -> list[bytes] of `size` items."""

    def callback(_user, in_ptr, nbytes, out_ptr, timed_out, missing_rank, err, errlen):
        try:
            data = ctypes.string_at(in_ptr, nbytes) if nbytes else b""
            parts = list(fn(data))
            if len(parts) != size:
                raise ValueError(f"allgather returned {len(parts)} items for a world of {size}")
            for r, part in enumerate(parts):
                part = bytes(part)
                if len(part) != nbytes:
                    raise ValueError(f"allgather: rank {r} sent {len(part)} bytes, this rank {nbytes}")
                if nbytes:
                    ctypes.memmove(out_ptr + r * nbytes, part, nbytes)
            return 0
        except BaseException as e:  # noqa: BLE001 -- nothing may escape into C
            if isinstance(e, TimeoutError):
                timed_out[0] = 1
            missing = getattr(e, "missing_rank", None)
            if isinstance(missing, int) and not isinstance(missing, bool):
                missing_rank[0] = missing
            msg = (f"{type(e).__name__}: {e}".encode("utf-8", "replace"))[: max(int(errlen) - 1, 0)]
            if errlen:
                ctypes.memmove(err, msg + b"\0", len(msg) + 1)
            return 1

    return _lib.ALLGATHER_FN(callback)


class _Closeable:
    """close() on leaving a `with` block and when collected (errors then have nobody to reach:
    interpreter shutdown, a broken world)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


class World(_Closeable):
    """The ranks, their bootstrap, the backend and its symmetric heap (collective to create).

    allgather: the exchange, a callable allgather(data: bytes) -> list[bytes] (one item per rank,
    rank-major; e.g. over a torch.distributed store). A TimeoutError raised in it becomes
    PeerTimeout (its int attribute missing_rank, if any, names the rank). None: weft's own
    bootstrap from the environment (a world of one needs none).
    backend: "host", "nccl", "auto", or None (WEFT_BACKEND, else auto). device: the CUDA device
    on nccl (-1: the current one). heap_mib, timeout_ms: 0 for the environment's values.
    """

    def __init__(self, rank, size, *, local_rank=None, local_size=None, device=-1, backend=None, allgather=None,
                 heap_mib=0, timeout_ms=0):
        self._handle = None
        self._ops = weakref.WeakSet()
        L = _lib.lib()
        self._lib = L
        opt = _lib.WorldOptions()
        opt.rank, opt.size = int(rank), int(size)
        opt.local_size = 0 if local_size is None else int(local_size)
        if local_rank is None:
            local_rank = rank if local_size is None else rank % int(local_size)
        opt.local_rank = int(local_rank)
        opt.device = int(device)
        opt.backend = _text(backend)
        self._callback = _make_allgather(allgather, int(size)) if allgather is not None else None
        if self._callback is not None:
            opt.allgather = self._callback  # kept alive on the object: the world calls it until closed
        opt.heap_mib, opt.timeout_ms = int(heap_mib), int(timeout_ms)
        h = ctypes.c_void_p()
        _check(L.weft_world_create(ctypes.byref(opt), ctypes.byref(h)))
        self._handle = h.value
        r, s, k = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        _check(L.weft_world_info(self._handle, ctypes.byref(r), ctypes.byref(s), ctypes.byref(k)))
        self._rank, self._size = r.value, s.value
        self._backend = "host" if k.value == _lib.BACKEND_HOST else "nccl"

    @property
    def handle(self):
        if self._handle is None:
            raise InvalidArgument("weft: the world is closed")
        return self._handle

    @property
    def rank(self):
        return self._rank

    @property
    def size(self):
        return self._size

    @property
    def backend(self):
        return self._backend

    @property
    def closed(self):
        return self._handle is None

    def synchronize(self):
        _check(self._lib.weft_world_synchronize(self.handle))

    def barrier(self):
        _check(self._lib.weft_world_barrier(self.handle))

    def alloc(self, nbytes):
        """Collective: nbytes of every rank's heap at the same offset, zeroed -> (handle, offset, ptr)."""
        h, off, p = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_void_p()
        _check(self._lib.weft_alloc(self.handle, int(nbytes), ctypes.byref(h), ctypes.byref(off), ctypes.byref(p)))
        return h.value, off.value, p.value or 0

    def free(self, handle):
        _check(self._lib.weft_free(self.handle, int(handle)))

    def heap_contains(self, ptr, nbytes):
        """ptr's offset in this rank's heap when [ptr, ptr + nbytes) lies in it, else None."""
        off = ctypes.c_uint64()
        if self._lib.weft_heap_contains(self.handle, _ptr(ptr), int(nbytes), ctypes.byref(off)):
            return off.value
        return None

    def heap_info(self):
        """(capacity, used) in bytes, this rank's heap."""
        cap, used = ctypes.c_uint64(), ctypes.c_uint64()
        _check(self._lib.weft_heap_info(self.handle, ctypes.byref(cap), ctypes.byref(used)))
        return cap.value, used.value

    def _register(self, op):
        self._ops.add(op)

    def close(self):
        """Destroys the world's ops, then the world (idempotent; local)."""
        if self._handle is None:
            return
        for op in list(self._ops):
            op.close()
        h, self._handle = self._handle, None
        _check(self._lib.weft_world_destroy(h))

    def __repr__(self):
        state = "closed" if self.closed else f"backend={self._backend}"
        return f"weft.World(rank={getattr(self, '_rank', '?')}, size={getattr(self, '_size', '?')}, {state})"


class _Op(_Closeable):
    _destroy = None

    def __init__(self, world):
        self._world = world
        self._handle = None

    @property
    def handle(self):
        if self._handle is None:
            raise InvalidArgument(f"weft: the {type(self).__name__} object is closed")
        return self._handle

    def close(self):
        if self._handle is None:
            return
        h, self._handle = self._handle, None
        _check(getattr(self._world._lib, self._destroy)(h))



class Collectives(_Op):
    """Collectives on a world (sum; F32, F16, BF16). Pointers and streams are ints; outputs may be
    any memory of the backend (symmetric ones are written in place, others through a staging
    buffer and one copy). method: None or "auto", "baseline", "one-shot", "two-shot", "ll",
    "ll128", "direct". Every call is collective."""

    _destroy = "weft_coll_destroy"

    def __init__(self, world):
        super().__init__(world)
        h = ctypes.c_void_p()
        _check(world._lib.weft_coll_create(world.handle, ctypes.byref(h)))
        self._handle = h.value
        world._register(self)

    def _call(self, name, in_ptr, out_ptr, count, dtype, method, stream):
        _check(getattr(self._world._lib, name)(self.handle, _ptr(in_ptr), _ptr(out_ptr), int(count), int(dtype),
                                               _text(method), _ptr(stream)))

    def all_reduce(self, in_ptr, out_ptr, count, dtype, method=None, stream=0):
        self._call("weft_all_reduce", in_ptr, out_ptr, count, dtype, method, stream)

    def all_gather(self, in_ptr, out_ptr, count, dtype, method=None, stream=0):
        self._call("weft_all_gather", in_ptr, out_ptr, count, dtype, method, stream)

    def reduce_scatter(self, in_ptr, out_ptr, count, dtype, method=None, stream=0):
        self._call("weft_reduce_scatter", in_ptr, out_ptr, count, dtype, method, stream)

    def all_to_all(self, in_ptr, out_ptr, count, dtype, method=None, stream=0):
        self._call("weft_all_to_all", in_ptr, out_ptr, count, dtype, method, stream)

    def all_to_all_v(self, in_ptr, send_counts_ptr, out_ptr, out_capacity, recv_counts_ptr, dtype, method=None,
                     stream=0):
        _check(self._world._lib.weft_all_to_all_v(self.handle, _ptr(in_ptr), _ptr(send_counts_ptr), _ptr(out_ptr),
                                                  int(out_capacity), _ptr(recv_counts_ptr), int(dtype),
                                                  _text(method), _ptr(stream)))

    def prepare(self, collective, count, dtype, method=None):
        """Collective: allocates what a call of this shape uses, so that it can be graph-captured."""
        _check(self._world._lib.weft_coll_prepare(self.handle, _text(collective), int(count), int(dtype),
                                                  _text(method)))


class GemmOverlap(_Op):
    """A GEMM with communication: op "ag_gemm", "gemm_rs" or "gemm_ar" over the global shape
    (m, n, k), dtype BF16 or F16 (collective to create). b_layout "nk" (a linear's weight
    [N, K_local]) or "kn". m_buckets: further Ms a call may have, prepared at creation."""

    _destroy = "weft_gemm_destroy"

    def __init__(self, world, op, m, n, k, dtype, *, b_layout="nk", chunks=0, m_buckets=()):
        super().__init__(world)
        buckets = [int(x) for x in m_buckets]
        arr = (ctypes.c_int64 * len(buckets))(*buckets) if buckets else None
        cfg = _lib.GemmConfig(op=_text(op), m=int(m), n=int(n), k=int(k), dtype=int(dtype),
                              b_layout=_text(b_layout), chunks=int(chunks),
                              m_buckets=ctypes.cast(arr, ctypes.POINTER(ctypes.c_int64)) if arr else None,
                              n_m_buckets=len(buckets))
        h = ctypes.c_void_p()
        _check(world._lib.weft_gemm_create(world.handle, ctypes.byref(cfg), ctypes.byref(h)))
        self._handle = h.value
        self.op = op
        world._register(self)

    def run(self, a_ptr, b_ptr, c_ptr, m=0, method=None, stream=0, gathered_a_ptr=None):
        """Collective: one call with M rows (0: the configured M). ag_gemm: gathered_a_ptr, when
        given, receives the call's gathered A [M, K] too."""
        if gathered_a_ptr is None:
            _check(self._world._lib.weft_gemm_run(self.handle, _ptr(a_ptr), _ptr(b_ptr), _ptr(c_ptr), int(m),
                                                  _text(method), _ptr(stream)))
        else:
            _check(self._world._lib.weft_gemm_run_gathered(self.handle, _ptr(a_ptr), _ptr(b_ptr), _ptr(c_ptr),
                                                           int(m), _text(method), _ptr(stream),
                                                           _ptr(gathered_a_ptr)))

    def shapes(self, m=0):
        """(a_rows, a_cols, b_rows, b_cols, c_rows, c_cols) of this rank's operands for M rows."""
        v = [ctypes.c_int64() for _ in range(6)]
        _check(self._world._lib.weft_gemm_shapes(self.handle, int(m), *(ctypes.byref(x) for x in v)))
        return tuple(x.value for x in v)

    def auto_method(self, m=0):
        """The method `auto` runs for M rows."""
        s = ctypes.c_char_p()
        _check(self._world._lib.weft_gemm_auto_method(self.handle, int(m), ctypes.byref(s)))
        return s.value.decode()


class MoeDispatchCombine(_Op):
    """The MoE token exchange (collective to create; docs/moe.md): dispatch sends each token's
    row [hidden] to the ranks of its top_k experts (experts / world a rank), received
    rank-major and expert-grouped in the op's buffer (buffers()); combine brings the experts'
    output rows back and sums each token's with its weights (fp32, slot order). dtype F32, F16
    or BF16; T = 0 ... max_tokens tokens a call; recv_capacity rows a rank (0: any routing)."""

    _destroy = "weft_moe_destroy"

    def __init__(self, world, hidden, experts, top_k, max_tokens, dtype, *, recv_capacity=0, check_ids=True):
        super().__init__(world)
        cfg = _lib.MoeConfig(hidden=int(hidden), experts=int(experts), top_k=int(top_k), max_tokens=int(max_tokens),
                             recv_capacity=int(recv_capacity), dtype=int(dtype), check_ids=1 if check_ids else 0)
        h = ctypes.c_void_p()
        _check(world._lib.weft_moe_create(world.handle, ctypes.byref(cfg), ctypes.byref(h)))
        self._handle = h.value
        self.hidden, self.experts, self.top_k, self.max_tokens = int(hidden), int(experts), int(top_k), int(max_tokens)
        world._register(self)

    def dispatch(self, x_ptr, ids_ptr, tokens=-1, method=None, stream=0):
        """Collective: x [T, hidden], ids [T, top_k] int32 (T = tokens; -1: max_tokens)."""
        _check(self._world._lib.weft_moe_dispatch(self.handle, _ptr(x_ptr), _ptr(ids_ptr), int(tokens), _text(method),
                                                  _ptr(stream)))

    def combine(self, expert_out_ptr, weights_ptr, y_ptr, tokens=-1, method=None, stream=0):
        """Collective: expert_out in recv's layout, weights [T, top_k] fp32, y [T, hidden]; the
        last dispatch's T and method."""
        _check(self._world._lib.weft_moe_combine(self.handle, _ptr(expert_out_ptr), _ptr(weights_ptr), _ptr(y_ptr),
                                                 int(tokens), _text(method), _ptr(stream)))

    def buffers(self):
        """(recv pointer, recv_counts pointer (int64 [world][experts / world]), recv_capacity,
        experts per rank), in the backend's memory."""
        recv, counts = ctypes.c_void_p(), ctypes.c_void_p()
        cap, local = ctypes.c_int64(), ctypes.c_int64()
        _check(self._world._lib.weft_moe_buffers(self.handle, ctypes.byref(recv), ctypes.byref(counts),
                                                 ctypes.byref(cap), ctypes.byref(local)))
        return recv.value, counts.value, cap.value, local.value


class MoeLayer(_Op):
    """The MoE layer (collective to create; docs/moe.md, "Layer"): dispatch, each local expert's
    SwiGLU FFN (w_up [experts / world, 2 ffn, hidden]: the gate's ffn rows, then the up
    projection's; w_down [experts / world, hidden, ffn]), combine with the router's weights.
    Methods auto (= fused on GPUs), baseline, decomposed (no host synchronisation, capturable),
    fused (decomposed with the down projection's epilogue storing combine's rows; GPUs, else
    as decomposed).
    dtype BF16 or F16 on GPUs (F32 too on the host backend)."""

    _destroy = "weft_moe_layer_destroy"

    def __init__(self, world, hidden, ffn, experts, top_k, max_tokens, dtype, *, recv_capacity=0, check_ids=True):
        super().__init__(world)
        cfg = _lib.MoeConfig(hidden=int(hidden), experts=int(experts), top_k=int(top_k), max_tokens=int(max_tokens),
                             recv_capacity=int(recv_capacity), dtype=int(dtype), check_ids=1 if check_ids else 0)
        h = ctypes.c_void_p()
        _check(world._lib.weft_moe_layer_create(world.handle, ctypes.byref(cfg), int(ffn), ctypes.byref(h)))
        self._handle = h.value
        self.hidden, self.ffn, self.experts = int(hidden), int(ffn), int(experts)
        self.top_k, self.max_tokens = int(top_k), int(max_tokens)
        world._register(self)

    def forward(self, x_ptr, ids_ptr, weights_ptr, w_up_ptr, w_down_ptr, y_ptr, tokens=-1, method=None, stream=0):
        """Collective: x [T, hidden], ids [T, top_k] int32, weights [T, top_k] fp32, the weights,
        y [T, hidden] (T = tokens; -1: max_tokens)."""
        _check(self._world._lib.weft_moe_layer_forward(self.handle, _ptr(x_ptr), _ptr(ids_ptr), _ptr(weights_ptr),
                                                       _ptr(w_up_ptr), _ptr(w_down_ptr), _ptr(y_ptr), int(tokens),
                                                       _text(method), _ptr(stream)))


class EmbeddingA2A(_Op):
    """Embedding-bag lookups + all-to-all for recommendation models (collective to create;
    docs/embedding_a2a.md). The tables are sharded across ranks -- this rank's are `tables`, a
    sequence of (rows, dim), maybe empty -- and the samples are not: rank p owns samples
    p * batch ... (p + 1) * batch - 1 of the global batch of world * batch. forward pools each of
    this rank's tables' bags for the whole global batch and hands every rank its own samples'
    pooled rows of every rank's tables: out [batch, total_dim], the tables in global order (rank
    0's first; dims lists them, first_table is this rank's first). weight_dtype F32, BF16 or F16
    (alike on every rank, tables or not); out_dtype F32 or BF16; pooling "sum" or "mean".
    Methods auto, baseline, decomposed, fused (the host backend runs each as the baseline).
    backward is forward's transpose: the tables' gradients, dense or sparse, or SGD's or Adagrad's
    step in place."""

    _destroy = "weft_embedding_a2a_destroy"

    def __init__(self, world, tables, batch, weight_dtype, *, out_dtype=F32, pooling="sum", check_indices=True):
        super().__init__(world)
        shapes = [(int(rows), int(dim)) for rows, dim in tables]
        n = len(shapes)
        rows = (ctypes.c_int64 * max(n, 1))(*[r for r, _ in shapes])
        dims = (ctypes.c_int64 * max(n, 1))(*[d for _, d in shapes])
        i64p = ctypes.POINTER(ctypes.c_int64)
        cfg = _lib.EmbeddingA2AConfig(n_tables=n, rows=ctypes.cast(rows, i64p), dims=ctypes.cast(dims, i64p),
                                      batch=int(batch), weight_dtype=int(weight_dtype), out_dtype=int(out_dtype),
                                      pooling=_text(pooling), check_indices=1 if check_indices else 0)
        h = ctypes.c_void_p()
        _check(world._lib.weft_embedding_a2a_create(world.handle, ctypes.byref(cfg), ctypes.byref(h)))
        self._handle = h.value
        world._register(self)
        self.tables, self.batch, self.pooling = shapes, int(batch), pooling
        self.weight_dtype, self.out_dtype = int(weight_dtype), int(out_dtype)
        total, n_dims, first, local = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int64()
        all_dims = i64p()
        _check(world._lib.weft_embedding_a2a_layout(self._handle, ctypes.byref(total), ctypes.byref(all_dims),
                                                    ctypes.byref(n_dims), ctypes.byref(first), ctypes.byref(local)))
        self.total_dim, self.first_table, self.local_dim = total.value, first.value, local.value
        self.dims = [all_dims[i] for i in range(n_dims.value)]
        self._bags = (_lib.EmbeddingBag * max(n, 1))()  # the calls' tables, filled per call
        self._grads = (_lib.EmbeddingGrad * max(n, 1))()  # backward's sinks, filled per call

    GRAD_KINDS = ("dense", "sparse", "sgd", "adagrad")
    _SINK_FIELDS = ("dense", "rows", "values", "count", "weight", "state")

    def _fill_tables(self, call, tables):
        tables = list(tables)
        if len(tables) != len(self.tables):
            raise InvalidArgument(f"weft.EmbeddingA2A.{call}: {len(tables)} tables' inputs for the {len(self.tables)} "
                                  f"tables of this rank")
        for t, (bag, table) in enumerate(zip(self._bags, tables)):
            if len(table) not in (4, 5):
                raise InvalidArgument(f"weft.EmbeddingA2A.{call}: tables[{t}] has {len(table)} values; it takes "
                                      f"(weight, offsets, indices, per_sample_weights[, num_indices])")
            weight, offsets, indices, psw = table[:4]
            num = table[4] if len(table) == 5 and table[4] is not None else -1
            bag.weight, bag.offsets, bag.indices, bag.per_sample_weights = (_ptr(weight), _ptr(offsets), _ptr(indices),
                                                                            _ptr(psw))
            bag.num_indices = int(num)
        return self._bags if tables else None

    def forward(self, tables, out_ptr, method=None, stream=0):
        """Collective: tables, one (weight_ptr, offsets_ptr, indices_ptr, per_sample_weights_ptr or
        None[, num_indices]) per table of this rank, for the global batch: weight [rows, dim], offsets
        int64 [world * batch + 1], indices int64 [offsets[-1]], per-sample weights fp32 (one per
        index), num_indices the indices' count (None or negative: not given; backward on GPUs needs
        it); out [batch, total_dim] in out_dtype."""
        bags = self._fill_tables("forward", tables)
        _check(self._world._lib.weft_embedding_a2a_forward(self.handle, bags, _ptr(out_ptr), _text(method),
                                                           _ptr(stream)))

    def backward(self, tables, grad_out_ptr, grads, kind=None, lr=0.0, eps=1e-10, method=None, stream=0):
        """Collective: the transpose of forward. tables as forward's (num_indices needed on GPUs);
        grad_out [batch, total_dim] in out_dtype, the gradient of forward's out on this rank; grads,
        one sink per table of this rank: a dict of pointers (or a sequence in this order) --
        dense: fp32 [rows, dim], set; rows: int64 [n] and values: fp32 [n, dim] and count: one int64
        (the distinct rows the bags index, ascending, their gradients, n; n <= the indices); weight:
        [rows, dim] in weight_dtype and state: fp32 [rows, dim] (updated in place, only the rows the
        bags index). kind: what each sink takes (a name of GRAD_KINDS; None: dense): the dense gradient
        (dense), the sparse one (rows, values, count), SGD's step w -= lr * g (weight) or
        torch.optim.Adagrad's sparse step (weight, state; eps). A row's gradient g is the sum in
        fp32, the bags in order, of (per-sample weight, / bag size for mean) * the bag's pooled
        gradient (docs/embedding_a2a.md)."""
        bags = self._fill_tables("backward", tables)
        grads = list(grads)
        if len(grads) != len(self.tables):
            raise InvalidArgument(f"weft.EmbeddingA2A.backward: {len(grads)} gradient sinks for the "
                                  f"{len(self.tables)} tables of this rank")
        for t, (sink, g) in enumerate(zip(self._grads, grads)):
            if isinstance(g, dict):
                unknown = set(g) - set(self._SINK_FIELDS)
                if unknown:
                    raise InvalidArgument(f"weft.EmbeddingA2A.backward: grads[{t}] has {sorted(unknown)}; a sink's "
                                          f"fields are {', '.join(self._SINK_FIELDS)}")
                values = [g.get(f) for f in self._SINK_FIELDS]
            else:
                values = list(g)
                if len(values) > len(self._SINK_FIELDS):
                    raise InvalidArgument(f"weft.EmbeddingA2A.backward: grads[{t}] has {len(values)} pointers; a "
                                          f"sink has {', '.join(self._SINK_FIELDS)}")
                values += [None] * (len(self._SINK_FIELDS) - len(values))
            for f, v in zip(self._SINK_FIELDS, values):
                setattr(sink, f, _ptr(v))
        _check(self._world._lib.weft_embedding_a2a_backward(self.handle, bags, _ptr(grad_out_ptr),
                                                            self._grads if grads else None, _text(kind), float(lr),
                                                            float(eps), _text(method), _ptr(stream)))


class GemvAllReduce(_Op):
    """GEMV + AllReduce for decode (collective to create): y[M, N] = sum over ranks of
    x[M, K/world] · w[N, K/world]ᵀ, dtype BF16 or F16, any M from 1 to m_max (<= 128) per call
    from this one object, with nothing allocated after creation (every call capturable in a
    CUDA graph). epilogue=True: a call also takes residual [M, N] and gamma [N], writes
    residual_out = y + residual, and y receives RMSNorm(residual_out) · gamma (eps)."""

    _destroy = "weft_gemv_destroy"

    def __init__(self, world, n, k, dtype, *, m_max=128, epilogue=False, eps=1e-6):
        super().__init__(world)
        cfg = _lib.GemvConfig(n=int(n), k=int(k), m_max=int(m_max), dtype=int(dtype), epilogue=1 if epilogue else 0,
                              eps=float(eps))
        h = ctypes.c_void_p()
        _check(world._lib.weft_gemv_create(world.handle, ctypes.byref(cfg), ctypes.byref(h)))
        self._handle = h.value
        self.n, self.k, self.m_max, self.epilogue = int(n), int(k), int(m_max), bool(epilogue)
        world._register(self)

    def run(self, x_ptr, w_ptr, y_ptr, m=0, method=None, stream=0, residual_ptr=None, gamma_ptr=None,
            residual_out_ptr=None):
        """Collective: one call with M tokens (0: m_max). The epilogue's pointers are required
        with the epilogue and refused without it."""
        _check(self._world._lib.weft_gemv_run(self.handle, _ptr(x_ptr), _ptr(w_ptr), _ptr(y_ptr), int(m),
                                              _text(method), _ptr(residual_ptr), _ptr(gamma_ptr),
                                              _ptr(residual_out_ptr), _ptr(stream)))

    def auto_method(self, m=0):
        """The method `auto` runs for M tokens (0: m_max)."""
        s = ctypes.c_char_p()
        _check(self._world._lib.weft_gemv_auto_method(self.handle, int(m), ctypes.byref(s)))
        return s.value.decode()
