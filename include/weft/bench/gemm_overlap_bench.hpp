// `weft bench ag_gemm | gemm_rs | gemm_ar`: every method of ops::GemmOverlap side by side in
// one run — baseline (NCCL + cuBLAS; the host reference on the host backend), the local GEMM
// alone (the overlap ceiling), decomposed, fused (when built) and auto — for the shapes of
// ../shared/ANCHORS.md (M x K x N, bf16, W[N,K]); on the host backend small shapes, so the
// command runs in CI. GPU: calls captured in CUDA graphs, GPUs lined up before each replay,
// medians of replays, the slowest rank's median reported. JSON + a table.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "weft/runtime/backend.hpp"

namespace weft::bench {

struct OverlapPoint {
  std::string op;  // ag_gemm, gemm_rs, gemm_ar
  int64_t m = 0, k = 0, n = 0;
  std::string method;    // baseline, gemm_only, decomposed, fused, auto
  double median_us = 0;  // 0: did not run (see note)
  double tflops = 0;     // per rank: 2 * M * N * K_local / time
  int chunks = 0;        // decomposed
  std::string note;      // auto: what it chose; a method that cannot run: why
};

struct OverlapBenchOptions {
  std::string op = "ag_gemm";
  bool quick = false;
  std::vector<std::string> shapes;  // "MxKxN"; empty: ANCHORS.md's four (GPU) or small ones (host)
  int chunks = 0;                   // 0: the cost model's (or tuning cache's) choice
  std::string trace_dir;            // non-empty: one traced call per method, Chrome JSON per method
  bool tune = false;                // store the fastest method per shape in the tuning cache
  std::function<void(const std::string&)> progress;
};

struct OverlapBenchResult {
  std::string op, device, backend, timing;
  int world = 1;
  std::vector<OverlapPoint> points;
  std::vector<std::string> traces;  // files written (rank 0)
};

// Collective: every rank calls it with the same options.
OverlapBenchResult bench_gemm_overlap(Backend& b, const OverlapBenchOptions& opt);
nlohmann::json to_json(const OverlapBenchResult& r);
std::string to_table(const OverlapBenchResult& r);

}  // namespace weft::bench
