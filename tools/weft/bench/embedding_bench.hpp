// `weft bench embedding_a2a` (issue 24; docs/embedding_a2a.md, "Measured"): ops::EmbeddingA2A's
// forward by method beside its parts -- the lookups alone (EmbeddingA2A::pool) and NCCL's
// all-to-all of the same pooled rows alone -- and its backward by method (SGD's update in place:
// the fused optimizer, no dense gradient; bwd_*), on the MLPerf DLRM-DCNv2 layout (26 tables,
// D 128, its per-table pooling factors) at several samples per GPU, and a sweep of D x pooling;
// the lookups' bandwidth (row bytes read / time) against a device copy's. Tables round-robin over
// the ranks (global table t on rank t % world), fp32 weights and output, sum pooling, bags of
// exactly the table's pooling factor of uniform random rows (seeded per table): the same
// workload as bench/torch_embedding_peer.py. GPUs: CUDA graphs, every column's replays
// interleaved, the slowest rank's median; the outputs of baseline and fused compared bitwise
// first (forward, and the backward's sparse gradients where they fit in 1 GiB). Host backend:
// eager calls, wall clock, small tables (a smoke test, CPU figures).
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "weft/runtime/backend.hpp"

namespace weft::bench {

struct EmbeddingBenchOptions {
  bool quick = false;
  std::vector<std::string> shapes;  // dlrm, sweep; empty: both
  // Samples per GPU; empty: dlrm 2048, 4096, 16384, 65536 and the sweep 4096 (GPU; 64 / 16 on
  // the host). A rank's lookups at world W cover W x its samples for 26 / W tables, so one GPU
  // at W x 4096 samples a table reads each table as a rank of W GPUs does.
  std::vector<int64_t> batches;
  int64_t rows = 0;                 // rows of every table; 0: 1,000,000 on GPUs, 1000 on the host
  std::function<void(const std::string&)> progress;
};

struct EmbeddingPoint {
  std::string shape;   // "dlrm" or "sweep"
  std::string method;  // baseline, decomposed, fused, auto, lookup, all_to_all
  int64_t batch = 0, dim = 0, tables = 0;
  double pooling = 0;  // mean indices a bag
  double median_us = 0;
  double bytes = 0;  // lookup: row bytes this rank reads; all_to_all: bytes it sends to other ranks
  double gbps = 0;   // bytes / median (lookup, all_to_all)
};

struct EmbeddingBenchResult {
  std::string device, backend, timing;
  int world = 1;
  double copy_gbps = 0;  // a device-to-device copy: (read + written bytes) / time, the slowest rank
  std::vector<EmbeddingPoint> points;
};

EmbeddingBenchResult bench_embedding(Backend& b, const EmbeddingBenchOptions& opt);
nlohmann::json to_json(const EmbeddingBenchResult& r);
std::string to_table(const EmbeddingBenchResult& r);

}  // namespace weft::bench
