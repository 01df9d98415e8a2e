#include "weft/ops/gemm.hpp"

#include <fmt/format.h>

#include <vector>

#include "weft/core/error.hpp"
#ifdef WEFT_HAVE_CUDA
#include "weft/core/cuda_check.hpp"
#include "weft/kernels/gemm.hpp"
#endif

namespace weft::ops {
namespace {

float load(dev::DType t, const void* base, int64_t i) {
  switch (t) {
    case dev::DType::kBF16:
      return dev::to_float(static_cast<const dev::bf16_t*>(base)[i]);
    case dev::DType::kF16:
      return dev::to_float(static_cast<const dev::f16_t*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}
void store(dev::DType t, void* base, int64_t i, float v) {
  switch (t) {
    case dev::DType::kBF16:
      static_cast<dev::bf16_t*>(base)[i] = dev::from_float<dev::bf16_t>(v);
      break;
    case dev::DType::kF16:
      static_cast<dev::f16_t*>(base)[i] = dev::from_float<dev::f16_t>(v);
      break;
    default:
      static_cast<float*>(base)[i] = v;
  }
}

}  // namespace

void gemm_tile_cpu(const CpuGemm& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  WEFT_REQUIRE(m0 >= 0 && m0 <= m1 && n0 >= 0 && n0 <= n1 && g.k >= 0,
               fmt::format("gemm_tile_cpu: bad tile rows [{}, {}) cols [{}, {}) k {}", m0, m1, n0, n1, g.k));
  WEFT_REQUIRE(g.a && g.b && g.c, "gemm_tile_cpu: null operand");
  // B's row for column j, converted once per tile: a K-vector per output column.
  std::vector<float> bcol(static_cast<size_t>(g.k));
  std::vector<float> arow(static_cast<size_t>(g.k));
  for (int64_t j = n0; j < n1; ++j) {
    for (int64_t kk = 0; kk < g.k; ++kk) bcol[kk] = load(g.in, g.b, g.b_kn ? kk * g.ldb + j : j * g.ldb + kk);
    for (int64_t i = m0; i < m1; ++i) {
      float acc = 0.f;
      for (int64_t kk = 0; kk < g.k; ++kk) acc += load(g.in, g.a, i * g.lda + kk) * bcol[kk];
      const int64_t ci = i * g.ldc + j;
      if (g.accumulate) acc = load(g.out, g.c, ci) + acc;
      store(g.out, g.c, ci, acc);
    }
  }
}

void gemm_cpu(const CpuGemm& g, int64_t m, int64_t n) {
  constexpr int64_t kTile = 64;
  for (int64_t i = 0; i < m; i += kTile)
    for (int64_t j = 0; j < n; j += kTile) gemm_tile_cpu(g, i, std::min(m, i + kTile), j, std::min(n, j + kTile));
}

#ifdef WEFT_HAVE_CUDA
void gemm_gpu(const kernels::GemmArgs& a, const kernels::GemmHooks& h, cudaStream_t stream, bool force_portable) {
  const char* why = nullptr;
  const cudaError_t e = kernels::gemm(a, h, stream, &why, force_portable);
  if (e == cudaErrorInvalidValue && why)
    throw InvalidArgument(fmt::format("gemm M={} N={} K={}: {}", a.m, a.n, a.k, why));
  WEFT_CUDA_CHECK(e);
}

void gemm_gpu(const kernels::GemmArgs& a) { gemm_gpu(a, kernels::GemmHooks{}); }
#endif

}  // namespace weft::ops
