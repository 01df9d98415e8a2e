"""Symmetric tensors: torch tensors on weft's symmetric heap, without a copy."""

from __future__ import annotations

import ctypes
import math
import weakref

import torch

import weft

from . import _world

_DTYPE_BYTES = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}

# torch dtype -> the __cuda_array_interface__ typestr (bf16 has none: the block is exposed as
# int16 and viewed as bfloat16, which reinterprets the bytes).
_TYPESTR = {torch.float32: ("<f4", None), torch.float16: ("<f2", None), torch.bfloat16: ("<i2", torch.bfloat16),
            torch.int64: ("<i8", None)}


def _free(world_ref, handle):
    w = world_ref()
    if w is not None and not w.closed:
        w.world.free(handle)


class _CudaBlock:
    """Device memory as __cuda_array_interface__; torch.as_tensor keeps it alive as long as the
    tensor's storage lives (empty() attaches the finalizer that frees its heap block; the MoE
    ops view their op's buffers through it, owning nothing)."""

    def __init__(self, ptr, shape, typestr):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": typestr, "data": (ptr, False), "version": 3, "strides": None,
            # weft's alloc completes before returning (zeroed, collective): no stream to order.
            "stream": None,
        }


def empty(shape, dtype=torch.bfloat16, device=None, group=None) -> torch.Tensor:
    """A tensor on weft's symmetric heap (collective over the group: every rank calls it with the
    same shape and dtype, in the same order). Zeroed. The block returns to the heap when the
    tensor's storage dies (ranks must free their blocks in the same order, as they allocate), at
    once: on CUDA, keep a reference until the work queued on it is done (torch's caching
    allocator would order the reuse on the stream; weft's heap does not).

    device: None (the world's device), or a device that must match it (CPU on the host
    backend, the world's CUDA device on nccl).
    """
    w = _world.world(group)
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise weft.InvalidArgument(f"weft.torch.empty: negative size in shape {shape}")
    if dtype not in _DTYPE_BYTES:
        raise weft.InvalidArgument(f"weft.torch.empty: dtype {dtype} is not supported (float32, float16, bfloat16)")
    if device is not None:
        dev = torch.device(device)
        if dev.type != w.device.type or (dev.type == "cuda" and dev.index is not None and dev.index != w.device.index):
            raise weft.InvalidArgument(f"weft.torch.empty: device {dev} is not the world's device {w.device} "
                                       f"(backend {w.backend})")
    numel = math.prod(shape)
    nbytes = max(numel * _DTYPE_BYTES[dtype], 1)
    cap, used = w.world.heap_info()
    if nbytes > cap - used:
        raise weft.InvalidArgument(
            f"weft.torch.empty: {nbytes} bytes do not fit this rank's symmetric heap ({cap - used} of {cap} "
            f"bytes free; raise heap_mib in weft.torch.init or WEFT_HOST_HEAP_MIB / WEFT_GPU_HEAP_MIB)")
    handle, _offset, ptr = w.world.alloc(nbytes)
    world_ref = weakref.ref(w)
    if w.device.type == "cpu":
        block = (ctypes.c_char * nbytes).from_address(ptr)
        fin = weakref.finalize(block, _free, world_ref, handle)
        fin.atexit = False  # at exit the world may be gone already
        flat = torch.frombuffer(block, dtype=dtype, count=numel) if numel else torch.empty(0, dtype=dtype)
        if not numel:
            fin()  # nothing references the block
        return flat.view(shape)
    typestr, view_as = _TYPESTR[dtype]
    try:
        import numpy  # noqa: F401  (torch parses __cuda_array_interface__'s typestr through NumPy)
    except ImportError:
        w.world.free(handle)
        raise RuntimeError("weft.torch.empty on CUDA needs NumPy (torch reads __cuda_array_interface__ "
                           "through it): python -m pip install numpy") from None
    block = _CudaBlock(ptr, (numel,), typestr)
    fin = weakref.finalize(block, _free, world_ref, handle)
    fin.atexit = False
    t = torch.as_tensor(block, device=w.device)
    del block
    if view_as is not None:
        t = t.view(view_as)
    return t.view(shape)


def is_symmetric(t: torch.Tensor, group=None) -> bool:
    """Whether the tensor's bytes lie in the world's symmetric heap (ops then skip staging)."""
    w = _world.world(group)
    nbytes = t.numel() * t.element_size()
    return w.world.heap_contains(t.data_ptr(), max(nbytes, 1)) is not None
