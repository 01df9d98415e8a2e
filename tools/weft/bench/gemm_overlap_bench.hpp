// `weft bench ag_gemm | gemm_rs | gemm_ar`: every method of ops::GemmOverlap side by side in
// one run — baseline (NCCL + cuBLAS; the host reference on the host backend), the local GEMM
// alone (the overlap ceiling), decomposed, fused (when built) and auto — for the shapes of
// docs/anchors.md (M x K x N, bf16, W[N,K]); on the host backend small shapes, so the
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
  // baseline-relative error of the method's output (decomposed, fused, auto): max |C - C_base|
  // / max |C_base| over every rank's C, on the bench's inputs; -1: not checked.
  double rel_err = -1;
  double tolerance = 0;  // overlap_bench_tolerance(op, world) where rel_err was checked
};

// Tolerance of `weft bench`'s check against the baseline. bf16 output: two correct results
// differ by the rounding of C (2^-8 relative) and, for gemm_rs / gemm_ar, by the order and
// precision of the reduction (NCCL's ring rounds each partial sum to bf16, world - 1 times;
// weft sums in fp32), so those grow with the world: 2e-2 x max(1, world / 2). A missing or
// stale contribution is off by about a whole partial product, far above that.
inline double overlap_bench_tolerance(const std::string& op, int world) {
  return op == "ag_gemm" ? 2e-2 : 2e-2 * (world > 2 ? world / 2.0 : 1.0);
}

// n values uniform in [-1, 1), rounded to bf16 (bits): a hash of the index and the salt, the
// same on every run (the op benches' random data).
std::vector<uint16_t> random_bf16(size_t n, int salt);
// Collective: the largest v over the ranks (the benches report the slowest rank's time).
double max_over_ranks(Backend& b, double v);
// Calls per timed run of the op benches: WEFT_BENCH_PER_GRAPH (experiments; at most 1000)
// where set, else `dflt`.
int bench_calls_per_run(int dflt);
// The sleep before each timed run, which must outlast the host's launch of the graph or the
// GPU idles inside the events (WEFT_BENCH_SLEEP_US, at most 100 ms), in ns.
uint64_t bench_sleep_ns();
// The op benches' interleaved rounds: a warm-up round, then `reps` rounds of one run_once(col)
// of every column that ran (odd rounds in reverse order, so clock and power drift reach every
// column alike), each time pushed onto col.us.
template <class Column, class Run>
void interleaved_rounds(std::vector<Column>& cols, int reps, const Run& run_once) {
  for (int r = -1; r < reps; ++r)
    for (size_t i = 0; i < cols.size(); ++i) {
      Column& col = cols[r % 2 ? cols.size() - 1 - i : i];
      if (!col.ran) continue;
      const double us = run_once(col);
      if (r >= 0) col.us.push_back(us);
    }
}

// max |got - ref| / max |ref| over bf16 values (bits), the bench's check; a NaN in got gives
// infinity. got and ref have the same length.
double relative_error_bf16(const std::vector<uint16_t>& got, const std::vector<uint16_t>& ref);

struct OverlapBenchOptions {
  std::string op = "ag_gemm";
  bool quick = false;
  std::vector<std::string> shapes;  // "MxKxN"; empty: docs/anchors.md's four (GPU) or small ones (host)
  // random > 0: that many seeded shapes (random_gemm_shapes: M, K, N multiples of 16 in 256 ...
  // 8192 on GPUs; 16 ... 128, rounded as the host's defaults, on the host backend) after
  // `shapes` (instead of the defaults when shapes is empty); the table then summarises auto
  // against the baseline over every shape.
  int random = 0;
  uint64_t seed = 1;
  int chunks = 0;                   // 0: the cost model's (or tuning cache's) choice
  std::string trace_dir;            // non-empty: one traced call per method, Chrome JSON per method
  bool tune = false;                // store the fastest method per shape in the tuning cache
  // Inputs: "random" (uniform in [-1, 1), rounded to bf16; default, like the PyTorch peer's
  // randn) or "ints" (a small-integer pattern: the earlier runs' data, docs/gemm_overlap.md).
  std::string data = "random";
  // Interleave the columns' timed replays (default: every column sees the same clock and power
  // history), or time each column's replays back to back (the earlier protocol).
  bool sequential = false;
  // GPU: time eager calls (a barrier, a sleep, then the graph's number of calls enqueued back to
  // back, between events) instead of graph replays -- what a caller that does not capture sees.
  bool eager = false;
  std::function<void(const std::string&)> progress;
};

struct OverlapBenchResult {
  std::string op, device, backend, timing, data;
  int world = 1;
  int random = 0;  // the options' random shapes and seed (0: none)
  uint64_t seed = 0;
  std::vector<OverlapPoint> points;
  std::vector<std::string> traces;  // files written (rank 0)
};

// Collective: every rank calls it with the same options.
OverlapBenchResult bench_gemm_overlap(Backend& b, const OverlapBenchOptions& opt);
nlohmann::json to_json(const OverlapBenchResult& r);
std::string to_table(const OverlapBenchResult& r);

// auto against the baseline over the shapes where both ran: the geometric mean of auto / baseline
// and the worst ratio (issue 26's generality bars: worst <= 1.02, geometric mean <= 0.9).
struct AutoSummary {
  int shapes = 0;
  double geomean = 0, worst = 0;
  std::string worst_shape;
};
AutoSummary auto_summary(const OverlapBenchResult& r);

}  // namespace weft::bench
