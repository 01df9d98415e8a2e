// GemmOverlap's auto (include/weft/ops/gemm_overlap_model.hpp: the plan cost model's formulas
// stepped through each method) against the choices measured on H200s: at each point pinned here the model picks the method that was
// fastest (or within 2% of it) in the measured runs on 2, 4 and 8 GPUs that docs/gemm_overlap.md
// lists (the model's check against them). A recalibration that breaks one of these must say why
// there.
#include "weft/ops/gemm_overlap_model.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace weft::ops {
namespace {

plan::DeviceConstants h200x2() {  // as bench/constants/h200x2.json, which the device run reads
  plan::DeviceConstants d = plan::h200_constants();
  d.hbm_gbps = 4300;
  d.signal_latency_us = 1.25;
  return d;
}

struct Point {
  GemmOp op;
  int world;
  int64_t m, k, n;  // M x K x N, as the bench names shapes
  GemmMethod want;  // kFused here: "a weft method" (the fused ag_gemm was not measured validly there)
};

TEST(GemmOverlapModel, PicksTheMeasuredFastest) {
  const auto d = h200x2();
  const GemmMethod B = GemmMethod::kBaseline, D = GemmMethod::kDecomposed;
  const Point pts[] = {
      // 2 GPUs: decomposed everywhere (the fused ag_gemm within 0.2-1.1% of it at two shapes).
      {GemmOp::kAgGemm, 2, 8192, 8192, 14336, D},
      {GemmOp::kAgGemm, 2, 4096, 8192, 8192, D},
      {GemmOp::kAgGemm, 2, 16384, 8192, 3584, D},
      {GemmOp::kAgGemm, 2, 2048, 4096, 4096, D},
      {GemmOp::kGemmRs, 2, 8192, 8192, 14336, D},
      {GemmOp::kGemmRs, 2, 2048, 4096, 4096, D},
      // gemm_ar: never decomposed (erratic: 2-6x the baseline at some shapes, 2026-11-28).
      {GemmOp::kGemmAr, 2, 8192, 8192, 14336, B},
      {GemmOp::kGemmAr, 2, 2048, 4096, 4096, B},
      // 4 GPUs: NCCL + cuBLAS wins gemm_rs's smallest shape (85.6 vs 99.3 us).
      {GemmOp::kAgGemm, 4, 2048, 4096, 4096, GemmMethod::kFused},  // decomposed 123.5 vs 150.8 us
      {GemmOp::kGemmRs, 4, 8192, 8192, 14336, D},
      {GemmOp::kGemmRs, 4, 2048, 4096, 4096, B},
      // 4 GPUs, random shapes (2026-11-28): decomposed 0.76-0.93x the baseline at the first three
      // (chosen since NCCL's reduce-scatter rate was fitted), 1.12x at the last.
      {GemmOp::kGemmRs, 4, 1664, 7840, 6816, D},
      {GemmOp::kGemmRs, 4, 2512, 4128, 5104, D},
      {GemmOp::kGemmRs, 4, 4784, 5600, 2320, D},
      {GemmOp::kGemmRs, 4, 7200, 1728, 1504, B},
      // 8 GPUs: NCCL + cuBLAS wins gemm_ar everywhere, gemm_rs and ag_gemm at 2048x4096x4096
      // (84.6 vs 175.9 us; 151.6 vs 195.7).
      {GemmOp::kAgGemm, 8, 8192, 8192, 14336, D},
      {GemmOp::kAgGemm, 8, 2048, 4096, 4096, B},
      {GemmOp::kGemmRs, 8, 8192, 8192, 14336, D},
      {GemmOp::kGemmRs, 8, 2048, 4096, 4096, B},
      {GemmOp::kGemmAr, 8, 8192, 8192, 14336, B},
      {GemmOp::kGemmAr, 8, 4096, 8192, 8192, B},
      {GemmOp::kGemmAr, 8, 2048, 4096, 4096, B},
  };
  for (const Point& p : pts) {
    const OverlapModelInput in{p.op, p.world, p.m, p.n, p.k, 2};
    const OverlapPrediction r = predict_overlap(in, d, default_rs_fold(in, d, /*weft_fold_ok=*/true));
    if (p.want == GemmMethod::kFused)
      EXPECT_NE(r.choice, B) << to_string(p.op) << " " << p.m << "x" << p.k << "x" << p.n << " on " << p.world;
    else
      EXPECT_EQ(r.choice, p.want) << to_string(p.op) << " " << p.m << "x" << p.k << "x" << p.n << " on " << p.world
                                  << " ranks: predicted baseline " << r.baseline_us << ", decomposed "
                                  << r.decomposed_us << " (" << r.chunks << " chunks), fused " << r.fused_us;
    EXPECT_GT(r.baseline_us, 0);
    EXPECT_GT(r.decomposed_us, 0);
  }
}

// The gemm_rs fold GemmOverlap takes when nothing forces one (its thresholds were measured on
// 2xH200: docs/gemm_overlap.md).
TEST(GemmOverlapModel, DefaultRsFold) {
  const auto d = h200x2();
  // 2 ranks: the inputs travel where the peer's rows of A and its B arrive within this rank's
  // own K-half (8192x8192x14336, 16384x8192x3584); else cuBLASLt's fold where the own block is
  // long (4096x8192x8192: 80 MiB against ~185 us; 1024 x 16384 x 16384), else the reduce pass.
  EXPECT_EQ(default_rs_fold({GemmOp::kGemmRs, 2, 8192, 14336, 8192, 2}, d, true), RsFold::kGather);
  EXPECT_EQ(default_rs_fold({GemmOp::kGemmRs, 2, 16384, 3584, 8192, 2}, d, true), RsFold::kGather);
  // Without stream memory operations or copy-engine transfers: the next rule, not a fixed fold.
  EXPECT_EQ(default_rs_fold({GemmOp::kGemmRs, 2, 16384, 3584, 8192, 2}, d, true, false), RsFold::kLt);
  EXPECT_EQ(default_rs_fold({GemmOp::kGemmRs, 2, 256, 264, 256, 2}, d, true, true), RsFold::kGather);
  EXPECT_EQ(default_rs_fold({GemmOp::kGemmRs, 2, 256, 264, 256, 2}, d, true, false), RsFold::kNone);
  EXPECT_EQ(default_rs_fold({GemmOp::kGemmRs, 2, 4096, 8192, 8192, 2}, d, true), RsFold::kLt);
  EXPECT_EQ(default_rs_fold({GemmOp::kGemmRs, 2, 1024, 16384, 16384, 2}, d, true), RsFold::kLt);
  EXPECT_EQ(default_rs_fold({GemmOp::kGemmRs, 2, 2048, 4096, 4096, 2}, d, true), RsFold::kNone);
  EXPECT_EQ(default_rs_fold({GemmOp::kGemmRs, 4, 8192, 14336, 8192, 2}, d, true), RsFold::kWeft);
  EXPECT_EQ(default_rs_fold({GemmOp::kGemmRs, 4, 8192, 14336, 8192, 2}, d, false), RsFold::kNone);
  EXPECT_EQ(default_rs_fold({GemmOp::kAgGemm, 2, 8192, 14336, 8192, 2}, d, true), RsFold::kNone);
  EXPECT_EQ(default_rs_fold({GemmOp::kGemmRs, 1, 8192, 14336, 8192, 2}, d, true), RsFold::kNone);
}

TEST(GemmOverlapModel, GatherChunks) {
  const auto d = h200x2();
  // The whole transfer fits under the own K-half: one piece (measured within 2% of the GEMM
  // alone at 8192x8192x14336 and 16384x8192x3584: docs/benchmarks.md); at 4096x8192x8192 it does
  // not (80 MiB, ~210 us, against ~185): the peer's half in two column pieces.
  EXPECT_EQ(predict_overlap({GemmOp::kGemmRs, 2, 8192, 14336, 8192, 2}, d, RsFold::kGather).chunks, 1);
  EXPECT_EQ(predict_overlap({GemmOp::kGemmRs, 2, 16384, 3584, 8192, 2}, d, RsFold::kGather).chunks, 1);
  EXPECT_EQ(predict_overlap({GemmOp::kGemmRs, 2, 4096, 8192, 8192, 2}, d, RsFold::kGather).chunks, 2);
  // Gathering beats shipping partial products where it is chosen.
  for (const OverlapModelInput in : {OverlapModelInput{GemmOp::kGemmRs, 2, 8192, 14336, 8192, 2},
                                     OverlapModelInput{GemmOp::kGemmRs, 2, 16384, 3584, 8192, 2}})
    EXPECT_LT(predict_overlap(in, d, RsFold::kGather).decomposed_us, predict_overlap(in, d, RsFold::kLt).decomposed_us);
}

TEST(GemmOverlapModel, FixedChunksAndNoFused) {
  const auto d = h200x2();
  const OverlapModelInput in{GemmOp::kAgGemm, 2, 4096, 8192, 8192, 2};
  const OverlapPrediction any = predict_overlap(in, d, RsFold::kNone);
  EXPECT_GT(any.fused_us, 0);
  const OverlapPrediction four = predict_overlap(in, d, RsFold::kNone, 4, false);
  EXPECT_EQ(four.chunks, 4);
  EXPECT_EQ(four.fused_us, 0);  // not available: not predicted, never chosen
  EXPECT_NE(four.choice, GemmMethod::kFused);
  // gemm_rs / gemm_ar's fused methods are not modelled.
  EXPECT_EQ(predict_overlap({GemmOp::kGemmRs, 2, 4096, 8192, 8192, 2}, d, RsFold::kLt).fused_us, 0);
  // One rank: nothing to overlap, the GEMM alone (baseline).
  EXPECT_EQ(predict_overlap({GemmOp::kGemmRs, 1, 4096, 8192, 8192, 2}, d, RsFold::kNone).choice, GemmMethod::kBaseline);
}

// No formulas of its own: every term is the plan cost model's (include/weft/plan/cost.hpp),
// so a constant changed there moves the ops' predictions by exactly its share.
TEST(GemmOverlapModel, UsesThePlanCostModelsFormulas) {
  const auto d = h200x2();
  using plan::Collective;
  const double m = 4096, n = 8192, k = 8192, eb = 2;
  // Baseline: NCCL's collective and the library GEMM, as the plan cost model times them.
  EXPECT_DOUBLE_EQ(predict_overlap({GemmOp::kAgGemm, 2, 4096, 8192, 8192, 2}, d, RsFold::kNone).baseline_us,
                   plan::collective_us(d, Collective::kAllGather, 2, m * k * eb) + plan::gemm_us(d, m, n, k));
  EXPECT_DOUBLE_EQ(predict_overlap({GemmOp::kGemmRs, 4, 4096, 8192, 8192, 2}, d, RsFold::kNone).baseline_us,
                   plan::gemm_us(d, m, n, k / 4) + plan::collective_us(d, Collective::kReduceScatter, 4, m * n * eb));
  EXPECT_DOUBLE_EQ(predict_overlap({GemmOp::kGemmAr, 8, 4096, 8192, 8192, 2}, d, RsFold::kNone).baseline_us,
                   plan::gemm_us(d, m, n, k / 8) + plan::collective_us(d, Collective::kAllReduce, 8, m * n * eb));
  // Decomposed ag_gemm, 2 ranks, one chunk: the own shard's GEMM, then the peer's shard once its
  // copy and signal are in (or after the own GEMM, whichever is later), its GEMM and the
  // per-piece cost.
  const double own = plan::gemm_us(d, m / 2, n, k);
  const double arrive = plan::copy_call_us(d, m / 2 * k * eb) + d.signal_latency_us + d.calls.wait_us;
  EXPECT_DOUBLE_EQ(predict_overlap({GemmOp::kAgGemm, 2, 4096, 8192, 8192, 2}, d, RsFold::kNone, 1).decomposed_us,
                   std::max(own, arrive) + own + d.calls.ag_piece_us);
  // A fixed cost changed in the device constants moves every prediction that pays it.
  plan::DeviceConstants slow = d;
  slow.calls.collective_us += 5;
  slow.calls.gemm_launch_us += 1;
  for (GemmOp op : {GemmOp::kAgGemm, GemmOp::kGemmRs, GemmOp::kGemmAr}) {
    const OverlapModelInput in{op, 4, 4096, 8192, 8192, 2};
    EXPECT_DOUBLE_EQ(predict_overlap(in, slow, RsFold::kNone).baseline_us,
                     predict_overlap(in, d, RsFold::kNone).baseline_us + 6)
        << to_string(op);
  }
  // So does a bandwidth: the copy engine's (decomposed's copies; the simulation's copy-engine
  // transfers read the same constant).
  slow = d;
  slow.link_gbps[plan::Engine::kCopyEngine] /= 20;  // the peer's shard now arrives after the own GEMM
  const OverlapModelInput ag{GemmOp::kAgGemm, 2, 4096, 8192, 8192, 2};
  EXPECT_GT(predict_overlap(ag, slow, RsFold::kNone, 1).decomposed_us,
            predict_overlap(ag, d, RsFold::kNone, 1).decomposed_us);
  EXPECT_DOUBLE_EQ(plan::transfer_us(slow, plan::Engine::kCopyEngine, 1e6),
                   20 * plan::transfer_us(d, plan::Engine::kCopyEngine, 1e6));
}

}  // namespace
}  // namespace weft::ops

namespace weft::ops {
namespace {

// Unaligned K: the padding copies are A and B read and written at HBM speed plus two launches,
// and `auto` pads where the padded op's prediction with them beats the baseline with its GEMM
// kUnalignedGemmSlowdown times the aligned prediction.
TEST(GemmOverlapModel, PadsAnUnalignedKWhereItPays) {
  const auto d = h200x2();
  EXPECT_EQ(padded_k_local(1028), 1032);
  EXPECT_EQ(padded_k_local(1032), 1032);
  const OverlapModelInput rs{GemmOp::kGemmRs, 4, 5616, 6832, 4112, 2};  // K per rank 1028
  EXPECT_DOUBLE_EQ(pad_copy_us(rs, d),
                   plan::hbm_us(d, (5616.0 + 6832.0) * (1028 + 1032) * 2) + 2 * d.calls.gemm_launch_us);
  const OverlapModelInput ag{GemmOp::kAgGemm, 4, 5616, 6832, 1028, 2};  // A: M / 4 rows of K
  EXPECT_DOUBLE_EQ(pad_copy_us(ag, d),
                   plan::hbm_us(d, (1404.0 + 6832.0) * (1028 + 1032) * 2) + 2 * d.calls.gemm_launch_us);
  // Measured there (4 H200s): the baseline 569.7 us, its GEMM alone 355.6 (the aligned
  // prediction ~108): the padded op at its own predictions wins.
  const OverlapModelInput aligned{GemmOp::kGemmRs, 4, 5616, 6832, 4128, 2};
  const OverlapPrediction p = predict_overlap(aligned, d, RsFold::kNone);
  EXPECT_TRUE(pad_unaligned_k(rs, d, p.baseline_us, std::min(p.baseline_us, p.decomposed_us)));
  // Not where the padded op is predicted slower than the unaligned baseline.
  EXPECT_FALSE(pad_unaligned_k(rs, d, p.baseline_us, 10 * p.baseline_us));
}

}  // namespace
}  // namespace weft::ops
