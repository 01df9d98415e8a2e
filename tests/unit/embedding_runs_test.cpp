// The pool kernel's run-length model (src/ops/embedding_a2a/runs.hpp): the busiest warp's load
// against a warp-by-warp count, and the choice it makes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "ops/embedding_a2a/runs.hpp"

namespace weft::ops::embedding {
namespace {

// Every item dealt to its warp, one by one (the kernel's order: destination-minor, table-major).
double load_by_items(const std::vector<RunTable>& tables, const std::vector<int>& runs, int dests, int64_t warps,
                     int ahead) {
  std::vector<double> load(static_cast<size_t>(warps), 0.0);
  int64_t jj = 0;
  for (size_t t = 0; t < tables.size(); ++t) {
    const int64_t per_item = static_cast<int64_t>(tables[t].poolers) * runs[t];
    const int64_t items = (tables[t].bags + per_item - 1) / per_item;
    const double cost = kStartBatches + std::ceil(runs[t] * tables[t].pooling / ahead);
    for (int64_t i = 0; i < items * dests; ++i, ++jj) load[static_cast<size_t>(jj % warps)] += cost;
  }
  return *std::max_element(load.begin(), load.end());
}

TEST(EmbeddingRuns, BusiestWarpMatchesDealingItemsOut) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 30);
    const int dests = 1 + static_cast<int>(rng() % 8);
    const int64_t warps = 1 + static_cast<int64_t>(rng() % 3000);
    const int ahead = 1 << (rng() % 4);
    std::vector<RunTable> tables(static_cast<size_t>(n));
    std::vector<int> runs(static_cast<size_t>(n));
    for (int t = 0; t < n; ++t) {
      tables[static_cast<size_t>(t)] = {static_cast<int64_t>(rng() % 20000), (rng() % 2000) / 10.0, 1 << (rng() % 6)};
      runs[static_cast<size_t>(t)] = 1 + static_cast<int>(rng() % 8);
    }
    EXPECT_DOUBLE_EQ(run_load(tables, runs, dests, warps, ahead), load_by_items(tables, runs, dests, warps, ahead))
        << "trial " << trial;
  }
}

TEST(EmbeddingRuns, ChoosesAFullerLastRoundWhereItPays) {
  // 26 tables of D 64 (fp32: 4 groups a warp, 4 rows ahead), pooling 10, 4096 bags, 2112 warps:
  // 64 rows a run (6 bags) deals 2.1 rounds of items; 7 bags a run fill two rounds.
  const std::vector<RunTable> tables(26, RunTable{4096, 10.0, 4});
  const std::vector<int> runs = choose_run_bags(tables, 1, 2112, 4, 8);
  const std::vector<int> rule(26, 6);
  for (int r : runs) {
    EXPECT_GE(r, 1);
    EXPECT_LE(r, 8);
  }
  EXPECT_NE(runs, rule);
  EXPECT_LE(run_load(tables, runs, 1, 2112, 4), 0.98 * run_load(tables, rule, 1, 2112, 4));
}

TEST(EmbeddingRuns, KeepsTheRuleWhenNothingIsClearlyLighter) {
  // One warp: every item is its, the load is the rows' batches plus the starts; 64 rows a run
  // (8 bags of pooling 8) is already the fewest starts a run of at most 8 bags allows.
  const std::vector<RunTable> tables(3, RunTable{1000, 8.0, 1});
  EXPECT_EQ(choose_run_bags(tables, 2, 1, 8, 8), std::vector<int>(3, 8));
  // No bags: any choice loads nothing; the rule stays.
  const std::vector<RunTable> empty(2, RunTable{0, 10.0, 2});
  EXPECT_EQ(choose_run_bags(empty, 1, 100, 4, 8), std::vector<int>(2, 6));
}

}  // namespace
}  // namespace weft::ops::embedding
