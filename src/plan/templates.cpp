#include "weft/plan/templates.hpp"

#include <fmt/format.h>

#include <map>
#include <unordered_map>

#include "weft/core/error.hpp"

namespace weft::plan {
namespace {

// Generous but finite: the verifier's reachability sets grow with chunks squared.
constexpr int kMaxWorld = 1024;

void check_shape(const char* what, int world, int64_t rows, int64_t cols, const TemplateOptions& opt) {
  WEFT_REQUIRE(world >= 1 && world <= kMaxWorld, fmt::format("{}: world size {} (need 1..{})", what, world, kMaxWorld));
  WEFT_REQUIRE(rows >= 1 && cols >= 1, fmt::format("{}: shape {}x{} (need at least 1x1)", what, rows, cols));
  WEFT_REQUIRE(opt.splits >= 1, fmt::format("{}: {} splits (need >= 1)", what, opt.splits));
  WEFT_REQUIRE(opt.elem_bytes >= 1, fmt::format("{}: element size {} bytes", what, opt.elem_bytes));
}

int mod(int a, int w) { return ((a % w) + w) % w; }

Region rows_of(int64_t r0, int64_t r1, int64_t cols) { return Region::rect(r0, r1, 0, cols); }

// Local copies never go through NCCL or the network.
Engine local_engine(const TemplateOptions& opt) {
  return opt.engine == Engine::kCopyEngine ? Engine::kCopyEngine : Engine::kSm;
}

// One transfer that bumps a fresh signal on `consumer` (the rank whose work waits for it).
struct Emitter {
  PlanBuilder& b;
  Engine engine;
  int64_t operator()(int exec, Kind kind, Endpoint src, Endpoint dst, std::vector<int64_t> deps, int consumer,
                     Engine e) {
    Transfer t;
    t.kind = kind;
    t.src = src;
    t.dst = dst;
    t.deps = std::move(deps);
    t.signal = b.new_signal(consumer);
    t.increment = 1;
    t.engine = e;
    return b.add(exec, std::move(t));
  }
  int64_t operator()(int exec, Kind kind, Endpoint src, Endpoint dst, std::vector<int64_t> deps, int consumer) {
    return (*this)(exec, kind, src, dst, std::move(deps), consumer, engine);
  }
};

Tensor make_tensor(std::string name, int64_t rows, int64_t cols, Role role, const TemplateOptions& opt,
                   bool sum = false) {
  Tensor t;
  t.name = std::move(name);
  t.rows = rows;
  t.cols = cols;
  t.elem_bytes = opt.elem_bytes;
  t.role = role;
  t.sum = sum;
  return t;
}

// out (on `owner`) = in[owner] + sum over the other ranks of in[q], pulled and added in a
// chain that starts at the next rank (so ranks do not all read rank 0 first). Each step
// waits for the previous one: adds into one element never race. Returns the chain's last chunk.
int64_t pull_reduce_chain(Emitter& emit, int world, int owner, int in, Region in_rows, int out, Region out_rows,
                          Engine local, std::vector<int64_t> first_deps = {}) {
  int64_t prev =
      emit(owner, Kind::kCopy, {owner, in, in_rows}, {owner, out, out_rows}, std::move(first_deps), owner, local);
  for (int d = 1; d < world; ++d) {
    const int q = mod(owner + d, world);
    prev = emit(owner, Kind::kReduce, {q, in, in_rows}, {owner, out, out_rows}, {prev}, owner);
  }
  return prev;
}

}  // namespace

CommPlan all_gather(AllGatherAlgo algo, int world, int64_t rows, int64_t cols, TemplateOptions opt) {
  check_shape("all_gather", world, rows, cols, opt);
  const char* names[] = {"all_gather.direct", "all_gather.ring", "all_gather.bidirectional_ring"};
  PlanBuilder b(names[static_cast<int>(algo)], world);
  const int in = b.add_tensor(make_tensor("in", rows, cols, Role::kInput, opt));
  const int out = b.add_tensor(make_tensor("out", int64_t{world} * rows, cols, Role::kOutput, opt));
  Emitter emit{b, opt.engine};
  const Engine local = local_engine(opt);
  auto shard = [&](int q, int64_t r0, int64_t r1) { return rows_of(q * rows + r0, q * rows + r1, cols); };

  for (int r = 0; r < world; ++r)
    emit(r, Kind::kCopy, {r, in, rows_of(0, rows, cols)}, {r, out, shard(r, 0, rows)}, {}, r, local);

  if (algo == AllGatherAlgo::kDirect) {
    for (int q = 0; q < world; ++q)
      for (int d = 1; d < world; ++d) {
        const int p = mod(q + d, world);
        emit(q, Kind::kPush, {q, in, rows_of(0, rows, cols)}, {p, out, shard(q, 0, rows)}, {}, p);
      }
    return split_chunks(b.finish(), opt.splits);
  }

  // Rings: a half of every shard travels each direction (all of it for the plain ring).
  struct Half {
    int dir;
    int64_t r0, r1;
  };
  std::vector<Half> halves;
  if (algo == AllGatherAlgo::kRing) {
    halves.push_back({+1, 0, rows});
  } else {
    const int64_t mid = (rows + 1) / 2;
    halves.push_back({+1, 0, mid});
    if (mid < rows) halves.push_back({-1, mid, rows});
  }
  // last[h][r]: the chunk that delivered the shard rank r forwards next in direction h.
  std::vector<std::vector<int64_t>> last(halves.size(), std::vector<int64_t>(static_cast<size_t>(world), -1));
  for (int t = 1; t < world; ++t) {
    for (size_t h = 0; h < halves.size(); ++h) {
      const auto& hv = halves[h];
      std::vector<int64_t> delivered(static_cast<size_t>(world));
      for (int r = 0; r < world; ++r) {
        const int c = mod(r - hv.dir * (t - 1), world);  // the shard rank r forwards at step t
        const int next = mod(r + hv.dir, world);
        Endpoint src = t == 1 ? Endpoint{r, in, rows_of(hv.r0, hv.r1, cols)} : Endpoint{r, out, shard(c, hv.r0, hv.r1)};
        std::vector<int64_t> deps;
        if (t > 1) deps.push_back(last[h][static_cast<size_t>(r)]);
        delivered[static_cast<size_t>(next)] =
            emit(r, Kind::kPush, src, {next, out, shard(c, hv.r0, hv.r1)}, std::move(deps), next);
      }
      last[h] = delivered;
    }
  }
  return split_chunks(b.finish(), opt.splits);
}

CommPlan reduce_scatter(ReduceScatterAlgo algo, int world, int64_t rows, int64_t cols, TemplateOptions opt) {
  check_shape("reduce_scatter", world, rows, cols, opt);
  const char* names[] = {"reduce_scatter.direct", "reduce_scatter.ring", "reduce_scatter.staged"};
  PlanBuilder b(names[static_cast<int>(algo)], world);
  const int in = b.add_tensor(make_tensor("in", int64_t{world} * rows, cols, Role::kInput, opt));
  const int out = b.add_tensor(make_tensor("out", rows, cols, Role::kOutput, opt, /*sum=*/true));
  Emitter emit{b, opt.engine};
  const Engine local = local_engine(opt);
  auto shard = [&](int q) { return rows_of(q * rows, (q + 1) * rows, cols); };

  if (algo == ReduceScatterAlgo::kDirect) {
    for (int r = 0; r < world; ++r) pull_reduce_chain(emit, world, r, in, shard(r), out, rows_of(0, rows, cols), local);
    return split_chunks(b.finish(), opt.splits);
  }

  if (algo == ReduceScatterAlgo::kStaged) {
    // Built in pieces here (not by split_chunks): the owner's reduce of piece j waits for
    // piece j of every slot, and its queue runs piece by piece.
    const int stage = b.add_tensor(make_tensor("stage", int64_t{world} * rows, cols, Role::kScratch, opt));
    const auto pieces = split_range(0, rows, opt.splits);
    auto piece = [&](int64_t base, size_t j) {
      return rows_of(base + pieces[j].first, base + pieces[j].second, cols);
    };
    // into[p][q * pieces + j]: the chunk that lands q's piece j in p's slot q.
    std::vector<std::vector<int64_t>> into(static_cast<size_t>(world),
                                           std::vector<int64_t>(static_cast<size_t>(world) * pieces.size(), -1));
    for (int q = 0; q < world; ++q)
      for (int d = 0; d < world; ++d) {  // d == 0 last: the own slot, by a local copy
        const int p = d == world - 1 ? q : mod(q + d + 1, world);
        for (size_t j = 0; j < pieces.size(); ++j)
          into[static_cast<size_t>(p)][static_cast<size_t>(q) * pieces.size() + j] =
              p == q ? emit(q, Kind::kCopy, {q, in, piece(q * rows, j)}, {q, stage, piece(q * rows, j)}, {}, q, local)
                     : emit(q, Kind::kPush, {q, in, piece(p * rows, j)}, {p, stage, piece(q * rows, j)}, {}, p);
      }
    // The sums are an SM's work (a copy engine does not add): the owner's chain on kSm.
    for (int r = 0; r < world; ++r)
      for (size_t j = 0; j < pieces.size(); ++j) {
        const auto& slot = into[static_cast<size_t>(r)];
        int64_t prev = emit(r, Kind::kCopy, {r, stage, piece(r * rows, j)}, {r, out, piece(0, j)},
                            {slot[static_cast<size_t>(r) * pieces.size() + j]}, r, Engine::kSm);
        for (int d = 1; d < world; ++d) {
          const int q = mod(r + d, world);
          prev = emit(r, Kind::kReduce, {r, stage, piece(q * rows, j)}, {r, out, piece(0, j)},
                      {prev, slot[static_cast<size_t>(q) * pieces.size() + j]}, r, Engine::kSm);
        }
      }
    return b.finish();
  }

  const int acc = b.add_tensor(make_tensor("acc", int64_t{world} * rows, cols, Role::kScratch, opt));
  // Shard c travels c+1 -> ... -> c. Rank r adds into acc shard c unless it starts the shard
  // (r == c+1, sends from in) or ends it (r == c, adds into out). Receivers copy their own
  // contribution first; the sender waits for that copy (it is the receiver's buffer it adds into).
  std::vector<int64_t> init(static_cast<size_t>(world) * world, -1);  // init[r*world + c]
  for (int r = 0; r < world; ++r)
    for (int c = 0; c < world; ++c) {
      if (world == 1 || c == mod(r - 1, world)) continue;
      const bool final_dst = (c == r);
      Endpoint dst = final_dst ? Endpoint{r, out, rows_of(0, rows, cols)} : Endpoint{r, acc, shard(c)};
      // The sender (r-1) waits for this copy; with one rank nobody does, and r consumes it.
      init[static_cast<size_t>(r * world + c)] =
          emit(r, Kind::kCopy, {r, in, shard(c)}, dst, {}, mod(r - 1, world), local);
    }
  if (world == 1) emit(0, Kind::kCopy, {0, in, shard(0)}, {0, out, rows_of(0, rows, cols)}, {}, 0, local);
  std::vector<int64_t> prev(static_cast<size_t>(world), -1);  // prev[c]: last hop of shard c
  for (int h = 1; h < world; ++h)
    for (int c = 0; c < world; ++c) {
      const int s = mod(c + h, world);
      const int recv = mod(s + 1, world);
      Endpoint src = h == 1 ? Endpoint{s, in, shard(c)} : Endpoint{s, acc, shard(c)};
      Endpoint dst = recv == c ? Endpoint{recv, out, rows_of(0, rows, cols)} : Endpoint{recv, acc, shard(c)};
      std::vector<int64_t> deps{init[static_cast<size_t>(recv * world + c)]};
      if (h > 1) deps.push_back(prev[static_cast<size_t>(c)]);
      prev[static_cast<size_t>(c)] = emit(s, Kind::kReduce, src, dst, std::move(deps), recv);
    }
  return split_chunks(b.finish(), opt.splits);
}

CommPlan all_reduce(AllReduceAlgo algo, int world, int64_t rows, int64_t cols, TemplateOptions opt) {
  check_shape("all_reduce", world, rows, cols, opt);
  const char* names[] = {"all_reduce.one_shot", "all_reduce.two_shot", "all_reduce.ring"};
  PlanBuilder b(names[static_cast<int>(algo)], world);
  const int in = b.add_tensor(make_tensor("in", rows, cols, Role::kInput, opt));
  const int out = b.add_tensor(make_tensor("out", rows, cols, Role::kOutput, opt, /*sum=*/true));
  Emitter emit{b, opt.engine};
  const Engine local = local_engine(opt);

  if (algo == AllReduceAlgo::kOneShot) {
    for (int r = 0; r < world; ++r)
      pull_reduce_chain(emit, world, r, in, rows_of(0, rows, cols), out, rows_of(0, rows, cols), local);
    return split_chunks(b.finish(), opt.splits);
  }

  // Shard c (owned by rank c) is rows shards[c]; with fewer rows than ranks the last ranks own none.
  const auto shards = split_range(0, rows, world);
  const int nshards = static_cast<int>(shards.size());
  auto shard = [&](int c) {
    return rows_of(shards[static_cast<size_t>(c)].first, shards[static_cast<size_t>(c)].second, cols);
  };

  if (algo == AllReduceAlgo::kTwoShot) {
    // Two-shot: each owner pulls and adds its shard from every rank, then pushes the sum to all.
    for (int c = 0; c < nshards; ++c) {
      // The chain's last link is consumed by the owner's own pushes: it signals the owner.
      const int64_t done = pull_reduce_chain(emit, world, c, in, shard(c), out, shard(c), local);
      for (int d = 1; d < world; ++d) {
        const int p = mod(c + d, world);
        emit(c, Kind::kPush, {c, out, shard(c)}, {p, out, shard(c)}, {done}, p);
      }
    }
    return split_chunks(b.finish(), opt.splits);
  }

  // Ring: ring reduce-scatter of each shard into its owner's out, then a ring all-gather of
  // the sums. Every rank's queue: its copies, its reduce-scatter hops, its all-gather hops.
  const int acc = b.add_tensor(make_tensor("acc", rows, cols, Role::kScratch, opt));
  if (world == 1) {
    emit(0, Kind::kCopy, {0, in, rows_of(0, rows, cols)}, {0, out, rows_of(0, rows, cols)}, {}, 0, local);
    return split_chunks(b.finish(), opt.splits);
  }
  std::vector<int64_t> init(static_cast<size_t>(world) * nshards, -1);  // init[r*nshards + c]
  for (int r = 0; r < world; ++r)
    for (int c = 0; c < nshards; ++c) {
      if (c == mod(r - 1, world)) continue;  // rank c+1 starts shard c from in
      Endpoint dst = c == r ? Endpoint{r, out, shard(c)} : Endpoint{r, acc, shard(c)};
      init[static_cast<size_t>(r * nshards + c)] =
          emit(r, Kind::kCopy, {r, in, shard(c)}, dst, {}, mod(r - 1, world), local);
    }
  std::vector<int64_t> prev(static_cast<size_t>(nshards), -1);
  for (int h = 1; h < world; ++h)
    for (int c = 0; c < nshards; ++c) {
      const int s = mod(c + h, world);
      const int recv = mod(s + 1, world);
      Endpoint src = h == 1 ? Endpoint{s, in, shard(c)} : Endpoint{s, acc, shard(c)};
      Endpoint dst = recv == c ? Endpoint{recv, out, shard(c)} : Endpoint{recv, acc, shard(c)};
      std::vector<int64_t> deps{init[static_cast<size_t>(recv * nshards + c)]};
      if (h > 1) deps.push_back(prev[static_cast<size_t>(c)]);
      prev[static_cast<size_t>(c)] = emit(s, Kind::kReduce, src, dst, std::move(deps), recv);
    }
  // All-gather: the sum of shard c leaves rank c and travels c -> c+1 -> ... -> c-1.
  for (int h = 1; h < world; ++h)
    for (int c = 0; c < nshards; ++c) {
      const int s = mod(c + h - 1, world);
      const int recv = mod(s + 1, world);
      prev[static_cast<size_t>(c)] =
          emit(s, Kind::kPush, {s, out, shard(c)}, {recv, out, shard(c)}, {prev[static_cast<size_t>(c)]}, recv);
    }
  return split_chunks(b.finish(), opt.splits);
}

CommPlan all_to_all(int world, int64_t rows, int64_t cols, TemplateOptions opt) {
  check_shape("all_to_all", world, rows, cols, opt);
  std::vector<std::vector<int64_t>> counts(static_cast<size_t>(world),
                                           std::vector<int64_t>(static_cast<size_t>(world), rows));
  CommPlan p = all_to_all_counts(counts, cols, opt);
  p.name = "all_to_all.uniform";
  return p;
}

CommPlan all_to_all_counts(const std::vector<std::vector<int64_t>>& counts, int64_t cols, TemplateOptions opt) {
  const int world = static_cast<int>(counts.size());
  check_shape("all_to_all_counts", world, 1, cols, opt);
  for (int q = 0; q < world; ++q) {
    WEFT_REQUIRE(counts[static_cast<size_t>(q)].size() == counts.size(),
                 fmt::format("all_to_all_counts: row {} of counts has {} entries, need {}", q,
                             counts[static_cast<size_t>(q)].size(), world));
    for (int p = 0; p < world; ++p)
      WEFT_REQUIRE(counts[static_cast<size_t>(q)][static_cast<size_t>(p)] >= 0,
                   fmt::format("all_to_all_counts: rank {} sends {} rows to rank {}", q,
                               counts[static_cast<size_t>(q)][static_cast<size_t>(p)], p));
  }
  auto n = [&](int q, int p) { return counts[static_cast<size_t>(q)][static_cast<size_t>(p)]; };
  // send_off[q][p]: where rank q's rows for p start in its in; recv_off[p][q]: where rows
  // from q start in p's out.
  std::vector<std::vector<int64_t>> send_off(static_cast<size_t>(world),
                                             std::vector<int64_t>(static_cast<size_t>(world) + 1, 0));
  std::vector<std::vector<int64_t>> recv_off = send_off;
  int64_t in_rows = 1, out_rows = 1;
  std::vector<int64_t> valid(static_cast<size_t>(world));
  for (int q = 0; q < world; ++q) {
    for (int p = 0; p < world; ++p) {
      send_off[static_cast<size_t>(q)][static_cast<size_t>(p) + 1] =
          send_off[static_cast<size_t>(q)][static_cast<size_t>(p)] + n(q, p);
      recv_off[static_cast<size_t>(q)][static_cast<size_t>(p) + 1] =
          recv_off[static_cast<size_t>(q)][static_cast<size_t>(p)] + n(p, q);
    }
    in_rows = std::max(in_rows, send_off[static_cast<size_t>(q)].back());
    out_rows = std::max(out_rows, recv_off[static_cast<size_t>(q)].back());
    valid[static_cast<size_t>(q)] = recv_off[static_cast<size_t>(q)].back();
  }
  PlanBuilder b("all_to_all.counts", world);
  const int in = b.add_tensor(make_tensor("in", in_rows, cols, Role::kInput, opt));
  Tensor o = make_tensor("out", out_rows, cols, Role::kOutput, opt);
  o.valid_rows = valid;
  const int out = b.add_tensor(std::move(o));
  Emitter emit{b, opt.engine};
  for (int q = 0; q < world; ++q)
    for (int d = 0; d < world; ++d) {
      const int p = mod(q + d, world);
      if (n(q, p) == 0) continue;
      const int64_t s0 = send_off[static_cast<size_t>(q)][static_cast<size_t>(p)];
      const int64_t r0 = recv_off[static_cast<size_t>(p)][static_cast<size_t>(q)];
      if (p == q)
        emit(q, Kind::kCopy, {q, in, rows_of(s0, s0 + n(q, p), cols)}, {p, out, rows_of(r0, r0 + n(q, p), cols)}, {}, p,
             local_engine(opt));
      else
        emit(q, Kind::kPush, {q, in, rows_of(s0, s0 + n(q, p), cols)}, {p, out, rows_of(r0, r0 + n(q, p), cols)}, {},
             p);
    }
  return split_chunks(b.finish(), opt.splits);
}

CommPlan split_chunks(const CommPlan& plan, int splits) {
  WEFT_REQUIRE(splits >= 1, fmt::format("split_chunks: {} splits (need >= 1)", splits));
  if (splits == 1) return plan;
  // Row offsets of each transfer's pieces, relative to its first row.
  std::unordered_map<int64_t, std::vector<std::pair<int64_t, int64_t>>> pieces;
  std::unordered_map<int64_t, std::vector<int64_t>> ids;
  std::map<std::pair<int, int>, int> bumpers;
  std::vector<int> next_index(static_cast<size_t>(std::max(plan.world, 0)), 0);
  for (const auto& s : plan.signals)
    if (s.rank >= 0 && s.rank < plan.world)
      next_index[static_cast<size_t>(s.rank)] = std::max(next_index[static_cast<size_t>(s.rank)], s.index + 1);
  int64_t next_chunk = 0;
  for (const auto& q : plan.queues)
    for (const auto& t : q) {
      auto& pc = pieces[t.chunk];
      pc = split_range(0, t.dst.region.rows(), splits);
      if (pc.empty()) pc.emplace_back(0, 0);  // keep degenerate transfers: the verifier reports them
      for (size_t j = 0; j < pc.size(); ++j) ids[t.chunk].push_back(next_chunk++);
      if (t.signal.rank >= 0) {
        ++bumpers[{t.signal.rank, t.signal.index}];
        if (t.signal.rank < plan.world)
          next_index[static_cast<size_t>(t.signal.rank)] =
              std::max(next_index[static_cast<size_t>(t.signal.rank)], t.signal.index + 1);
      }
    }

  CommPlan out = plan;
  for (auto& q : out.queues) q.clear();
  for (size_t r = 0; r < plan.queues.size(); ++r)
    for (const auto& t : plan.queues[r]) {
      const auto& pc = pieces[t.chunk];
      // A signal counted by this transfer alone becomes one signal per piece, so a consumer
      // of piece j waits for piece j only; a signal shared with other transfers stays shared.
      const bool own_signal =
          t.signal.rank >= 0 && t.signal.rank < plan.world && bumpers[{t.signal.rank, t.signal.index}] == 1;
      for (size_t j = 0; j < pc.size(); ++j) {
        Transfer p = t;
        p.chunk = ids[t.chunk][j];
        p.src.region.row_begin = t.src.region.row_begin + pc[j].first;
        p.src.region.row_end = t.src.region.row_begin + pc[j].second;
        p.dst.region.row_begin = t.dst.region.row_begin + pc[j].first;
        p.dst.region.row_end = t.dst.region.row_begin + pc[j].second;
        p.deps.clear();
        for (int64_t d : t.deps) {
          auto it = pieces.find(d);
          WEFT_REQUIRE(it != pieces.end(),
                       fmt::format("split_chunks: chunk {} depends on chunk {}, which does not exist", t.chunk, d));
          if (it->second == pc) {
            p.deps.push_back(ids[d][j]);  // piece j needs piece j only
          } else {
            for (int64_t id : ids[d]) p.deps.push_back(id);
          }
        }
        if (own_signal && j > 0) p.signal.index = next_index[static_cast<size_t>(t.signal.rank)]++;
        out.queues[r].push_back(std::move(p));
      }
    }
  recount_signals(out);
  return out;
}

}  // namespace weft::plan
