// Micro-benchmarks of the device API: push and pull bandwidth to a peer (every rank at
// once, rank r to rank r+1) and one-way signal latency (ping-pong between ranks 0 and 1).
// The data moved is checked after timing; the numbers are medians of timed repetitions.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "weft/runtime/backend.hpp"

namespace weft::bench {

struct BandwidthPoint {
  std::string mode;  // "push" or "pull"
  int ctas = 0;      // CUDA blocks (GPU) or worker threads (host)
  int threads = 0;   // threads per block
  uint64_t bytes = 0;
  double median_us = 0;
  double gbps = 0;  // bytes / median time, per rank (every rank moves `bytes` at once)
  bool verified = false;
};

struct DevapiBenchResult {
  std::string device;
  std::string backend;
  int world = 1;
  int reps = 0;
  std::vector<BandwidthPoint> bandwidth;
  double one_way_latency_us = -1;  // < 0: not measured (a world of one)
  int latency_iters = 0;
};

struct DevapiBenchOptions {
  bool quick = false;  // small sizes and few repetitions (CI)
  // Called on rank 0 as each measurement completes (progress output).
  std::function<void(const std::string&)> progress;
};

// Collective: every rank calls it.
DevapiBenchResult bench_devapi(Backend& b, const DevapiBenchOptions& opt);
#ifdef WEFT_HAVE_CUDA
DevapiBenchResult bench_devapi_gpu(Backend& b, const DevapiBenchOptions& opt);
#endif

nlohmann::json to_json(const DevapiBenchResult& r);
std::string to_table(const DevapiBenchResult& r);

double median(std::vector<double> v);

}  // namespace weft::bench
