// `fused`: one call of the fused GEMV + all-reduce (+ add + RMSNorm) over the op's symmetric
// state -- kernels::gemv_ar_fused on GPUs (a.ctas persistent CTAs), kernels::gemv_ar_host_fused
// on the host backend (a.ctas host teams, the same exchange and sum code). The state is sized
// for m_max at construction (include/weft/kernels/gemv_ar_kernels.hpp: receive lines by epoch
// parity, per-CTA epochs, the epilogue's norm state) and never reset, so every call of every M
// is capturable.
#include <fmt/format.h>

#include <algorithm>

#include "gemv_ar_impl.hpp"
#include "weft/core/error.hpp"

#ifdef WEFT_HAVE_CUDA
#include "weft/core/cuda_check.hpp"
#endif

namespace weft::ops::detail {

namespace {
// ll128: the set's receive lines are LL128 lines (the set of M > kGemvSmallM).
kernels::GemvArgs fused_state(GemvContext& c, int m_max, int ctas, const char* name, bool ll128) {
  const int world = c.world, n = static_cast<int>(c.cfg.n);
  kernels::GemvArgs a;
  a.n = n;
  a.k = static_cast<int>(c.k_local);
  a.m_max = m_max;
  a.ctas = ctas;
  a.eps = c.cfg.eps;
  a.op_tag = dev::op_tag("gemv_ar");
  a.ll128 = ll128 ? 1 : 0;
  a.lines_off = c.op.workspace(
      ll128 ? kernels::gemv_ll128_lines_bytes(world, m_max, n) : kernels::gemv_lines_bytes(world, m_max, n),
      fmt::format("fused.{}.lines", name));
  a.epoch_off = c.op.workspace(kernels::gemv_epochs_bytes(ctas), fmt::format("fused.{}.epochs", name));
  if (c.cfg.epilogue)
    a.norm_off = c.op.workspace(kernels::gemv_norm_bytes(m_max, ctas), fmt::format("fused.{}.norm", name));
  return a;
}
}  // namespace

GemvFused::GemvFused(GemvContext& c, int ctas, int small_ctas) : c_(c) {
  const int m_max = static_cast<int>(c.cfg.m_max);
  small_ = fused_state(c, std::min(m_max, kernels::kGemvSmallM), small_ctas, "small", false);
  if (m_max > kernels::kGemvSmallM) large_ = fused_state(c, m_max, ctas, "large", true);
}

void GemvFused::run(int64_t m, const void* x, const void* w, void* y, const GemvEpilogue& ep, void* stream) {
  kernels::GemvArgs a = m <= kernels::kGemvSmallM ? small_ : large_;
  a.x = x;
  a.w = w;
  a.y = y;
  a.m = static_cast<int>(m);
  a.residual = ep.residual;
  a.gamma = ep.gamma;
  a.residual_out = ep.residual_out;
#ifdef WEFT_HAVE_CUDA
  if (!c_.host()) {
    WEFT_CUDA_CHECK(kernels::gemv_ar_fused(c_.b.ctx(), a, c_.cfg.dtype, static_cast<cudaStream_t>(stream)));
    return;
  }
#endif
  (void)stream;
  kernels::gemv_ar_host_fused(c_.b.ctx(), a, c_.cfg.dtype);
  c_.b.synchronize();  // a wait that failed in a team is in the error slot: raised here
}

}  // namespace weft::ops::detail
