// The pool kernel's run lengths (runs.hpp).
#include "runs.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

namespace weft::ops::embedding {
namespace {

// Bags a run of about `rows` indices, as the kernel's own rule: rows / pooling, 1 ... max_bags.
int bags_for(double rows, double pooling, int max_bags) {
  if (pooling <= 0) return max_bags;
  return static_cast<int>(std::clamp(std::floor(rows / pooling), 1.0, static_cast<double>(max_bags)));
}

}  // namespace

double run_load(const std::vector<RunTable>& tables, const std::vector<int>& run_bags, int dest_count, int64_t warps,
                int ahead) {
  if (warps < 1 || dest_count < 1 || ahead < 1) return 0;
  // Item jj (destination-minor: item j of the tables' sequence is jj / dest_count) goes to warp
  // jj % warps. A table's items are one range of jj at one cost: every warp gets n / warps of
  // them, and the n % warps warps from the range's start (cyclically) one more. The busiest warp:
  // the most of those extras over the warps, swept over their edges.
  std::vector<std::pair<int64_t, double>> edges;  // (warp, change of the extra load from it on)
  double base = 0;
  int64_t at = 0;
  for (size_t t = 0; t < tables.size(); ++t) {
    const RunTable& x = tables[t];
    const int64_t per_item = static_cast<int64_t>(std::max(1, x.poolers)) * std::max(1, run_bags[t]);
    const int64_t n = (x.bags + per_item - 1) / per_item * dest_count;
    if (n == 0) continue;
    const double cost = kStartBatches + std::ceil(run_bags[t] * x.pooling / ahead);
    base += cost * static_cast<double>(n / warps);
    const int64_t r = n % warps, s = at % warps, e = s + r;
    if (r > 0) {  // warps s ... e - 1, cyclically
      edges.emplace_back(s, cost);
      edges.emplace_back(std::min(e, warps), -cost);
      if (e > warps) {
        edges.emplace_back(0, cost);
        edges.emplace_back(e - warps, -cost);
      }
    }
    at += n;
  }
  std::sort(edges.begin(), edges.end());
  double run = 0, most = 0;
  for (size_t i = 0; i < edges.size(); ++i) {
    run += edges[i].second;
    if (i + 1 == edges.size() || edges[i + 1].first != edges[i].first) most = std::max(most, run);
  }
  return base + most;
}

std::vector<int> choose_run_bags(const std::vector<RunTable>& tables, int dest_count, int64_t warps, int ahead,
                                 int max_bags) {
  auto runs = [&](double rows) {
    std::vector<int> r(tables.size());
    for (size_t t = 0; t < tables.size(); ++t) r[t] = bags_for(rows, tables[t].pooling, max_bags);
    return r;
  };
  std::vector<int> best = runs(64);
  const double at64 = run_load(tables, best, dest_count, warps, ahead);
  double least = at64;
  for (double rows = 16; rows <= 128; rows += 8) {
    std::vector<int> r = runs(rows);
    const double load = run_load(tables, r, dest_count, warps, ahead);
    if (load < least && load <= 0.98 * at64) {
      least = load;
      best = std::move(r);
    }
  }
  return best;
}

}  // namespace weft::ops::embedding
