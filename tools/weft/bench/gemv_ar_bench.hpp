// `weft bench gemv_ar` (issue 23, docs/gemv_ar.md "Benchmark"): ops::GemvAllReduce's methods
// side by side with their parts, for decode shapes (K, N) x M tokens, bf16. Per (K, N) one op
// with m_max = the largest M, and a second with the residual + RMSNorm epilogue. Columns:
// baseline (cuBLAS + NCCL), the GEMV alone (cuBLAS; weft's kernel), the all-reduce of y alone
// (NCCL; weft's latency all-reduce), decomposed, fused, auto, fused + RMSNorm and the unfused
// sequence (the epilogue op's baseline: GEMM, all-reduce, add + RMSNorm), and the roofline
// time (W's bytes per rank / the HBM bandwidth measured by the bench). GPU: every column
// timed in CUDA graphs (graph_timing.hpp), interleaved rounds, the slowest rank's median;
// host backend: eager calls, wall clock (a smoke test, CPU figures). Every method's output is
// checked against the baseline's.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "weft/runtime/backend.hpp"

namespace weft::bench {

struct GemvShape {
  int64_t k = 0, n = 0;  // K: the full depth (before the split over the ranks)
};

// "K:N", two positive integers; throws InvalidArgument naming `s` otherwise.
GemvShape parse_gemv_shape(const std::string& s);

struct GemvPoint {
  int64_t k = 0, n = 0, m = 0;
  // baseline, gemv_cublas, gemv_weft, ar_nccl, ar_weft, decomposed, fused, auto, fused_rmsnorm,
  // unfused_rmsnorm, roofline (computed, not timed)
  std::string method;
  double median_us = 0;  // 0: did not run (see note)
  std::string note;      // auto: what it chose; a column that cannot run: why
  // max |out - out_ref| / max |out_ref| over every rank's output against the column's
  // reference (the baseline's y; gemv_weft: gemv_cublas's; fused_rmsnorm: unfused_rmsnorm's,
  // both of its outputs); -1: not checked.
  double rel_err = -1;
  double tolerance = 0;
};

// The check's tolerance (bf16 output): as gemm_ar's in `weft bench gemm_ar`, 2e-2 x
// max(1, world / 2) (the rounding of y and the reductions' order and precision; a missing or
// stale contribution is off by a whole partial product).
inline double gemv_bench_tolerance(int world) { return 2e-2 * (world > 2 ? world / 2.0 : 1.0); }

struct GemvBenchOptions {
  bool quick = false;
  std::vector<std::string> shapes;  // "K:N"; empty: the four (GPU) or small ones (host)
  std::vector<int64_t> ms;          // tokens; empty: 1, 8, 16, 64, 128 (GPU) or small ones (host)
  // Store each (shape, M)'s fastest method (baseline, decomposed, fused; with the epilogue:
  // the unfused sequence or fused) in the tuning cache that `auto` reads (later ops).
  bool tune = false;
  std::function<void(const std::string&)> progress;
};

struct GemvBenchResult {
  std::string device, backend, timing, bandwidth_method;
  int world = 1;
  double hbm_gbps = 0;  // measured: bytes read + written / time of a large device copy
  std::vector<GemvPoint> points;
};

// Collective: every rank calls it with the same options.
GemvBenchResult bench_gemv_ar(Backend& b, const GemvBenchOptions& opt);
nlohmann::json to_json(const GemvBenchResult& r);
std::string to_table(const GemvBenchResult& r);

}  // namespace weft::bench
