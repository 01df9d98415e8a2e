// `weft bench collectives`: weft's collectives side by side with NCCL in one run, every
// call inside a CUDA graph (GPU), sizes 8 KiB to 256 MiB. Size = bytes of each rank's input.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "weft/runtime/backend.hpp"

namespace weft::bench {

struct CollPoint {
  std::string coll;    // all_reduce, all_gather, reduce_scatter, all_to_all
  std::string method;  // nccl (host: reference), nccl_symm (NCCL's symmetric windows), one-shot, two-shot, ll,
                      // ll128, direct, auto
  uint64_t bytes = 0;  // each rank's input
  double median_us = 0;
  double busbw_gbps = 0;  // bytes each rank sends to peers / time (nccl-tests' "bus bandwidth" idea)
};

struct CollBenchOptions {
  bool quick = false;
  std::vector<std::string> colls;  // empty: all
  std::function<void(const std::string&)> progress;
};

std::vector<CollPoint> bench_collectives(Backend& b, const CollBenchOptions& opt);
nlohmann::json to_json(const std::vector<CollPoint>& pts);
// One row per (collective, size); best/base: weft's best method / the better NCCL mode.
std::string to_table(const std::vector<CollPoint>& pts);

}  // namespace weft::bench
