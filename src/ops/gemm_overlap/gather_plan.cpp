// gemm_rs decomposed with the gathered-inputs fold (RsFold::kGather): its plan, built by hand
// (no template has its shape: it moves the GEMM's inputs, not its partial products). See
// plan.hpp, gather_inputs_plan, and docs/gemm_overlap.md, "Gathered inputs".
#include <fmt/format.h>

#include <algorithm>

#include "plan.hpp"
#include "weft/core/error.hpp"
#include "weft/device/dtype.hpp"
#include "weft/plan/verify.hpp"

namespace weft::ops::detail {

OpPlan gather_inputs_plan(const GemmOverlapConfig& cfg, int64_t k_local, int64_t m_shard, int chunks) {
  constexpr int kWorld = 2;
  WEFT_REQUIRE(cfg.op == GemmOp::kGemmRs && cfg.m == kWorld * m_shard && m_shard >= 1 && k_local >= 1 && cfg.n >= 1 &&
                   chunks >= 1,
               fmt::format("gather_inputs_plan: {} {}x{}x{} with m_shard {}, k_local {}, chunks {}: needs gemm_rs on "
                           "2 ranks",
                           to_string(cfg.op), cfg.m, cfg.k, cfg.n, m_shard, k_local, chunks));
  const bool nk = cfg.b_layout == BLayout::kNK;
  const int eb = static_cast<int>(dev::dtype_size(cfg.dtype));
  const int64_t n = cfg.n;
  // Column pieces of whole 128-column tiles (cuBLAS's) where N allows, uniform, the last shorter.
  const int64_t per = (n + chunks - 1) / chunks;
  const int64_t tile_cols = std::min(n, (per + 127) / 128 * 128);

  plan::PlanBuilder pb("gather_inputs", kWorld);
  auto tensor = [&](const char* name, int64_t rows, int64_t cols, plan::Role role) {
    plan::Tensor t;
    t.name = name;
    t.rows = rows;
    t.cols = cols;
    t.elem_bytes = eb;
    t.role = role;
    return pb.add_tensor(t);
  };
  const int64_t b_rows = nk ? n : k_local, b_cols = nk ? k_local : n;
  const int a = tensor("a", cfg.m, k_local, plan::Role::kInput);
  const int b = tensor("b", b_rows, b_cols, plan::Role::kInput);
  const int ga = tensor("g_a", m_shard, k_local, plan::Role::kScratch);
  const int gb = tensor("g_b", b_rows, b_cols, plan::Role::kScratch);
  for (int r = 0; r < kWorld; ++r) {
    const int p = 1 - r;
    auto push = [&](int src_t, int dst_t, plan::Region g) {
      plan::Transfer x;
      x.kind = plan::Kind::kPush;
      x.engine = plan::Engine::kCopyEngine;
      x.src = {r, src_t, src_t == a ? plan::Region::rect(p * m_shard, (p + 1) * m_shard, 0, k_local) : g};
      x.dst = {p, dst_t, g};
      x.signal = pb.new_signal(p);
      pb.add(r, x);
    };
    push(a, ga, plan::Region::rect(0, m_shard, 0, k_local));
    for (int64_t c0 = 0; c0 < n; c0 += tile_cols) {
      const int64_t c1 = std::min(n, c0 + tile_cols);
      push(b, gb, nk ? plan::Region::rect(c0, c1, 0, k_local) : plan::Region::rect(0, k_local, c0, c1));
    }
  }
  OpPlan o;
  o.op = GemmOp::kGemmRs;
  o.plan = pb.finish();
  o.plan.name = "gemm_rs.gather_inputs";
  o.input = a;
  o.gemm = ga;
  o.output = -1;
  o.schedule = plan::gemm_schedule(o.plan, "g_a", n, m_shard, tile_cols);
  o.schedule.column_reads.push_back(plan::ColumnRead{"g_b", nk});
  plan::attach_waits(o.schedule, o.plan);
  // One copy stream and one compute stream per rank.
  plan::verify_or_throw(o.plan, {.workers_per_rank = 1});
  const plan::VerifyResult v = plan::verify_schedule(o.plan, o.schedule, {.comm_workers = 1, .tile_workers = 1});
  WEFT_CHECK(v.ok, fmt::format("gemm_rs: the tile schedule of plan {} is invalid:\n{}", o.plan.name, v.text()));
  o.lowered = plan::lower(o.plan, o.schedule);
  o.tiles_m = o.schedule.tiles_m();
  o.tiles_n = o.schedule.tiles_n();
  return o;
}

}  // namespace weft::ops::detail
