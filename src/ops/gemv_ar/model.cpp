// The op's model: which all-reduce decomposed runs for each M, and what `auto` picks -- each
// method's call stepped through the plan cost model's formulas (include/weft/plan/cost.hpp).
// On the host backend `auto` is the fused method (gemv_ar.cpp): the model is for GPUs.
#include <fmt/format.h>

#include <algorithm>

#include "gemv_ar_impl.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"

namespace weft::ops::detail {

plan::DeviceConstants gemv_device_constants() {
  if (const std::string p = tunable_text(tunables::kDeviceConstants); !p.empty()) return plan::load_device_constants(p);
  return plan::h200_constants();
}

Method gemv_all_reduce_method(int world, uint64_t bytes) {
  // LL128 beat LL (and one-shot, two-shot) at every all-reduce size measured, 8 KiB to 4 MiB
  // (docs/collectives.md, "Auto rules"); below 8 KiB sent per rank LL's doubled bytes cost
  // under a tenth of a microsecond of NVLink and its lines need no warp-wide store, so LL
  // keeps the smallest calls.
  const uint64_t sent = bytes * static_cast<uint64_t>(std::max(world - 1, 1));
  return sent < kGemvLLMaxBytes ? Method::kLowLatency : Method::kLowLatency128;
}

GemvAutoChoice predict_gemv(const GemvModelInput& in, const plan::DeviceConstants& d) {
  const double eb = static_cast<double>(in.eb);
  const double w_bytes = static_cast<double>(in.n * in.k_local) * eb;
  const double x_bytes = static_cast<double>(in.m * in.k_local) * eb;
  const double y_bytes = static_cast<double>(in.m * in.n) * eb;
  const double peers = in.world - 1;
  const double flops = 2.0 * static_cast<double>(in.m * in.n * in.k_local);
  // The local product streams W once: memory-bound at decode sizes (its FLOPs at the GEMM rate
  // only matter at the largest M).
  const double stream_us = std::max(plan::hbm_us(d, w_bytes + x_bytes + y_bytes), flops / (d.gemm_tflops * 1e6));
  const double cublas_us = d.calls.gemm_launch_us + stream_us;
  // The unfused epilogue: one kernel reading y and the residual, writing residual_out and out.
  const double epilogue_us = in.epilogue ? d.launch_us + plan::hbm_us(d, 4 * y_bytes) : 0;
  double ll_us = 0;  // weft's all-reduce (decomposed)
  if (in.world > 1) {
    const bool ll = gemv_all_reduce_method(in.world, static_cast<uint64_t>(y_bytes)) == Method::kLowLatency;
    // Every rank pushes its y to every peer in lines: LL doubles the bytes, LL128 adds 1/15
    // and moves them at kGemvLL128LinkEfficiency of the link rate (measured on 2 and 4 GPUs).
    const double on_link = peers * y_bytes * (ll ? 2.0 : 16.0 / 15.0 / kGemvLL128LinkEfficiency);
    ll_us = d.launch_us + d.signal_latency_us + plan::transfer_us(d, plan::Engine::kSm, on_link);
  }
  GemvAutoChoice a;
  a.source = "cost model";
  a.predicted_baseline_us =
      cublas_us + plan::collective_us(d, plan::Collective::kAllReduce, in.world, y_bytes) + epilogue_us;
  a.predicted_decomposed_us = in.decomposed_available ? cublas_us + ll_us + epilogue_us : 0;
  if (in.fused_available) {
    // One launch; W streamed at weft's measured GEMV rate. Up to kGemvSmallM each part's LL
    // lines leave as it is done, so only the last part's push and one flag latency follow the
    // stream (bounded here by the whole push); above, every tile finishes in the same wave and
    // all of y follows as LL128 lines. The epilogue's grid-wide barrier adds a flag round.
    const double io_us = plan::hbm_us(d, w_bytes + x_bytes + y_bytes);
    const bool small = in.m <= kernels::kGemvSmallM;
    const double weft_stream_us =
        small ? io_us / kGemvRegHbmEfficiency : io_us + kGemvTileUs + static_cast<double>(in.m) * kGemvTileUsPerToken;
    const double on_link = peers * y_bytes * (small ? 2.0 : 16.0 / 15.0 / kGemvLL128LinkEfficiency);
    const double push_us = in.world > 1 ? d.signal_latency_us + plan::transfer_us(d, plan::Engine::kSm, on_link) : 0;
    a.predicted_fused_us = d.launch_us + weft_stream_us + push_us + (in.epilogue ? d.signal_latency_us : 0);
  }
  // The fastest prediction; ties keep the earlier (baseline, decomposed, fused).
  a.method = GemvMethod::kBaseline;
  double best = a.predicted_baseline_us;
  if (in.decomposed_available && a.predicted_decomposed_us < best) {
    best = a.predicted_decomposed_us;
    a.method = GemvMethod::kDecomposed;
  }
  if (in.fused_available && a.predicted_fused_us < best) {
    best = a.predicted_fused_us;
    a.method = GemvMethod::kFused;
  }
  return a;
}

}  // namespace weft::ops::detail

namespace weft::ops {

GemvAutoChoice predict_gemv_ar(int world, int64_t m, int64_t n, int64_t k, bool epilogue,
                               const plan::DeviceConstants& d) {
  WEFT_REQUIRE(world >= 1 && m >= 1 && n >= 1 && k >= world,
               fmt::format("predict_gemv_ar: world {}, M {}, N {}, K {}: each must be positive, K at least world",
                           world, m, n, k));
  return detail::predict_gemv({world, m, n, k / world, 2, epilogue, true, true}, d);
}

}  // namespace weft::ops
