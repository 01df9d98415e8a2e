// `decomposed`: the same GEMM as the baseline, then weft's latency all-reduce (Collectives ll or
// ll128, chosen per M by the model) in place on the stream, then the unfused epilogue. The
// collective kernel is launched with programmatic dependent launch (kernels::collective, where
// kernels::pdl_enabled()) and begins with griddepcontrol.wait, so it is scheduled while the
// GEMM finishes and reads y only after the GEMM's writes are visible.
//
// A collective's state is per element count, so every M from 1 to m_max has its own, prepared
// here (prepare_all_reduce): every call of every M is then capturable. Their sum grows as
// m_max^2 x N x world (docs/gemv_ar.md, "Methods"); where the symmetric heap cannot hold it the
// method is left out (available_methods()) and its space given back, instead of failing the op.
#include <fmt/format.h>

#include "gemv_ar_impl.hpp"
#include "weft/core/error.hpp"

namespace weft::ops::detail {

GemvDecomposed::GemvDecomposed(GemvContext& c) : c_(c) {
  for (int64_t m = 1; m <= c.cfg.m_max; ++m)
    methods_.push_back(gemv_all_reduce_method(c.world, static_cast<uint64_t>(m * c.cfg.n) * c.eb));
  if (c.world == 1) {  // nothing to reduce: all_reduce() launches nothing
    coll_ = std::make_unique<Collectives>(c.b);
    return;
  }
  auto coll = std::make_unique<Collectives>(c.b);
  try {
    for (int64_t m = 1; m <= c.cfg.m_max; ++m)
      coll->prepare_all_reduce(static_cast<uint64_t>(m * c.cfg.n), c.cfg.dtype, method(m));
  } catch (const InvalidArgument& e) {
    // The heap refuses an allocation on every rank alike, so every rank ends up here.
    why_ = fmt::format("its all-reduce states for M = 1 .. {} do not fit in the symmetric heap ({})", c.cfg.m_max,
                       e.message());
  }
  if (why_.empty()) coll_ = std::move(coll);
  // else: coll is destroyed here, outside the handler: its heap share gives its space back.
}

void GemvDecomposed::all_reduce(void* y, int64_t m, void* stream) {
  if (c_.world == 1) return;  // y is the sum (and nothing was prepared)
  coll_->all_reduce(y, y, static_cast<uint64_t>(m * c_.cfg.n), c_.cfg.dtype, method(m), stream);
}

void GemvDecomposed::run(int64_t m, const void* x, const void* w, void* y, const GemvEpilogue& ep, void* stream) {
  void* sum = ep ? c_.sum_buffer() : y;
  c_.gemv(x, w, sum, m, stream);
  all_reduce(sum, m, stream);
  if (ep) c_.add_rmsnorm(sum, ep.residual, ep.gamma, ep.residual_out, y, m, stream);
}

}  // namespace weft::ops::detail
