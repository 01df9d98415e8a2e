// CUDA, NCCL and cuBLAS status checks that carry file:line (host code only; include nccl.h /
// cublas_v2.h before using the last two). The message is built out of line
// (weft::throw_call_failed), so this header pulls in no formatting library.
#pragma once
#include <cuda_runtime.h>

#include "weft/core/error.hpp"

#define WEFT_CUDA_CHECK(call)                                                                                      \
  do {                                                                                                             \
    cudaError_t weft_e_ = (call);                                                                                  \
    if (weft_e_ != cudaSuccess) ::weft::throw_call_failed(__FILE__, __LINE__, #call, cudaGetErrorString(weft_e_)); \
  } while (0)

#define WEFT_NCCL_CHECK(call)                                                                                       \
  do {                                                                                                              \
    ncclResult_t weft_r_ = (call);                                                                                  \
    if (weft_r_ != ncclSuccess)                                                                                     \
      ::weft::throw_call_failed(__FILE__, __LINE__, #call, ncclGetErrorString(weft_r_), ncclGetLastError(nullptr)); \
  } while (0)

#define WEFT_CUBLAS_CHECK(call)                                                          \
  do {                                                                                   \
    cublasStatus_t weft_s_ = (call);                                                     \
    if (weft_s_ != CUBLAS_STATUS_SUCCESS)                                                \
      ::weft::throw_call_failed(__FILE__, __LINE__, #call, cublasGetStatusName(weft_s_), \
                                cublasGetStatusString(weft_s_));                         \
  } while (0)
