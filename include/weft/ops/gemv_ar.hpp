// GEMV + AllReduce for decode (issue 23): the row-parallel linear of a transformer with a few
// tokens, optionally followed by the residual add + RMSNorm of the next layer's input.
//
//   y[M, N] = sum over ranks r of x_r[M, K/world] * W_r[N, K/world]^T
//
// W is in the torch.nn.functional.linear layout ([N rows, K_local columns], row-major); x, y
// row-major. bf16 or f16; products and the sum accumulate in fp32, every rank adds the ranks'
// partial products in rank order (so every rank holds the same y); y has the inputs' type.
// With the epilogue (GemvArConfig::epilogue, the residual given in the run options):
//
//   residual_out[M, N] = y + residual            (the next layer's residual)
//   out[M, N]          = residual_out / sqrt(mean over N of residual_out^2 + eps) * gamma
//
// (residual_out rounded to the dtype before the norm reads it, as the unfused sequence does.)
// Methods: `baseline` (cuBLAS GEMM + NCCL all-reduce; on the host backend a CPU GEMV and the
// reference all-reduce), `decomposed` (cuBLAS + weft's latency all-reduce, ll or ll128, the
// second launched with programmatic dependent launch), `fused` (one kernel: a skinny GEMM
// streaming W whose CTAs push their finished slice of y into every peer's receive slots in LL
// lines and finish the sum where it lands; no reset between calls), `auto` (cost model).
// On the host backend every method runs and is exact on integer data. docs/gemv_ar.md.
//
// Construction and run() are collective: every rank makes the same calls, in the same order,
// with the same configuration and methods. One op serves every M from 1 to config.m_max
// (GemvRunOptions::m) without allocating: the symmetric receive slots and epochs are sized
// for m_max at construction, so every call (every M, every method) can be captured into a
// CUDA graph after the op is made.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weft/device/dtype.hpp"
#include "weft/ops/names.hpp"
#include "weft/runtime/backend.hpp"

namespace weft::plan {
struct DeviceConstants;
}

namespace weft::ops {

enum class GemvMethod { kAuto, kBaseline, kDecomposed, kFused };
inline constexpr Named<GemvMethod> kGemvMethodNames[] = {{GemvMethod::kAuto, "auto"},
                                                         {GemvMethod::kBaseline, "baseline"},
                                                         {GemvMethod::kDecomposed, "decomposed"},
                                                         {GemvMethod::kFused, "fused"}};
inline const char* to_string(GemvMethod m) { return name_in(kGemvMethodNames, m); }
inline GemvMethod parse_gemv_method(const std::string& s) { return parse_in(kGemvMethodNames, s, "method"); }

// The most tokens one call may have.
inline constexpr int64_t kGemvMaxM = 128;

struct GemvArConfig {
  // Global shape: N output features, K the full input depth (split over the ranks: K/world
  // each, a multiple of 8). m_max: the most tokens a call may have (1 ... kGemvMaxM).
  int64_t n = 0, k = 0, m_max = kGemvMaxM;
  dev::DType dtype = dev::DType::kBF16;
  // The residual add + RMSNorm epilogue (run options: residual, gamma, residual_out, out).
  bool epilogue = false;
  float eps = 1e-6f;
  // The tuning cache `auto` reads (one choice per token tile: M of 1-8, 9-16, 17-32, 33-64,
  // 65-128) and record_tuned writes: "" = WEFT_TUNE_CACHE, else $XDG_CACHE_HOME/weft/gemv_ar.json
  // or ~/.cache/weft/gemv_ar.json; "-" = none.
  std::string tune_cache;
};

struct GemvRunOptions {
  GemvMethod method = GemvMethod::kAuto;
  int64_t m = 0;  // tokens of this call (0: config.m_max); 1 <= m <= m_max
  // Epilogue operands (config.epilogue only; each required then): residual [M, N] (may be the
  // same pointer as residual_out: in place), gamma [N], residual_out [M, N]; the normalised
  // result goes to run()'s y, and the op's un-normalised sum is not kept.
  const void* residual = nullptr;
  const void* gamma = nullptr;
  void* residual_out = nullptr;
  void* stream = nullptr;  // cudaStream_t on the nccl backend (nullptr: the default stream)
};

// What `auto` picks for M tokens, and the model's predictions (us; 0: not predicted).
struct GemvAutoChoice {
  GemvMethod method = GemvMethod::kBaseline;
  std::string source;  // "cost model", "host backend default", "tuning cache <path>"
  double predicted_baseline_us = 0, predicted_decomposed_us = 0, predicted_fused_us = 0;
};

// The model `auto` runs on GPUs (src/ops/gemv_ar/model.cpp): every method's predicted time for
// M tokens of an [N, K] weight (K global, split over `world` ranks) on the device `d`, and the
// fastest, with decomposed and fused both available (weft's sm_90a build). `weft plan --op
// gemv_ar` prints it; the op itself also weighs the tuning cache and what the build has.
GemvAutoChoice predict_gemv_ar(int world, int64_t m, int64_t n, int64_t k, bool epilogue,
                               const plan::DeviceConstants& d);

class GemvAllReduce {
 public:
  // Collective. Throws InvalidArgument naming the value when it cannot run: n or k < 1, k not
  // divisible by the world size or k/world not a multiple of 8, n not a multiple of 8, m_max
  // outside 1 ... kGemvMaxM, a dtype other than bf16/f16, ranks that disagree on the config.
  GemvAllReduce(Backend& backend, const GemvArConfig& config);
  ~GemvAllReduce();
  GemvAllReduce(const GemvAllReduce&) = delete;
  GemvAllReduce& operator=(const GemvAllReduce&) = delete;

  // One call: x [M, K/world], w [N, K/world], y [M, N] (this rank's; device pointers on nccl,
  // host pointers on host), each 16-byte aligned; y must not overlap x or w. Returns with the
  // work enqueued on the stream (GPU) or done (host). Throws InvalidArgument for M outside
  // 1 ... m_max, null or misaligned pointers, epilogue operands missing (or given without the
  // epilogue), ranks calling with different M or methods (checked on the first call of each
  // (M, method) only: later calls are capturable and check nothing on the host).
  void run(const void* x, const void* w, void* y, const GemvRunOptions& opt = {});

  // The local GEMV alone, y = x * w^T of this rank's slice, no communication (benchmarks'
  // ceiling). `weft`: weft's skinny GEMM kernel (GPU); else cuBLAS. The host backend runs
  // its CPU GEMV for both.
  void run_gemv_only(const void* x, const void* w, void* y, int64_t m, bool weft, void* stream = nullptr);
  // The all-reduce alone of an [M, N] y in place, by NCCL (baseline) or weft's latency
  // all-reduce (decomposed's).
  void run_all_reduce_only(void* y, int64_t m, GemvMethod method, void* stream = nullptr);
  // The epilogue alone, unfused: residual_out = y + residual, out = RMSNorm(residual_out) * gamma
  // (one kernel; the host backend: a CPU loop). For the unfused sequence in benchmarks.
  void run_add_rmsnorm(const void* y, const void* residual, const void* gamma, void* residual_out, void* out,
                       int64_t m, void* stream = nullptr);

  std::vector<GemvMethod> available_methods() const;
  GemvAutoChoice auto_choice(int64_t m) const;
  // Records `method` as the fastest measured at M = m (us per call) for this op's shape in the
  // tuning cache, for M's token tile (`weft bench gemv_ar --tune`); rank 0 writes, the others
  // return. Ops made after it read it; this one's choices do not change.
  void record_tuned(int64_t m, GemvMethod method, double us) const;
  const GemvArConfig& config() const;
  int64_t k_local() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft::ops
