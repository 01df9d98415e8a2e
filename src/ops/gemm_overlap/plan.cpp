#include "plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <utility>

#include "weft/core/error.hpp"
#include "weft/ops/gemm.hpp"
#include "weft/plan/templates.hpp"
#include "weft/plan/verify.hpp"

namespace weft::ops::detail {

std::string default_algo(GemmOp op) { return op == GemmOp::kGemmAr ? "two-shot" : "direct"; }

void check_algo(GemmOp op, const std::string& algo) {
  const std::vector<std::string> ok = op == GemmOp::kAgGemm ? std::vector<std::string>{"direct", "ring", "bidir"}
                                      : op == GemmOp::kGemmRs
                                          ? std::vector<std::string>{"direct", "ring", "staged"}
                                          : std::vector<std::string>{"one-shot", "two-shot", "ring"};
  WEFT_REQUIRE(algo.empty() || std::find(ok.begin(), ok.end(), algo) != ok.end(),
               fmt::format("{}: unknown plan algo '{}' (expected {})", to_string(op), algo, fmt::join(ok, ", ")));
}

void order_by_demand(plan::TileSchedule& s, const plan::CommPlan& p) {
  const int t = p.tensor_id(s.tensor);
  WEFT_REQUIRE(t >= 0, fmt::format("order_by_demand: plan {} has no tensor '{}'", p.name, s.tensor));
  const auto depth = plan::chain_depth(p);
  using Key = std::pair<int, int>;
  const Key none{INT32_MAX, INT32_MAX};
  // need[q][m]: the earliest transfer reading row block m of tensor t on rank q.
  std::vector<std::vector<Key>> need(s.order.size(), std::vector<Key>(static_cast<size_t>(s.tiles_m()), none));
  for (const auto& q : p.queues)
    for (size_t pos = 0; pos < q.size(); ++pos) {
      const plan::Transfer& x = q[pos];
      if (x.src.tensor != t || x.src.rank < 0 || static_cast<size_t>(x.src.rank) >= need.size()) continue;
      const Key k{depth.at(x.chunk), static_cast<int>(pos)};
      const int m0 = s.block_of(x.src.region.row_begin);
      const int m1 = s.block_of(x.src.region.row_end - 1);
      for (int m = m0; m <= m1 && m < s.tiles_m(); ++m) {
        Key& cur = need[static_cast<size_t>(x.src.rank)][static_cast<size_t>(m)];
        cur = std::min(cur, k);
      }
    }
  for (size_t r = 0; r < s.order.size(); ++r)
    std::stable_sort(s.order[r].begin(), s.order[r].end(), [&](const plan::Tile& a, const plan::Tile& b) {
      return need[r][static_cast<size_t>(a.m)] < need[r][static_cast<size_t>(b.m)];
    });
}

void interleave_bands(plan::TileSchedule& s, int64_t band_rows) {
  WEFT_REQUIRE(band_rows > 0, "interleave_bands: no bands");
  auto key = [&](const plan::Tile& t) {
    const int64_t r0 = s.block_rows(t.m).first, band = r0 / band_rows;
    return std::pair<int64_t, int64_t>{(r0 - band * band_rows) / s.tile_rows, band};
  };
  for (auto& order : s.order)
    std::stable_sort(order.begin(), order.end(),
                     [&](const plan::Tile& a, const plan::Tile& b) { return key(a) < key(b); });
}

namespace {
// The op's shape, splits and element size; the caller sets the engine and the tiles.
OpPlanParams op_plan_params(const GemmOverlapConfig& cfg, int world, int64_t k_local, int chunks) {
  OpPlanParams p;
  p.op = cfg.op;
  p.world = world;
  p.m = cfg.m;
  p.n = cfg.n;
  p.k_local = k_local;
  p.chunks = chunks;
  p.algo = cfg.algo;
  p.elem_bytes = static_cast<int>(dev::dtype_size(cfg.dtype));
  return p;
}
}  // namespace

OpPlanParams fused_plan_params(const GemmOverlapConfig& cfg, int world, int64_t k_local, int chunks) {
  OpPlanParams p = op_plan_params(cfg, world, k_local, chunks);
  p.engine = plan::Engine::kSm;
  p.tile_rows = cfg.tile_rows ? cfg.tile_rows : 128;
  p.tile_cols = cfg.tile_cols ? cfg.tile_cols : 128;
  return p;
}

OpPlanParams decomposed_plan_params(const GemmOverlapConfig& cfg, int world, int64_t k_local, int chunks,
                                    int64_t m_shard) {
  OpPlanParams p = op_plan_params(cfg, world, k_local, chunks);
  p.engine = plan::Engine::kCopyEngine;
  p.tile_rows = (m_shard + chunks - 1) / chunks;
  p.tile_cols = cfg.n;
  if (cfg.op != GemmOp::kAgGemm) {
    // The GPU method's algorithm whatever config.algo says (that picks the fused method's
    // template), one GEMM tile per piece of each owner's shard: gemm_rs the staged
    // reduce-scatter (copy-engine pushes), gemm_ar the two-shot all-reduce, whose chains
    // (a copy, reduces, pushes) the GPU runs as one SM pass each (ar_chain_tables).
    p.algo = cfg.op == GemmOp::kGemmRs ? "staged" : "two-shot";
    if (cfg.op == GemmOp::kGemmAr) p.engine = plan::Engine::kSm;
    p.band_rows = m_shard;
  }
  return p;
}

OpPlan build_op_plan(const OpPlanParams& p) {
  OpPlan o;
  o.op = p.op;
  const std::string algo = p.algo.empty() ? default_algo(p.op) : p.algo;
  check_algo(p.op, algo);
  const int w = p.world;
  plan::TemplateOptions t;
  t.splits = p.chunks;
  t.engine = p.engine;
  t.elem_bytes = p.elem_bytes;
  std::string sched;
  switch (p.op) {
    case GemmOp::kAgGemm: {
      const auto a = algo == "direct" ? plan::AllGatherAlgo::kDirect
                     : algo == "ring" ? plan::AllGatherAlgo::kRing
                                      : plan::AllGatherAlgo::kBidirectionalRing;
      o.plan = plan::all_gather(a, w, p.m / w, p.k_local, t);
      sched = "out";
      o.input = o.plan.tensor_id("in");
      o.gemm = o.output = o.plan.tensor_id("out");
      break;
    }
    case GemmOp::kGemmRs: {
      const auto a = algo == "direct" ? plan::ReduceScatterAlgo::kDirect
                     : algo == "ring" ? plan::ReduceScatterAlgo::kRing
                                      : plan::ReduceScatterAlgo::kStaged;
      o.plan = plan::reduce_scatter(a, w, p.m / w, p.n, t);
      sched = "in";
      break;
    }
    case GemmOp::kGemmAr: {
      const auto a = algo == "one-shot"   ? plan::AllReduceAlgo::kOneShot
                     : algo == "two-shot" ? plan::AllReduceAlgo::kTwoShot
                                          : plan::AllReduceAlgo::kRing;
      o.plan = plan::all_reduce(a, w, p.m, p.n, t);
      sched = "in";
      break;
    }
  }
  if (p.op != GemmOp::kAgGemm) {
    o.input = o.gemm = o.plan.tensor_id("in");
    o.output = o.plan.tensor_id("out");
  }
  o.plan.name = fmt::format("{}.{}", to_string(p.op), o.plan.name);
  o.schedule = plan::gemm_schedule(o.plan, sched, p.n, p.tile_rows, p.tile_cols, p.band_rows);
  if (p.op == GemmOp::kAgGemm)
    plan::order_by_arrival(o.schedule, o.plan);
  else if (p.op == GemmOp::kGemmAr && p.band_rows > 0)
    interleave_bands(o.schedule, p.band_rows);
  else
    order_by_demand(o.schedule, o.plan);
  plan::verify_or_throw(o.plan, {.workers_per_rank = p.transfer_workers});
  const plan::VerifyResult v =
      plan::verify_schedule(o.plan, o.schedule, {.comm_workers = p.transfer_workers, .tile_workers = p.tile_workers});
  WEFT_CHECK(v.ok,
             fmt::format("{}: the tile schedule of plan {} is invalid:\n{}", to_string(p.op), o.plan.name, v.text()));
  o.schedule.tiles_write = p.op != GemmOp::kAgGemm;
  o.lowered = plan::lower(o.plan, o.schedule);
  o.tiles_m = o.schedule.tiles_m();
  o.tiles_n = o.schedule.tiles_n();

  return o;
}

RsDecomposedTables rs_decomposed_tables(const OpPlan& o, int rank, int64_t m_shard) {
  const std::string who = fmt::format("gemm_rs decomposed: plan {} on rank {}", o.plan.name, rank);
  WEFT_CHECK(o.op == GemmOp::kGemmRs && rank >= 0 && static_cast<size_t>(rank) < o.lowered.ranks.size() &&
                 m_shard >= 1,
             who + ": not a gemm_rs plan for this rank");
  const plan::LoweredRank& lr = o.lowered.ranks[static_cast<size_t>(rank)];
  const plan::TileSchedule& s = o.schedule;
  const int stage = o.plan.tensor_id("stage");
  const int64_t n = s.cols;
  WEFT_CHECK(stage >= 0 && s.tensor == o.plan.tensors[static_cast<size_t>(o.input)].name && s.tiles_n() == 1,
             who + ": not the staged reduce-scatter with tiles of whole rows");
  const int world = o.lowered.world;
  const int64_t own0 = int64_t{rank} * m_shard, own1 = own0 + m_shard;
  RsDecomposedTables t;

  // The own shard's tiles come last, in row order, covering it: its pieces.
  size_t own_begin = lr.tiles.size();
  while (own_begin > 0 && s.block_rows(lr.tiles[own_begin - 1].m).first >= own0 &&
         s.block_rows(lr.tiles[own_begin - 1].m).second <= own1)
    --own_begin;
  t.own_tiles_begin = static_cast<int32_t>(own_begin);
  int64_t next = own0;
  for (size_t i = own_begin; i < lr.tiles.size(); ++i) {
    const auto [r0, r1] = s.block_rows(lr.tiles[i].m);
    WEFT_CHECK(r0 == next, fmt::format("{}: the own shard's tiles are not in row order", who));
    t.pieces.push_back({r0 - own0, r1 - own0, {}, {}});
    next = r1;
  }
  WEFT_CHECK(next == own1, fmt::format("{}: the last tiles do not cover the own shard", who));
  auto piece_at = [&](int64_t r0, int64_t rows) {
    for (size_t j = 0; j < t.pieces.size(); ++j)
      if (t.pieces[j].r0 == r0 && t.pieces[j].r1 - r0 == rows) return static_cast<int32_t>(j);
    throw Error(fmt::format("{}: rows [{},{}) of a shard are not a piece", who, r0, r0 + rows));
  };

  std::vector<bool> issued(static_cast<size_t>(s.tiles_m()), false);
  size_t cursor = 0;
  // slots[j][q]: the owner's sum of piece j has slot q.
  std::vector<std::vector<int>> slots(t.pieces.size(), std::vector<int>(static_cast<size_t>(world), 0));
  for (size_t i = 0; i < lr.transfers.size(); ++i) {
    const plan::TransferDesc& d = lr.transfers[i];
    const auto kind = static_cast<plan::Kind>(d.kind);
    const bool whole_rows = d.src_col == 0 && d.dst_col == 0 && d.cols == n;
    WEFT_CHECK(whole_rows, fmt::format("{}: chunk {} moves part of a row", who, d.chunk));
    if (d.src_tensor == o.input) {
      const int p = d.dst_rank;
      WEFT_CHECK(d.src_rank == rank && d.dst_tensor == stage && p >= 0 && p < world,
                 fmt::format("{}: chunk {} does not move this rank's partial product into a staging slot", who,
                             d.chunk));
      const int64_t r0 = d.src_row - int64_t{p} * m_shard;
      const int32_t j = piece_at(r0, d.rows);
      WEFT_CHECK(d.dst_row == own0 + r0,
                 fmt::format("{}: chunk {} lands outside slot {} of rank {}'s staging", who, d.chunk, rank, p));
      if (p == rank) {
        WEFT_CHECK(kind == plan::Kind::kCopy, fmt::format("{}: chunk {}: the own slot by a local copy", who, d.chunk));
        continue;  // left out on GPUs: the own block's tiles write the slot (or are folded)
      }
      WEFT_CHECK(kind == plan::Kind::kPush && d.signal_rank == p && d.increment == 1 &&
                     lr.counter_wait_begin[i + 1] > lr.counter_wait_begin[i] &&
                     o.lowered.ranks[static_cast<size_t>(p)].signal_expected[static_cast<size_t>(d.signal)] == 1,
                 fmt::format("{}: chunk {} is not a push that bumps one signal of rank {} by 1 (a copy of the call "
                             "count may stand for it) after tiles",
                             who, d.chunk, p));
      for (int32_t k = lr.counter_wait_begin[i]; k < lr.counter_wait_begin[i + 1]; ++k) {
        const plan::CounterWait& w = lr.counter_waits[static_cast<size_t>(k)];
        WEFT_CHECK(w.rank == rank && w.counter >= 0 && w.counter < s.tiles_m(),
                   fmt::format("{}: chunk {} waits for another rank's tiles", who, d.chunk));
        while (!issued[static_cast<size_t>(w.counter)]) {
          WEFT_CHECK(cursor < own_begin,
                     fmt::format("{}: chunk {} needs row block {}, not among the tiles before the own shard's", who,
                                 d.chunk, w.counter));
          const plan::TileEntry& e = lr.tiles[cursor++];
          WEFT_CHECK(e.notify == e.m && e.wait_count == 0,
                     fmt::format("{}: tile {} waits or notifies a counter not its row block", who, e.m));
          issued[static_cast<size_t>(e.m)] = true;
        }
      }
      t.pushes.push_back({static_cast<int32_t>(i), static_cast<int32_t>(cursor), j});
    } else if (d.dst_tensor == o.output) {
      const int q = static_cast<int>(d.src_row / m_shard);
      WEFT_CHECK(d.src_rank == rank && d.dst_rank == rank && d.src_tensor == stage && q < world &&
                     (kind == plan::Kind::kCopy || kind == plan::Kind::kReduce),
                 fmt::format("{}: chunk {} is not a sum of this rank's staging slots", who, d.chunk));
      const int32_t j = piece_at(d.dst_row, d.rows);
      WEFT_CHECK(d.src_row - int64_t{q} * m_shard == d.dst_row && slots[static_cast<size_t>(j)][static_cast<size_t>(q)]++ == 0,
                 fmt::format("{}: chunk {} adds slot {} into the wrong rows or twice", who, d.chunk, q));
      RsDecomposedTables::Piece& pc = t.pieces[static_cast<size_t>(j)];
      for (int32_t k = d.wait_begin; k < d.wait_begin + d.wait_count; ++k) {
        const plan::WaitEntry& w = lr.transfer_waits[static_cast<size_t>(k)];
        const int32_t from = lr.signal_producer[static_cast<size_t>(w.signal)];
        WEFT_CHECK(from >= 0, fmt::format("{}: chunk {} waits for a signal of several ranks", who, d.chunk));
        if (from == rank) continue;  // this rank's own chain: stream order on GPUs
        pc.waits.push_back(w);
        pc.producers.push_back(from);
      }
    } else {
      throw Error(fmt::format("{}: chunk {} is neither a push of a partial product nor the owner's sum", who, d.chunk));
    }
  }
  WEFT_CHECK(cursor == own_begin, fmt::format("{}: tiles before the own shard's that no push needs", who));
  for (const auto& v : slots)
    for (int c : v) WEFT_CHECK(c == 1, fmt::format("{}: the owner's sum misses a staging slot", who));
  return t;
}

ArChainTables ar_chain_tables(const OpPlan& o, int rank) {
  const std::string who = fmt::format("gemm_ar decomposed: plan {} on rank {}", o.plan.name, rank);
  WEFT_CHECK(o.op == GemmOp::kGemmAr && rank >= 0 && static_cast<size_t>(rank) < o.lowered.ranks.size(),
             who + ": not a gemm_ar plan for this rank");
  const plan::LoweredRank& lr = o.lowered.ranks[static_cast<size_t>(rank)];
  const plan::TileSchedule& s = o.schedule;
  const int world = o.lowered.world;
  const int in = o.input, out = o.output;
  WEFT_CHECK(s.tiles_n() == 1 && s.tensor == o.plan.tensors[static_cast<size_t>(in)].name,
             who + ": not tiles of whole rows of \"in\"");
  // pos[m]: where this rank takes row block m (its tiles write "in" and wait for nothing).
  std::vector<int32_t> pos(static_cast<size_t>(s.tiles_m()), -1);
  for (size_t i = 0; i < lr.tiles.size(); ++i) {
    const plan::TileEntry& e = lr.tiles[i];
    WEFT_CHECK(e.notify == e.m && e.wait_count == 0,
               fmt::format("{}: tile {} waits or notifies a counter not its row block", who, e.m));
    pos[static_cast<size_t>(e.m)] = static_cast<int32_t>(i);
  }
  auto through = [&](int64_t r0, int64_t r1) {  // this rank's tiles up to the last one holding rows [r0, r1)
    int32_t n = 0;
    for (int m = s.block_of(r0); m <= s.block_of(r1 - 1); ++m) n = std::max(n, pos[static_cast<size_t>(m)] + 1);
    return n;
  };
  ArChainTables t;
  struct Links {
    std::vector<int32_t> signals;  // the lowered signals here that the chain's links bump
    bool pushed = false;           // a push was seen: no copy or reduce may follow
  };
  std::vector<Links> links;
  auto chain_at = [&](int64_t r0, int64_t rows) {
    for (size_t c = 0; c < t.chains.size(); ++c)
      if (t.chains[c].r0 == r0 && t.chains[c].r1 == r0 + rows) return c;
    return t.chains.size();
  };
  for (size_t i = 0; i < lr.transfers.size(); ++i) {
    const plan::TransferDesc& d = lr.transfers[i];
    const auto kind = static_cast<plan::Kind>(d.kind);
    WEFT_CHECK(d.src_col == 0 && d.dst_col == 0 && d.cols == s.cols && d.src_row == d.dst_row && d.rows > 0,
               fmt::format("{}: chunk {} does not move whole rows to the same rows", who, d.chunk));
    size_t c = chain_at(d.dst_row, d.rows);
    if (kind == plan::Kind::kCopy) {
      WEFT_CHECK(d.src_rank == rank && d.dst_rank == rank && d.src_tensor == in && d.dst_tensor == out &&
                     c == t.chains.size() && d.wait_count == 0,
                 fmt::format("{}: chunk {} is not the first link of a sum (this rank's rows of \"in\" into its "
                             "\"out\", waiting for nothing)",
                             who, d.chunk));
      t.chains.push_back({d.dst_row, d.dst_row + d.rows, {}, {}, {}, 0});
      links.emplace_back();
      c = t.chains.size() - 1;
    } else {
      WEFT_CHECK(c < t.chains.size() && (kind == plan::Kind::kPush || !links[c].pushed),
                 fmt::format("{}: chunk {} ({} {}->{}) adds to or pushes rows [{},{}) that no earlier copy began",
                             who, d.chunk, plan::to_string(kind), d.src_rank, d.dst_rank, d.dst_row,
                             d.dst_row + d.rows));
      // A later link waits only for the chain's own links (the GPU's one pass orders them).
      for (int32_t k = d.wait_begin; k < d.wait_begin + d.wait_count; ++k) {
        const int32_t sig = lr.transfer_waits[static_cast<size_t>(k)].signal;
        WEFT_CHECK(std::find(links[c].signals.begin(), links[c].signals.end(), sig) != links[c].signals.end(),
                   fmt::format("{}: chunk {} waits for a signal no link of its sum bumps", who, d.chunk));
      }
      if (kind == plan::Kind::kReduce) {
        WEFT_CHECK(d.dst_rank == rank && d.src_tensor == in && d.dst_tensor == out,
                   fmt::format("{}: chunk {} does not add a rank's \"in\" rows into this rank's \"out\"", who,
                               d.chunk));
      } else {
        WEFT_CHECK(kind == plan::Kind::kPush && d.src_rank == rank && d.src_tensor == out && d.dst_tensor == out &&
                       d.dst_rank != rank && d.signal_rank == d.dst_rank && d.increment == 1 &&
                       lr.counter_wait_begin[i + 1] == lr.counter_wait_begin[i],
                   fmt::format("{}: chunk {} is not a push of the sum into a peer's \"out\" that bumps one of "
                               "its signals by 1",
                               who, d.chunk));
        links[c].pushed = true;
      }
    }
    ArChainTables::Chain& ch = t.chains[c];
    if (kind == plan::Kind::kPush) {
      ch.signals.emplace_back(d.dst_rank, d.signal);
    } else {
      ch.sources.push_back(d.src_rank);
      WEFT_CHECK(d.signal_rank == rank, fmt::format("{}: chunk {} signals another rank", who, d.chunk));
      links[c].signals.push_back(d.signal);
      for (int32_t k = lr.counter_wait_begin[i]; k < lr.counter_wait_begin[i + 1]; ++k)
        ch.tile_waits.push_back(lr.counter_waits[static_cast<size_t>(k)]);
    }
  }
  for (ArChainTables::Chain& ch : t.chains) {
    std::vector<int32_t> src = ch.sources, peers;
    std::sort(src.begin(), src.end());
    for (const auto& [p, sig] : ch.signals) peers.push_back(p);
    std::sort(peers.begin(), peers.end());
    WEFT_CHECK(static_cast<int>(src.size()) == world && std::adjacent_find(src.begin(), src.end()) == src.end() &&
                   static_cast<int>(peers.size()) == world - 1 &&
                   std::adjacent_find(peers.begin(), peers.end()) == peers.end(),
               fmt::format("{}: the sum of rows [{},{}) does not add every rank once and push to every peer once",
                           who, ch.r0, ch.r1));
    ch.after_tile = through(ch.r0, ch.r1);
  }
  // The links' own signals: nothing outside the chain waits for them (the GPU never bumps them).
  for (const Links& l : links)
    for (int32_t sig : l.signals)
      for (const plan::WaitEntry& w : lr.final_waits)
        WEFT_CHECK(w.signal != sig, fmt::format("{}: a final wait is on a link's own signal", who));
  std::stable_sort(t.chains.begin(), t.chains.end(),
                   [](const ArChainTables::Chain& a, const ArChainTables::Chain& b) { return a.after_tile < b.after_tile; });

  // Landings: the peers' pushes into this rank's "out", by rows, with the final waits on them.
  for (int q = 0; q < world; ++q) {
    if (q == rank) continue;
    for (const plan::TransferDesc& d : o.lowered.ranks[static_cast<size_t>(q)].transfers) {
      if (d.dst_rank != rank || static_cast<plan::Kind>(d.kind) != plan::Kind::kPush) continue;
      WEFT_CHECK(d.dst_tensor == out && d.signal_rank == rank,
                 fmt::format("{}: rank {}'s chunk {} pushes into this rank's rows other than a sum", who, q, d.chunk));
      ArChainTables::Landing* l = nullptr;
      for (auto& x : t.landings)
        if (x.r0 == d.dst_row && x.r1 == d.dst_row + d.rows) l = &x;
      if (!l) {
        t.landings.push_back({d.dst_row, d.dst_row + d.rows, {}, {}, through(d.dst_row, d.dst_row + d.rows)});
        l = &t.landings.back();
      }
      bool found = false;
      for (const plan::WaitEntry& w : lr.final_waits)
        if (w.signal == d.signal) {
          l->waits.push_back(w);
          l->producers.push_back(q);
          found = true;
        }
      WEFT_CHECK(found, fmt::format("{}: nothing waits for rank {}'s push of rows [{},{})", who, q, d.dst_row,
                                    d.dst_row + d.rows));
    }
  }
  size_t waits = 0;
  for (const auto& l : t.landings) waits += l.waits.size();
  WEFT_CHECK(waits == lr.final_waits.size(), fmt::format("{}: final waits on rows no peer pushes", who));
  // Every row of "out" is this rank's sum or a landing, once.
  std::vector<std::pair<int64_t, int64_t>> rows;
  for (const auto& c : t.chains) rows.emplace_back(c.r0, c.r1);
  for (const auto& l : t.landings) rows.emplace_back(l.r0, l.r1);
  std::sort(rows.begin(), rows.end());
  int64_t next = 0;
  for (const auto& [r0, r1] : rows) {
    WEFT_CHECK(r0 == next, fmt::format("{}: rows from {} are summed or land twice, or never", who, next));
    next = r1;
  }
  WEFT_CHECK(next == s.rows, fmt::format("{}: rows from {} are neither summed here nor land", who, next));
  std::stable_sort(t.landings.begin(), t.landings.end(),
                   [](const ArChainTables::Landing& a, const ArChainTables::Landing& b) {
                     return a.after_tile < b.after_tile;
                   });
  return t;
}

void host_gemm(dev::DType t, BLayout layout, const void* a, const void* b, void* c, int64_t k, int64_t n, int64_t r0,
               int64_t r1, int64_t c0, int64_t c1, int me, int threads) {
  // The CPU tile reference (ops::gemm_tile_cpu), one row at a time: thread `me` of `threads`
  // takes rows r0 + me, r0 + me + threads, ...
  const CpuGemm g{t, t, layout == BLayout::kKN, a, k, b, layout == BLayout::kKN ? n : k, c, n, k};
  for (int64_t i = r0 + me; i < r1; i += threads) gemm_tile_cpu(g, i, i + 1, c0, c1);
}

// ---- the host methods: the plan executor with host_gemm tiles -------------------------

HostGemmExec::HostGemmExec(Backend& backend, OpPlan plan, dev::DType dtype, BLayout layout, int64_t k_local,
                           int transfer_workers, int tile_workers, const std::string& tag)
    : op_(plan.op),
      input_(plan.input),
      gemm_(plan.gemm),
      output_(plan.output),
      dtype_(dtype),
      layout_(layout),
      k_local_(k_local),
      // build_op_plan verified the plan and the schedule with these worker counts already.
      x_(backend, std::move(plan.plan), std::move(plan.schedule), std::move(plan.lowered), tag,
         {.transfer_workers = transfer_workers,
          .tile_workers = tile_workers,
          .threads = 1,
          .dtype = dtype,
          .verify = false}) {}

void HostGemmExec::run(const void* a, const void* b, void* c, std::vector<TraceEvent>* trace) {
  const bool ag = op_ == GemmOp::kAgGemm;
  const int64_t n = x_.schedule().cols;
  void* gemm_tensor = x_.tensor(gemm_);
  plan::ExecCall call;
  if (ag) {
    // A_r goes into the plan's input tensor; tiles read the gathered A and write the user's C.
    call.input = a;
    call.input_tensor = input_;
    call.tile = [&](const plan::TileEntry&, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
      host_gemm(dtype_, layout_, gemm_tensor, b, c, k_local_, n, r0, r1, c0, c1);
    };
  } else {
    // Tiles read the user's A_r and write the partial product into the plan's input tensor,
    // which the transfers reduce into the output tensor, copied out to C.
    call.tile = [&](const plan::TileEntry&, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
      host_gemm(dtype_, layout_, a, b, gemm_tensor, k_local_, n, r0, r1, c0, c1);
    };
    call.output_tensor = output_;
    call.output = c;
  }
  std::vector<plan::ExecEvent> events;
  if (trace) call.events = &events;
  x_.run(call);
  if (!trace) return;
  const int nt = x_.options().transfer_workers;
  for (plan::ExecEvent& e : events) {
    const bool tile = e.what == plan::ExecEvent::What::kTile;
    trace->push_back(TraceEvent{
        x_.rank(), tile ? TraceKind::kTile : TraceKind::kChunk, e.id, tile ? nt + e.worker : e.worker,
        fmt::format("{} worker {}", tile ? "tile" : "transfer", e.worker), std::move(e.name), e.start_ns, e.end_ns});
  }
}

}  // namespace weft::ops::detail
