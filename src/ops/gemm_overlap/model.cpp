// The cost model of GemmOverlap's `auto` (include/weft/ops/gemm_overlap_model.hpp).
#include "weft/ops/gemm_overlap_model.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace weft::ops {
namespace {

struct Cost {
  double tflops, link_ce, nccl, hbm, lat_us;
  static constexpr double kGemmLaunchUs = 4.0, kCopyUs = 2.0, kNcclUs = 12.0, kWaitUs = 2.0;
  // Per peer piece of a pipeline: a cuBLAS launch on few rows, an event, a copy, a signal, a
  // wait. Each from one measured point (8 ranks, 2048x4096x4096: measured minus predicted over
  // its 7 pieces; bench/results/x8-20261122/model-check.md): gemm_rs 15.7 us, ag_gemm 10.5 us
  // (the fused ag_gemm pays the latter per peer too: a copy, its signal and the wait for it).
  static constexpr double kRsPieceUs = 15.7, kAgPieceUs = 10.5;
  // NCCL's effective rate grows with the world (2 ranks ~210-300 GB/s, 4 ~280-340, 8 ~315-350
  // in the runs): 0.66 x the copy engine x (2(W-1)/W)^0.44, the exponent from the 8-rank
  // reduce-scatter rates.
  static constexpr double kNcclWorldExp = 0.44;
  double gemm(double rows, double n, double k) const { return 2 * rows * n * k / (tflops * 1e6) + kGemmLaunchUs; }
  double copy(double bytes) const { return bytes / (link_ce * 1e3) + kCopyUs; }
  double coll(double bytes) const { return bytes / (nccl * 1e3) + kNcclUs; }
};

struct Shape {
  GemmOp op;
  int w;
  double m, n, k, kl, eb;
};

double link_of(const plan::DeviceConstants& d, plan::Engine e) {
  auto it = d.link_gbps.find(e);
  if (it != d.link_gbps.end()) return it->second;
  return d.link_gbps.empty() ? 300.0 : d.link_gbps.begin()->second;
}

Cost cost_of(const plan::DeviceConstants& d, int world) {
  const double ce = link_of(d, plan::Engine::kCopyEngine);
  const double grow = world > 1 ? std::pow(2.0 * (world - 1) / world, Cost::kNcclWorldExp) : 1.0;
  return Cost{d.gemm_tflops, ce, 0.66 * ce * grow, d.hbm_gbps, d.signal_latency_us};
}

Shape shape_of(const OverlapModelInput& in) {
  const double kl = in.op == GemmOp::kAgGemm ? double(in.k) : double(in.k) / in.world;
  return Shape{in.op, in.world, double(in.m), double(in.n), double(in.k), kl, double(in.elem_bytes)};
}

double predict_baseline(const Cost& c, const Shape& s) {
  if (s.w == 1) return c.gemm(s.m, s.n, s.kl);
  const double f = (s.w - 1.0) / s.w;
  switch (s.op) {
    case GemmOp::kAgGemm:
      return c.coll(f * s.m * s.k * s.eb) + c.gemm(s.m, s.n, s.k);
    case GemmOp::kGemmRs:
      return c.gemm(s.m, s.n, s.kl) + c.coll(f * s.m * s.n * s.eb);
    case GemmOp::kGemmAr:
      return c.gemm(s.m, s.n, s.kl) + c.coll(2 * f * s.m * s.n * s.eb);
  }
  return 0;
}

// fold (gemm_rs): the own block on weft's GEMM, one launch waiting per M-block for the peers'
// pieces and adding them in its epilogue; or one cuBLASLt GEMM per piece, each after that
// piece has arrived, adding it in cuBLAS's epilogue; either way no reduce pass. Else the own
// block by cuBLAS, then a reduce.
double predict_decomposed(const Cost& c, const Shape& s, int chunks, RsFold fold) {
  const double w = s.w, ml = s.m / w, piece = ml / chunks;
  if (s.op == GemmOp::kAgGemm) {
    // Own shard first; then (w-1)*chunks pieces, each arriving after the copies before it.
    double t = c.gemm(ml, s.n, s.k);
    const double cp = c.copy(piece * s.k * s.eb);
    for (int i = 0; i < (s.w - 1) * chunks; ++i)
      t = std::max(t, (i + 1) * cp + c.lat_us + Cost::kWaitUs) + c.gemm(piece, s.n, s.k) + Cost::kAgPieceUs;
    return t;
  }
  if (s.op == GemmOp::kGemmRs && fold == RsFold::kGather) {
    // 2 ranks: the own K-half of the block, then the peer's in `chunks` column pieces, piece j
    // once the peer's rows of A and its B up to piece j have landed (one stream of copies).
    const double a_bytes = ml * s.kl * s.eb, b_bytes = s.n * s.kl * s.eb;
    double t = c.gemm(ml, s.n, s.kl), copy_end = c.copy(a_bytes);
    for (int j = 0; j < chunks; ++j) {
      copy_end += c.copy(b_bytes / chunks);
      t = std::max(t, copy_end + c.lat_us + Cost::kWaitUs) + c.gemm(ml, s.n / chunks, s.kl);
    }
    return t;
  }
  if (s.op == GemmOp::kGemmRs) {
    double t = 0, copy_end = 0;
    const double cp = c.copy(piece * s.n * s.eb);
    std::vector<double> arrive(static_cast<size_t>(chunks), 0.0);  // piece j of every peer
    for (int i = 0; i < (s.w - 1) * chunks; ++i) {
      t += c.gemm(piece, s.n, s.kl) + Cost::kRsPieceUs;
      copy_end = std::max(copy_end, t) + cp;
      arrive[static_cast<size_t>(i % chunks)] = copy_end + c.lat_us;
    }
    if (fold == RsFold::kLt) {
      for (int j = 0; j < chunks; ++j)
        t = std::max(t, arrive[static_cast<size_t>(j)] + Cost::kWaitUs) + c.gemm(piece, s.n, s.kl);
      return t;
    }
    if (fold == RsFold::kWeft) {
      // One launch; its rows of piece j start once piece j is here.
      const double per = (c.gemm(ml, s.n, s.kl) - Cost::kGemmLaunchUs) / chunks;
      t += Cost::kGemmLaunchUs;
      for (int j = 0; j < chunks; ++j) t = std::max(t, arrive[static_cast<size_t>(j)]) + per;
      return t;
    }
    t += c.gemm(ml, s.n, s.kl);
    return std::max(t, copy_end + c.lat_us) + (w + 1) * ml * s.n * s.eb / (c.hbm * 1e3) + Cost::kGemmLaunchUs;
  }
  // gemm_ar: chunk GEMMs, each followed by weft's all-reduce of its rows on the other stream.
  // The all-reduce kernels take SMs the next chunk's GEMM needs, so the overlap hides little:
  // measured on 2xH200 (bench/results/gemm_overlap-chunks-20261122/) 4096x8192x8192 took 532 /
  // 559 / 589 / 639 us with 1 / 2 / 4 / 8 chunks. Modelled as serial: every chunk pays its
  // GEMM and its all-reduce (fixed costs included), so one chunk is predicted best.
  const double rows = s.m / chunks, f = (w - 1) / w;
  double t = 0;
  for (int i = 0; i < chunks; ++i) {
    t += c.gemm(rows, s.n, s.kl);
    if (s.w > 1) t += 2 * f * rows * s.n * s.eb / (c.link_ce * 0.8e3) + 8.0;
  }
  return t;
}

// The fused ag_gemm: communication hidden except the first chunk, at ~95% of the library
// GEMM's rate, plus a fixed cost per peer (its copy, signal and wait).
double predict_fused(const Cost& c, const Shape& s) {
  const double w = s.w, f = (w - 1) / w;
  const double gemm = 2 * s.m * s.n * s.kl / (c.tflops * 1e6) / 0.95;
  const double bytes = s.op == GemmOp::kAgGemm ? f * s.m * s.k * s.eb : s.m * s.n * s.eb * f;
  return std::max(gemm, bytes / (c.link_ce * 1e3)) + 10.0 + Cost::kAgPieceUs * (w - 1);
}

}  // namespace

// Thresholds, not model terms: the costs that decide them are not in the model. cuBLASLt's
// fold (each own piece, after the peer's piece of those rows has arrived, D = A B + that
// piece: no reduce pass, no weft GEMM) measured on 2xH200 (2026-11-22 10:12,
// bench/results/gemm_rs-lt-20261122/) against the reduce pass: 1190 vs 1312 us
// (8192x8192x14336), 347 vs 366 (4096x8192x8192), 660 vs 653 (16384x8192x3584), but 85 vs 71 at
// 2048x4096x4096 (a 23 us own block: the pieces' GEMMs are too small to hide the copies and
// waits). weft's fold: removing a ~90 us reduce pass (8192x8192x14336) saved 115 us, removing
// 46 / 29 / 10 us passes cost 7-31 us (the epilogue's source reads slow the own GEMM ~10%, and
// its rows wait for the last piece; docs/gemm_overlap.md).
RsFold default_rs_fold(const OverlapModelInput& in, const plan::DeviceConstants& d, bool weft_fold_ok, bool gather_ok) {
  if (in.op != GemmOp::kGemmRs || in.world < 2) return RsFold::kNone;
  const Shape s = shape_of(in);
  const Cost c = cost_of(d, in.world);
  const double own_us = c.gemm(s.m / s.w, s.n, s.kl);
  // Gather where the whole transfer (the peer's rows of A and its B) fits under the own K-half:
  // one piece for the peer's half. Where it needs pieces (4096x8192x8192: 80 MiB against a
  // ~185 us half) it measured no better than cuBLASLt's fold (1.067-1.077 vs 1.066-1.075x the
  // GEMM alone, 2xH200, bench/results/gemm_rs-gather-20261122/).
  if (in.world == 2 && gather_ok && c.copy((s.m / s.w + s.n) * s.kl * s.eb) + c.lat_us <= own_us)
    return RsFold::kGather;
  if (in.world == 2 && own_us >= 100.0) return RsFold::kLt;
  const double reduce_us = (in.world + 1) * double(in.m / in.world) * double(in.n) * in.elem_bytes / (d.hbm_gbps * 1e3);
  return weft_fold_ok && reduce_us >= 60.0 ? RsFold::kWeft : RsFold::kNone;
}

OverlapPrediction predict_overlap(const OverlapModelInput& in, const plan::DeviceConstants& d, RsFold fold, int chunks,
                                  bool fused) {
  const Shape s = shape_of(in);
  const Cost c = cost_of(d, in.world);
  OverlapPrediction p;
  const int64_t rows_per_rank = std::max<int64_t>(1, in.m / std::max(1, in.world));
  double best = 1e300;
  for (int ch : {1, 2, 4, 8}) {
    if (ch > rows_per_rank) break;
    const double t = predict_decomposed(c, s, ch, fold);
    if (t < best) {
      best = t;
      p.chunks = ch;
    }
  }
  if (chunks > 0) p.chunks = chunks;
  p.baseline_us = predict_baseline(c, s);
  p.decomposed_us = predict_decomposed(c, s, p.chunks, fold);
  // The fused gemm_rs / gemm_ar measured slower than decomposed almost everywhere
  // (docs/gemm_overlap.md): not modelled (a tuning-cache entry can choose them).
  if (fused && in.op == GemmOp::kAgGemm) p.fused_us = predict_fused(c, s);
  p.choice = GemmMethod::kBaseline;
  double t = p.baseline_us;
  if (in.world > 1 && p.decomposed_us < t) {
    p.choice = GemmMethod::kDecomposed;
    t = p.decomposed_us;
  }
  if (p.fused_us > 0 && p.fused_us < t) p.choice = GemmMethod::kFused;
  return p;
}

}  // namespace weft::ops
