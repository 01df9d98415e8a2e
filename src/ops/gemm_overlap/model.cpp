// The cost model of GemmOverlap's `auto` (include/weft/ops/gemm_overlap_model.hpp).
#include "weft/ops/gemm_overlap_model.hpp"

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

namespace weft::ops {
namespace {

using plan::Collective;

// The op's shape in the model's terms; every time below comes from the plan cost model's
// formulas (include/weft/plan/cost.hpp) with the device's constants.
struct Shape {
  const plan::DeviceConstants& d;
  GemmOp op;
  int w;
  double m, n, k, kl, eb;  // kl: this rank's GEMM depth
  double gemm(double rows, double cols, double depth) const { return plan::gemm_us(d, rows, cols, depth); }
  double copy(double bytes) const { return plan::copy_call_us(d, bytes); }
  double lat() const { return d.signal_latency_us; }
  const plan::CallCosts& calls() const { return d.calls; }
};

Shape shape_of(const OverlapModelInput& in, const plan::DeviceConstants& d) {
  const double kl = in.op == GemmOp::kAgGemm ? double(in.k) : double(in.k) / in.world;
  return Shape{d, in.op, in.world, double(in.m), double(in.n), double(in.k), kl, double(in.elem_bytes)};
}

// NCCL's collective and a library GEMM, one after the other: {GEMM, collective}.
std::pair<double, double> predict_baseline(const Shape& s) {
  if (s.w == 1) return {s.gemm(s.m, s.n, s.kl), 0};
  switch (s.op) {
    case GemmOp::kAgGemm:
      return {s.gemm(s.m, s.n, s.k), plan::collective_us(s.d, Collective::kAllGather, s.w, s.m * s.k * s.eb)};
    case GemmOp::kGemmRs:
      return {s.gemm(s.m, s.n, s.kl), plan::collective_us(s.d, Collective::kReduceScatter, s.w, s.m * s.n * s.eb)};
    case GemmOp::kGemmAr:
      return {s.gemm(s.m, s.n, s.kl), plan::collective_us(s.d, Collective::kAllReduce, s.w, s.m * s.n * s.eb)};
  }
  return {0, 0};
}

// The decomposed methods stepped through piece by piece: library GEMM calls, copy-engine
// copies one after another on the sending engine, a flag latency and a stream wait before a
// piece is used, a fixed cost per peer piece.
// fold (gemm_rs): the own block on weft's GEMM, one launch waiting per M-block for the peers'
// pieces and adding them in its epilogue; or one cuBLASLt GEMM per piece, each after that
// piece has arrived, adding it in cuBLAS's epilogue; either way no reduce pass. Else the own
// block by cuBLAS, then a reduce pass.
double predict_decomposed(const Shape& s, int chunks, RsFold fold) {
  const double w = s.w, ml = s.m / w, piece = ml / chunks;
  const plan::CallCosts& cc = s.calls();
  if (s.op == GemmOp::kAgGemm) {
    // Own shard first; then (w-1)*chunks pieces, each arriving after the copies before it.
    double t = s.gemm(ml, s.n, s.k);
    const double cp = s.copy(piece * s.k * s.eb);
    for (int i = 0; i < (s.w - 1) * chunks; ++i)
      t = std::max(t, (i + 1) * cp + s.lat() + cc.wait_us) + s.gemm(piece, s.n, s.k) + cc.ag_piece_us;
    return t;
  }
  if (s.op == GemmOp::kGemmRs && fold == RsFold::kGather) {
    // 2 ranks: the own K-half of the block, then the peer's in `chunks` column pieces, piece j
    // once the peer's rows of A and its B up to piece j have landed (one stream of copies).
    const double a_bytes = ml * s.kl * s.eb, b_bytes = s.n * s.kl * s.eb;
    double t = s.gemm(ml, s.n, s.kl), copy_end = s.copy(a_bytes);
    for (int j = 0; j < chunks; ++j) {
      copy_end += s.copy(b_bytes / chunks);
      t = std::max(t, copy_end + s.lat() + cc.wait_us) + s.gemm(ml, s.n / chunks, s.kl);
    }
    return t;
  }
  if (s.op == GemmOp::kGemmRs) {
    double t = 0, copy_end = 0;
    const double cp = s.copy(piece * s.n * s.eb);
    std::vector<double> arrive(static_cast<size_t>(chunks), 0.0);  // piece j of every peer
    for (int i = 0; i < (s.w - 1) * chunks; ++i) {
      t += s.gemm(piece, s.n, s.kl) + cc.rs_piece_us;
      copy_end = std::max(copy_end, t) + cp;
      arrive[static_cast<size_t>(i % chunks)] = copy_end + s.lat();
    }
    if (fold == RsFold::kLt) {
      for (int j = 0; j < chunks; ++j)
        t = std::max(t, arrive[static_cast<size_t>(j)] + cc.wait_us) + s.gemm(piece, s.n, s.kl);
      return t;
    }
    if (fold == RsFold::kWeft) {
      // One launch; its rows of piece j start once piece j is here.
      const double per = (s.gemm(ml, s.n, s.kl) - cc.gemm_launch_us) / chunks;
      t += cc.gemm_launch_us;
      for (int j = 0; j < chunks; ++j) t = std::max(t, arrive[static_cast<size_t>(j)]) + per;
      return t;
    }
    // The reduce pass: a kernel reading the own block and w pieces, writing one.
    t += s.gemm(ml, s.n, s.kl);
    return std::max(t, copy_end + s.lat()) + plan::hbm_us(s.d, (w + 1) * ml * s.n * s.eb) + cc.gemm_launch_us;
  }
  // gemm_ar: GEMMs by pieces of every shard, each owner's sum of a piece one SM pass on the
  // other stream (the two-shot all-reduce's bytes: sm_all_reduce_us). The passes take SMs the
  // next GEMMs need, so the overlap hides little (docs/gemm_overlap.md has the measured chunk
  // counts): modelled as serial, every chunk pays its GEMM and its all-reduce (fixed costs
  // included), so one chunk is predicted best.
  const double rows = s.m / chunks;
  double t = 0;
  for (int i = 0; i < chunks; ++i) t += s.gemm(rows, s.n, s.kl) + plan::sm_all_reduce_us(s.d, s.w, rows * s.n * s.eb);
  return t;
}

// The fused ag_gemm: communication hidden except the first chunk, the GEMM at
// fused_gemm_efficiency of the library's rate, plus a fixed cost and one per peer (its copy,
// signal and wait: ag_piece_us).
double predict_fused(const Shape& s) {
  const double w = s.w, f = (w - 1) / w;
  const plan::CallCosts& cc = s.calls();
  const double gemm = (s.gemm(s.m, s.n, s.kl) - cc.gemm_launch_us) / cc.fused_gemm_efficiency;
  const double bytes = s.op == GemmOp::kAgGemm ? f * s.m * s.k * s.eb : s.m * s.n * s.eb * f;
  return std::max(gemm, plan::transfer_us(s.d, plan::Engine::kCopyEngine, bytes)) + cc.fused_us +
         cc.ag_piece_us * (w - 1);
}

}  // namespace

// Thresholds, not model terms: the costs that decide them are not in the model. The
// measurements behind them (cuBLASLt's fold against the reduce pass, weft's fold, gathering
// the inputs) are in docs/gemm_overlap.md ("gemm_rs's fold"): cuBLASLt's fold lost only where
// the own block's GEMM is short (its pieces' GEMMs too small to hide the copies and waits);
// weft's fold saved time only where the reduce pass it removes is long (its epilogue's source
// reads slow the own GEMM, and its rows wait for the last piece).
RsFold default_rs_fold(const OverlapModelInput& in, const plan::DeviceConstants& d, bool weft_fold_ok, bool gather_ok) {
  if (in.op != GemmOp::kGemmRs || in.world < 2) return RsFold::kNone;
  const Shape s = shape_of(in, d);
  const double own_us = s.gemm(s.m / s.w, s.n, s.kl);
  // Gather where the whole transfer (the peer's rows of A and its B) fits under the own K-half:
  // one piece for the peer's half. Where it needs pieces it measured no better than cuBLASLt's
  // fold.
  if (in.world == 2 && gather_ok && s.copy((s.m / s.w + s.n) * s.kl * s.eb) + s.lat() <= own_us)
    return RsFold::kGather;
  if (in.world == 2 && own_us >= 100.0) return RsFold::kLt;
  const double reduce_us = plan::hbm_us(d, (in.world + 1) * double(in.m / in.world) * double(in.n) * in.elem_bytes);
  return weft_fold_ok && reduce_us >= 60.0 ? RsFold::kWeft : RsFold::kNone;
}

OverlapPrediction predict_overlap(const OverlapModelInput& in, const plan::DeviceConstants& d, RsFold fold, int chunks,
                                  bool fused) {
  const Shape s = shape_of(in, d);
  OverlapPrediction p;
  const int64_t rows_per_rank = std::max<int64_t>(1, in.m / std::max(1, in.world));
  double best = 1e300;
  for (int ch : {1, 2, 4, 8}) {
    if (ch > rows_per_rank) break;
    const double t = predict_decomposed(s, ch, fold);
    if (t < best) {
      best = t;
      p.chunks = ch;
    }
  }
  if (chunks > 0) p.chunks = chunks;
  std::tie(p.baseline_gemm_us, p.baseline_comm_us) = predict_baseline(s);
  p.baseline_us = p.baseline_gemm_us + p.baseline_comm_us;
  p.decomposed_us = predict_decomposed(s, p.chunks, fold);
  // The fused gemm_rs / gemm_ar measured slower than decomposed almost everywhere
  // (docs/gemm_overlap.md): not modelled (a tuning-cache entry can choose them).
  if (fused && in.op == GemmOp::kAgGemm) p.fused_us = predict_fused(s);
  p.choice = GemmMethod::kBaseline;
  double t = p.baseline_us;
  // gemm_ar's decomposed is never chosen: on 2 and 4 H200s it measured 2-6x the baseline at
  // some shapes, with one piece a shard or two, and no rule separates them from the shapes where
  // it gains up to 10 % (docs/gemm_overlap.md, "gemm_ar"). A tuning-cache entry can choose it.
  // ag_gemm with few rows a rank: the pieces' fixed costs are more than the model holds (384 x
  // 7984 x 7456 on 2 H200s: decomposed 1.55x, fused 1.17x the baseline; docs/gemm_overlap.md).
  const bool few_rows = in.op == GemmOp::kAgGemm && rows_per_rank < 256;
  if (in.world > 1 && p.decomposed_us < t && in.op != GemmOp::kGemmAr && !few_rows) {
    p.choice = GemmMethod::kDecomposed;
    t = p.decomposed_us;
  }
  if (p.fused_us > 0 && p.fused_us < t && !few_rows) p.choice = GemmMethod::kFused;
  return p;
}

double pad_copy_us(const OverlapModelInput& in, const plan::DeviceConstants& d) {
  const int64_t kl = in.op == GemmOp::kAgGemm ? in.k : in.k / std::max(1, in.world);
  const double a_rows = in.op == GemmOp::kAgGemm ? double(in.m) / std::max(1, in.world) : double(in.m);
  const double bytes = (a_rows + double(in.n)) * double(kl + padded_k_local(kl)) * in.elem_bytes;
  return plan::hbm_us(d, bytes) + 2 * d.calls.gemm_launch_us;
}

bool pad_unaligned_k(const OverlapModelInput& in, const plan::DeviceConstants& d, double aligned_baseline_us,
                     double padded_best_us) {
  const Shape s = shape_of(in, d);
  const double gemm = in.op == GemmOp::kAgGemm ? s.gemm(s.m, s.n, s.k) : s.gemm(s.m, s.n, s.kl);
  const double unaligned_baseline_us = aligned_baseline_us + (kUnalignedGemmSlowdown - 1) * gemm;
  return padded_best_us + pad_copy_us(in, d) < unaligned_baseline_us;
}

}  // namespace weft::ops
