// The pool kernel's run lengths, chosen on the host for each call (docs/embedding_a2a.md, "What
// the lookups are bound by"). A warp's work item is `poolers` groups of lanes, each pooling
// run_bags consecutive bags of one table as one run of indices, `ahead` rows in flight a lane; the
// items go to the warps round-robin (destination-minor, then table-major). Short runs pay each
// item's start (offsets, then indices, then rows: dependent loads) more often; long runs leave
// the last round of items part-full. The model: an item costs its start (kStartBatches) plus one
// batch of `ahead` rows per batch of its run; the call takes as long as its busiest warp.
#pragma once
#include <cstdint>
#include <vector>

namespace weft::ops::embedding {

struct RunTable {
  int64_t bags = 0;    // bags a destination (the batch)
  double pooling = 0;  // the table's average indices a bag
  int poolers = 1;     // groups of lanes a warp (32 / group)
};

// An item's start, in batches of rows.
inline constexpr double kStartBatches = 3.0;

// The busiest warp's load, in batches, with run_bags[t] bags a run for table t.
double run_load(const std::vector<RunTable>& tables, const std::vector<int>& run_bags, int dest_count, int64_t warps,
                int ahead);

// Each table's bags a run (1 ... max_bags): about `rows` indices a run for the rows (16 ... 128) the
// model loads least; 64 unless another is at least 2 % lighter.
std::vector<int> choose_run_bags(const std::vector<RunTable>& tables, int dest_count, int64_t warps, int ahead,
                                 int max_bags);

}  // namespace weft::ops::embedding
