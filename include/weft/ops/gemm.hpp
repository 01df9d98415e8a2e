// weft's GEMM at the op level: the CPU tile reference (the `host` backend's compute, and the
// exact reference of the tests) and, in CUDA builds, the checked GPU entry point.
//
// C[M,N] = A[M,K] * B with A row-major; B either W[N,K] (torch.nn.functional.linear's
// weight, `b_kn = false`) or B[K,N] (`b_kn = true`); fp32 accumulation in K order; C in the
// input type (bf16 or fp16, rounded to nearest even) or fp32.
#pragma once
#include <cstdint>

#include "weft/device/dtype.hpp"

#ifdef WEFT_HAVE_CUDA
// Declared only: the kernel's argument and hook structs are in weft/kernels/gemm.hpp, which
// callers of gemm_gpu include; this op header stays free of the kernel layer.
struct CUstream_st;  // cudaStream_t is CUstream_st*
namespace weft::kernels {
struct GemmArgs;
struct GemmHooks;
}  // namespace weft::kernels
#endif

namespace weft::ops {

struct CpuGemm {
  dev::DType in = dev::DType::kBF16;   // type of A and B (kBF16, kF16 or kF32)
  dev::DType out = dev::DType::kBF16;  // type of C
  bool b_kn = false;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  int64_t k = 0;
  bool accumulate = false;  // C += A*B (the reduce-add destination mode) instead of C = A*B
};

// One tile: rows [m0, m1), columns [n0, n1) of C. Throws InvalidArgument on bad ranges.
void gemm_tile_cpu(const CpuGemm& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
// The whole C[m, n], tile by tile.
void gemm_cpu(const CpuGemm& g, int64_t m, int64_t n);

#ifdef WEFT_HAVE_CUDA
// Runs kernels::gemm; bad arguments throw InvalidArgument with the kernel's reason, launch
// failures throw Error.
void gemm_gpu(const kernels::GemmArgs& a, const kernels::GemmHooks& h, CUstream_st* stream = nullptr,
              bool force_portable = false);
// No hooks, the default stream.
void gemm_gpu(const kernels::GemmArgs& a);
#endif

}  // namespace weft::ops
