// Private to src/ops/gemv_ar: the GEMV + AllReduce op in the op skeleton (docs/architecture.md,
// "Adding an op"; docs/gemv_ar.md):
//  - the op (gemv_ar.cpp: GemvAllReduce::Impl): argument checks, agreement, the method choice
//    (`auto`: model.cpp), dispatch;
//  - GemvContext (below, gemv_ar.cpp): what every method reads or shares, written once: the
//    configuration, the per-rank shape, cuBLAS, the epilogue's scratch, the local GEMV and the
//    unfused add + RMSNorm (CPU loops on the host backend, cuBLAS and kernels on GPUs);
//  - one class per method, each owning its state: baseline.cpp (GEMM, then NCCL's all-reduce
//    or the host reference), decomposed.cpp (GEMM, then weft's latency all-reduce, every M's
//    state prepared at construction), fused.cpp (one fused call over the op's symmetric lines);
//  - model.cpp: the methods' predictions and `auto`.
// Every method's state is set up when the op is constructed (symmetric heap allocations are
// collective: matched across ranks by name, size and order), never inside a CUDA graph capture.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../common/op_base.hpp"
#include "weft/kernels/gemv_ar_kernels.hpp"
#include "weft/ops/collectives.hpp"
#include "weft/ops/gemv_ar.hpp"
#include "weft/plan/cost.hpp"

#ifdef WEFT_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif

namespace weft::ops::detail {

// The epilogue operands of one call (residual == nullptr: none).
struct GemvEpilogue {
  const void* residual = nullptr;
  const void* gamma = nullptr;
  void* residual_out = nullptr;
  explicit operator bool() const { return residual != nullptr; }
};

// What the op's methods share. The op fills it (validated config) before any method is made.
struct GemvContext {
  GemvContext(Backend& backend, const GemvArConfig& c);
  ~GemvContext();
  GemvContext(const GemvContext&) = delete;
  GemvContext& operator=(const GemvContext&) = delete;

  Backend& b;
  GemvArConfig cfg;
  HeapShare share;  // before op: destroyed after every method (their symmetric state is its)
  OpBase op;
  int world = 1, rank = 0;
  size_t eb = 2;
  int64_t k_local = 0;
  Collectives coll;  // the host baseline's reference all-reduce, decomposed's weft all-reduce
  // [m_max, n] of the op's own: the un-normalised sum of an epilogue call of baseline and
  // decomposed (run()'s y receives the normalised result), and decomposed's all-reduce rows
  // where the call's M is not one of its all-reduce shapes (GemvDecomposed::rows).
  std::vector<unsigned char> host_sum;
  void* sum_buffer() { return gpu_sum ? gpu_sum : host_sum.data(); }
  void* gpu_sum = nullptr;  // device memory on GPUs
  // dst = src, m rows of y's shape, in the stream's order (host: now).
  void copy_rows(void* dst, const void* src, int64_t m, void* stream);

  bool host() const { return b.kind() == BackendKind::kHost; }

  // y [m, n] = x [m, k_local] * w [n, k_local]^T of this rank (no communication). GPU:
  // cublasGemmEx (fp32 compute) on `stream`, or weft's skinny GEMM (kernels::gemv_local) with
  // `weft`; host: a CPU loop (fp32 accumulate in k order, rounded to the dtype).
  void gemv(const void* x, const void* w, void* y, int64_t m, void* stream, bool weft = false);
  // The unfused epilogue: residual_out = y + residual (rounded), out = residual_out /
  // sqrt(mean of squares + eps) * gamma (rounded). GPU: kernels::add_rmsnorm; host: a CPU loop.
  void add_rmsnorm(const void* y, const void* residual, const void* gamma, void* residual_out, void* out, int64_t m,
                   void* stream);

#ifdef WEFT_HAVE_CUDA
  cublasHandle_t blas = nullptr;
  void* blas_workspace = nullptr;
  // cuBLAS, its workspace (set explicitly: cuBLAS in CUDA graphs needs a user workspace) and the
  // epilogue's sum buffer.
  void init_gpu();
#endif
};

// One method of the op. The op has checked the call (M, pointers, epilogue operands) and
// resolved `auto`. GPU: enqueue the call on `stream`; host: run it.
class GemvMethodImpl {
 public:
  virtual ~GemvMethodImpl() = default;
  virtual void run(int64_t m, const void* x, const void* w, void* y, const GemvEpilogue& ep, void* stream) = 0;
};

// `baseline`: GEMM (cuBLAS / CPU), NCCL's all-reduce in place (host: the collectives' reference
// all-reduce), then the unfused epilogue. Any M: no per-M state.
class GemvBaseline : public GemvMethodImpl {
 public:
  explicit GemvBaseline(GemvContext& c) : c_(c) {}
  void run(int64_t m, const void* x, const void* w, void* y, const GemvEpilogue& ep, void* stream) override;
  // NCCL's (host: the reference) all-reduce of m rows of y, in place.
  void all_reduce(void* y, int64_t m, void* stream);

 private:
  GemvContext& c_;
};

// `decomposed`: the same GEMM, then weft's latency all-reduce (ll or ll128: gemv_all_reduce_method)
// in place, launched with programmatic dependent launch (the collective kernel waits in
// griddepcontrol.wait for the GEMM), then the unfused epilogue. Every M's all-reduce state is
// prepared at construction when it fits in the symmetric heap (ready() false otherwise: why()).
class GemvDecomposed : public GemvMethodImpl {
 public:
  explicit GemvDecomposed(GemvContext& c);
  void run(int64_t m, const void* x, const void* w, void* y, const GemvEpilogue& ep, void* stream) override;
  void all_reduce(void* y, int64_t m, void* stream);
  bool ready() const { return coll_ != nullptr; }
  const std::string& why() const { return why_; }
  // ll or ll128: the all-reduce of a call of M rows.
  Method method(int64_t m) const { return methods_[static_cast<size_t>(m - 1)]; }
  // The rows the all-reduce of a call of M rows runs on: M itself up to kExactRows, else the
  // next power of two (at most m_max). One collective state per shape, so this keeps the
  // prepared states to ~kExactRows + log2(m_max) shapes (their sum ~ (kExactRows^2 / 2 +
  // 2 m_max) rows of N) instead of one per M (m_max^2 / 2 rows). Rows past M are the op's
  // sum buffer's: reduced and never read.
  static constexpr int64_t kExactRows = 16;
  int64_t rows(int64_t m) const;

 private:
  GemvContext& c_;
  // Its own collectives object: its prepared states (one per M) are its heap share's, all
  // given back at once when they do not fit.
  std::unique_ptr<Collectives> coll_;
  std::vector<Method> methods_;  // [m - 1]: of rows(m)
  std::string why_;
};

// `fused`: one call of kernels::gemv_ar_fused (GPU) or kernels::gemv_ar_host_fused (host
// teams) over the op's symmetric state, allocated here for m_max: two sets of it, one for the
// calls of M <= kernels::kGemvSmallM (their own grid: the GPU runs another kernel for them) and
// one for larger M (gemv_ar_kernels.hpp).
class GemvFused : public GemvMethodImpl {
 public:
  // ctas: the grid of M > kGemvSmallM (GPU: kernels::gemv_ar_fused_ctas; host: a few teams);
  // small_ctas: of M <= kGemvSmallM (GPU: kernels::gemv_ar_fused_small_ctas).
  GemvFused(GemvContext& c, int ctas, int small_ctas);
  void run(int64_t m, const void* x, const void* w, void* y, const GemvEpilogue& ep, void* stream) override;

 private:
  GemvContext& c_;
  // The symmetric state's offsets and the shape; per call: pointers, m.
  kernels::GemvArgs small_;  // M <= kGemvSmallM
  kernels::GemvArgs large_;  // larger M (unused when m_max <= kGemvSmallM)
};

// ---- model (model.cpp) ---------------------------------------------------------------------
struct GemvModelInput {
  int world = 1;
  int64_t m = 1, n = 0, k_local = 0;
  size_t eb = 2;
  bool epilogue = false;
  bool fused_available = true;
  bool decomposed_available = true;
};
// weft's all-reduce of decomposed for `bytes` of y per rank: ll (16-byte lines, 8 of data)
// while every rank sends less than kGemvLLMaxBytes, ll128 from there.
inline constexpr uint64_t kGemvLLMaxBytes = 8ull << 10;
// Measured (docs/gemv_ar.md, "Measured"; model.cpp): weft's GEMV streams W at this fraction
// of HBM bandwidth on the register path (M <= 16); the tile kernel (larger M) at the full rate
// plus kGemvTileUs + M * kGemvTileUsPerToken (its ring fill, cluster sum and stores, and x's
// share of shared memory; fitted to 2 x H200 at M = 32 .. 128, within 8%) ...
inline constexpr double kGemvRegHbmEfficiency = 0.87;
inline constexpr double kGemvTileUs = 4.0;
inline constexpr double kGemvTileUsPerToken = 0.045;
// ... and LL128 moves its lines at this fraction of the SM link rate.
inline constexpr double kGemvLL128LinkEfficiency = 0.65;
Method gemv_all_reduce_method(int world, uint64_t bytes);
// Each method's prediction (us) and the fastest available one.
GemvAutoChoice predict_gemv(const GemvModelInput& in, const plan::DeviceConstants& d);
// The constants the model uses: WEFT_DEVICE_CONSTANTS' file, else the compiled-in H200 ones.
plan::DeviceConstants gemv_device_constants();

}  // namespace weft::ops::detail
