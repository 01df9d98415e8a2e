"""ctypes declarations of weft's C API (include/weft/c_api.h) and the library's loading.

The compiled part of the package is libweft_c.so alone (no Python extension), so one build
serves every Python and PyTorch version. It is looked up, in order:
  1. $WEFT_LIBRARY: the library's path;
  2. next to this package: weft/lib/libweft_c.so (what `pip install .` puts there);
  3. $WEFT_BUILD_DIR/libweft_c.so: a CMake build directory (development).
"""

import ctypes
import os
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_float, c_int, c_int64, c_size_t, c_uint64,
                    c_void_p)
from pathlib import Path

API_VERSION = 1  # WEFT_C_API_VERSION this binding was written for

OK, EINVAL, ETIMEOUT, EFAIL = 0, 1, 2, 3
BACKEND_HOST, BACKEND_NCCL = 0, 1

# int (*)(void* user, const void* in, size_t bytes, void* out, int* timed_out, int* missing_rank,
#         char* err, size_t errlen)
ALLGATHER_FN = CFUNCTYPE(c_int, c_void_p, c_void_p, c_size_t, c_void_p, POINTER(c_int), POINTER(c_int),
                         c_void_p, c_size_t)


class WorldOptions(Structure):
    _fields_ = [
        ("rank", c_int),
        ("size", c_int),
        ("local_rank", c_int),
        ("local_size", c_int),
        ("device", c_int),
        ("backend", c_char_p),
        ("allgather", ALLGATHER_FN),
        ("user", c_void_p),
        ("heap_mib", c_int64),
        ("timeout_ms", c_int64),
    ]


class GemmConfig(Structure):
    _fields_ = [
        ("op", c_char_p),
        ("m", c_int64),
        ("n", c_int64),
        ("k", c_int64),
        ("dtype", c_int),
        ("b_layout", c_char_p),
        ("chunks", c_int),
        ("m_buckets", POINTER(c_int64)),
        ("n_m_buckets", c_int),
    ]


class GemvConfig(Structure):
    _fields_ = [
        ("n", c_int64),
        ("k", c_int64),
        ("m_max", c_int64),
        ("dtype", c_int),
        ("epilogue", c_int),
        ("eps", c_float),
    ]


class MoeConfig(Structure):
    _fields_ = [
        ("hidden", c_int64),
        ("experts", c_int64),
        ("top_k", c_int64),
        ("max_tokens", c_int64),
        ("recv_capacity", c_int64),
        ("dtype", c_int),
        ("check_ids", c_int),
    ]


class EmbeddingA2AConfig(Structure):
    _fields_ = [
        ("n_tables", c_int64),
        ("rows", POINTER(c_int64)),
        ("dims", POINTER(c_int64)),
        ("batch", c_int64),
        ("weight_dtype", c_int),
        ("out_dtype", c_int),
        ("pooling", c_char_p),
        ("check_indices", c_int),
    ]


class EmbeddingBag(Structure):
    _fields_ = [
        ("weight", c_void_p),
        ("offsets", c_void_p),
        ("indices", c_void_p),
        ("per_sample_weights", c_void_p),
        ("num_indices", c_int64),  # negative: not given (backward on GPUs needs it)
    ]


class EmbeddingGrad(Structure):
    _fields_ = [
        ("dense", c_void_p),
        ("rows", c_void_p),
        ("values", c_void_p),
        ("count", c_void_p),
        ("weight", c_void_p),
        ("state", c_void_p),
    ]


_p = c_void_p
_u64p = POINTER(c_uint64)
_i64p = POINTER(c_int64)
_ip = POINTER(c_int)

# name: (restype, argtypes)
_SIGNATURES = {
    "weft_last_error": (c_char_p, []),
    "weft_api_version": (c_int, []),
    "weft_version": (c_char_p, []),
    "weft_has_cuda": (c_int, []),
    "weft_world_create": (c_int, [POINTER(WorldOptions), POINTER(c_void_p)]),
    "weft_world_destroy": (c_int, [_p]),
    "weft_world_info": (c_int, [_p, _ip, _ip, _ip]),
    "weft_world_synchronize": (c_int, [_p]),
    "weft_world_barrier": (c_int, [_p]),
    "weft_alloc": (c_int, [_p, c_uint64, _u64p, _u64p, POINTER(c_void_p)]),
    "weft_free": (c_int, [_p, c_uint64]),
    "weft_heap_info": (c_int, [_p, _u64p, _u64p]),
    "weft_heap_contains": (c_int, [_p, _p, c_uint64, _u64p]),
    "weft_coll_create": (c_int, [_p, POINTER(c_void_p)]),
    "weft_coll_destroy": (c_int, [_p]),
    "weft_all_reduce": (c_int, [_p, _p, _p, c_uint64, c_int, c_char_p, _p]),
    "weft_all_gather": (c_int, [_p, _p, _p, c_uint64, c_int, c_char_p, _p]),
    "weft_reduce_scatter": (c_int, [_p, _p, _p, c_uint64, c_int, c_char_p, _p]),
    "weft_all_to_all": (c_int, [_p, _p, _p, c_uint64, c_int, c_char_p, _p]),
    "weft_all_to_all_v": (c_int, [_p, _p, _p, _p, c_uint64, _p, c_int, c_char_p, _p]),
    "weft_coll_prepare": (c_int, [_p, c_char_p, c_uint64, c_int, c_char_p]),
    "weft_gemm_create": (c_int, [_p, POINTER(GemmConfig), POINTER(c_void_p)]),
    "weft_gemm_destroy": (c_int, [_p]),
    "weft_gemm_run": (c_int, [_p, _p, _p, _p, c_int64, c_char_p, _p]),
    "weft_gemm_run_gathered": (c_int, [_p, _p, _p, _p, c_int64, c_char_p, _p, _p]),
    "weft_gemm_shapes": (c_int, [_p, c_int64, _i64p, _i64p, _i64p, _i64p, _i64p, _i64p]),
    "weft_gemm_auto_method": (c_int, [_p, c_int64, POINTER(c_char_p)]),
    "weft_gemv_create": (c_int, [_p, POINTER(GemvConfig), POINTER(c_void_p)]),
    "weft_gemv_destroy": (c_int, [_p]),
    "weft_gemv_run": (c_int, [_p, _p, _p, _p, c_int64, c_char_p, _p, _p, _p, _p]),
    "weft_gemv_auto_method": (c_int, [_p, c_int64, POINTER(c_char_p)]),
    "weft_moe_create": (c_int, [_p, POINTER(MoeConfig), POINTER(c_void_p)]),
    "weft_moe_destroy": (c_int, [_p]),
    "weft_moe_dispatch": (c_int, [_p, _p, _p, c_int64, c_char_p, _p]),
    "weft_moe_combine": (c_int, [_p, _p, _p, _p, c_int64, c_char_p, _p]),
    "weft_moe_buffers": (c_int, [_p, POINTER(c_void_p), POINTER(c_void_p), _i64p, _i64p]),
    "weft_moe_layer_create": (c_int, [_p, POINTER(MoeConfig), c_int64, POINTER(c_void_p)]),
    "weft_moe_layer_destroy": (c_int, [_p]),
    "weft_moe_layer_forward": (c_int, [_p, _p, _p, _p, _p, _p, _p, c_int64, c_char_p, _p]),
    "weft_embedding_a2a_create": (c_int, [_p, POINTER(EmbeddingA2AConfig), POINTER(c_void_p)]),
    "weft_embedding_a2a_destroy": (c_int, [_p]),
    "weft_embedding_a2a_forward": (c_int, [_p, POINTER(EmbeddingBag), _p, c_char_p, _p]),
    "weft_embedding_a2a_backward": (c_int, [_p, POINTER(EmbeddingBag), _p, POINTER(EmbeddingGrad), c_char_p, c_float,
                                            c_float, c_char_p, _p]),
    "weft_embedding_a2a_layout": (c_int, [_p, _i64p, POINTER(_i64p), _i64p, _i64p, _i64p]),
}


def library_candidates():
    """The paths tried, in order (see the module's docstring)."""
    out = []
    if os.environ.get("WEFT_LIBRARY"):
        out.append(Path(os.environ["WEFT_LIBRARY"]))
    out.append(Path(__file__).resolve().parent / "lib" / "libweft_c.so")
    if os.environ.get("WEFT_BUILD_DIR"):
        out.append(Path(os.environ["WEFT_BUILD_DIR"]) / "libweft_c.so")
    return out


_lib = None
_lock = threading.Lock()


def lib():
    """The loaded library, with every function's argtypes and restype declared."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = library_candidates()
        path = next((p for p in tried if p.is_file()), None)
        if path is None:
            raise ImportError(
                "weft: libweft_c.so not found (tried: " + ", ".join(str(p) for p in tried) + "). Install the "
                "package (python -m pip install .), or set WEFT_LIBRARY to the library or WEFT_BUILD_DIR to a "
                "CMake build directory holding it.")
        # RTLD_LOCAL: weft's symbols never meet another library's (it exports weft_* only anyway).
        handle = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
        for name, (res, args) in _SIGNATURES.items():
            fn = getattr(handle, name)
            fn.restype = res
            fn.argtypes = args
        got = handle.weft_api_version()
        if got != API_VERSION:
            raise ImportError(f"weft: {path} has C API version {got}, this package needs {API_VERSION}: rebuild "
                              "or reinstall weft so that the library and the Python package match")
        handle.path = path
        _lib = handle
        return _lib


def last_error():
    msg = lib().weft_last_error()
    return msg.decode("utf-8", "replace") if msg else ""
