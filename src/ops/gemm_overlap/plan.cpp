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
                                          ? std::vector<std::string>{"direct", "ring"}
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
      const int m0 = static_cast<int>(x.src.region.row_begin / s.tile_rows);
      const int m1 = static_cast<int>((x.src.region.row_end - 1) / s.tile_rows);
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
      const auto a = algo == "direct" ? plan::ReduceScatterAlgo::kDirect : plan::ReduceScatterAlgo::kRing;
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
  o.schedule = plan::gemm_schedule(o.plan, sched, p.n, p.tile_rows, p.tile_cols);
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
