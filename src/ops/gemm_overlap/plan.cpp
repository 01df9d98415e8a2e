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
  if (cfg.op == GemmOp::kGemmRs) {
    // The GPU method's algorithm whatever config.algo says (that picks the fused method's
    // template): the staged reduce-scatter, one GEMM tile per piece of each owner's shard.
    p.algo = "staged";
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
