#include "weft/plan/schedule.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "weft/core/error.hpp"
#include "weft/plan/progress.hpp"
#include "weft/plan/templates.hpp"

namespace weft::plan {
namespace {

struct Where {
  int rank;
  int pos;
  const Transfer* t;
};

std::unordered_map<int64_t, Where> index_chunks(const CommPlan& p) {
  std::unordered_map<int64_t, Where> ix;
  for (size_t r = 0; r < p.queues.size(); ++r)
    for (size_t k = 0; k < p.queues[r].size(); ++k)
      ix.emplace(p.queues[r][k].chunk, Where{static_cast<int>(r), static_cast<int>(k), &p.queues[r][k]});
  return ix;
}

std::pair<int64_t, int64_t> block_rows(const TileSchedule& s, int m) { return s.block_rows(m); }

// Chunks that write rows of tensor t on rank r, and the rows they write.
std::vector<const Transfer*> writers(const CommPlan& p, int t, int r) {
  std::vector<const Transfer*> w;
  for (const auto& q : p.queues)
    for (const auto& x : q)
      if (x.dst.rank == r && x.dst.tensor == t) w.push_back(&x);
  return w;
}

// The grid columns [first, second) a chunk writes of a column-read tensor: the rows of its
// region for a transposed read (W[N, K]), else its columns.
std::pair<int64_t, int64_t> grid_cols(const Transfer& x, bool transposed) {
  const Region& g = x.dst.region;
  return transposed ? std::pair{g.row_begin, g.row_end} : std::pair{g.col_begin, g.col_end};
}

// Columns [c0, c1) of tile column block n.
std::pair<int64_t, int64_t> block_cols(const TileSchedule& s, int n) {
  const int64_t c0 = int64_t{n} * s.tile_cols;
  return {c0, std::min(s.cols, c0 + s.tile_cols)};
}

// Per column read of the schedule: the chunks that write its tensor on rank r, and whether
// the read is transposed.
std::vector<std::pair<std::vector<const Transfer*>, bool>> column_writers(const CommPlan& p, const TileSchedule& s,
                                                                          int r) {
  std::vector<std::pair<std::vector<const Transfer*>, bool>> out;
  for (const ColumnRead& cr : s.column_reads) {
    const int t = p.tensor_id(cr.tensor);
    out.emplace_back(t >= 0 ? writers(p, t, r) : std::vector<const Transfer*>{}, cr.transposed);
  }
  return out;
}

std::string tile_name(const Tile& t, int r) { return fmt::format("tile ({},{}) on rank {}", t.m, t.n, r); }

void check_geometry(const TileSchedule& s) {
  WEFT_REQUIRE(s.rows >= 1 && s.cols >= 1 && s.tile_rows >= 1 && s.tile_cols >= 1 && s.band_rows >= 0,
               fmt::format("tile schedule: grid {}x{} in tiles {}x{}, bands of {} rows (need positive; bands >= 0)",
                           s.rows, s.cols, s.tile_rows, s.tile_cols, s.band_rows));
}

// Bands that change nothing (one band, or bands that are whole row blocks) are stored as 0,
// so equal grids compare equal and keep their closed form.
int64_t effective_band(int64_t band_rows, int64_t rows, int64_t tile_rows) {
  return band_rows <= 0 || band_rows >= rows || band_rows % tile_rows == 0 ? 0 : band_rows;
}

}  // namespace

int TileSchedule::tiles_m() const {
  if (tile_rows < 1) return 0;
  if (band_rows <= 0) return static_cast<int>((rows + tile_rows - 1) / tile_rows);
  const int64_t per_band = (band_rows + tile_rows - 1) / tile_rows;
  const int64_t rest = rows % band_rows;
  return static_cast<int>(rows / band_rows * per_band + (rest + tile_rows - 1) / tile_rows);
}

std::pair<int64_t, int64_t> TileSchedule::block_rows(int m) const {
  if (band_rows <= 0) {
    const int64_t a = int64_t{m} * tile_rows;
    return {a, std::min(rows, a + tile_rows)};
  }
  const int64_t per_band = (band_rows + tile_rows - 1) / tile_rows;
  const int64_t band0 = m / per_band * band_rows;
  const int64_t a = band0 + m % per_band * tile_rows;
  return {a, std::min({rows, band0 + band_rows, a + tile_rows})};
}

int TileSchedule::block_of(int64_t row) const {
  if (band_rows <= 0) return static_cast<int>(row / tile_rows);
  const int64_t per_band = (band_rows + tile_rows - 1) / tile_rows;
  return static_cast<int>(row / band_rows * per_band + row % band_rows / tile_rows);
}

TileSchedule gemm_schedule(const CommPlan& plan, const std::string& tensor, int64_t cols, int64_t tile_rows,
                           int64_t tile_cols, int64_t band_rows) {
  const int t = plan.tensor_id(tensor);
  WEFT_REQUIRE(t >= 0, fmt::format("tile schedule: plan {} has no tensor '{}'", plan.name, tensor));
  TileSchedule s;
  s.world = plan.world;
  s.tensor = tensor;
  s.rows = plan.tensors[static_cast<size_t>(t)].rows;
  s.cols = cols;
  s.tile_rows = tile_rows;
  s.tile_cols = tile_cols;
  s.band_rows = band_rows;
  check_geometry(s);
  s.band_rows = effective_band(band_rows, s.rows, tile_rows);
  s.order.resize(static_cast<size_t>(plan.world));
  for (auto& o : s.order)
    for (int m = 0; m < s.tiles_m(); ++m)
      for (int n = 0; n < s.tiles_n(); ++n) o.push_back(Tile{m, n, {}, m});
  s.counters.assign(static_cast<size_t>(s.tiles_m()), s.tiles_n());
  attach_waits(s, plan);
  return s;
}

TileSchedule row_schedule(const CommPlan& plan, const std::string& tensor, int64_t tile_rows) {
  return gemm_schedule(plan, tensor, 1, tile_rows, 1);
}

void attach_waits(TileSchedule& s, const CommPlan& plan) {
  const int t = plan.tensor_id(s.tensor);
  WEFT_REQUIRE(t >= 0, fmt::format("tile schedule: plan {} has no tensor '{}'", plan.name, s.tensor));
  WEFT_REQUIRE(s.order.size() == static_cast<size_t>(plan.world),
               fmt::format("tile schedule for {} ranks, plan {} for {}", s.order.size(), plan.name, plan.world));
  check_geometry(s);
  for (const ColumnRead& cr : s.column_reads)
    WEFT_REQUIRE(plan.tensor_id(cr.tensor) >= 0,
                 fmt::format("tile schedule: plan {} has no tensor '{}' (a column read)", plan.name, cr.tensor));
  for (int r = 0; r < plan.world; ++r) {
    const auto w = writers(plan, t, r);
    const auto cw = column_writers(plan, s, r);
    // Waits depend on the row block (and the column block, with column reads) only: compute
    // them once per block.
    std::map<std::pair<int, int>, std::vector<TileWait>> by_block;
    for (Tile& tile : s.order[static_cast<size_t>(r)]) {
      const std::pair<int, int> key{tile.m, cw.empty() ? 0 : tile.n};
      auto it = by_block.find(key);
      if (it == by_block.end()) {
        const auto [a, b] = block_rows(s, tile.m);
        std::set<int> sigs;
        for (const Transfer* x : w)
          if (x->dst.region.row_begin < b && a < x->dst.region.row_end && x->signal.rank == r)
            sigs.insert(x->signal.index);
        const auto [c0, c1] = block_cols(s, tile.n);
        for (const auto& [xs, transposed] : cw)
          for (const Transfer* x : xs) {
            const auto [g0, g1] = grid_cols(*x, transposed);
            if (g0 < c1 && c0 < g1 && x->signal.rank == r) sigs.insert(x->signal.index);
          }
        std::vector<TileWait> waits;
        for (int sig : sigs) {
          const Signal* d = plan.find_signal(r, sig);
          waits.push_back(TileWait{sig, d ? d->expected : 0});
        }
        it = by_block.emplace(key, std::move(waits)).first;
      }
      tile.waits = it->second;
    }
  }
}

std::unordered_map<int64_t, int> chain_depth(const CommPlan& plan) {
  const auto ix = index_chunks(plan);
  std::unordered_map<int64_t, int> depth, pending;
  std::unordered_map<int64_t, std::vector<int64_t>> users;
  std::vector<int64_t> ready;
  for (const auto& [id, w] : ix) {
    int n = 0;
    for (int64_t d : w.t->deps)
      if (ix.count(d)) {
        users[d].push_back(id);
        ++n;
      }
    pending[id] = n;
    if (!n) ready.push_back(id);
  }
  for (int64_t id : ready) depth[id] = 0;
  while (!ready.empty()) {
    const int64_t id = ready.back();
    ready.pop_back();
    for (int64_t u : users[id]) {
      depth[u] = std::max(depth[u], depth[id] + 1);
      if (--pending[u] == 0) ready.push_back(u);
    }
  }
  for (const auto& [id, n] : pending)
    if (n) depth[id] = INT32_MAX;
  return depth;
}

void order_by_arrival(TileSchedule& s, const CommPlan& plan) {
  const auto ix = index_chunks(plan);
  const auto depth = chain_depth(plan);
  using Key = std::pair<int, int>;                // (depth, position in the issuing queue)
  std::map<std::pair<int, int>, Key> signal_key;  // latest arrival among a signal's chunks
  for (const auto& [id, w] : ix) {
    if (w.t->signal.rank < 0) continue;
    const Key k{depth.at(id), w.pos};
    auto& cur = signal_key[{w.t->signal.rank, w.t->signal.index}];
    cur = std::max(cur, k);
  }
  for (size_t r = 0; r < s.order.size(); ++r) {
    auto key = [&](const Tile& t) {
      Key k{-1, -1};
      for (const auto& w : t.waits) {
        auto it = signal_key.find({static_cast<int>(r), w.signal});
        if (it != signal_key.end()) k = std::max(k, it->second);
      }
      return k;
    };
    std::stable_sort(s.order[r].begin(), s.order[r].end(),
                     [&](const Tile& a, const Tile& b) { return key(a) < key(b); });
  }
}

void rotate_by_rank(TileSchedule& s) {
  const int tm = s.tiles_m();
  for (size_t r = 0; r < s.order.size(); ++r) {
    const int off = static_cast<int>(int64_t(r) * tm / std::max(s.world, 1));
    std::stable_sort(s.order[r].begin(), s.order[r].end(),
                     [&](const Tile& a, const Tile& b) { return (a.m - off + tm) % tm < (b.m - off + tm) % tm; });
  }
}

void swizzle(TileSchedule& s, int group) {
  WEFT_REQUIRE(group >= 1, fmt::format("swizzle group {} (need >= 1)", group));
  for (auto& o : s.order) {
    // Row blocks numbered by first appearance in the current order.
    std::unordered_map<int, int> idx;
    for (const Tile& t : o) idx.emplace(t.m, static_cast<int>(idx.size()));
    auto key = [&](const Tile& t) {
      const int i = idx[t.m];
      return std::make_tuple(i / group, t.n, i % group);
    };
    std::stable_sort(o.begin(), o.end(), [&](const Tile& a, const Tile& b) { return key(a) < key(b); });
  }
}

void split_chunks(TileSchedule& s, CommPlan& plan, int splits) {
  plan = split_chunks(plan, splits);
  attach_waits(s, plan);
}

VerifyResult verify_schedule(const CommPlan& plan, const TileSchedule& s, const ScheduleVerifyOptions& opt) {
  VerifyResult res;
  auto add = [&](std::string m) {
    res.ok = false;
    if (res.messages.size() < std::max<size_t>(opt.max_messages, 1)) res.messages.push_back(std::move(m));
  };
  const int t = plan.tensor_id(s.tensor);
  if (t < 0) add(fmt::format("the schedule waits for tensor '{}', which plan {} does not have", s.tensor, plan.name));
  if (s.world != plan.world || s.order.size() != static_cast<size_t>(plan.world) ||
      plan.queues.size() != static_cast<size_t>(plan.world))
    add(fmt::format("the schedule is for {} ranks, plan {} for {}", s.order.size(), plan.name, plan.world));
  if (s.rows < 1 || s.cols < 1 || s.tile_rows < 1 || s.tile_cols < 1 || s.band_rows < 0)
    add(fmt::format("grid {}x{} in tiles {}x{}, bands of {} rows (need positive; bands >= 0)", s.rows, s.cols,
                    s.tile_rows, s.tile_cols, s.band_rows));
  else if (t >= 0 && plan.tensors[static_cast<size_t>(t)].rows != s.rows)
    add(fmt::format("the schedule has {} rows, tensor '{}' {}", s.rows, s.tensor,
                    plan.tensors[static_cast<size_t>(t)].rows));
  for (const ColumnRead& cr : s.column_reads) {
    const int ct = plan.tensor_id(cr.tensor);
    if (ct < 0) {
      add(fmt::format("the schedule's tiles read columns of tensor '{}', which plan {} does not have", cr.tensor,
                      plan.name));
      continue;
    }
    const Tensor& x = plan.tensors[static_cast<size_t>(ct)];
    const int64_t extent = cr.transposed ? x.rows : x.cols;
    if (extent != s.cols)
      add(fmt::format("the schedule has {} columns, tensor '{}' (a {}column read) {}", s.cols, cr.tensor,
                      cr.transposed ? "transposed " : "", extent));
  }
  if (!res.ok) return res;

  const int tm = s.tiles_m(), tn = s.tiles_n();
  std::map<std::pair<int, int>, std::vector<int>> bumpers;  // (rank, signal) -> dense chunk indices
  std::vector<const Transfer*> xs;
  std::vector<int> exec;
  std::unordered_map<int64_t, int> dense;
  for (size_t r = 0; r < plan.queues.size(); ++r)
    for (const auto& x : plan.queues[r]) {
      dense.emplace(x.chunk, static_cast<int>(xs.size()));
      if (x.signal.rank >= 0) bumpers[{x.signal.rank, x.signal.index}].push_back(static_cast<int>(xs.size()));
      xs.push_back(&x);
      exec.push_back(static_cast<int>(r));
    }

  ProgressGraph g;
  g.queues.resize(2 * static_cast<size_t>(plan.world));
  g.workers.resize(2 * static_cast<size_t>(plan.world));
  for (int r = 0; r < plan.world; ++r) {
    g.names.push_back(fmt::format("rank {}", r));
    g.workers[static_cast<size_t>(r)] = opt.comm_workers;
    g.workers[static_cast<size_t>(plan.world + r)] = opt.tile_workers;
  }
  for (int r = 0; r < plan.world; ++r) g.names.push_back(fmt::format("rank {} tiles", r));
  // Transfers: effective deps as in verify().
  for (size_t i = 0; i < xs.size(); ++i) {
    g.queues[static_cast<size_t>(exec[i])].push_back(static_cast<int>(i));
    std::set<int> eff;
    for (int64_t d : xs[i]->deps) {
      auto it = dense.find(d);
      if (it == dense.end()) continue;
      const Transfer* dt = xs[static_cast<size_t>(it->second)];
      if (dt->signal.rank == exec[i])
        for (int j : bumpers[{dt->signal.rank, dt->signal.index}]) eff.insert(j);
    }
    g.deps.emplace_back(eff.begin(), eff.end());
  }
  std::vector<std::string> item_names;
  for (const Transfer* x : xs) item_names.push_back(fmt::format("chunk {}", x->chunk));

  for (int r = 0; r < plan.world; ++r) {
    const auto& order = s.order[static_cast<size_t>(r)];
    std::vector<int> seen(static_cast<size_t>(tm) * tn, 0);
    std::vector<int64_t> notifies(s.counters.size(), 0);
    const auto w = writers(plan, t, r);
    const auto cw = column_writers(plan, s, r);
    for (const Tile& tile : order) {
      const std::string who = tile_name(tile, r);
      if (tile.m < 0 || tile.m >= tm || tile.n < 0 || tile.n >= tn) {
        add(fmt::format("{} is outside the {}x{} grid of tiles", who, tm, tn));
        continue;
      }
      if (++seen[static_cast<size_t>(tile.m) * tn + tile.n] == 2) add(fmt::format("{} is scheduled twice", who));
      std::set<int> waited;
      std::set<int> deps;
      for (const TileWait& wt : tile.waits) {
        waited.insert(wt.signal);
        const Signal* d = plan.find_signal(r, wt.signal);
        if (!d) {
          add(fmt::format("{} waits for signal {}, which the plan does not declare on rank {}", who, wt.signal, r));
          continue;
        }
        int64_t reach = 0;
        for (int j : bumpers[{r, wt.signal}]) {
          reach += xs[static_cast<size_t>(j)]->increment;
          deps.insert(j);
        }
        if (wt.threshold != reach)
          add(fmt::format("{}: threshold {} but {} notifies reach signal {} on rank {}", who, wt.threshold, reach,
                          wt.signal, r));
      }
      // A writer is waited for directly (its signal) or through a chunk that waits for it: it
      // happens before a chunk whose signal the tile waits for (effective deps, transitively:
      // release/acquire is cumulative). E.g. a ring's first copy into a rank's output, which the
      // reduce hops that follow it wait for.
      std::vector<char> before;  // dense index -> happens before a waited chunk (filled on demand)
      auto covered = [&](const Transfer* x) {
        if (x->signal.rank == r && waited.count(x->signal.index)) return true;
        if (before.empty()) {
          before.assign(xs.size(), 0);
          std::vector<int> stack(deps.begin(), deps.end());
          while (!stack.empty()) {
            const int j = stack.back();
            stack.pop_back();
            for (int d : g.deps[static_cast<size_t>(j)])
              if (!before[static_cast<size_t>(d)]) {
                before[static_cast<size_t>(d)] = 1;
                stack.push_back(d);
              }
          }
        }
        return before[static_cast<size_t>(dense.at(x->chunk))] != 0;
      };
      const auto [a, b] = block_rows(s, tile.m);
      for (const Transfer* x : w)
        if (x->dst.region.row_begin < b && a < x->dst.region.row_end && !covered(x))
          add(fmt::format("{} reads rows [{},{}) of '{}' that chunk {} writes, but does not wait for it", who,
                          std::max(a, x->dst.region.row_begin), std::min(b, x->dst.region.row_end), s.tensor,
                          x->chunk));
      const auto [c0, c1] = block_cols(s, tile.n);
      for (size_t k = 0; k < cw.size(); ++k)
        for (const Transfer* x : cw[k].first) {
          const auto [g0, g1] = grid_cols(*x, cw[k].second);
          if (g0 < c1 && c0 < g1 && !covered(x))
            add(fmt::format("{} reads grid columns [{},{}) of '{}' ({}) that chunk {} writes, but does not wait for it",
                            who, std::max(c0, g0), std::min(c1, g1), s.column_reads[k].tensor,
                            cw[k].second ? "its rows" : "its columns", x->chunk));
        }
      if (tile.notify >= 0 && static_cast<size_t>(tile.notify) < notifies.size())
        ++notifies[static_cast<size_t>(tile.notify)];
      else if (tile.notify != -1)
        add(fmt::format("{} notifies counter {}, but the schedule has {} counters", who, tile.notify,
                        s.counters.size()));
      g.queues[static_cast<size_t>(plan.world + r)].push_back(static_cast<int>(g.deps.size()));
      g.deps.emplace_back(deps.begin(), deps.end());
      item_names.push_back(who);
    }
    for (int m = 0; m < tm; ++m)
      for (int n = 0; n < tn; ++n)
        if (!seen[static_cast<size_t>(m) * tn + n])
          add(fmt::format("tile ({},{}) on rank {} is never scheduled", m, n, r));
    for (size_t c = 0; c < s.counters.size(); ++c)
      if (notifies[c] != s.counters[c])
        add(fmt::format("threshold {} but {} notifies reach counter {} on rank {}", s.counters[c], notifies[c], c, r));
  }
  if (!res.ok) return res;
  auto plural = [](int w, const char* what) {
    return w <= 0 ? fmt::format("unlimited {} workers", what)
                  : fmt::format("{} {} worker{} per rank", w, what, w == 1 ? "" : "s");
  };
  const std::string dead = simulate_progress(
      g, [&](int i) { return item_names[static_cast<size_t>(i)]; },
      plural(opt.comm_workers, "transfer") + " and " + plural(opt.tile_workers, "tile"));
  if (!dead.empty()) add(dead);
  return res;
}

// ---- lowering ----------------------------------------------------------------------------

std::pair<int, int> ClosedForm::tile_at(int rank, int k) const {
  const int per_group = group * tiles_n;
  const int g = k / per_group;
  const int first = g * group;
  const int gsize = std::min(group, tiles_m - first);
  const int within = k % per_group;
  const int mp = first + within % gsize;
  const int n = within / gsize;
  return {(mp + first_block[static_cast<size_t>(rank)]) % tiles_m, n};
}

std::pair<int, int> ClosedForm::waits_of(int m, int64_t rows) const {
  const int64_t a = int64_t{m} * tile_rows;
  const int64_t b = std::min(rows, a + tile_rows);
  return {static_cast<int>(a / rows_per_signal), static_cast<int>((b - 1) / rows_per_signal)};
}

namespace {

std::optional<ClosedForm> find_closed_form(const TileSchedule& s, const Lowered& L, const CommPlan& plan, int t) {
  if (s.band_rows != 0) return std::nullopt;  // the formula has uniform row blocks
  if (!s.column_reads.empty()) return std::nullopt;  // its waits follow the rows alone
  ClosedForm f;
  f.tiles_m = s.tiles_m();
  f.tiles_n = s.tiles_n();
  f.tile_rows = s.tile_rows;
  if (L.ranks.empty() || L.ranks[0].tiles.empty()) return std::nullopt;
  for (const auto& lr : L.ranks) f.first_block.push_back(lr.tiles.front().m);
  f.group = 1;
  if (f.tiles_n > 1) {
    f.group = 0;
    while (f.group < static_cast<int>(L.ranks[0].tiles.size()) && L.ranks[0].tiles[static_cast<size_t>(f.group)].n == 0)
      ++f.group;
  }
  // Rows guarded by lowered signal 0 on rank 0: the chunk row count of a uniform split.
  int64_t lo = INT64_MAX, hi = -1;
  const LoweredRank& l0 = L.ranks[0];
  for (const auto& q : plan.queues)
    for (const auto& x : q)
      if (x.dst.rank == 0 && x.dst.tensor == t && x.signal.rank == 0 && x.signal.index >= 0 &&
          static_cast<size_t>(x.signal.index) < l0.signal_map.size() &&
          l0.signal_map[static_cast<size_t>(x.signal.index)] == 0) {
        lo = std::min(lo, x.dst.region.row_begin);
        hi = std::max(hi, x.dst.region.row_end);
      }
  if (lo != 0 || hi <= 0) return std::nullopt;
  f.rows_per_signal = hi;
  if (l0.tile_waits.empty()) return std::nullopt;
  f.threshold = l0.tile_waits.front().threshold;
  for (size_t r = 0; r < L.ranks.size(); ++r) {
    const LoweredRank& lr = L.ranks[r];
    for (size_t k = 0; k < lr.tiles.size(); ++k) {
      const TileEntry& e = lr.tiles[k];
      if (f.tile_at(static_cast<int>(r), static_cast<int>(k)) != std::make_pair(e.m, e.n) || e.notify != e.m)
        return std::nullopt;
      const auto [a, b] = f.waits_of(e.m, s.rows);
      if (e.wait_count != b - a + 1) return std::nullopt;
      for (int j = 0; j < e.wait_count; ++j) {
        const WaitEntry& w = lr.tile_waits[static_cast<size_t>(e.wait_begin + j)];
        if (w.signal != a + j || w.threshold != f.threshold) return std::nullopt;
      }
    }
  }
  return f;
}

}  // namespace

namespace {

// The tables between transfers and tiles, and around the output: counter waits of transfers
// that read rows tiles write (tiles_write), the ranks each counter is notified on, the final
// waits of outputs that other ranks write, and each signal's producer.
void lower_dependencies(const CommPlan& plan, const TileSchedule& s, int t, Lowered& L) {
  const int w = plan.world;
  const auto ncounters = static_cast<int>(s.counters.size());
  // covering[r][m]: counters of rank r's tiles in row block m.
  std::vector<std::vector<std::set<int>>> covering(static_cast<size_t>(w),
                                                   std::vector<std::set<int>>(static_cast<size_t>(s.tiles_m())));
  for (int r = 0; r < w; ++r)
    for (const Tile& tile : s.order[static_cast<size_t>(r)])
      if (tile.notify >= 0) covering[static_cast<size_t>(r)][static_cast<size_t>(tile.m)].insert(tile.notify);
  // consumers[r][c]: ranks other than r whose transfers wait for counter c of rank r.
  std::vector<std::vector<std::set<int>>> consumers(static_cast<size_t>(w),
                                                    std::vector<std::set<int>>(static_cast<size_t>(ncounters)));
  for (int r = 0; r < w; ++r) {
    LoweredRank& lr = L.ranks[static_cast<size_t>(r)];
    lr.counter_wait_begin.push_back(0);
    for (const TransferDesc& d : lr.transfers) {
      if (s.tiles_write && d.src_tensor == t && d.rows > 0) {
        const int m0 = s.block_of(d.src_row);
        const int m1 = std::min(s.block_of(d.src_row + d.rows - 1), s.tiles_m() - 1);
        std::set<int> cs;
        for (int m = m0; m <= m1; ++m)
          for (int c : covering[static_cast<size_t>(d.src_rank)][static_cast<size_t>(m)]) cs.insert(c);
        for (int c : cs) {
          lr.counter_waits.push_back(CounterWait{d.src_rank, c, s.counters[static_cast<size_t>(c)]});
          if (d.src_rank != r) consumers[static_cast<size_t>(d.src_rank)][static_cast<size_t>(c)].insert(r);
        }
      }
      lr.counter_wait_begin.push_back(static_cast<int32_t>(lr.counter_waits.size()));
    }
  }
  std::vector<std::set<int32_t>> finals(static_cast<size_t>(w));
  for (int r = 0; r < w; ++r) {
    LoweredRank& lr = L.ranks[static_cast<size_t>(r)];
    lr.notify_begin.push_back(0);
    for (int c = 0; c < ncounters; ++c) {
      for (int q : consumers[static_cast<size_t>(r)][static_cast<size_t>(c)]) lr.notify_ranks.push_back(q);
      lr.notify_begin.push_back(static_cast<int32_t>(lr.notify_ranks.size()));
    }
    lr.signal_producer.assign(lr.signal_expected.size(), -2);
  }
  for (int x = 0; x < w; ++x)
    for (const TransferDesc& d : L.ranks[static_cast<size_t>(x)].transfers) {
      if (d.signal_rank >= 0) {
        int32_t& pr = L.ranks[static_cast<size_t>(d.signal_rank)].signal_producer[static_cast<size_t>(d.signal)];
        pr = pr == -2 || pr == x ? x : -1;
      }
      // A rank's own transfers into its output are done when it is; tiles wait for what they
      // read; every other write into an output needs a signal on the output's rank.
      const Tensor& dt = plan.tensors[static_cast<size_t>(d.dst_tensor)];
      if (dt.role != Role::kOutput || d.dst_rank == x || (d.dst_tensor == t && !s.tiles_write)) continue;
      WEFT_REQUIRE(d.signal_rank == d.dst_rank,
                   fmt::format("lower: plan {}: chunk {} writes output '{}' of rank {} but signals rank {}: nothing "
                               "tells rank {} when its output is complete",
                               plan.name, d.chunk, dt.name, d.dst_rank, d.signal_rank, d.dst_rank));
      finals[static_cast<size_t>(d.dst_rank)].insert(d.signal);
    }
  for (int r = 0; r < w; ++r) {
    LoweredRank& lr = L.ranks[static_cast<size_t>(r)];
    for (int32_t& pr : lr.signal_producer)
      if (pr == -2) pr = -1;
    for (int32_t g : finals[static_cast<size_t>(r)])
      lr.final_waits.push_back(WaitEntry{g, 0, lr.signal_expected[static_cast<size_t>(g)]});
  }
}

}  // namespace

Lowered lower(const CommPlan& plan, const TileSchedule& s) {
  const int t = plan.tensor_id(s.tensor);
  WEFT_REQUIRE(t >= 0, fmt::format("lower: plan {} has no tensor '{}'", plan.name, s.tensor));
  WEFT_REQUIRE(
      s.order.size() == static_cast<size_t>(plan.world) && plan.queues.size() == static_cast<size_t>(plan.world),
      fmt::format("lower: schedule for {} ranks, plan {} for {}", s.order.size(), plan.name, plan.world));
  const auto ix = index_chunks(plan);
  Lowered L;
  L.world = plan.world;
  L.counters = s.counters;
  L.ranks.resize(static_cast<size_t>(plan.world));

  // Renumber each rank's signals: those that guard rows of the tensor first, by row.
  for (int r = 0; r < plan.world; ++r) {
    LoweredRank& lr = L.ranks[static_cast<size_t>(r)];
    std::map<int, int64_t> guard_row;  // signal -> first row it guards on this rank
    for (const auto& q : plan.queues)
      for (const auto& x : q)
        if (x.dst.rank == r && x.dst.tensor == t && x.signal.rank == r) {
          auto [it, fresh] = guard_row.emplace(x.signal.index, x.dst.region.row_begin);
          if (!fresh) it->second = std::min(it->second, x.dst.region.row_begin);
        }
    std::vector<std::tuple<int, int64_t, int>> keyed;  // (group, row, old index)
    int max_index = -1;
    for (const auto& g : plan.signals)
      if (g.rank == r) {
        auto it = guard_row.find(g.index);
        keyed.emplace_back(it == guard_row.end() ? 1 : 0, it == guard_row.end() ? 0 : it->second, g.index);
        max_index = std::max(max_index, g.index);
      }
    std::sort(keyed.begin(), keyed.end());
    lr.signal_map.assign(static_cast<size_t>(max_index + 1), -1);
    lr.signal_expected.resize(keyed.size());
    for (size_t k = 0; k < keyed.size(); ++k) {
      const int old = std::get<2>(keyed[k]);
      lr.signal_map[static_cast<size_t>(old)] = static_cast<int32_t>(k);
      lr.signal_expected[k] = plan.find_signal(r, old)->expected;
    }
  }
  auto mapped = [&](int rank, int index) {
    const auto& m = L.ranks[static_cast<size_t>(rank)].signal_map;
    WEFT_REQUIRE(index >= 0 && static_cast<size_t>(index) < m.size() && m[static_cast<size_t>(index)] >= 0,
                 fmt::format("lower: signal {} on rank {} is not declared", index, rank));
    return m[static_cast<size_t>(index)];
  };

  for (int r = 0; r < plan.world; ++r) {
    LoweredRank& lr = L.ranks[static_cast<size_t>(r)];
    for (const Tile& tile : s.order[static_cast<size_t>(r)]) {
      TileEntry e{tile.m, tile.n, static_cast<int32_t>(lr.tile_waits.size()), 0, tile.notify, 0};
      std::vector<WaitEntry> ws;
      for (const TileWait& w : tile.waits) ws.push_back(WaitEntry{mapped(r, w.signal), 0, w.threshold});
      std::sort(ws.begin(), ws.end(), [](const WaitEntry& a, const WaitEntry& b) { return a.signal < b.signal; });
      e.wait_count = static_cast<int32_t>(ws.size());
      lr.tile_waits.insert(lr.tile_waits.end(), ws.begin(), ws.end());
      lr.tiles.push_back(e);
    }
    for (const Transfer& x : plan.queues[static_cast<size_t>(r)]) {
      TransferDesc d{};
      d.chunk = x.chunk;
      d.kind = static_cast<int32_t>(x.kind);
      d.engine = static_cast<int32_t>(x.engine);
      d.src_rank = x.src.rank;
      d.src_tensor = x.src.tensor;
      d.dst_rank = x.dst.rank;
      d.dst_tensor = x.dst.tensor;
      d.src_row = x.src.region.row_begin;
      d.src_col = x.src.region.col_begin;
      d.dst_row = x.dst.region.row_begin;
      d.dst_col = x.dst.region.col_begin;
      d.rows = x.src.region.rows();
      d.cols = x.src.region.cols();
      d.signal_rank = x.signal.rank;
      d.signal = x.signal.rank >= 0 ? mapped(x.signal.rank, x.signal.index) : -1;
      d.increment = x.increment;
      // A transfer waits, on its own rank, for the whole total of each signal its deps bump.
      std::set<int> sigs;
      for (int64_t dep : x.deps) {
        auto it = ix.find(dep);
        WEFT_REQUIRE(it != ix.end(), fmt::format("lower: chunk {} depends on unknown chunk {}", x.chunk, dep));
        const Transfer* dt = it->second.t;
        WEFT_REQUIRE(dt->signal.rank == r, fmt::format("lower: chunk {} on rank {} depends on chunk {}, which does not "
                                                       "signal rank {}",
                                                       x.chunk, r, dep, r));
        sigs.insert(mapped(r, dt->signal.index));
      }
      d.wait_begin = static_cast<int32_t>(lr.transfer_waits.size());
      d.wait_count = static_cast<int32_t>(sigs.size());
      for (int g : sigs) lr.transfer_waits.push_back(WaitEntry{g, 0, lr.signal_expected[static_cast<size_t>(g)]});
      lr.transfers.push_back(d);
    }
  }
  lower_dependencies(plan, s, t, L);
  L.closed = find_closed_form(s, L, plan, t);
  return L;
}

int32_t Lowered::max_signals() const {
  int32_t n = 1;
  for (const LoweredRank& lr : ranks) n = std::max(n, static_cast<int32_t>(lr.signal_expected.size()));
  return n;
}

}  // namespace weft::plan
