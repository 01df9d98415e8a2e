"""weft for PyTorch: worlds from torch.distributed groups, symmetric tensors, torch.ops.weft.*,
tensor-parallel linears (weft.torch.nn). Importing it registers the ops.

    import torch.distributed as dist, weft.torch
    dist.init_process_group("nccl")                  # under torchrun
    weft.torch.init()                                # weft's world over the default group
    y = torch.ops.weft.all_reduce(x)                 # or weft.torch.all_reduce(x)

docs/python.md has the whole API, the costs and the autograd rules.
"""

import torch  # noqa: F401  (weft.torch needs torch; `import weft` alone does not)

from weft import InvalidArgument

from . import _ops  # noqa: F401  (registers torch.ops.weft.*)
from ._memory import empty, is_symmetric
from ._ops import prepare
from ._world import TorchWorld, group_name, init, shutdown, world


# Python spellings that take a ProcessGroup (or None) for group; torch.ops.weft.<op> takes the
# group's name (a str, as custom ops need). Same arguments and results as the ops (_ops.py).
# Ops whose output shape depends on the group's size get it passed (group_size), so a compiled
# graph is keyed on it.

def _size(group):
    from ._world import lookup

    return lookup(group_name(group)).size


def all_reduce(x, method="auto", group=None):
    """Sum over the group's ranks; every rank gets the sum (any shape)."""
    return torch.ops.weft.all_reduce(x, method, group_name(group))


def all_gather(x, method="auto", group=None):
    """Every rank's x concatenated along dim 0: [world*n, ...]."""
    return torch.ops.weft.all_gather(x, method, group_name(group), _size(group))


def reduce_scatter(x, method="auto", group=None):
    """x [world*n, ...] summed over the ranks; rank r gets rows r*n ... (r+1)*n-1."""
    return torch.ops.weft.reduce_scatter(x, method, group_name(group), _size(group))


def all_to_all(x, method="auto", group=None):
    """x [world*n, ...]: block p to rank p; the output's block s came from rank s."""
    return torch.ops.weft.all_to_all(x, method, group_name(group))


def all_to_all_v(x, send_counts, out_capacity, method="auto", group=None):
    """Rows packed by destination (send_counts[p] for rank p) -> (out [out_capacity, ...] packed by
    source, recv_counts)."""
    return torch.ops.weft.all_to_all_v(x, send_counts, int(out_capacity), method, group_name(group))


def ag_gemm(a, b, method="auto", group=None, b_layout="nk"):
    """all_gather(a [M/world, K]) · bᵀ with b [N, K] (linear's weight; b_layout "kn": [K, N])."""
    return torch.ops.weft.ag_gemm(a, b, method, group_name(group), b_layout, _size(group))


def ag_gemm_gathered(a, b, method="auto", group=None, b_layout="nk"):
    """(ag_gemm(a, b), all_gather(a)): the gathered input kept, for a weight gradient."""
    return torch.ops.weft.ag_gemm_gathered(a, b, method, group_name(group), b_layout, _size(group))


def gemm_rs(a, b, method="auto", group=None, b_layout="nk"):
    """reduce_scatter(a [M, K/world] · bᵀ) along M -> [M/world, N]; b [N, K/world]."""
    return torch.ops.weft.gemm_rs(a, b, method, group_name(group), b_layout, _size(group))


def gemm_ar(a, b, method="auto", group=None, b_layout="nk"):
    """all_reduce(a [M, K/world] · bᵀ) -> [M, N]; b [N, K/world]."""
    return torch.ops.weft.gemm_ar(a, b, method, group_name(group), b_layout)


def gemv_ar(x, w, method="auto", group=None, residual=None, gamma=None, eps=1e-6):
    """Decode's row-parallel linear: all_reduce(x [..., K/world] · wᵀ) -> y [..., N], w [N, K/world],
    1 ... 128 tokens. With residual [..., N] and gamma [N]: the residual + RMSNorm epilogue in
    the same op, returning (RMSNorm(y + residual) · gamma, y + residual)."""
    if (residual is None) != (gamma is None):
        raise ValueError("weft.torch.gemv_ar: the epilogue needs both residual and gamma (or neither)")
    if residual is None:
        return torch.ops.weft.gemv_ar(x, w, method, group_name(group))
    return torch.ops.weft.gemv_ar_rmsnorm(x, w, residual, gamma, float(eps), method, group_name(group))


def moe_dispatch(x, ids, experts, max_tokens=0, recv_capacity=0, method="auto", group=None):
    """Expert parallelism's dispatch: each token's row of x [T, hidden] to the ranks of its
    experts ids [T, top_k] -> (recv [capacity, hidden], counts [world, experts / world] int64);
    docs/moe.md. max_tokens 0: a bucket of T (pass it for CUDA graphs)."""
    return torch.ops.weft.moe_dispatch(x, ids, int(experts), int(max_tokens), int(recv_capacity), method,
                                       group_name(group))


def moe_combine(expert_out, weights, experts, max_tokens=0, recv_capacity=0, method="auto", group=None):
    """After moe_dispatch with the same arguments: expert_out (recv's layout) back to the tokens'
    ranks, y [T, hidden] = each token's rows summed with weights [T, top_k] (fp32)."""
    return torch.ops.weft.moe_combine(expert_out, weights, int(experts), int(max_tokens), int(recv_capacity), method,
                                      group_name(group))


def moe_layer(x, ids, weights, w_up, w_down, experts, max_tokens=0, recv_capacity=0, method="auto", group=None):
    """A mixture-of-experts layer with expert parallelism: x [T, hidden] through the SwiGLU
    experts of its ids [T, top_k] (w_up [experts / world, 2 ffn, hidden], w_down
    [experts / world, hidden, ffn]: this rank's), summed with weights [T, top_k] (fp32) ->
    y [T, hidden]; docs/moe.md, "Layer". max_tokens 0: a bucket of T (pass it for CUDA graphs)."""
    return torch.ops.weft.moe_layer(x, ids, weights, w_up, w_down, int(experts), int(max_tokens), int(recv_capacity),
                                    method, group_name(group))


_GRAD_ANCHORS = {}  # device -> a tensor that requires grad (embedding_a2a's grad_anchor)


def embedding_a2a(weights, offsets, indices, batch, per_sample_weights=None, pooling="sum", out_dtype=torch.float32,
                  method="auto", group=None, total_dim=0, weight_dtype=None, check_indices=True, requires_grad=None):
    """Embedding-bag lookups + all-to-all (DLRM): this rank's tables (weights [rows, dim], maybe
    none) pool the bags of the whole global batch (offsets int64 [world * batch + 1], indices
    int64, optional per_sample_weights: fp32 a table, None for a table without), and each rank
    gets its own batch samples' pooled rows of every rank's tables, in global table order -> out
    [batch, total_dim] (out_dtype float32 or bfloat16); docs/embedding_a2a.md. total_dim 0: the
    op's (pass it under torch.compile); weight_dtype: where this rank holds no table and the
    tables are not float32.

    Autograd: the weights get their gradients (as nn.EmbeddingBag's; per_sample_weights none). The
    backward is collective, so out must require grad on every rank or on none: requires_grad None
    means grad mode is on and this rank's weights require grad, or it holds no table (pass False on
    every rank when the tables are frozen, True where a rank's weights do not require grad but
    others' do)."""
    weights = list(weights)
    if requires_grad is None:
        requires_grad = torch.is_grad_enabled() and (not weights or any(w.requires_grad for w in weights))
    anchor = None
    if requires_grad and torch.is_grad_enabled() and not any(w.requires_grad for w in weights):
        from ._world import lookup

        dev = weights[0].device if weights else lookup(group_name(group)).device
        anchor = _GRAD_ANCHORS.get(dev)
        if anchor is None:
            anchor = _GRAD_ANCHORS[dev] = torch.empty(0, device=dev, requires_grad=True)
    return torch.ops.weft.embedding_a2a(weights, list(offsets), list(indices), int(batch),
                                        [] if per_sample_weights is None else list(per_sample_weights), pooling,
                                        out_dtype, method, group_name(group), int(total_dim), weight_dtype,
                                        bool(check_indices), anchor)


def embedding_a2a_backward(weights, offsets, indices, batch, grad_out, kind="dense", lr=0.0, eps=1e-10, states=None,
                           per_sample_weights=None, pooling="sum", method="auto", group=None, weight_dtype=None,
                           check_indices=True):
    """embedding_a2a's backward (collective: every rank calls it, with the forward's arguments and
    grad_out [batch, total_dim], the gradient of its out, in out_dtype), each of this rank's tables'
    gradient g (fp32: per row, the sum over the global batch's bags in order of (per-sample weight,
    over the bag's size for mean) * the bag's pooled gradient) as kind says:
      "dense":   returns a fp32 [rows, dim] tensor a table;
      "sparse":  returns a coalesced sparse COO fp32 tensor [rows, dim] a table: the distinct rows
                 its bags index, ascending, and their gradients (the counts are read back: a host
                 synchronisation on GPUs);
      "sgd":     w = w - lr * g in place, in the rows the bags index; returns None;
      "adagrad": torch.optim.Adagrad's sparse step in place (states: fp32 [rows, dim] a table, the
                 sums of squares, e.g. zeros at first; updated too): state = state + g * g,
                 w = w + (-lr) * (g / (sqrt(state) + eps)); returns None.
    The weights are contiguous for sgd and adagrad (updated in place, under torch.no_grad())."""
    args = (list(weights), list(offsets), list(indices), int(batch),
            [] if per_sample_weights is None else list(per_sample_weights))
    tail = (pooling, method, group_name(group), weight_dtype, bool(check_indices))
    if kind == "dense":
        return torch.ops.weft.embedding_a2a_backward(*args, grad_out, *tail)
    if kind == "sparse":
        rows, values, counts = torch.ops.weft.embedding_a2a_backward_sparse(*args, grad_out, *tail)
        out = []
        for w, r, v, n in zip(args[0], rows, values, counts.tolist()):
            out.append(torch.sparse_coo_tensor(r[:n].unsqueeze(0), v[:n], tuple(w.shape), is_coalesced=True))
        return out
    if kind not in ("sgd", "adagrad"):
        raise InvalidArgument(f"weft.torch.embedding_a2a_backward: unknown kind {kind!r} (one of "
                              f"{', '.join(_ops.EMBEDDING_GRAD_KINDS)})")
    if kind == "adagrad" and states is None:
        raise InvalidArgument("weft.torch.embedding_a2a_backward: kind 'adagrad' needs states: one fp32 [rows, dim] "
                              "tensor a table (the sums of squares; zeros at first), updated in place")
    with torch.no_grad():
        torch.ops.weft.embedding_a2a_update(args[0], [] if states is None else list(states), *args[1:], grad_out,
                                            kind, float(lr), float(eps), *tail)
    return None


from . import nn  # noqa: E402

__all__ = ["init", "world", "shutdown", "TorchWorld", "group_name", "empty", "is_symmetric", "prepare",
           "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_v", "ag_gemm", "ag_gemm_gathered",
           "gemm_rs", "gemm_ar", "gemv_ar", "moe_dispatch", "moe_combine", "moe_layer", "embedding_a2a",
           "embedding_a2a_backward", "nn"]
