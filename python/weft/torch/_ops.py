"""weft's ops as torch.library custom ops (namespace "weft"), with fake implementations and
autograd rules.

Registered from Python (torch.library.custom_op), so the compiled part of weft does not depend
on the torch version. Every op is functional: it returns new tensors and mutates none of its
inputs (mutates_args=()), except embedding_a2a_update, an optimizer's step (its weights and states
in place). Inputs are made contiguous (a copy where they are not); outputs are
new ordinary tensors, which weft's C layer fills through its symmetric workspace (docs/python.md:
the staging copies).

(No `from __future__ import annotations` here: torch.library reads the annotations as types.)

The `group` argument is the process group's name (`group.group_name`; "" : the default group's
world, or the only world); weft.torch.group_name(group) converts a ProcessGroup.
"""

import math
from typing import Optional

import torch
from torch import Tensor

import weft

from . import _memory, _world

COLLECTIVE_METHODS = ("auto", "baseline", "one-shot", "two-shot", "ll", "ll128", "direct")
GEMM_METHODS = ("auto", "baseline", "decomposed", "fused")
B_LAYOUTS = ("nk", "kn")

_WEFT_DTYPE = {torch.float32: weft.F32, torch.float16: weft.F16, torch.bfloat16: weft.BF16}
_COLL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_GEMM_DTYPES = (torch.bfloat16, torch.float16)


# ---- validation ----------------------------------------------------------------------------

def _check_method(op, method, allowed):
    if method not in allowed:
        raise weft.InvalidArgument(f"weft.{op}: unknown method {method!r} (one of {', '.join(allowed)})")


def _check_input(w, op, name, t, dtypes):
    """The tensor, contiguous, after checking its dtype and device against the world's."""
    if not isinstance(t, Tensor):
        raise TypeError(f"weft.{op}: {name} must be a torch.Tensor, not {type(t).__name__}")
    if t.dtype not in dtypes:
        raise weft.InvalidArgument(f"weft.{op}: {name} has dtype {t.dtype}; this op takes "
                                   f"{', '.join(str(d) for d in dtypes)}")
    if w.backend == "host":
        if t.device.type != "cpu":
            raise weft.InvalidArgument(f"weft.{op}: {name} is on {t.device}, but the world "
                                       f"({w.group_name!r}) runs the host backend: CPU tensors only")
    else:
        if t.device.type != "cuda" or t.device.index != w.device.index:
            raise weft.InvalidArgument(f"weft.{op}: {name} is on {t.device}, but the world "
                                       f"({w.group_name!r}) runs the nccl backend on {w.device}")
    return t.contiguous()


def _divisible(op, what, value, size):
    if value % size:
        raise weft.InvalidArgument(f"weft.{op}: {what} ({value}) is not divisible by the world size ({size})")


def _stream(t):
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _capturing(t):
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _not_prepared(op, what):
    return RuntimeError(
        f"weft.{op}: the first call of a shape ({what}) cannot run inside CUDA graph capture: it "
        f"allocates symmetric state, which is collective. Make one eager call of this shape before "
        f"capturing, or call weft.torch.prepare('{op}', ...) with the same arguments")


# ---- collectives -----------------------------------------------------------------------------

def _coll_call(w, op, key_count, dtype, method, t, call):
    """Runs call(collectives, stream); the first call of a (shape, dtype, method) is refused
    inside graph capture (with the message above, before weft's own refusal)."""
    key = (op, key_count, dtype, method)
    if key not in w._coll_prepared and _capturing(t):
        raise _not_prepared(op, f"count {key_count}, {dtype}, method {method!r}")
    call(w.collectives(), _stream(t))
    w._coll_prepared.add(key)


def _prepare_collective(w, op, key_count, dtype, method):
    key = (op, key_count, dtype, method)
    if key not in w._coll_prepared:
        w.collectives().prepare(op, key_count, _WEFT_DTYPE[dtype], method=method)
        w._coll_prepared.add(key)


def _all_reduce_args(x, method, group):
    w = _world.lookup(group)
    _check_method("all_reduce", method, COLLECTIVE_METHODS)
    x = _check_input(w, "all_reduce", "x", x, _COLL_DTYPES)
    return w, x, x.numel()


@torch.library.custom_op("weft::all_reduce", mutates_args=())
def all_reduce(x: Tensor, method: str = "auto", group: str = "") -> Tensor:
    """Sum over the ranks of x (every rank gets the sum), any shape."""
    w, x, count = _all_reduce_args(x, method, group)
    out = torch.empty_like(x)
    if count:
        _coll_call(w, "all_reduce", count, x.dtype, method, x,
                   lambda c, s: c.all_reduce(x.data_ptr(), out.data_ptr(), count, _WEFT_DTYPE[x.dtype],
                                             method=method, stream=s))
    return out


@all_reduce.register_fake
def _(x, method="auto", group=""):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _size_of(op, w, group_size):
    """The world's size, checked against the caller's group_size where given (0: not given)."""
    if group_size and group_size != w.size:
        raise weft.InvalidArgument(f"weft.{op}: group_size {group_size} but the group has {w.size} ranks")
    return w.size


def _fake_size(group, group_size):
    # Under torch.compile the output shape must come from the arguments: compiled graphs are
    # cached by them, and the world's size is not one of them unless passed (group_size, as
    # torch's functional collectives take it).
    return group_size or _world.lookup(group).size


def _all_gather_args(x, method, group):
    w = _world.lookup(group)
    _check_method("all_gather", method, COLLECTIVE_METHODS)
    x = _check_input(w, "all_gather", "x", x, _COLL_DTYPES)
    if x.dim() == 0:
        raise weft.InvalidArgument("weft.all_gather: x must have at least one dimension (gathered along dim 0)")
    return w, x, x.numel()


@torch.library.custom_op("weft::all_gather", mutates_args=())
def all_gather(x: Tensor, method: str = "auto", group: str = "", group_size: int = 0) -> Tensor:
    """Every rank's x concatenated along dim 0 (as all_gather_into_tensor): [world*n, ...].
    group_size: the group's size (0: looked up; pass it under torch.compile)."""
    w, x, count = _all_gather_args(x, method, group)
    _size_of("all_gather", w, group_size)
    out = x.new_empty((w.size * x.shape[0],) + tuple(x.shape[1:]))
    if count:
        _coll_call(w, "all_gather", count, x.dtype, method, x,
                   lambda c, s: c.all_gather(x.data_ptr(), out.data_ptr(), count, _WEFT_DTYPE[x.dtype],
                                             method=method, stream=s))
    return out


@all_gather.register_fake
def _(x, method="auto", group="", group_size=0):
    return x.new_empty((_fake_size(group, group_size) * x.shape[0],) + tuple(x.shape[1:]))


def _reduce_scatter_args(x, method, group):
    w = _world.lookup(group)
    _check_method("reduce_scatter", method, COLLECTIVE_METHODS)
    x = _check_input(w, "reduce_scatter", "x", x, _COLL_DTYPES)
    if x.dim() == 0:
        raise weft.InvalidArgument("weft.reduce_scatter: x must have at least one dimension (scattered along dim 0)")
    _divisible("reduce_scatter", "x.shape[0]", x.shape[0], w.size)
    return w, x, x.numel() // w.size


@torch.library.custom_op("weft::reduce_scatter", mutates_args=())
def reduce_scatter(x: Tensor, method: str = "auto", group: str = "", group_size: int = 0) -> Tensor:
    """x [world*n, ...] summed over the ranks; rank r gets block r: [n, ...]. group_size as
    all_gather's."""
    w, x, count = _reduce_scatter_args(x, method, group)
    _size_of("reduce_scatter", w, group_size)
    out = x.new_empty((x.shape[0] // w.size,) + tuple(x.shape[1:]))
    if count:
        _coll_call(w, "reduce_scatter", count, x.dtype, method, x,
                   lambda c, s: c.reduce_scatter(x.data_ptr(), out.data_ptr(), count, _WEFT_DTYPE[x.dtype],
                                                 method=method, stream=s))
    return out


@reduce_scatter.register_fake
def _(x, method="auto", group="", group_size=0):
    return x.new_empty((x.shape[0] // _fake_size(group, group_size),) + tuple(x.shape[1:]))


def _all_to_all_args(x, method, group):
    w = _world.lookup(group)
    _check_method("all_to_all", method, COLLECTIVE_METHODS)
    x = _check_input(w, "all_to_all", "x", x, _COLL_DTYPES)
    if x.dim() == 0:
        raise weft.InvalidArgument("weft.all_to_all: x must have at least one dimension (split along dim 0)")
    _divisible("all_to_all", "x.shape[0]", x.shape[0], w.size)
    return w, x, x.numel() // w.size


@torch.library.custom_op("weft::all_to_all", mutates_args=())
def all_to_all(x: Tensor, method: str = "auto", group: str = "") -> Tensor:
    """x [world*n, ...] in equal blocks along dim 0: block p goes to rank p; the output's block s
    is what rank s sent here (as all_to_all_single with equal splits)."""
    w, x, count = _all_to_all_args(x, method, group)
    out = torch.empty_like(x)
    if count:
        _coll_call(w, "all_to_all", count, x.dtype, method, x,
                   lambda c, s: c.all_to_all(x.data_ptr(), out.data_ptr(), count, _WEFT_DTYPE[x.dtype],
                                             method=method, stream=s))
    return out


@all_to_all.register_fake
def _(x, method="auto", group=""):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _all_to_all_v_args(x, send_counts, out_capacity, method, group):
    w = _world.lookup(group)
    _check_method("all_to_all_v", method, COLLECTIVE_METHODS)
    x = _check_input(w, "all_to_all_v", "x", x, _COLL_DTYPES)
    if x.dim() == 0:
        raise weft.InvalidArgument("weft.all_to_all_v: x must have at least one dimension (rows along dim 0)")
    if not isinstance(send_counts, Tensor) or send_counts.dtype not in (torch.int64, torch.int32):
        raise weft.InvalidArgument("weft.all_to_all_v: send_counts must be an int64 (or int32) tensor")
    if send_counts.device != x.device:
        raise weft.InvalidArgument(f"weft.all_to_all_v: send_counts is on {send_counts.device}, x on {x.device}")
    if tuple(send_counts.shape) != (w.size,):
        raise weft.InvalidArgument(f"weft.all_to_all_v: send_counts has shape {tuple(send_counts.shape)}; "
                                   f"it needs one count per rank: ({w.size},)")
    if out_capacity < 0:
        raise weft.InvalidArgument(f"weft.all_to_all_v: out_capacity ({out_capacity}) is negative")
    row = math.prod(x.shape[1:])
    if row == 0:
        raise weft.InvalidArgument("weft.all_to_all_v: rows of zero elements")
    if x.device.type == "cpu":
        # On CUDA this check would synchronise with the device: the counts stay unchecked there
        # against x's length (weft reads send_counts on the device).
        if bool((send_counts < 0).any()) or int(send_counts.sum()) > x.shape[0]:
            raise weft.InvalidArgument(f"weft.all_to_all_v: send_counts {send_counts.tolist()} ask for more rows "
                                       f"than x has ({x.shape[0]}), or a negative count")
    return w, x, row


@torch.library.custom_op("weft::all_to_all_v", mutates_args=())
def all_to_all_v(x: Tensor, send_counts: Tensor, out_capacity: int, method: str = "auto",
                 group: str = "") -> tuple[Tensor, Tensor]:
    """By counts, in rows of dim 0: x's rows packed by destination (send_counts[p] rows for rank
    p; send_counts an int64 tensor [world] on x's device); returns (out, recv_counts): out
    [out_capacity, ...] holds the rows received packed by source, recv_counts[s] (int64 [world])
    the rows rank s sent here. Rows of out past sum(recv_counts) are unspecified. A call in which
    any rank would receive more than out_capacity rows raises on every rank."""
    w, x, row = _all_to_all_v_args(x, send_counts, out_capacity, method, group)
    out = x.new_empty((out_capacity,) + tuple(x.shape[1:]))
    send_elems = (send_counts.to(torch.int64) * row).contiguous()
    recv_elems = torch.zeros(w.size, dtype=torch.int64, device=x.device)
    _coll_call(w, "all_to_all_v", out_capacity * row, x.dtype, method, x,
               lambda c, s: c.all_to_all_v(x.data_ptr(), send_elems.data_ptr(), out.data_ptr(), out_capacity * row,
                                           recv_elems.data_ptr(), _WEFT_DTYPE[x.dtype], method=method, stream=s))
    return out, recv_elems // row


@all_to_all_v.register_fake
def _(x, send_counts, out_capacity, method="auto", group=""):
    w = _world.lookup(group)
    return (x.new_empty((out_capacity,) + tuple(x.shape[1:])),
            send_counts.new_empty((w.size,), dtype=torch.int64))


# ---- GEMM + communication --------------------------------------------------------------------

def _gemm_operands(op, a, b, method, group, b_layout):
    w = _world.lookup(group)
    _check_method(op, method, GEMM_METHODS)
    if b_layout not in B_LAYOUTS:
        raise weft.InvalidArgument(f"weft.{op}: b_layout must be 'nk' ([N, K], linear's weight) or 'kn', "
                                   f"not {b_layout!r}")
    a = _check_input(w, op, "a", a, _GEMM_DTYPES)
    b = _check_input(w, op, "b", b, _GEMM_DTYPES)
    if a.dtype != b.dtype:
        raise weft.InvalidArgument(f"weft.{op}: a is {a.dtype} but b is {b.dtype}")
    if a.dim() != 2 or b.dim() != 2:
        raise weft.InvalidArgument(f"weft.{op}: a and b must be 2-D (a {tuple(a.shape)}, b {tuple(b.shape)})")
    n, kb = (b.shape[0], b.shape[1]) if b_layout == "nk" else (b.shape[1], b.shape[0])
    if kb != a.shape[1]:
        raise weft.InvalidArgument(f"weft.{op}: a {tuple(a.shape)} and b {tuple(b.shape)} (layout {b_layout}) "
                                   f"disagree on K ({a.shape[1]} vs {kb})")
    return w, a, b, n


def _gemm_problem(op, w, a, n):
    """(M, N, K) of the global problem, and C's shape."""
    rows, k_local = a.shape
    if op == "ag_gemm":
        m = rows * w.size
        return (m, n, k_local), (m, n)
    k = k_local * w.size
    if op == "gemm_rs":
        _divisible(op, "a.shape[0] (M)", rows, w.size)
        return (rows, n, k), (rows // w.size, n)
    return (rows, n, k), (rows, n)


def _gemm_object(w, op, problem, dtype, b_layout, t, capture_check=True):
    m, n, k = problem
    key = (op, m, n, k, dtype, b_layout)
    g = w._gemms.get(key)
    if g is None:
        if capture_check and _capturing(t):
            raise _not_prepared(op, f"M={m}, N={n}, K={k}, {dtype}, b_layout {b_layout}")
        g = weft.GemmOverlap(w.world, op, m, n, k, _WEFT_DTYPE[dtype], b_layout=b_layout)
        w._gemms[key] = g
    return g


def _gemm_run(op, a, b, method, group, b_layout, group_size=0, gathered=False):
    w, a, b, n = _gemm_operands(op, a, b, method, group, b_layout)
    _size_of(op, w, group_size)
    problem, c_shape = _gemm_problem(op, w, a, n)
    c = a.new_empty(c_shape)
    a_full = a.new_empty((problem[0], a.shape[1])) if gathered else None
    if c.numel() and a.shape[1]:
        g = _gemm_object(w, op, problem, a.dtype, b_layout, a)
        g.run(a.data_ptr(), b.data_ptr(), c.data_ptr(), method=method, stream=_stream(a),
              gathered_a_ptr=a_full.data_ptr() if gathered else None)
    else:
        if c.numel():
            c.zero_()
        if gathered and a_full.numel():  # K = 0 never reaches here (a.shape[1] == a_full.shape[1])
            a_full.zero_()
    return (c, a_full) if gathered else c


def _gemm_fake(op, a, b, group, b_layout, group_size=0):
    n = b.shape[0] if b_layout == "nk" else b.shape[1]
    if op == "ag_gemm":
        return a.new_empty((a.shape[0] * _fake_size(group, group_size), n))
    if op == "gemm_rs":
        return a.new_empty((a.shape[0] // _fake_size(group, group_size), n))
    return a.new_empty((a.shape[0], n))


@torch.library.custom_op("weft::ag_gemm", mutates_args=())
def ag_gemm(a: Tensor, b: Tensor, method: str = "auto", group: str = "", b_layout: str = "nk",
            group_size: int = 0) -> Tensor:
    """C[M, N] = all_gather(A[M/world, K]) · Bᵀ, B [N, K] (b_layout "nk", linear's weight layout;
    "kn": B [K, N] and C = all_gather(A) · B). bf16/f16."""
    return _gemm_run("ag_gemm", a, b, method, group, b_layout, group_size)


@ag_gemm.register_fake
def _(a, b, method="auto", group="", b_layout="nk", group_size=0):
    return _gemm_fake("ag_gemm", a, b, group, b_layout, group_size)


@torch.library.custom_op("weft::ag_gemm_gathered", mutates_args=())
def ag_gemm_gathered(a: Tensor, b: Tensor, method: str = "auto", group: str = "", b_layout: str = "nk",
                     group_size: int = 0) -> tuple[Tensor, Tensor]:
    """ag_gemm that also returns the gathered A [M, K] it multiplied: (C, all_gather(A)). For
    training, where the weight's gradient needs all_gather(A) again: the baseline gathers
    straight into it, decomposed and fused copy it from their workspace (one device copy of
    M x K elements after the GEMM) instead of a second all-gather."""
    return _gemm_run("ag_gemm", a, b, method, group, b_layout, group_size, gathered=True)


@ag_gemm_gathered.register_fake
def _(a, b, method="auto", group="", b_layout="nk", group_size=0):
    c = _gemm_fake("ag_gemm", a, b, group, b_layout, group_size)
    return c, a.new_empty((c.shape[0], a.shape[1]))


@torch.library.custom_op("weft::gemm_rs", mutates_args=())
def gemm_rs(a: Tensor, b: Tensor, method: str = "auto", group: str = "", b_layout: str = "nk",
            group_size: int = 0) -> Tensor:
    """C[M/world, N] = reduce_scatter(A[M, K/world] · Bᵀ) along M, B [N, K/world] ("nk"; "kn":
    [K/world, N]). bf16/f16."""
    return _gemm_run("gemm_rs", a, b, method, group, b_layout, group_size)


@gemm_rs.register_fake
def _(a, b, method="auto", group="", b_layout="nk", group_size=0):
    return _gemm_fake("gemm_rs", a, b, group, b_layout, group_size)


@torch.library.custom_op("weft::gemm_ar", mutates_args=())
def gemm_ar(a: Tensor, b: Tensor, method: str = "auto", group: str = "", b_layout: str = "nk") -> Tensor:
    """C[M, N] = all_reduce(A[M, K/world] · Bᵀ), B [N, K/world] ("nk"; "kn": [K/world, N]).
    bf16/f16."""
    return _gemm_run("gemm_ar", a, b, method, group, b_layout)


@gemm_ar.register_fake
def _(a, b, method="auto", group="", b_layout="nk"):
    return _gemm_fake("gemm_ar", a, b, group, b_layout)


# ---- GEMV + AllReduce for decode -------------------------------------------------------------
# One weft.GemvAllReduce per (N, K, dtype, epilogue, eps, group), made with m_max = 128: every
# decode batch size runs on it without allocating, so every call after the first of a shape
# (or after prepare) can be captured in a CUDA graph.

GEMV_METHODS = GEMM_METHODS
GEMV_M_MAX = 128  # the tokens one call may have (ops::kGemvMaxM)


def _gemv_operands(op, x, w, method, group):
    """(world, x as [M, K/world], w, M, N, the output's leading shape)."""
    wd = _world.lookup(group)
    _check_method(op, method, GEMV_METHODS)
    x = _check_input(wd, op, "x", x, _GEMM_DTYPES)
    w = _check_input(wd, op, "w", w, _GEMM_DTYPES)
    if x.dtype != w.dtype:
        raise weft.InvalidArgument(f"weft.{op}: x is {x.dtype} but w is {w.dtype}")
    if w.dim() != 2 or x.dim() < 1:
        raise weft.InvalidArgument(f"weft.{op}: w must be 2-D [N, K/world] and x [..., K/world] "
                                   f"(x {tuple(x.shape)}, w {tuple(w.shape)})")
    n, k_local = w.shape
    if x.shape[-1] != k_local:
        raise weft.InvalidArgument(f"weft.{op}: x {tuple(x.shape)} and w {tuple(w.shape)} disagree on K/world "
                                   f"({x.shape[-1]} vs {k_local})")
    if k_local % 8 or n % 8 or n == 0 or k_local == 0:
        raise weft.InvalidArgument(f"weft.{op}: K/world ({k_local}) and N ({n}) must be positive multiples of 8")
    lead = tuple(x.shape[:-1])
    x2 = x.reshape(-1, k_local)
    m = x2.shape[0]
    if m > GEMV_M_MAX:
        raise weft.InvalidArgument(f"weft.{op}: M = {m} tokens, more than the op's maximum {GEMV_M_MAX} (a decode "
                                   f"batch; use gemm_ar for more tokens)")
    return wd, x2, w, m, n, lead


def _gemv_object(wd, n, k, dtype, epilogue, eps, t, capture_check=True):
    key = ("gemv_ar", n, k, dtype, epilogue, float(eps) if epilogue else None)
    g = wd._gemms.get(key)
    if g is None:
        if capture_check and _capturing(t):
            op = "gemv_ar_rmsnorm" if epilogue else "gemv_ar"
            raise _not_prepared(op, f"N={n}, K={k}, {dtype}" + (f", eps {eps}" if epilogue else ""))
        g = weft.GemvAllReduce(wd.world, n, k, _WEFT_DTYPE[dtype], m_max=GEMV_M_MAX, epilogue=epilogue, eps=eps)
        wd._gemms[key] = g
    return g


def _gemv_epilogue_operands(op, wd, residual, gamma, m, n, dtype, lead):
    residual = _check_input(wd, op, "residual", residual, (dtype,))
    gamma = _check_input(wd, op, "gamma", gamma, (dtype,))
    if tuple(residual.shape) != lead + (n,):
        raise weft.InvalidArgument(f"weft.{op}: residual has shape {tuple(residual.shape)}; the output's is "
                                   f"{lead + (n,)}")
    if tuple(gamma.shape) != (n,):
        raise weft.InvalidArgument(f"weft.{op}: gamma has shape {tuple(gamma.shape)}, not ({n},)")
    return residual.reshape(m, n), gamma


@torch.library.custom_op("weft::gemv_ar", mutates_args=())
def gemv_ar(x: Tensor, w: Tensor, method: str = "auto", group: str = "") -> Tensor:
    """y[..., N] = all_reduce(x[..., K/world] · wᵀ), w [N, K/world] (linear's weight layout), bf16/f16,
    1 ... 128 tokens (x's leading dimensions flattened). Decode: no autograd."""
    wd, x2, w, m, n, lead = _gemv_operands("gemv_ar", x, w, method, group)
    y = x2.new_empty((m, n))
    if m:
        g = _gemv_object(wd, n, x2.shape[1] * wd.size, x2.dtype, False, 0.0, x2)
        g.run(x2.data_ptr(), w.data_ptr(), y.data_ptr(), m=m, method=method, stream=_stream(x2))
    return y.reshape(lead + (n,))


@gemv_ar.register_fake
def _(x, w, method="auto", group=""):
    return x.new_empty(tuple(x.shape[:-1]) + (w.shape[0],))


@torch.library.custom_op("weft::gemv_ar_rmsnorm", mutates_args=())
def gemv_ar_rmsnorm(x: Tensor, w: Tensor, residual: Tensor, gamma: Tensor, eps: float = 1e-6, method: str = "auto",
                    group: str = "") -> tuple[Tensor, Tensor]:
    """gemv_ar with the residual + RMSNorm epilogue: with y = all_reduce(x · wᵀ),
    residual_out = y + residual and out = RMSNorm(residual_out) · gamma (eps); returns
    (out, residual_out), both [..., N]. residual [..., N], gamma [N], x's dtype."""
    wd, x2, w, m, n, lead = _gemv_operands("gemv_ar_rmsnorm", x, w, method, group)
    res2, gamma = _gemv_epilogue_operands("gemv_ar_rmsnorm", wd, residual, gamma, m, n, x2.dtype, lead)
    out = x2.new_empty((m, n))
    res_out = x2.new_empty((m, n))
    if m:
        g = _gemv_object(wd, n, x2.shape[1] * wd.size, x2.dtype, True, eps, x2)
        g.run(x2.data_ptr(), w.data_ptr(), out.data_ptr(), m=m, method=method, stream=_stream(x2),
              residual_ptr=res2.data_ptr(), gamma_ptr=gamma.data_ptr(), residual_out_ptr=res_out.data_ptr())
    return out.reshape(lead + (n,)), res_out.reshape(lead + (n,))


@gemv_ar_rmsnorm.register_fake
def _(x, w, residual, gamma, eps=1e-6, method="auto", group=""):
    shape = tuple(x.shape[:-1]) + (w.shape[0],)
    return x.new_empty(shape), x.new_empty(shape)


def _gemv_no_grad(ctx, inputs, output):
    # Called only when an input requires grad (with grad mode on): refuse at the forward, with
    # the way out, rather than leave a graph whose backward fails later.
    raise RuntimeError("weft.gemv_ar / gemv_ar_rmsnorm have no backward (decode ops): call them under "
                       "torch.no_grad() or torch.inference_mode(), or with inputs that do not require grad; "
                       "for training use gemm_ar (weft.torch.nn.RowParallelLinear)")


def _gemv_bwd(ctx, *grads):
    raise RuntimeError("weft.gemv_ar has no backward")


gemv_ar.register_autograd(_gemv_bwd, setup_context=_gemv_no_grad)
gemv_ar_rmsnorm.register_autograd(_gemv_bwd, setup_context=_gemv_no_grad)


# ---- MoE token exchange ------------------------------------------------------------------------
# One weft.MoeDispatchCombine per (hidden, experts, top_k, max_tokens, recv_capacity, dtype,
# group). max_tokens 0 picks a bucket (the next power of two >= T, at least 128), so calls of
# changing T share a few objects; pass max_tokens (and make one eager call, or prepare) before
# capturing in a CUDA graph. combine uses the routing of the last dispatch of its object.

MOE_METHODS = ("auto", "baseline", "decomposed", "direct")
_MOE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
def _backend_view(wd, ptr, numel, dtype):
    """A tensor over `numel` elements at `ptr` in the backend's memory (no copy, not owned)."""
    if numel == 0:
        return torch.empty(0, dtype=dtype, device=wd.device)
    if wd.device.type == "cpu":
        import ctypes
        block = (ctypes.c_char * (numel * torch.empty(0, dtype=dtype).element_size())).from_address(ptr)
        return torch.frombuffer(block, dtype=dtype, count=numel)
    typestr, view_as = _memory._TYPESTR[dtype]
    try:
        import numpy  # noqa: F401  (torch parses __cuda_array_interface__'s typestr through NumPy)
    except ImportError:
        raise RuntimeError("weft.moe_dispatch on CUDA needs NumPy (torch reads __cuda_array_interface__ through "
                           "it): python -m pip install numpy") from None
    t = torch.as_tensor(_memory._CudaBlock(ptr, (numel,), typestr), device=wd.device)
    return t.view(view_as) if view_as is not None else t


def _moe_max_tokens(t, max_tokens):
    if max_tokens < 0:
        raise weft.InvalidArgument(f"weft.moe: max_tokens must be >= 0, got {max_tokens}")
    if max_tokens > 0:
        return max_tokens
    m = 128
    while m < t:
        m *= 2
    return m


def _moe_capacity(wd, experts, top_k, max_tokens, recv_capacity):
    if recv_capacity < 0:
        raise weft.InvalidArgument(f"weft.moe: recv_capacity must be >= 0, got {recv_capacity}")
    if recv_capacity:
        return recv_capacity
    return wd.size * max_tokens * min(top_k, max(experts // wd.size, 1))


def _cached_object(op, wd, key, shape, make, t, capture_check):
    """The world's object for `key`, made by make() the first time -- outside a CUDA graph
    capture (a capture must not allocate: prepare() first, or an eager call)."""
    m = wd._gemms.get(key)
    if m is None:
        if capture_check and _capturing(t):
            raise _not_prepared(op, shape)
        m = wd._gemms[key] = make()
    return m


def _moe_object(op, wd, hidden, experts, top_k, max_tokens, recv_capacity, dtype, t, capture_check=True):
    return _cached_object(
        op, wd, ("moe", hidden, experts, top_k, max_tokens, recv_capacity, dtype),
        f"hidden={hidden}, experts={experts}, top_k={top_k}, max_tokens={max_tokens}, {dtype}",
        lambda: weft.MoeDispatchCombine(wd.world, hidden, experts, top_k, max_tokens, _WEFT_DTYPE[dtype],
                                        recv_capacity=recv_capacity), t, capture_check)


def _moe_dispatch_operands(x, ids, experts, max_tokens, recv_capacity, method, group):
    wd = _world.lookup(group)
    _check_method("moe_dispatch", method, MOE_METHODS)
    x = _check_input(wd, "moe_dispatch", "x", x, _MOE_DTYPES)
    ids = _check_input(wd, "moe_dispatch", "ids", ids, (torch.int32, torch.int64))
    if x.dim() != 2 or ids.dim() != 2 or ids.shape[0] != x.shape[0]:
        raise weft.InvalidArgument(f"weft.moe_dispatch: x must be [T, hidden] and ids [T, top_k] (x "
                                   f"{tuple(x.shape)}, ids {tuple(ids.shape)})")
    t, hidden = x.shape
    top_k = ids.shape[1]
    if experts < 1 or experts % wd.size:
        raise weft.InvalidArgument(f"weft.moe_dispatch: experts must be a positive multiple of the world size "
                                   f"{wd.size}, got {experts}")
    mt = _moe_max_tokens(t, max_tokens)
    if t > mt:
        raise weft.InvalidArgument(f"weft.moe_dispatch: {t} tokens, more than max_tokens {mt}")
    cap = _moe_capacity(wd, experts, top_k, mt, recv_capacity)
    return wd, x, ids, t, hidden, top_k, mt, cap


@torch.library.custom_op("weft::moe_dispatch", mutates_args=())
def moe_dispatch(x: Tensor, ids: Tensor, experts: int, max_tokens: int = 0, recv_capacity: int = 0,
                 method: str = "auto", group: str = "") -> tuple[Tensor, Tensor]:
    """Sends each token's row of x [T, hidden] to the ranks of its experts ids [T, top_k]
    (experts / world a rank; int32 or int64 ids) -> (recv [capacity, hidden]: this rank's rows,
    rank-major and expert-grouped, the first sum(counts) valid; counts [world, experts / world]
    int64: rows from each source rank for each local expert). capacity = recv_capacity, or 0:
    world * max_tokens * min(top_k, experts / world). bf16/f16/f32. No autograd yet."""
    wd, x, ids, t, hidden, top_k, mt, cap = _moe_dispatch_operands(x, ids, experts, max_tokens, recv_capacity,
                                                                    method, group)
    ids32 = ids if ids.dtype == torch.int32 else ids.to(torch.int32)
    m = _moe_object("moe_dispatch", wd, hidden, experts, top_k, mt, recv_capacity, x.dtype, x)
    m.dispatch(x.data_ptr() if t else 0, ids32.data_ptr() if t else 0, t, method, _stream(x))
    recv_ptr, counts_ptr, _, local = m.buffers()
    recv = _backend_view(wd, recv_ptr, cap * hidden, x.dtype).view(cap, hidden).clone()
    counts = _backend_view(wd, counts_ptr, wd.size * local, torch.int64).view(wd.size, local).clone()
    return recv, counts


@moe_dispatch.register_fake
def _(x, ids, experts, max_tokens=0, recv_capacity=0, method="auto", group=""):
    wd, x, ids, t, hidden, top_k, mt, cap = _moe_dispatch_operands(x, ids, experts, max_tokens, recv_capacity,
                                                                    method, group)
    return x.new_empty((cap, hidden)), x.new_empty((wd.size, experts // wd.size), dtype=torch.int64)


def _moe_combine_operands(expert_out, weights, experts, max_tokens, recv_capacity, method, group):
    wd = _world.lookup(group)
    _check_method("moe_combine", method, MOE_METHODS)
    expert_out = _check_input(wd, "moe_combine", "expert_out", expert_out, _MOE_DTYPES)
    weights = _check_input(wd, "moe_combine", "weights", weights, (torch.float32,))
    if expert_out.dim() != 2 or weights.dim() != 2:
        raise weft.InvalidArgument(f"weft.moe_combine: expert_out must be [capacity, hidden] and weights [T, top_k] "
                                   f"(expert_out {tuple(expert_out.shape)}, weights {tuple(weights.shape)})")
    t, top_k = weights.shape
    hidden = expert_out.shape[1]
    mt = _moe_max_tokens(t, max_tokens)
    cap = _moe_capacity(wd, experts, top_k, mt, recv_capacity)
    if expert_out.shape[0] != cap:
        raise weft.InvalidArgument(f"weft.moe_combine: expert_out has {expert_out.shape[0]} rows; the dispatch's recv "
                                   f"has {cap} (capacity)")
    return wd, expert_out, weights, t, hidden, top_k, mt


@torch.library.custom_op("weft::moe_combine", mutates_args=())
def moe_combine(expert_out: Tensor, weights: Tensor, experts: int, max_tokens: int = 0, recv_capacity: int = 0,
                method: str = "auto", group: str = "") -> Tensor:
    """After moe_dispatch with the same experts, max_tokens, recv_capacity, method and group:
    the experts' output rows (expert_out, recv's layout) back to their tokens' ranks ->
    y [T, hidden], y[t] = sum over slots j of weights[t, j] * row(t, j), in slot order in fp32
    (weights [T, top_k] fp32). No autograd yet."""
    wd, expert_out, weights, t, hidden, top_k, mt = _moe_combine_operands(expert_out, weights, experts, max_tokens,
                                                                          recv_capacity, method, group)
    m = _moe_object("moe_combine", wd, hidden, experts, top_k, mt, recv_capacity, expert_out.dtype, expert_out)
    y = expert_out.new_empty((t, hidden))
    m.combine(expert_out.data_ptr() if expert_out.numel() else 0, weights.data_ptr() if t else 0,
              y.data_ptr() if t else 0, t, method, _stream(expert_out))
    return y


@moe_combine.register_fake
def _(expert_out, weights, experts, max_tokens=0, recv_capacity=0, method="auto", group=""):
    wd, expert_out, weights, t, hidden, top_k, mt = _moe_combine_operands(expert_out, weights, experts, max_tokens,
                                                                          recv_capacity, method, group)
    return expert_out.new_empty((t, hidden))


def _moe_no_grad(ctx, inputs, output):
    # Called only when an input requires grad (with grad mode on): refuse at the forward rather
    # than leave a graph whose backward fails later.
    raise RuntimeError("weft.moe_dispatch / moe_combine have no backward yet: call them under torch.no_grad() or "
                       "torch.inference_mode(), or with inputs that do not require grad")


def _moe_bwd(ctx, *grads):
    raise RuntimeError("weft.moe_dispatch / moe_combine have no backward yet")


moe_dispatch.register_autograd(_moe_bwd, setup_context=_moe_no_grad)
moe_combine.register_autograd(_moe_bwd, setup_context=_moe_no_grad)


# ---- MoE layer ---------------------------------------------------------------------------------
# One weft.MoeLayer per (hidden, ffn, experts, top_k, max_tokens, recv_capacity, dtype, group),
# max_tokens bucketed as moe_dispatch's.

MOE_LAYER_METHODS = ("auto", "baseline", "decomposed", "fused")


def _moe_layer_operands(x, ids, weights, w_up, w_down, experts, max_tokens, recv_capacity, method, group):
    wd = _world.lookup(group)
    _check_method("moe_layer", method, MOE_LAYER_METHODS)
    x = _check_input(wd, "moe_layer", "x", x, _MOE_DTYPES)
    ids = _check_input(wd, "moe_layer", "ids", ids, (torch.int32, torch.int64))
    weights = _check_input(wd, "moe_layer", "weights", weights, (torch.float32,))
    w_up = _check_input(wd, "moe_layer", "w_up", w_up, (x.dtype,))
    w_down = _check_input(wd, "moe_layer", "w_down", w_down, (x.dtype,))
    if x.dim() != 2 or ids.dim() != 2 or weights.shape != ids.shape or ids.shape[0] != x.shape[0]:
        raise weft.InvalidArgument(f"weft.moe_layer: x must be [T, hidden], ids and weights [T, top_k] (x "
                                   f"{tuple(x.shape)}, ids {tuple(ids.shape)}, weights {tuple(weights.shape)})")
    t, hidden = x.shape
    top_k = ids.shape[1]
    if experts < 1 or experts % wd.size:
        raise weft.InvalidArgument(f"weft.moe_layer: experts must be a positive multiple of the world size "
                                   f"{wd.size}, got {experts}")
    local = experts // wd.size
    if w_up.dim() != 3 or w_up.shape[0] != local or w_up.shape[2] != hidden or w_up.shape[1] % 2:
        raise weft.InvalidArgument(f"weft.moe_layer: w_up must be [experts / world = {local}, 2 * ffn, hidden = "
                                   f"{hidden}], got {tuple(w_up.shape)}")
    ffn = w_up.shape[1] // 2
    if tuple(w_down.shape) != (local, hidden, ffn):
        raise weft.InvalidArgument(f"weft.moe_layer: w_down must be [{local}, {hidden}, {ffn}] (experts / world, "
                                   f"hidden, ffn), got {tuple(w_down.shape)}")
    mt = _moe_max_tokens(t, max_tokens)
    if t > mt:
        raise weft.InvalidArgument(f"weft.moe_layer: {t} tokens, more than max_tokens {mt}")
    return wd, x, ids, weights, w_up, w_down, t, hidden, ffn, top_k, mt


def _moe_layer_object(wd, hidden, ffn, experts, top_k, max_tokens, recv_capacity, dtype, t, capture_check=True):
    if recv_capacity < 0:
        raise weft.InvalidArgument(f"weft.moe: recv_capacity must be >= 0, got {recv_capacity}")
    return _cached_object(
        "moe_layer", wd, ("moe_layer", hidden, ffn, experts, top_k, max_tokens, recv_capacity, dtype),
        f"hidden={hidden}, ffn={ffn}, experts={experts}, top_k={top_k}, max_tokens={max_tokens}, {dtype}",
        lambda: weft.MoeLayer(wd.world, hidden, ffn, experts, top_k, max_tokens, _WEFT_DTYPE[dtype],
                              recv_capacity=recv_capacity), t, capture_check)


@torch.library.custom_op("weft::moe_layer", mutates_args=())
def moe_layer(x: Tensor, ids: Tensor, weights: Tensor, w_up: Tensor, w_down: Tensor, experts: int,
              max_tokens: int = 0, recv_capacity: int = 0, method: str = "auto", group: str = "") -> Tensor:
    """A mixture-of-experts layer with expert parallelism (docs/moe.md, "Layer"): each token of
    x [T, hidden] to its experts ids [T, top_k] (experts / world a rank), each expert's SwiGLU
    FFN (w_up [experts / world, 2 ffn, hidden]: gate rows, then up rows; w_down
    [experts / world, hidden, ffn]: this rank's experts), the outputs back and summed with the
    router's weights [T, top_k] fp32 -> y [T, hidden]. bf16/f16 (f32 on the host backend).
    No autograd yet."""
    wd, x, ids, weights, w_up, w_down, t, hidden, ffn, top_k, mt = _moe_layer_operands(
        x, ids, weights, w_up, w_down, experts, max_tokens, recv_capacity, method, group)
    ids32 = ids if ids.dtype == torch.int32 else ids.to(torch.int32)
    m = _moe_layer_object(wd, hidden, ffn, experts, top_k, mt, recv_capacity, x.dtype, x)
    y = x.new_empty((t, hidden))
    m.forward(x.data_ptr() if t else 0, ids32.data_ptr() if t else 0, weights.data_ptr() if t else 0,
              w_up.data_ptr(), w_down.data_ptr(), y.data_ptr() if t else 0, t, method, _stream(x))
    return y


@moe_layer.register_fake
def _(x, ids, weights, w_up, w_down, experts, max_tokens=0, recv_capacity=0, method="auto", group=""):
    wd, x, ids, weights, w_up, w_down, t, hidden, ffn, top_k, mt = _moe_layer_operands(
        x, ids, weights, w_up, w_down, experts, max_tokens, recv_capacity, method, group)
    return x.new_empty((t, hidden))


def _moe_layer_no_grad(ctx, inputs, output):
    raise RuntimeError("weft.moe_layer has no backward yet: call it under torch.no_grad() or "
                       "torch.inference_mode(), or with inputs that do not require grad")


def _moe_layer_bwd(ctx, *grads):
    raise RuntimeError("weft.moe_layer has no backward yet")


moe_layer.register_autograd(_moe_layer_bwd, setup_context=_moe_layer_no_grad)


# ---- Embedding-bag lookups + all-to-all ---------------------------------------------------------
# One weft.EmbeddingA2A per (this rank's tables' shapes, batch, weight dtype, out dtype, pooling,
# check_indices, group): made at the first call of a configuration (collective: every rank makes
# its first call of a configuration together, as for every op), kept until release_ops().
# Nothing is allocated after that: calls may be captured in CUDA graphs (the eager GPU call with
# check_indices reads the indices' verdict back; inside a capture it does not).

EMBEDDING_A2A_METHODS = ("auto", "baseline", "decomposed", "fused")
EMBEDDING_POOLINGS = ("sum", "mean")
_EMBEDDING_WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_EMBEDDING_OUT_DTYPES = (torch.float32, torch.bfloat16)


def _embedding_a2a_operands(weights, offsets, indices, batch, per_sample_weights, pooling, out_dtype, method, group,
                            total_dim, weight_dtype, op="embedding_a2a"):
    """(world, weights, offsets, indices, per-sample weights (a list, None where none), this rank's
    tables' (rows, dim), the weights' dtype), after the checks that need no tensor's values."""
    wd = _world.lookup(group)
    _check_method(op, method, EMBEDDING_A2A_METHODS)
    if pooling not in EMBEDDING_POOLINGS:
        raise weft.InvalidArgument(f"weft.{op}: unknown pooling {pooling!r} (one of {', '.join(EMBEDDING_POOLINGS)})")
    if out_dtype not in _EMBEDDING_OUT_DTYPES:
        raise weft.InvalidArgument(f"weft.{op}: out_dtype {out_dtype} is not one of "
                                   f"{', '.join(str(d) for d in _EMBEDDING_OUT_DTYPES)}")
    if weight_dtype is not None and weight_dtype not in _EMBEDDING_WEIGHT_DTYPES:
        raise weft.InvalidArgument(f"weft.{op}: weight_dtype {weight_dtype} is not one of "
                                   f"{', '.join(str(d) for d in _EMBEDDING_WEIGHT_DTYPES)}")
    if batch < 0 or total_dim < 0:
        raise weft.InvalidArgument(f"weft.{op}: batch ({batch}) and total_dim ({total_dim}) must be >= 0")
    n = len(weights)
    psw = list(per_sample_weights) if per_sample_weights else [None] * n
    if len(offsets) != n or len(indices) != n or len(psw) != n:
        raise weft.InvalidArgument(f"weft.{op}: one weight, offsets, indices (and per_sample_weights, where given) a "
                                   f"table: got {n} weights, {len(offsets)} offsets, {len(indices)} indices, "
                                   f"{len(psw)} per_sample_weights")
    bags = wd.size * batch
    ws, offs, idxs, psws, shapes = [], [], [], [], []
    for t in range(n):
        w = _check_input(wd, op, f"weights[{t}]", weights[t], _EMBEDDING_WEIGHT_DTYPES)
        if w.dim() != 2:
            raise weft.InvalidArgument(f"weft.{op}: weights[{t}] must be [rows, dim], got {tuple(w.shape)}")
        want = weight_dtype or (ws[0].dtype if ws else w.dtype)
        if w.dtype != want:
            said = f"weight_dtype is {weight_dtype}" if weight_dtype else f"weights[0] is {want}"
            raise weft.InvalidArgument(f"weft.{op}: weights[{t}] is {w.dtype} but {said}: the tables have one dtype")
        o = _check_input(wd, op, f"offsets[{t}]", offsets[t], (torch.int64,))
        i = _check_input(wd, op, f"indices[{t}]", indices[t], (torch.int64,))
        if o.dim() != 1 or o.shape[0] != bags + 1:
            raise weft.InvalidArgument(f"weft.{op}: offsets[{t}] has shape {tuple(o.shape)}; it needs world * batch "
                                       f"+ 1 = {bags + 1} elements (a bag per sample of the global batch, and the end)")
        if i.dim() != 1:
            raise weft.InvalidArgument(f"weft.{op}: indices[{t}] must be 1-D, got {tuple(i.shape)}")
        p = psw[t]
        if p is not None:
            p = _check_input(wd, op, f"per_sample_weights[{t}]", p, (torch.float32,))
            if tuple(p.shape) != tuple(i.shape):
                raise weft.InvalidArgument(f"weft.{op}: per_sample_weights[{t}] has shape {tuple(p.shape)}; "
                                           f"indices[{t}] {tuple(i.shape)} (one weight per index)")
        ws.append(w)
        offs.append(o)
        idxs.append(i)
        psws.append(p)
        shapes.append((w.shape[0], w.shape[1]))
    wdtype = weight_dtype or (ws[0].dtype if ws else torch.float32)
    return wd, ws, offs, idxs, psws, tuple(shapes), wdtype


def _embedding_a2a_key(shapes, batch, wdtype, out_dtype, pooling, check_indices):
    return ("embedding_a2a", shapes, batch, wdtype, out_dtype, pooling, bool(check_indices))


def _embedding_a2a_object(wd, shapes, batch, wdtype, out_dtype, pooling, check_indices, t, capture_check=True):
    return _cached_object(
        "embedding_a2a", wd, _embedding_a2a_key(shapes, batch, wdtype, out_dtype, pooling, check_indices),
        f"tables {list(shapes)}, batch={batch}, weights {wdtype}, out {out_dtype}, pooling {pooling}",
        lambda: weft.EmbeddingA2A(wd.world, shapes, batch, _WEFT_DTYPE[wdtype], out_dtype=_WEFT_DTYPE[out_dtype],
                                  pooling=pooling, check_indices=check_indices), t, capture_check)


@torch.library.custom_op("weft::embedding_a2a", mutates_args=())
def embedding_a2a(weights: list[Tensor], offsets: list[Tensor], indices: list[Tensor], batch: int,
                  per_sample_weights: list[Optional[Tensor]], pooling: str = "sum",
                  out_dtype: torch.dtype = torch.float32, method: str = "auto", group: str = "", total_dim: int = 0,
                  weight_dtype: Optional[torch.dtype] = None, check_indices: bool = True,
                  grad_anchor: Optional[Tensor] = None) -> Tensor:
    """Embedding-bag lookups + all-to-all (DLRM's sparse features; docs/embedding_a2a.md). The
    tables are sharded across ranks, the samples are not: rank p owns samples p * batch ...
    (p + 1) * batch - 1 of the global batch. For each of this rank's tables (maybe none): weights
    [rows, dim] (f32, bf16 or f16, one dtype), offsets int64 [world * batch + 1] and indices int64
    for the bags of the whole global batch (as nn.EmbeddingBag takes them, include_last_offset);
    per_sample_weights: fp32 (one per index) a table, None for a table without, or [] for none (a
    list argument has no default in torch 2.11's custom ops). Returns out [batch, total_dim] in
    out_dtype (float32 or bfloat16): this rank's samples' pooled rows of every rank's tables, the
    tables in global order (rank 0's first), each table's dim columns; sum or mean pooling in
    fp32, an empty bag pools to zeros. total_dim: out's columns, the sum of every rank's tables' dims (0:
    the op's; pass it under torch.compile). weight_dtype: the tables' dtype, alike on every rank
    (None: weights[0]'s, or float32 where this rank holds no table).

    Autograd: differentiable w.r.t. the weights (each one's gradient the op's dense fp32 gradient,
    cast to its dtype; not w.r.t. per_sample_weights, refused). The backward is collective: out on
    every rank must be in its loss's graph -- a rank whose weights do not require grad (one holding
    no table) passes grad_anchor, any tensor that requires grad (weft.torch.embedding_a2a does; it is
    not read and gets no gradient)."""
    wd, ws, offs, idxs, psws, shapes, wdtype = _embedding_a2a_operands(
        weights, offsets, indices, batch, per_sample_weights, pooling, out_dtype, method, group, total_dim,
        weight_dtype)
    for t, (o, i) in enumerate(zip(offs, idxs)):
        # On CUDA this would synchronise with the device: there the offsets' end stays unchecked
        # against indices' length. weft checks the offsets' order and every index's table.
        if o.device.type == "cpu" and int(o[-1]) > i.shape[0]:
            raise weft.InvalidArgument(f"weft.embedding_a2a: offsets[{t}] ends at {int(o[-1])}, past the "
                                       f"{i.shape[0]} indices of indices[{t}]")
    anchor = ws[0] if ws else torch.empty(0, device=wd.device)
    e = _embedding_a2a_object(wd, shapes, batch, wdtype, out_dtype, pooling, check_indices, anchor)
    if total_dim and total_dim != e.total_dim:
        raise weft.InvalidArgument(f"weft.embedding_a2a: total_dim {total_dim}, but every rank's tables' dims "
                                   f"{e.dims} sum to {e.total_dim}")
    out = torch.empty((batch, e.total_dim), dtype=out_dtype, device=wd.device)
    e.forward(_embedding_tables(ws, offs, idxs, psws), out.data_ptr() if out.numel() else 0, method, _stream(anchor))
    return out


def _embedding_tables(ws, offs, idxs, psws):
    """weft.EmbeddingA2A's tables: pointers, and num_indices (backward on GPUs needs it)."""
    return [(w.data_ptr(), o.data_ptr(), i.data_ptr() if i.numel() else 0,
             p.data_ptr() if p is not None and p.numel() else 0, i.numel()) for w, o, i, p in zip(ws, offs, idxs, psws)]


@embedding_a2a.register_fake
def _(weights, offsets, indices, batch, per_sample_weights, pooling="sum", out_dtype=torch.float32,
      method="auto", group="", total_dim=0, weight_dtype=None, check_indices=True, grad_anchor=None):
    wd, ws, offs, idxs, psws, shapes, wdtype = _embedding_a2a_operands(
        weights, offsets, indices, batch, per_sample_weights, pooling, out_dtype, method, group, total_dim,
        weight_dtype)
    if not total_dim:
        # The op of this configuration, where an eager call (or prepare) made it.
        e = wd._gemms.get(_embedding_a2a_key(shapes, batch, wdtype, out_dtype, pooling, check_indices))
        if e is None:
            raise weft.InvalidArgument("weft.embedding_a2a: pass total_dim (out's columns: the sum of every rank's "
                                       "tables' dims) under torch.compile, or make one eager call of this "
                                       "configuration first")
        total_dim = e.total_dim
    return torch.empty((batch, total_dim), dtype=out_dtype, device=ws[0].device if ws else wd.device)


# ---- its backward ------------------------------------------------------------------------------
# The transpose of embedding_a2a (collective: every rank calls it, as the forward): grad_out
# [batch, total_dim] on every rank -> each of this rank's tables' gradient, as the kind says.
# Three ops, one a kind of result, on the forward's op object (the same configuration, out_dtype
# grad_out's): embedding_a2a_backward (the dense fp32 gradients: the autograd rule's),
# embedding_a2a_backward_sparse (the rows the bags index and their fp32 gradients, padded to the
# indices' count, and the counts: shapes known without reading the counts back) and
# embedding_a2a_update (SGD's or Adagrad's step into the weights and states, in place).

EMBEDDING_GRAD_KINDS = ("dense", "sparse", "sgd", "adagrad")


def _embedding_backward_operands(op, weights, offsets, indices, batch, per_sample_weights, grad_out, pooling, method,
                                 group, weight_dtype):
    """The forward's operands (out_dtype grad_out's) and grad_out, checked."""
    if not isinstance(grad_out, Tensor):
        raise TypeError(f"weft.{op}: grad_out must be a torch.Tensor, not {type(grad_out).__name__}")
    if grad_out.dtype not in _EMBEDDING_OUT_DTYPES:
        raise weft.InvalidArgument(f"weft.{op}: grad_out has dtype {grad_out.dtype}; it takes out's dtype, "
                                   f"{', '.join(str(d) for d in _EMBEDDING_OUT_DTYPES)}")
    operands = _embedding_a2a_operands(weights, offsets, indices, batch, per_sample_weights, pooling, grad_out.dtype,
                                       method, group, 0, weight_dtype, op)
    g = _check_input(operands[0], op, "grad_out", grad_out, _EMBEDDING_OUT_DTYPES)
    if g.dim() != 2 or g.shape[0] != batch:
        raise weft.InvalidArgument(f"weft.{op}: grad_out must be [batch = {batch}, total_dim], got {tuple(g.shape)}")
    return operands + (g,)


def _embedding_backward_run(op, operands, pooling, check_indices, method, sinks, kind, lr=0.0, eps=1e-10):
    wd, ws, offs, idxs, psws, shapes, wdtype, g = operands
    anchor = ws[0] if ws else g
    e = _embedding_a2a_object(wd, shapes, g.shape[0], wdtype, g.dtype, pooling, check_indices, anchor)
    if g.shape[1] != e.total_dim:
        raise weft.InvalidArgument(f"weft.{op}: grad_out has {g.shape[1]} columns, but every rank's tables' dims "
                                   f"{e.dims} sum to {e.total_dim}")
    e.backward(_embedding_tables(ws, offs, idxs, psws), g.data_ptr() if g.numel() else 0, sinks, kind, lr, eps, method,
               _stream(anchor))


@torch.library.custom_op("weft::embedding_a2a_backward", mutates_args=())
def embedding_a2a_backward(weights: list[Tensor], offsets: list[Tensor], indices: list[Tensor], batch: int,
                           per_sample_weights: list[Optional[Tensor]], grad_out: Tensor, pooling: str = "sum",
                           method: str = "auto", group: str = "", weight_dtype: Optional[torch.dtype] = None,
                           check_indices: bool = True) -> list[Tensor]:
    """embedding_a2a's transpose (collective), the dense gradient: grad_out [batch, total_dim] (the
    gradient of out, in out_dtype) -> a fp32 [rows, dim] gradient per table of this rank. Row r's:
    the sum in fp32, over the global batch's bags in order and each one's indices in order that
    name r, of (the per-sample weight, over the bag's size for mean) * the bag's pooled gradient.
    The other arguments as embedding_a2a's."""
    ops_ = _embedding_backward_operands("embedding_a2a_backward", weights, offsets, indices, batch, per_sample_weights,
                                        grad_out, pooling, method, group, weight_dtype)
    dense = [torch.empty(w.shape, dtype=torch.float32, device=w.device) for w in ops_[1]]
    _embedding_backward_run("embedding_a2a_backward", ops_, pooling, check_indices, method,
                            [{"dense": d.data_ptr()} for d in dense], "dense")
    return dense


@embedding_a2a_backward.register_fake
def _(weights, offsets, indices, batch, per_sample_weights, grad_out, pooling="sum", method="auto", group="",
      weight_dtype=None, check_indices=True):
    ops_ = _embedding_backward_operands("embedding_a2a_backward", weights, offsets, indices, batch, per_sample_weights,
                                        grad_out, pooling, method, group, weight_dtype)
    return [torch.empty(w.shape, dtype=torch.float32, device=w.device) for w in ops_[1]]


@torch.library.custom_op("weft::embedding_a2a_backward_sparse", mutates_args=())
def embedding_a2a_backward_sparse(weights: list[Tensor], offsets: list[Tensor], indices: list[Tensor], batch: int,
                                  per_sample_weights: list[Optional[Tensor]], grad_out: Tensor, pooling: str = "sum",
                                  method: str = "auto", group: str = "", weight_dtype: Optional[torch.dtype] = None,
                                  check_indices: bool = True) -> tuple[list[Tensor], list[Tensor], Tensor]:
    """embedding_a2a_backward's gradients, sparse: (rows, values, counts). Table t's gradient is
    rows[t][:counts[t]] (int64: the distinct rows its bags index, ascending) and
    values[t][:counts[t]] (fp32 [n, dim]: their gradients); rows[t] and values[t] have one entry per
    index (the most there can be), the rest unset; counts int64 [tables]."""
    ops_ = _embedding_backward_operands("embedding_a2a_backward_sparse", weights, offsets, indices, batch,
                                        per_sample_weights, grad_out, pooling, method, group, weight_dtype)
    ws, idxs, g = ops_[1], ops_[3], ops_[-1]
    dev = ws[0].device if ws else g.device
    rows = [torch.empty(i.shape[0], dtype=torch.int64, device=dev) for i in idxs]
    values = [torch.empty((i.shape[0], w.shape[1]), dtype=torch.float32, device=dev) for w, i in zip(ws, idxs)]
    counts = torch.zeros(len(ws), dtype=torch.int64, device=dev)
    # A table without indices writes no row: a scratch stands in for its empty rows and values
    # (the op takes no null pointer).
    scratch = torch.empty(4, dtype=torch.int64, device=dev)
    sinks = [{"rows": r.data_ptr() if r.numel() else scratch.data_ptr(),
              "values": v.data_ptr() if v.numel() else scratch.data_ptr(),
              "count": counts.data_ptr() + 8 * t} for t, (r, v) in enumerate(zip(rows, values))]
    _embedding_backward_run("embedding_a2a_backward_sparse", ops_, pooling, check_indices, method, sinks, "sparse")
    return rows, values, counts


@embedding_a2a_backward_sparse.register_fake
def _(weights, offsets, indices, batch, per_sample_weights, grad_out, pooling="sum", method="auto", group="",
      weight_dtype=None, check_indices=True):
    ops_ = _embedding_backward_operands("embedding_a2a_backward_sparse", weights, offsets, indices, batch,
                                        per_sample_weights, grad_out, pooling, method, group, weight_dtype)
    ws, idxs, g = ops_[1], ops_[3], ops_[-1]
    dev = ws[0].device if ws else g.device
    return ([torch.empty(i.shape[0], dtype=torch.int64, device=dev) for i in idxs],
            [torch.empty((i.shape[0], w.shape[1]), dtype=torch.float32, device=dev) for w, i in zip(ws, idxs)],
            torch.empty(len(ws), dtype=torch.int64, device=dev))


def _embedding_update_operands(weights, states, offsets, indices, batch, per_sample_weights, grad_out, kind, pooling,
                               method, group, weight_dtype):
    op = "embedding_a2a_update"
    if kind not in ("sgd", "adagrad"):
        raise weft.InvalidArgument(f"weft.{op}: unknown kind {kind!r} (sgd or adagrad; embedding_a2a_backward and "
                                   f"embedding_a2a_backward_sparse give the dense and sparse gradients)")
    ops_ = _embedding_backward_operands(op, weights, offsets, indices, batch, per_sample_weights, grad_out, pooling,
                                        method, group, weight_dtype)
    ws = ops_[1]
    for t, (w, given) in enumerate(zip(ws, weights)):
        if w is not given:  # _check_input's copy: an update in place needs the tensor itself
            raise weft.InvalidArgument(f"weft.{op}: weights[{t}] must be contiguous (updated in place)")
    if kind == "adagrad":
        if len(states) != len(ws):
            raise weft.InvalidArgument(f"weft.{op}: adagrad needs states, one fp32 [rows, dim] a table (its sum of "
                                       f"squares, e.g. zeros): got {len(states)} for {len(ws)} tables")
        for t, (st, w) in enumerate(zip(states, ws)):
            st_ = _check_input(ops_[0], op, f"states[{t}]", st, (torch.float32,))
            if st_ is not st or st.shape != w.shape:
                raise weft.InvalidArgument(f"weft.{op}: states[{t}] must be a contiguous fp32 {tuple(w.shape)} (the "
                                           f"shape of weights[{t}]), got {tuple(st.shape)}")
    elif states:
        raise weft.InvalidArgument(f"weft.{op}: sgd takes no states (got {len(states)})")
    return ops_


@torch.library.custom_op("weft::embedding_a2a_update", mutates_args=("weights", "states"))
def embedding_a2a_update(weights: list[Tensor], states: list[Tensor], offsets: list[Tensor], indices: list[Tensor],
                         batch: int, per_sample_weights: list[Optional[Tensor]], grad_out: Tensor, kind: str,
                         lr: float, eps: float = 1e-10, pooling: str = "sum", method: str = "auto", group: str = "",
                         weight_dtype: Optional[torch.dtype] = None, check_indices: bool = True) -> None:
    """embedding_a2a's backward fused with the optimizer's step (collective): each of this rank's
    weights (contiguous) takes the step of its gradient g (embedding_a2a_backward's), in place, in
    the rows its bags index only -- kind "sgd": w = w - lr * g; "adagrad" (torch.optim.Adagrad's
    sparse step; states: fp32 [rows, dim] a table, the sums of squares, updated too): state =
    state + g * g, w = w + (-lr) * (g / (sqrt(state) + eps)); in fp32, w rounded once to its dtype."""
    ops_ = _embedding_update_operands(weights, states, offsets, indices, batch, per_sample_weights, grad_out, kind,
                                      pooling, method, group, weight_dtype)
    sinks = [{"weight": w.data_ptr(), "state": states[t].data_ptr() if kind == "adagrad" else None}
             for t, w in enumerate(ops_[1])]
    _embedding_backward_run("embedding_a2a_update", ops_, pooling, check_indices, method, sinks, kind, lr, eps)


@embedding_a2a_update.register_fake
def _(weights, states, offsets, indices, batch, per_sample_weights, grad_out, kind, lr, eps=1e-10, pooling="sum",
      method="auto", group="", weight_dtype=None, check_indices=True):
    _embedding_update_operands(weights, states, offsets, indices, batch, per_sample_weights, grad_out, kind, pooling,
                               method, group, weight_dtype)


# Collectives: a rank whose results are unused (one without tables) must call them all the same,
# so a compiled graph keeps them (no dead-code elimination).
torch.fx.node.has_side_effect(torch.ops.weft.embedding_a2a_backward.default)
torch.fx.node.has_side_effect(torch.ops.weft.embedding_a2a_backward_sparse.default)
torch.fx.node.has_side_effect(torch.ops.weft.embedding_a2a_update.default)  # also where it updates no tensor


# The autograd rule: the weights' gradients are embedding_a2a_backward's, cast to their dtypes.

def _embedding_a2a_setup(ctx, inputs, output):
    (weights, offsets, indices, batch, psws, pooling, out_dtype, method, group, _total, weight_dtype,
     check_indices) = inputs[:12]
    for t, p in enumerate(psws or ()):
        if p is not None and p.requires_grad:
            raise RuntimeError(f"weft.embedding_a2a: per_sample_weights[{t}] requires grad, but the op has no "
                               f"gradient for per-sample weights (only for the weights): pass them detached "
                               f"(p.detach())")
    ctx.save_for_backward(*weights, *offsets, *indices, *[p for p in (psws or ()) if p is not None])
    ctx.n, ctx.has_psw = len(weights), [p is not None for p in (psws or ())]
    ctx.batch, ctx.pooling, ctx.out_dtype, ctx.method, ctx.group = batch, pooling, out_dtype, method, group
    ctx.weight_dtype, ctx.check_indices = weight_dtype, check_indices


def _embedding_a2a_bwd(ctx, grad):
    saved, n = list(ctx.saved_tensors), ctx.n
    weights, offsets, indices, given = saved[:n], saved[n:2 * n], saved[2 * n:3 * n], iter(saved[3 * n:])
    psws = [next(given) if has else None for has in ctx.has_psw]
    # Every rank calls the collective backward, whatever its own weights need.
    grads = torch.ops.weft.embedding_a2a_backward(weights, offsets, indices, ctx.batch, psws,
                                                  grad.to(ctx.out_dtype).contiguous(), ctx.pooling, ctx.method,
                                                  ctx.group, ctx.weight_dtype, ctx.check_indices)
    need = ctx.needs_input_grad[0]
    need = need if isinstance(need, (list, tuple)) else [need] * n
    grad_weights = [g.to(w.dtype) if nd else None for g, w, nd in zip(grads, weights, need)]
    # The inputs' structure: a list for each list argument; as many as the call passed (torch 2.11
    # leaves a trailing argument left at its default out: needs_input_grad has one entry an input).
    grads_in = (grad_weights, [None] * n, [None] * n, None, [None] * len(ctx.has_psw)) + (None,) * 8
    return grads_in[:len(ctx.needs_input_grad)]


embedding_a2a.register_autograd(_embedding_a2a_bwd, setup_context=_embedding_a2a_setup)


# ---- prepare: create an op's state ahead (for CUDA graph capture) ---------------------------

_PREPARE_PARAMS = {
    "all_reduce": ("x", "method", "group"),
    "all_gather": ("x", "method", "group", "group_size"),
    "reduce_scatter": ("x", "method", "group", "group_size"),
    "all_to_all": ("x", "method", "group"),
    "all_to_all_v": ("x", "send_counts", "out_capacity", "method", "group"),
    "ag_gemm": ("a", "b", "method", "group", "b_layout", "group_size"),
    "ag_gemm_gathered": ("a", "b", "method", "group", "b_layout", "group_size"),
    "gemm_rs": ("a", "b", "method", "group", "b_layout", "group_size"),
    "gemm_ar": ("a", "b", "method", "group", "b_layout"),
    "gemv_ar": ("x", "w", "method", "group"),
    "gemv_ar_rmsnorm": ("x", "w", "residual", "gamma", "eps", "method", "group"),
    "moe_dispatch": ("x", "ids", "experts", "max_tokens", "recv_capacity", "method", "group"),
    "moe_layer": ("x", "ids", "weights", "w_up", "w_down", "experts", "max_tokens", "recv_capacity", "method",
                  "group"),
    "embedding_a2a": ("weights", "offsets", "indices", "batch", "per_sample_weights", "pooling", "out_dtype", "method",
                      "group", "total_dim", "weight_dtype", "check_indices"),
}


def prepare(op: str, *args, **kwargs) -> None:
    """Creates the state the op's call with these arguments will use (collective: every rank
    calls it), so that its first call may be captured in a CUDA graph. Arguments as the op's:
    prepare("all_reduce", x, method="auto", group=""); prepare("ag_gemm", a, b, ...);
    prepare("all_to_all_v", x, send_counts, out_capacity, ...). Tensors may be meta tensors of
    the right shape and dtype (only their shapes and dtypes are read)."""
    params = _PREPARE_PARAMS.get(op)
    if params is None:
        raise weft.InvalidArgument(f"weft.prepare: unknown op {op!r} (one of {', '.join(_PREPARE_PARAMS)})")
    if len(args) > len(params):
        raise TypeError(f"weft.prepare({op!r}): at most {len(params)} arguments ({', '.join(params)})")
    vals = dict(zip(params, args))
    for k, v in kwargs.items():
        if k not in params:
            raise TypeError(f"weft.prepare({op!r}): unexpected argument {k!r}")
        vals[k] = v
    method = vals.get("method", "auto")
    w = _world.lookup(_world.group_name(vals.get("group", "")))
    if op == "ag_gemm_gathered":  # the same op object as ag_gemm's
        op = "ag_gemm"
    if op in ("gemv_ar", "gemv_ar_rmsnorm"):
        # One object serves every M (1 ... 128): only N, K/world and the dtype are read.
        _check_method(op, method, GEMV_METHODS)
        x, wt_ = vals["x"], vals["w"]
        if x.dtype not in _GEMM_DTYPES or x.dtype != wt_.dtype or wt_.dim() != 2:
            raise weft.InvalidArgument(f"weft.prepare: {op} takes bf16/f16 x and a 2-D w of one dtype")
        n, k_local = wt_.shape
        _gemv_object(w, n, k_local * w.size, x.dtype, op == "gemv_ar_rmsnorm", vals.get("eps", 1e-6), x,
                     capture_check=False)
        return
    if op == "moe_dispatch":  # the object moe_dispatch and moe_combine of these arguments share
        _check_method(op, method, MOE_METHODS)
        x, ids, experts = vals["x"], vals["ids"], int(vals["experts"])
        if x.dtype not in _MOE_DTYPES or x.dim() != 2 or ids.dim() != 2:
            raise weft.InvalidArgument("weft.prepare: moe_dispatch takes x [T, hidden] (bf16/f16/f32) and ids "
                                       "[T, top_k]")
        mt = _moe_max_tokens(x.shape[0], int(vals.get("max_tokens", 0)))
        _moe_object(op, w, x.shape[1], experts, ids.shape[1], mt, int(vals.get("recv_capacity", 0)), x.dtype, x,
                    capture_check=False)
        return
    if op == "moe_layer":  # shapes and dtypes only (meta tensors do)
        _check_method(op, method, MOE_LAYER_METHODS)
        x, ids, w_up = vals["x"], vals["ids"], vals["w_up"]
        if x.dtype not in _MOE_DTYPES or x.dim() != 2 or ids.dim() != 2 or w_up.dim() != 3:
            raise weft.InvalidArgument("weft.prepare: moe_layer takes x [T, hidden] (bf16/f16/f32), ids [T, top_k] "
                                       "and w_up [experts / world, 2 ffn, hidden]")
        mt = _moe_max_tokens(x.shape[0], int(vals.get("max_tokens", 0)))
        _moe_layer_object(w, x.shape[1], w_up.shape[1] // 2, int(vals["experts"]), ids.shape[1], mt,
                          int(vals.get("recv_capacity", 0)), x.dtype, x, capture_check=False)
        return
    if op == "embedding_a2a":  # this rank's tables' shapes and dtypes only (meta tensors do; offsets and indices
        # are not read and may be None)
        _check_method(op, method, EMBEDDING_A2A_METHODS)
        weights, pooling = list(vals.get("weights", ())), vals.get("pooling", "sum")
        out_dtype, wdtype = vals.get("out_dtype", torch.float32), vals.get("weight_dtype")
        if pooling not in EMBEDDING_POOLINGS or out_dtype not in _EMBEDDING_OUT_DTYPES or \
                any(t.dim() != 2 or t.dtype not in _EMBEDDING_WEIGHT_DTYPES for t in weights):
            raise weft.InvalidArgument("weft.prepare: embedding_a2a takes weights [rows, dim] (f32/bf16/f16), pooling "
                                       "sum or mean and out_dtype float32 or bfloat16")
        wdtype = wdtype or (weights[0].dtype if weights else torch.float32)
        _embedding_a2a_object(w, tuple((t.shape[0], t.shape[1]) for t in weights), int(vals["batch"]), wdtype,
                              out_dtype, pooling, vals.get("check_indices", True), None, capture_check=False)
        return
    if op in ("ag_gemm", "gemm_rs", "gemm_ar"):
        _check_method(op, method, GEMM_METHODS)
        a, b, b_layout = vals["a"], vals["b"], vals.get("b_layout", "nk")
        if a.dtype not in _GEMM_DTYPES or a.dtype != b.dtype or a.dim() != 2 or b.dim() != 2:
            raise weft.InvalidArgument(f"weft.prepare: {op} takes 2-D bf16/f16 a and b of one dtype")
        n = b.shape[0] if b_layout == "nk" else b.shape[1]
        problem, _ = _gemm_problem(op, w, a, n)
        _gemm_object(w, op, problem, a.dtype, b_layout, a, capture_check=False)
        return
    _check_method(op, method, COLLECTIVE_METHODS)
    x = vals["x"]
    if x.dtype not in _COLL_DTYPES:
        raise weft.InvalidArgument(f"weft.prepare: dtype {x.dtype} is not supported")
    if op == "all_to_all_v":
        count = int(vals["out_capacity"]) * math.prod(x.shape[1:])
    elif op in ("reduce_scatter", "all_to_all"):
        _divisible(op, "x.shape[0]", x.shape[0], w.size)
        count = x.numel() // w.size
    else:
        count = x.numel()
    if count:
        _prepare_collective(w, op, count, x.dtype, method)


# ---- autograd ----------------------------------------------------------------------------------
# The rules follow Megatron-LM's tensor/sequence parallelism, so the modules are drop-in there:
# an output that is the same on every rank (all_reduce, gemm_ar) gets the same gradient on every
# rank (the loss is computed identically on each), so its input's gradient needs no
# communication; an output that differs per rank (all_gather feeding a column-parallel GEMM,
# reduce_scatter, all_to_all) sends its gradient back along the reverse collective.

def _save_collective(ctx, inputs, output):
    ctx.method, ctx.group = inputs[1], inputs[2]
    ctx.group_size = inputs[3] if len(inputs) > 3 else 0


def _all_reduce_bwd(ctx, grad):
    return grad, None, None


def _all_gather_bwd(ctx, grad):
    return torch.ops.weft.reduce_scatter(grad.contiguous(), ctx.method, ctx.group, ctx.group_size), None, None, None


def _reduce_scatter_bwd(ctx, grad):
    return torch.ops.weft.all_gather(grad.contiguous(), ctx.method, ctx.group, ctx.group_size), None, None, None


def _all_to_all_bwd(ctx, grad):
    # Equal blocks: the exchange is its own inverse.
    return torch.ops.weft.all_to_all(grad.contiguous(), ctx.method, ctx.group), None, None


all_reduce.register_autograd(_all_reduce_bwd, setup_context=_save_collective)
all_gather.register_autograd(_all_gather_bwd, setup_context=_save_collective)
reduce_scatter.register_autograd(_reduce_scatter_bwd, setup_context=_save_collective)
all_to_all.register_autograd(_all_to_all_bwd, setup_context=_save_collective)


def _a2av_setup(ctx, inputs, output):
    x, send_counts, _cap, method, group = inputs
    ctx.save_for_backward(send_counts, output[1])
    ctx.rows = x.shape[0]
    ctx.method, ctx.group = method, group


def _a2av_bwd(ctx, grad_out, _grad_recv):
    # The reverse exchange: the gradient of the received rows (packed by source) goes back to
    # their sources, arriving packed by destination, which is x's layout. x's rows past
    # sum(send_counts) were not sent: zero gradient.
    send_counts, recv_counts = ctx.saved_tensors
    g, _ = torch.ops.weft.all_to_all_v(grad_out.contiguous(), recv_counts, ctx.rows, ctx.method, ctx.group)
    sent = torch.arange(ctx.rows, device=g.device) < send_counts.sum()
    g = torch.where(sent.view((-1,) + (1,) * (g.dim() - 1)), g, torch.zeros((), dtype=g.dtype, device=g.device))
    return g, None, None, None, None


all_to_all_v.register_autograd(_a2av_bwd, setup_context=_a2av_setup)


def _save_gemm(ctx, inputs, output):
    a, b, method, group, b_layout = inputs[:5]
    ctx.save_for_backward(a, b)
    ctx.method, ctx.group, ctx.b_layout = method, group, b_layout
    ctx.group_size = inputs[5] if len(inputs) > 5 else 0
    ctx.n_inputs = len(inputs)


def _flip(layout):
    return "kn" if layout == "nk" else "nk"


def _ag_gemm_bwd(ctx, grad_c):
    # C = AG(A) · B (B as [K, N]). dA = RS(dC · Bᵀ): a gemm_rs whose B operand is our B read in
    # the other layout (no transpose copy). dB = AG(A)ᵀ · dC, with A gathered again (the
    # forward's gathered A lives in weft's workspace, which is reused): ag_gemm_gathered, which
    # keeps it, is what training should call (ColumnParallelLinear does).
    a, b = ctx.saved_tensors
    grad_c = grad_c.contiguous()
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_a = torch.ops.weft.gemm_rs(grad_c, b, ctx.method, ctx.group, _flip(ctx.b_layout), ctx.group_size)
    if ctx.needs_input_grad[1]:
        a_full = torch.ops.weft.all_gather(a, "auto", ctx.group, ctx.group_size)
        grad_b = grad_c.t() @ a_full if ctx.b_layout == "nk" else a_full.t() @ grad_c
    return (grad_a, grad_b) + (None,) * (ctx.n_inputs - 2)


def _gemm_rs_bwd(ctx, grad_c):
    # C = RS(A · B). dA = AG(dC) · Bᵀ, an ag_gemm; dB = AG(dC)ᵀ · A from the gathered dC that
    # the same ag_gemm hands out (ag_gemm_gathered), so dC is gathered once, overlapped with dA.
    a, b = ctx.saved_tensors
    grad_c = grad_c.contiguous()
    grad_a = grad_b = None
    flip = _flip(ctx.b_layout)
    if ctx.needs_input_grad[0] and ctx.needs_input_grad[1]:
        grad_a, g_full = torch.ops.weft.ag_gemm_gathered(grad_c, b, ctx.method, ctx.group, flip, ctx.group_size)
    elif ctx.needs_input_grad[1]:
        g_full = torch.ops.weft.all_gather(grad_c, "auto", ctx.group, ctx.group_size)
    elif ctx.needs_input_grad[0]:
        grad_a = torch.ops.weft.ag_gemm(grad_c, b, ctx.method, ctx.group, flip, ctx.group_size)
    if ctx.needs_input_grad[1]:
        grad_b = g_full.t() @ a if ctx.b_layout == "nk" else a.t() @ g_full
    return (grad_a, grad_b) + (None,) * (ctx.n_inputs - 2)


def _save_ag_gathered(ctx, inputs, output):
    # The gathered A is saved instead of A: the weight's gradient reads it, A's needs none. It is
    # an activation kept for that, not a result: no gradient flows through it (and none is
    # materialised for it: a zero [M, K] reduce-scattered every backward otherwise).
    b = inputs[1]
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(output[1], b)
    ctx.method, ctx.group, ctx.b_layout = inputs[2], inputs[3], inputs[4]
    ctx.group_size = inputs[5] if len(inputs) > 5 else 0
    ctx.n_inputs = len(inputs)


def _ag_gemm_gathered_bwd(ctx, grad_c, _grad_full):
    # (C, G) = (AG(A) · B, AG(A)), G non-differentiable. dA = RS(dC · Bᵀ); dB = Gᵀ · dC.
    a_full, b = ctx.saved_tensors
    grad_a = grad_b = None
    if grad_c is None:  # C unused (grads are not materialised)
        return (None,) * ctx.n_inputs
    if ctx.needs_input_grad[0]:
        grad_a = torch.ops.weft.gemm_rs(grad_c.contiguous(), b, ctx.method, ctx.group, _flip(ctx.b_layout),
                                        ctx.group_size)
    if ctx.needs_input_grad[1]:
        grad_b = grad_c.t() @ a_full if ctx.b_layout == "nk" else a_full.t() @ grad_c
    return (grad_a, grad_b) + (None,) * (ctx.n_inputs - 2)


def _gemm_ar_bwd(ctx, grad_c):
    # C = AR(A · B) is the same on every rank, and so is dC: dA = dC · Bᵀ, dB = Aᵀ · dC, local.
    a, b = ctx.saved_tensors
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_a = grad_c @ b if ctx.b_layout == "nk" else grad_c @ b.t()
    if ctx.needs_input_grad[1]:
        grad_b = grad_c.t() @ a if ctx.b_layout == "nk" else a.t() @ grad_c
    return (grad_a, grad_b) + (None,) * (ctx.n_inputs - 2)


ag_gemm.register_autograd(_ag_gemm_bwd, setup_context=_save_gemm)
gemm_rs.register_autograd(_gemm_rs_bwd, setup_context=_save_gemm)
ag_gemm_gathered.register_autograd(_ag_gemm_gathered_bwd, setup_context=_save_ag_gathered)
gemm_ar.register_autograd(_gemm_ar_bwd, setup_context=_save_gemm)
