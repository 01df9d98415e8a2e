"""Tensor-parallel linears over weft's GEMM + communication ops (Megatron-LM / torchtitan style).

ColumnParallelLinear (sequence parallel): input [S/world, in] (this rank's rows of the sequence)
-> all-gather + GEMM with the weight shard [out/world, in] -> output [S, out/world].
RowParallelLinear: input [S, in/world] -> GEMM with the weight shard [out, in/world] +
reduce-scatter -> [S/world, out] (reduce="scatter"), or + all-reduce -> [S, out]
(reduce="all_reduce").

Leading dimensions are flattened into rows; the sharded one is the first (Megatron's [s, b, h]
layout: rank r holds rows r*S/world ... of dim 0). Forward and backward run through
the weft ops (their autograd rules: weft/torch/_ops.py, docs/python.md).
"""

import math

import torch
from torch import nn

import weft

from . import _world

__all__ = ["ColumnParallelLinear", "RowParallelLinear"]


def _default_device(w, device):
    if device is not None:
        return torch.device(device)
    return w.device


class _ParallelLinear(nn.Module):
    def __init__(self, in_features, out_features, bias, group, dtype, device, method, shard_out):
        super().__init__()
        self.group_name = _world.group_name(group)
        w = _world.lookup(self.group_name)
        self.world_size = w.size
        self.rank = w.rank
        self.method = method
        sharded = out_features if shard_out else in_features
        if sharded % w.size:
            raise weft.InvalidArgument(
                f"weft.torch.nn.{type(self).__name__}: {'out' if shard_out else 'in'}_features ({sharded}) is "
                f"not divisible by the world size ({w.size})")
        self.in_features = in_features
        self.out_features = out_features
        shape = (out_features // w.size, in_features) if shard_out else (out_features, in_features // w.size)
        dev = _default_device(w, device)
        self.weight = nn.Parameter(torch.empty(shape, dtype=dtype, device=dev))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features // w.size if shard_out else out_features,
                                                 dtype=dtype, device=dev))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        # As nn.Linear, with the fan-in of the full layer (the same distribution as the dense
        # layer's weight; each rank draws its own shard).
        bound = 1.0 / math.sqrt(self.in_features) if self.in_features else 0.0
        with torch.no_grad():
            self.weight.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)


class ColumnParallelLinear(_ParallelLinear):
    """y[S, out/world] = all_gather(x[S/world, in]) · W_shardᵀ (+ bias shard).

    sequence_parallel=True: the input is this rank's S/world rows, gathered with the GEMM
    (weft::ag_gemm). sequence_parallel=False: the input is the whole [S, in] on every rank (plain
    GEMM; its input gradient is all-reduced, as Megatron's copy_to_tensor_model_parallel_region).
    """

    def __init__(self, in_features, out_features, bias=False, group=None, sequence_parallel=True,
                 dtype=torch.bfloat16, device=None, method="auto"):
        super().__init__(in_features, out_features, bias, group, dtype, device, method, shard_out=True)
        self.sequence_parallel = sequence_parallel

    def load_full_weight(self, weight, bias=None):
        """Copies this rank's rows of the dense layer's weight [out, in] (and bias [out])."""
        n = self.out_features // self.world_size
        with torch.no_grad():
            self.weight.copy_(weight[self.rank * n:(self.rank + 1) * n])
            if bias is not None and self.bias is not None:
                self.bias.copy_(bias[self.rank * n:(self.rank + 1) * n])
        return self

    def forward(self, x):
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        if self.sequence_parallel:
            if torch.is_grad_enabled() and self.weight.requires_grad:
                # Training: keep the gathered input for the weight's gradient (no second gather).
                y, _ = torch.ops.weft.ag_gemm_gathered(x2, self.weight, self.method, self.group_name, "nk",
                                                       self.world_size)
            else:
                y = torch.ops.weft.ag_gemm(x2, self.weight, self.method, self.group_name, "nk", self.world_size)
            out_lead = (lead[0] * self.world_size,) + tuple(lead[1:]) if len(lead) else lead
        else:
            x2 = _CopyToParallel.apply(x2, self.group_name)
            y = x2 @ self.weight.t()
            out_lead = lead
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(tuple(out_lead) + (y.shape[-1],))

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"(shard {self.weight.shape[0]}), world={self.world_size}, sequence_parallel={self.sequence_parallel}")


class RowParallelLinear(_ParallelLinear):
    """y = x[S, in/world] · W_shardᵀ, reduce-scattered along S -> [S/world, out] (reduce="scatter",
    weft::gemm_rs) or all-reduced -> [S, out] (reduce="all_reduce", weft::gemm_ar); + bias (added
    once, after the reduction)."""

    def __init__(self, in_features, out_features, bias=False, group=None, reduce="scatter",
                 dtype=torch.bfloat16, device=None, method="auto"):
        if reduce not in ("scatter", "all_reduce"):
            raise weft.InvalidArgument(f"weft.torch.nn.RowParallelLinear: reduce must be 'scatter' or "
                                       f"'all_reduce', not {reduce!r}")
        super().__init__(in_features, out_features, bias, group, dtype, device, method, shard_out=False)
        self.reduce = reduce

    def load_full_weight(self, weight, bias=None):
        """Copies this rank's columns of the dense layer's weight [out, in] (and the bias [out])."""
        k = self.in_features // self.world_size
        with torch.no_grad():
            self.weight.copy_(weight[:, self.rank * k:(self.rank + 1) * k])
            if bias is not None and self.bias is not None:
                self.bias.copy_(bias)
        return self

    def forward(self, x):
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        if self.reduce == "scatter":
            if len(lead) and lead[0] % self.world_size:
                raise weft.InvalidArgument(f"weft.torch.nn.RowParallelLinear: the first dimension ({lead[0]}) is "
                                           f"not divisible by the world size ({self.world_size})")
            y = torch.ops.weft.gemm_rs(x2, self.weight, self.method, self.group_name, "nk", self.world_size)
            out_lead = (lead[0] // self.world_size,) + tuple(lead[1:]) if len(lead) else lead
        else:
            y = torch.ops.weft.gemm_ar(x2, self.weight, self.method, self.group_name)
            out_lead = lead
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(tuple(out_lead) + (y.shape[-1],))

    def extra_repr(self):
        return (f"in_features={self.in_features} (shard {self.weight.shape[1]}), out_features={self.out_features}, "
                f"world={self.world_size}, reduce={self.reduce!r}")


class _CopyToParallel(torch.autograd.Function):
    """Identity forward; the gradient all-reduced (the input is replicated and feeds a sharded
    computation on each rank)."""

    @staticmethod
    def forward(ctx, x, group_name):
        ctx.group_name = group_name
        return x

    @staticmethod
    def backward(ctx, grad):
        return torch.ops.weft.all_reduce(grad.contiguous(), "auto", ctx.group_name), None
