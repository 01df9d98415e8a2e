// `decomposed` and `fused` on the host backend: the plan executor (HostGemmExec, plan.hpp)
// running the op's plan with the method's geometry.
#include <fmt/format.h>

#include "gemm_overlap_impl.hpp"
#include "weft/core/error.hpp"

namespace weft::ops::detail {

HostPlanMethod::HostPlanMethod(GemmOpContext& op, bool decomposed) : op_(op) {
  const GemmOverlapConfig& cfg = op_.cfg;
  const int64_t shard_rows = cfg.op == GemmOp::kGemmAr ? ceil_div(cfg.m, op_.world) : cfg.m / op_.world;
  detail::OpPlanParams p;
  if (decomposed) {
    // The GPU decomposed method's plan (decomposed_plan_params: one "GEMM" per chunk of rows,
    // all of N), with one transfer team (the copy stream) and one tile team (the compute stream).
    p = detail::decomposed_plan_params(cfg, op_.world, op_.k_local, op_.chunks, shard_rows);
  } else {
    // fused: small tiles, several teams.
    p.op = cfg.op;
    p.world = op_.world;
    p.m = cfg.m;
    p.n = cfg.n;
    p.k_local = op_.k_local;
    p.chunks = op_.chunks;
    p.algo = cfg.algo;
    p.elem_bytes = static_cast<int>(op_.eb);
    p.engine = plan::Engine::kSm;
    p.tile_rows = cfg.tile_rows ? cfg.tile_rows : 8;
    p.tile_cols = cfg.tile_cols ? cfg.tile_cols : 16;
    p.transfer_workers = cfg.host_transfer_workers;
    p.tile_workers = cfg.host_tile_workers;
  }
  exec_ = std::make_unique<detail::HostGemmExec>(
      op_.b, detail::build_op_plan(p), cfg.dtype, cfg.b_layout, op_.k_local, p.transfer_workers, p.tile_workers,
      fmt::format("{}.{}.{}x{}x{}", to_string(cfg.op), decomposed ? "decomposed" : "fused", cfg.m, cfg.k, cfg.n));
}

// The plan executor's gathered tensor is its own; the reference all-gather makes the copy.
void HostPlanMethod::keep_gathered(int64_t m, const void* a, void* dst, void*) {
  op_.coll.baseline_all_gather(a, dst, static_cast<uint64_t>(m / op_.world * op_.k_local), op_.cfg.dtype);
}

void HostPlanMethod::run(int64_t m, const void* a, const void* bp, void* c, void* /*stream*/, bool tracing) {
  WEFT_CHECK(m == op_.cfg.m, "the plan executor runs its prepared M only");
  exec_->run(a, bp, c, tracing ? &op_.trace : nullptr);
}

}  // namespace weft::ops::detail
