#include "weft/plan/verify.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <queue>
#include <set>
#include <unordered_map>

#include "weft/core/error.hpp"
#include "weft/plan/progress.hpp"

namespace weft::plan {
namespace {

// Beyond these the verifier skips the element checks (and says so in a message): the
// happens-before sets grow with chunks squared, the cells with the grid.
constexpr size_t kMaxRaceCheckChunks = 16384;
constexpr size_t kMaxCellValues = size_t{1} << 26;
constexpr int kMaxWorld = 4096;
// Keeps sums of increments clear of int64 overflow: 2^40 per transfer leaves room for 2^23 transfers.
constexpr int64_t kMaxCount = int64_t{1} << 40;

struct Sink {
  VerifyResult& res;
  size_t max;
  size_t dropped = 0;
  void add(std::string m) {
    res.ok = false;
    if (res.messages.size() < max)
      res.messages.push_back(std::move(m));
    else
      ++dropped;
  }
  void finish() {
    if (dropped) res.messages.push_back(fmt::format("... and {} more problems", dropped));
  }
};

std::string region_str(const Region& g) {
  return fmt::format("rows [{},{}) cols [{},{})", g.row_begin, g.row_end, g.col_begin, g.col_end);
}

std::string endpoint_str(const CommPlan& p, int rank, int tensor, const Region& g) {
  return fmt::format("rank {} tensor '{}' {}", rank, p.tensors[static_cast<size_t>(tensor)].name, region_str(g));
}

std::string chunk_list(const std::vector<int64_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size() && i < 8; ++i) s += fmt::format("{}{}", i ? ", " : "", ids[i]);
  if (ids.size() > 8) s += fmt::format(", ... ({} in all)", ids.size());
  return s;
}

// The transfers in queue-major order: dense index i <-> (rank, position).
struct Index {
  std::vector<const Transfer*> xs;
  std::vector<int> exec;
  std::unordered_map<int64_t, int> of;
};

bool check_structure(const CommPlan& p, const Index& ix, Sink& sink) {
  const size_t before = sink.res.messages.size() + sink.dropped;
  if (p.world < 1 || p.world > kMaxWorld) {
    sink.add(fmt::format("world size {} (need 1..{})", p.world, kMaxWorld));
    return false;
  }
  if (p.queues.size() != static_cast<size_t>(p.world))
    sink.add(fmt::format("plan has {} rank queues for world size {}", p.queues.size(), p.world));
  for (size_t i = 0; i < p.tensors.size(); ++i) {
    const auto& t = p.tensors[i];
    if (t.rows < 1 || t.cols < 1 || t.elem_bytes < 1)
      sink.add(fmt::format("tensor '{}' has shape {}x{} with {}-byte elements (need positive)", t.name, t.rows, t.cols,
                           t.elem_bytes));
    if (!t.valid_rows.empty() && t.valid_rows.size() != static_cast<size_t>(p.world))
      sink.add(fmt::format("tensor '{}' lists valid rows for {} ranks, world size is {}", t.name, t.valid_rows.size(),
                           p.world));
    for (size_t r = 0; r < t.valid_rows.size(); ++r)
      if (t.valid_rows[r] < 0 || t.valid_rows[r] > t.rows)
        sink.add(
            fmt::format("tensor '{}' valid rows {} on rank {} outside [0,{}]", t.name, t.valid_rows[r], r, t.rows));
    for (size_t j = 0; j < i; ++j)
      if (p.tensors[j].name == t.name) sink.add(fmt::format("tensor '{}' declared twice", t.name));
  }
  std::set<std::pair<int, int>> seen;
  for (const auto& s : p.signals) {
    if (s.rank < 0 || s.rank >= p.world || s.index < 0)
      sink.add(fmt::format("signal {} on rank {} is outside the world of {} ranks", s.index, s.rank, p.world));
    if (!seen.insert({s.rank, s.index}).second)
      sink.add(fmt::format("signal {} on rank {} declared twice", s.index, s.rank));
    if (s.expected < 0 || s.expected > kMaxCount)
      sink.add(fmt::format("signal {} on rank {} expects {} notifies (need 0..2^40)", s.index, s.rank, s.expected));
  }
  for (size_t i = 0; i < ix.xs.size(); ++i) {
    const Transfer& t = *ix.xs[i];
    const int e = ix.exec[i];
    const std::string who = fmt::format("chunk {} on rank {}", t.chunk, e);
    if (ix.of.at(t.chunk) != static_cast<int>(i)) sink.add(fmt::format("{}: chunk id {} used twice", who, t.chunk));
    bool ends_ok = true;
    for (const Endpoint* ep : {&t.src, &t.dst}) {
      const char* end = ep == &t.src ? "source" : "destination";
      if (ep->rank < 0 || ep->rank >= p.world) {
        sink.add(fmt::format("{}: {} rank {} outside the world of {} ranks", who, end, ep->rank, p.world));
        ends_ok = false;
        continue;
      }
      if (ep->tensor < 0 || static_cast<size_t>(ep->tensor) >= p.tensors.size()) {
        sink.add(fmt::format("{}: {} tensor {} does not exist", who, end, ep->tensor));
        ends_ok = false;
        continue;
      }
      const auto& tn = p.tensors[static_cast<size_t>(ep->tensor)];
      const Region& g = ep->region;
      if (g.row_begin < 0 || g.col_begin < 0 || g.row_end > tn.rows || g.col_end > tn.cols || g.empty()) {
        sink.add(fmt::format("{}: {} {} is empty or outside tensor '{}' ({}x{})", who, end, region_str(g), tn.name,
                             tn.rows, tn.cols));
        ends_ok = false;
      }
    }
    if (ends_ok) {
      if (t.src.region.rows() != t.dst.region.rows() || t.src.region.cols() != t.dst.region.cols())
        sink.add(fmt::format("{}: source {} and destination {} differ in shape", who, region_str(t.src.region),
                             region_str(t.dst.region)));
      if (p.tensors[static_cast<size_t>(t.dst.tensor)].role == Role::kInput)
        sink.add(fmt::format("{}: writes input tensor '{}'", who, p.tensors[static_cast<size_t>(t.dst.tensor)].name));
    }
    const bool exec_ok = (t.kind == Kind::kPush && t.src.rank == e) || (t.kind == Kind::kPull && t.dst.rank == e) ||
                         (t.kind == Kind::kReduce && (t.src.rank == e || t.dst.rank == e)) ||
                         (t.kind == Kind::kCopy && t.src.rank == e && t.dst.rank == e);
    if (!exec_ok)
      sink.add(fmt::format("{}: a {} from rank {} to rank {} cannot run on rank {}", who, to_string(t.kind), t.src.rank,
                           t.dst.rank, e));
    if (t.signal.rank != -1 && (t.signal.rank < 0 || t.signal.rank >= p.world || t.signal.index < 0))
      sink.add(fmt::format("{}: bumps signal {} on rank {}, outside the world", who, t.signal.index, t.signal.rank));
    if (t.signal.rank >= 0 && (t.increment < 1 || t.increment > kMaxCount))
      sink.add(fmt::format("{}: bumps its signal by {} (need 1..2^40)", who, t.increment));
    for (int64_t d : t.deps) {
      if (!ix.of.count(d)) sink.add(fmt::format("{}: depends on chunk {}, which does not exist", who, d));
      if (d == t.chunk) sink.add(fmt::format("{}: depends on itself", who));
    }
  }
  return sink.res.messages.size() + sink.dropped == before;
}

// The grid of cells of each tensor: row and column boundaries that every region respects,
// closed under the src <-> dst shift of every transfer (so a cell maps to exactly one cell).
struct Grid {
  std::vector<std::vector<int64_t>> rows, cols;  // per tensor, sorted
};

bool build_grid(const CommPlan& p, const Index& ix, Grid& grid, size_t& cells) {
  const size_t nt = p.tensors.size();
  std::vector<std::set<int64_t>> rb(nt), cb(nt);
  for (size_t i = 0; i < nt; ++i) {
    rb[i] = {0, p.tensors[i].rows};
    cb[i] = {0, p.tensors[i].cols};
    for (int64_t v : p.tensors[i].valid_rows) rb[i].insert(v);
  }
  for (const Transfer* t : ix.xs)
    for (const Endpoint* ep : {&t->src, &t->dst}) {
      rb[static_cast<size_t>(ep->tensor)].insert({ep->region.row_begin, ep->region.row_end});
      cb[static_cast<size_t>(ep->tensor)].insert({ep->region.col_begin, ep->region.col_end});
    }
  // Copy the boundaries inside one end's region to the other end, until nothing changes.
  auto carry = [](const std::set<int64_t>& from, int64_t f0, int64_t f1, std::set<int64_t>& to, int64_t t0) {
    bool changed = false;
    for (auto it = from.upper_bound(f0); it != from.end() && *it < f1; ++it) changed |= to.insert(*it - f0 + t0).second;
    return changed;
  };
  size_t total = 0;
  for (bool changed = true; changed;) {
    changed = false;
    for (const Transfer* t : ix.xs) {
      const auto s = static_cast<size_t>(t->src.tensor), d = static_cast<size_t>(t->dst.tensor);
      const Region &a = t->src.region, &b = t->dst.region;
      changed |= carry(rb[s], a.row_begin, a.row_end, rb[d], b.row_begin);
      changed |= carry(rb[d], b.row_begin, b.row_end, rb[s], a.row_begin);
      changed |= carry(cb[s], a.col_begin, a.col_end, cb[d], b.col_begin);
      changed |= carry(cb[d], b.col_begin, b.col_end, cb[s], a.col_begin);
    }
    total = 0;
    for (size_t i = 0; i < nt; ++i) total += (rb[i].size() - 1) * (cb[i].size() - 1);
    if (total * static_cast<size_t>(p.world) * static_cast<size_t>(p.world) > kMaxCellValues) return false;
  }
  grid.rows.resize(nt);
  grid.cols.resize(nt);
  for (size_t i = 0; i < nt; ++i) {
    grid.rows[i].assign(rb[i].begin(), rb[i].end());
    grid.cols[i].assign(cb[i].begin(), cb[i].end());
  }
  cells = total;
  return true;
}

size_t cell_of(const std::vector<int64_t>& bounds, int64_t v) {
  return static_cast<size_t>(std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin());
}

// Symbolic execution of the plan on cells, in a topological order of the dependencies.
void check_data_flow(const CommPlan& p, const Index& ix, const std::vector<std::vector<int>>& eff, Sink& sink) {
  const size_t n = ix.xs.size();
  if (n > kMaxRaceCheckChunks) {
    sink.res.notes.push_back(
        fmt::format("element checks skipped: {} chunks (the verifier checks up to {})", n, kMaxRaceCheckChunks));
    return;
  }
  Grid grid;
  size_t cells_per_rank = 0;
  if (!build_grid(p, ix, grid, cells_per_rank)) {
    sink.res.notes.push_back("element checks skipped: the regions cut the tensors into too many cells");
    return;
  }
  const size_t W = static_cast<size_t>(p.world);
  // base[rank][tensor]: first cell of that tensor on that rank.
  std::vector<std::vector<size_t>> base(W, std::vector<size_t>(p.tensors.size()));
  size_t total = 0;
  for (size_t r = 0; r < W; ++r)
    for (size_t t = 0; t < p.tensors.size(); ++t) {
      base[r][t] = total;
      total += (grid.rows[t].size() - 1) * (grid.cols[t].size() - 1);
    }
  struct Cell {
    int writes = 0;
    int first_writer = -1;  // dense index
    int last_writer = -1;   // dense index; -1: initial contents
    bool defined = false;
    std::vector<std::pair<int, bool>> since;  // (reader or adder, adds) since the last write
  };
  std::vector<Cell> cell(total);
  std::vector<int> contrib(total * W, 0);  // contrib[c*W + q]: times rank q's contribution is in cell c
  for (size_t r = 0; r < W; ++r)
    for (size_t t = 0; t < p.tensors.size(); ++t)
      if (p.tensors[t].role == Role::kInput) {
        const size_t nc = (grid.rows[t].size() - 1) * (grid.cols[t].size() - 1);
        for (size_t c = 0; c < nc; ++c) {
          cell[base[r][t] + c].defined = true;
          contrib[(base[r][t] + c) * W + r] = 1;
        }
      }
  auto cell_region = [&](size_t t, size_t a, size_t b) {
    return Region::rect(grid.rows[t][a], grid.rows[t][a + 1], grid.cols[t][b], grid.cols[t][b + 1]);
  };

  // Topological order (Kahn), ties broken by queue-major index; ancestors as bitsets.
  std::vector<std::vector<int>> users(n);
  std::vector<int> pending(n, 0);
  for (size_t i = 0; i < n; ++i)
    for (int d : eff[i]) {
      users[static_cast<size_t>(d)].push_back(static_cast<int>(i));
      ++pending[i];
    }
  const size_t words = (n + 63) / 64;
  std::vector<uint64_t> anc(n * words, 0);
  auto is_anc = [&](int a, int of) {  // a happens before `of`
    return a < 0 || ((anc[static_cast<size_t>(of) * words + static_cast<size_t>(a) / 64] >> (a % 64)) & 1u);
  };
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (size_t i = 0; i < n; ++i)
    if (!pending[i]) ready.push(static_cast<int>(i));
  std::vector<int> src_val(W);
  while (!ready.empty()) {
    const int i = ready.top();
    ready.pop();
    const size_t iu = static_cast<size_t>(i);
    for (int d : eff[iu]) {
      const size_t du = static_cast<size_t>(d);
      for (size_t w = 0; w < words; ++w) anc[iu * words + w] |= anc[du * words + w];
      anc[iu * words + du / 64] |= uint64_t{1} << (du % 64);
    }
    for (int u : users[iu])
      if (--pending[static_cast<size_t>(u)] == 0) ready.push(u);

    const Transfer& t = *ix.xs[iu];
    const size_t st = static_cast<size_t>(t.src.tensor), dt = static_cast<size_t>(t.dst.tensor);
    const size_t sr = static_cast<size_t>(t.src.rank), dr = static_cast<size_t>(t.dst.rank);
    const size_t a0 = cell_of(grid.rows[st], t.src.region.row_begin), a1 = cell_of(grid.rows[st], t.src.region.row_end);
    const size_t b0 = cell_of(grid.cols[st], t.src.region.col_begin), b1 = cell_of(grid.cols[st], t.src.region.col_end);
    const int64_t drow = t.dst.region.row_begin - t.src.region.row_begin;
    const int64_t dcol = t.dst.region.col_begin - t.src.region.col_begin;
    const size_t sncols = grid.cols[st].size() - 1, dncols = grid.cols[dt].size() - 1;
    const std::string who = fmt::format("chunk {} (rank {})", t.chunk, ix.exec[iu]);
    // One message per transfer and kind of problem: the first cell names it.
    bool said_undefined = false, said_race = false, said_twice = false;
    for (size_t a = a0; a < a1; ++a)
      for (size_t b = b0; b < b1; ++b) {
        Cell& sc = cell[base[sr][st] + a * sncols + b];
        const size_t da = cell_of(grid.rows[dt], grid.rows[st][a] + drow);
        const size_t db = cell_of(grid.cols[dt], grid.cols[st][b] + dcol);
        const size_t dcell = base[dr][dt] + da * dncols + db;
        Cell& dc = cell[dcell];
        // Read the source.
        if (!sc.defined && !said_undefined) {
          said_undefined = true;
          sink.add(fmt::format("{} reads {} before anything writes it", who,
                               endpoint_str(p, t.src.rank, t.src.tensor, cell_region(st, a, b))));
        }
        if (!said_race) {
          int other = is_anc(sc.last_writer, i) ? -1 : sc.last_writer;
          for (auto [x, adds] : sc.since)
            if (other < 0 && adds && x != i && !is_anc(x, i)) other = x;
          if (other >= 0) {
            said_race = true;
            sink.add(fmt::format("race: {} reads {}, which chunk {} writes, and chunk {} does not wait for it", who,
                                 endpoint_str(p, t.src.rank, t.src.tensor, cell_region(st, a, b)),
                                 ix.xs[static_cast<size_t>(other)]->chunk, t.chunk));
          }
        }
        for (size_t q = 0; q < W; ++q) src_val[q] = contrib[(base[sr][st] + a * sncols + b) * W + q];
        // Adds in `since` matter to a later reader; reads too to a later writer.
        sc.since.push_back({i, false});
        // Write or add into the destination. Every earlier access must happen before.
        if (!said_race) {
          int other = is_anc(dc.last_writer, i) ? -1 : dc.last_writer;
          for (const auto& acc : dc.since)
            if (other < 0 && acc.first != i && !is_anc(acc.first, i)) other = acc.first;
          if (other >= 0) {
            said_race = true;
            sink.add(fmt::format("race: {} {} {}, which chunk {} also accesses, and neither waits for the other", who,
                                 t.kind == Kind::kReduce ? "adds into" : "overwrites",
                                 endpoint_str(p, t.dst.rank, t.dst.tensor, cell_region(dt, da, db)),
                                 ix.xs[static_cast<size_t>(other)]->chunk));
          }
        }
        if (t.kind == Kind::kReduce) {
          if (!dc.defined && !said_undefined) {
            said_undefined = true;
            sink.add(fmt::format("{} adds into {} before anything writes it", who,
                                 endpoint_str(p, t.dst.rank, t.dst.tensor, cell_region(dt, da, db))));
          }
          for (size_t q = 0; q < W; ++q) contrib[dcell * W + q] += src_val[q];
          dc.since.push_back({i, true});
        } else {
          ++dc.writes;
          if (dc.writes == 1) dc.first_writer = i;
          if (dc.writes == 2 && p.tensors[dt].role == Role::kOutput && !said_twice) {
            said_twice = true;
            sink.add(fmt::format("element written twice: {} by chunk {} and chunk {}",
                                 endpoint_str(p, t.dst.rank, t.dst.tensor, cell_region(dt, da, db)),
                                 ix.xs[static_cast<size_t>(dc.first_writer)]->chunk, t.chunk));
          }
          for (size_t q = 0; q < W; ++q) contrib[dcell * W + q] = src_val[q];
          dc.last_writer = i;
          dc.since.clear();
        }
        dc.defined = true;
      }
  }

  // Outputs: every valid element written exactly once, holding the right contributions.
  for (size_t t = 0; t < p.tensors.size(); ++t) {
    const Tensor& tn = p.tensors[t];
    if (tn.role != Role::kOutput) continue;
    const size_t nr = grid.rows[t].size() - 1, nc = grid.cols[t].size() - 1;
    for (size_t r = 0; r < W; ++r) {
      const int64_t valid = tn.valid_rows.empty() ? tn.rows : tn.valid_rows[r];
      for (size_t b = 0; b < nc; ++b) {
        // Merge runs of unwritten cells down a column of cells into one message.
        for (size_t a = 0; a < nr && grid.rows[t][a] < valid;) {
          if (cell[base[r][t] + a * nc + b].writes > 0) {
            ++a;
            continue;
          }
          size_t e = a;
          while (e < nr && grid.rows[t][e] < valid && cell[base[r][t] + e * nc + b].writes == 0) ++e;
          Region g = Region::rect(grid.rows[t][a], grid.rows[t][e], grid.cols[t][b], grid.cols[t][b + 1]);
          sink.add(fmt::format("missing chunk: {} is never written",
                               endpoint_str(p, static_cast<int>(r), static_cast<int>(t), g)));
          a = e;
        }
      }
      for (size_t a = 0; a < nr && grid.rows[t][a] < valid; ++a)
        for (size_t b = 0; b < nc; ++b) {
          const size_t c = base[r][t] + a * nc + b;
          if (cell[c].writes == 0) continue;
          const std::string at = endpoint_str(p, static_cast<int>(r), static_cast<int>(t), cell_region(t, a, b));
          if (tn.sum) {
            for (size_t q = 0; q < W; ++q) {
              const int k = contrib[c * W + q];
              if (k == 0) {
                sink.add(fmt::format("{} lacks the contribution of rank {}", at, q));
                break;
              }
              if (k > 1) {
                sink.add(fmt::format("{} holds the contribution of rank {} {} times (expected once)", at, q, k));
                break;
              }
            }
          } else {
            int k = 0;
            for (size_t q = 0; q < W; ++q) k += contrib[c * W + q];
            if (k != 1)
              sink.add(fmt::format("{} holds {} contributions (expected exactly one: it is not a sum)", at, k));
          }
        }
    }
  }
}

}  // namespace

std::string VerifyResult::text() const {
  std::string s;
  for (const auto& m : messages) s += m + "\n";
  for (const auto& m : notes) s += "note: " + m + "\n";
  return s;
}

VerifyResult verify(const CommPlan& p, const VerifyOptions& opt) {
  VerifyResult res;
  Sink sink{res, std::max<size_t>(opt.max_messages, 1)};
  Index ix;
  for (size_t r = 0; r < p.queues.size(); ++r)
    for (const auto& t : p.queues[r]) {
      ix.of.emplace(t.chunk, static_cast<int>(ix.xs.size()));
      ix.xs.push_back(&t);
      ix.exec.push_back(static_cast<int>(r));
    }
  if (!check_structure(p, ix, sink)) {
    sink.finish();
    return res;
  }
  const size_t n = ix.xs.size();

  // Signals: declared totals against the notifies that reach them.
  std::map<std::pair<int, int>, std::vector<int>> bumpers;
  std::map<std::pair<int, int>, int64_t> reach;
  for (size_t i = 0; i < n; ++i) {
    const Transfer& t = *ix.xs[i];
    if (t.signal.rank < 0) continue;
    bumpers[{t.signal.rank, t.signal.index}].push_back(static_cast<int>(i));
    reach[{t.signal.rank, t.signal.index}] += t.increment;
  }
  for (const auto& [key, who] : bumpers)
    if (!p.find_signal(key.first, key.second))
      sink.add(fmt::format("chunk {} bumps signal {} on rank {}, which the plan does not declare",
                           ix.xs[static_cast<size_t>(who.front())]->chunk, key.second, key.first));
  for (const auto& s : p.signals) {
    const int64_t got = reach.count({s.rank, s.index}) ? reach[{s.rank, s.index}] : 0;
    if (got != s.expected) {
      std::vector<int64_t> ids;
      for (int i : bumpers[{s.rank, s.index}]) ids.push_back(ix.xs[static_cast<size_t>(i)]->chunk);
      sink.add(fmt::format(
          "threshold {} but {} notifies reach signal {} on rank {}{}", s.expected, got, s.index, s.rank,
          ids.empty() ? std::string(" (no chunk bumps it)") : fmt::format(" (from chunks {})", chunk_list(ids))));
    }
  }

  // Waits: a transfer waits for the whole total of the signals its deps bump on its rank;
  // its effective deps are every chunk that bumps those signals.
  std::vector<std::vector<int>> eff(n);
  for (size_t i = 0; i < n; ++i) {
    const Transfer& t = *ix.xs[i];
    std::set<std::pair<int, int>> waits;
    for (int64_t d : t.deps) {
      const Transfer& dt = *ix.xs[static_cast<size_t>(ix.of.at(d))];
      if (dt.signal.rank < 0)
        sink.add(fmt::format("chunk {} on rank {} depends on chunk {}, which bumps no signal: nothing to wait on",
                             t.chunk, ix.exec[i], d));
      else if (dt.signal.rank != ix.exec[i])
        sink.add(
            fmt::format("chunk {} on rank {} depends on chunk {}, which signals rank {}: nothing to wait on at rank {}",
                        t.chunk, ix.exec[i], d, dt.signal.rank, ix.exec[i]));
      else
        waits.insert({dt.signal.rank, dt.signal.index});
    }
    for (const auto& w : waits)
      for (int j : bumpers[w]) eff[i].push_back(j);
    std::sort(eff[i].begin(), eff[i].end());
    eff[i].erase(std::unique(eff[i].begin(), eff[i].end()), eff[i].end());
  }

  const auto cyc = find_cycle(eff);
  if (!cyc.empty()) {
    std::string chunks, ranks;
    for (size_t k = 0; k < cyc.size(); ++k) {
      chunks += fmt::format("{}{}", k ? " -> " : "", ix.xs[static_cast<size_t>(cyc[k])]->chunk);
      ranks += fmt::format("{}{}", k ? " -> " : "", ix.exec[static_cast<size_t>(cyc[k])]);
    }
    sink.add(fmt::format("cycle through chunks {} (ranks {}; each waits for the next)", chunks, ranks));
    sink.finish();
    return res;
  }

  if (opt.workers_per_rank > 0) {
    ProgressGraph g;
    g.queues.resize(p.queues.size());
    for (size_t i = 0; i < n; ++i) g.queues[static_cast<size_t>(ix.exec[i])].push_back(static_cast<int>(i));
    g.deps = eff;
    g.workers.assign(p.queues.size(), opt.workers_per_rank);
    const std::string dead = simulate_progress(
        g, [&](int i) { return fmt::format("chunk {}", ix.xs[static_cast<size_t>(i)]->chunk); },
        fmt::format("{} worker{} per rank", opt.workers_per_rank, opt.workers_per_rank == 1 ? "" : "s"));
    if (!dead.empty()) sink.add(dead);
  }

  check_data_flow(p, ix, eff, sink);
  sink.finish();
  return res;
}

void verify_or_throw(const CommPlan& p, const VerifyOptions& opt) {
  const VerifyResult r = verify(p, opt);
  if (r.ok) return;
  std::string msg = fmt::format("plan {} is invalid:", p.name.empty() ? "(unnamed)" : p.name);
  for (const auto& m : r.messages) msg += "\n  " + m;
  throw InvalidArgument(msg);
}

}  // namespace weft::plan
