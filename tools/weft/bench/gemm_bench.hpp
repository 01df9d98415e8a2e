// `weft bench gemm`: weft's GEMM side by side with cuBLAS in one run on one GPU, for the
// shapes of docs/anchors.md and 8192^3 (bf16; also B[K,N] and fp16 rows). Each point
// also checks weft's C against cuBLAS's (max relative error, NaN count). Without a GPU it
// times the CPU tile reference on small shapes (the host backend's compute).
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace weft::bench {

struct GemmPoint {
  int64_t m = 0, n = 0, k = 0;
  std::string dtype;     // bf16, f16
  std::string b_layout;  // nk (W[N,K], torch linear) or kn (B[K,N])
  std::string impl;      // cublas, weft, cpu
  double median_us = 0;
  double tflops = 0;
  double max_rel_err = 0;  // weft vs cuBLAS (weft rows only)
  int64_t nan_count = 0;
};

struct GemmBenchOptions {
  bool quick = false;
  std::vector<std::string> shapes;  // "MxKxN" (docs/anchors.md order); empty: the defaults
  std::function<void(const std::string&)> progress;
};

struct GemmBenchResult {
  std::string device;
  std::string timing;
  std::vector<GemmPoint> points;
};

GemmBenchResult bench_gemm(const GemmBenchOptions& opt);
nlohmann::json to_json(const GemmBenchResult& r);
std::string to_table(const GemmBenchResult& r);

}  // namespace weft::bench
