// `weft bench moe` (issue 25, docs/moe.md "Measured"): ops::MoeDispatchCombine's dispatch and
// combine, alone and back to back, by method, on the shapes (Mixtral, Qwen3-30B-A3B,
// DeepSeek-V3-like) at T tokens a rank, bf16, uniform random top-k routing (seeded per rank).
// GPU: decomposed and direct timed in CUDA graphs, baseline eagerly (its counts go through the host), the
// slowest rank's median; the bytes of rows that cross the link and the GB/s they give. Host
// backend: eager calls, wall clock (a smoke test, CPU figures). GPUs, after each shape's
// exchange: the experts' two GEMMs on each rank (gate/up and down, fixed per-expert row counts
// near uniform routing's), weft's grouped GEMM beside a cuBLAS call per expert.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "weft/runtime/backend.hpp"

namespace weft::bench {

struct MoeBenchOptions {
  bool quick = false;
  std::vector<std::string> shapes;  // mixtral, qwen3-30b-a3b, deepseek-v3-like; empty: all (GPU) or a small one (host)
  std::vector<int64_t> tokens;      // tokens a rank; empty: 128 and 4096 (GPU) or 5 (host)
  // GPUs: also time the experts' GEMMs on each rank (parts experts-up, experts-down; methods
  // weft -- the grouped GEMM -- and cublas -- a call per expert).
  bool experts = true;
  bool exchange = true, layer = true;  // the parts dispatch/combine/both, and layer (`--parts`)
  std::function<void(const std::string&)> progress;
};

struct MoePoint {
  std::string shape, method, part;  // part: dispatch, combine, both
  int64_t hidden = 0, experts = 0, top_k = 0, tokens = 0;
  double median_us = 0;
  double link_bytes = 0;  // rows a rank sends to other ranks, bytes (mean over ranks)
  double gbps = 0;        // link_bytes / median (dispatch, combine)
  int64_t rows = 0;       // experts' parts: rows this rank multiplies (without the blocks' padding)
  double tflops = 0;      // experts' parts: 2 * rows * K * N / median
};

struct MoeBenchResult {
  std::string device, backend, timing;
  int world = 1;
  std::vector<MoePoint> points;
};

MoeBenchResult bench_moe(Backend& b, const MoeBenchOptions& opt);
nlohmann::json to_json(const MoeBenchResult& r);
std::string to_table(const MoeBenchResult& r);

}  // namespace weft::bench
