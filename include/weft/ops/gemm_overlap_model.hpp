// GemmOverlap's `auto` (docs/gemm_overlap.md, "auto"): per method a predicted time for one call
// of ag_gemm / gemm_rs / gemm_ar on `world` GPUs of one node. No formulas of its own: every
// term (a library GEMM, a copy-engine copy, an NCCL collective, weft's all-reduce, a reduce
// pass through HBM, the calls' fixed costs) is the plan cost model's (include/weft/plan/cost.hpp,
// the one model, which `weft plan` and `weft simulate` run too), from the device constants
// (bench/constants/*.json, plan::DeviceConstants). Baseline: the NCCL collective and the GEMM,
// one after the other; decomposed: its pipeline stepped through piece by piece; fused ag_gemm:
// the GEMM with its communication hidden. Calibrated against 2-, 4- and 8-GPU runs on H200s
// (docs/gemm_overlap.md; tests/unit/gemm_overlap_model_test.cpp pins the choices).
#pragma once
#include <cstdint>

#include "weft/ops/gemm_overlap.hpp"
#include "weft/plan/cost.hpp"

namespace weft::ops {

// gemm_rs decomposed: how the own block meets the peers' partial products — a reduce pass
// after its GEMM, folded into weft's GEMM (one launch waiting per M-block), or into one
// cuBLASLt GEMM per piece (D = A B + the peer's piece; 2 ranks). kGather (2 ranks): no partial
// products travel; the inputs do — the peer's rows of A for this rank's block and the peer's
// B, pushed from the start of the call — and this rank computes its block over all of K: its
// own K-half first, then the peer's, added in place (`chunks` column pieces of it, each after
// its part of the peer's B has landed).
enum class RsFold { kNone, kWeft, kLt, kGather };

struct OverlapModelInput {
  GemmOp op = GemmOp::kAgGemm;
  int world = 1;
  int64_t m = 0, n = 0, k = 0;  // global shape, as GemmOverlapConfig
  int elem_bytes = 2;
};

struct OverlapPrediction {
  double baseline_us = 0;
  double baseline_gemm_us = 0, baseline_comm_us = 0;  // the baseline's two calls (it is their sum)
  double decomposed_us = 0;                   // at `chunks`
  int chunks = 1;                             // decomposed's best chunk count of 1, 2, 4, 8 (at most the rows per rank)
  double fused_us = 0;                        // 0: not modelled (gemm_rs, gemm_ar)
  GemmMethod choice = GemmMethod::kBaseline;  // the fastest predicted (fused only where modelled and `fused` is true)
};

// `fold`: gemm_rs decomposed's fold (GemmOverlap chooses it; ignored for the other ops);
// `chunks` > 0 fixes decomposed's chunk count; `fused`: the fused method is available.
OverlapPrediction predict_overlap(const OverlapModelInput& in, const plan::DeviceConstants& d, RsFold fold,
                                  int chunks = 0, bool fused = true);

// gemm_rs decomposed's fold where nothing forces one (GemmOverlap: WEFT_RS_FOLD): on 2 ranks
// kGather where `gather_ok` (copy-engine transfers, stream memory operations) and the peer's
// rows of A and its B arrive before this rank's own K-half is computed (predicted), else
// cuBLASLt's fold where the own block's GEMM is predicted >= 100 us; else weft's fold where
// `weft_fold_ok` (its sm_90a GEMM, copy-engine transfers) and the reduce pass it removes would
// take >= 60 us; else the reduce pass. kNone for the other ops and one rank.
RsFold default_rs_fold(const OverlapModelInput& in, const plan::DeviceConstants& d, bool weft_fold_ok,
                       bool gather_ok = true);

// K per rank not a multiple of 8 (rows of A not 16-byte aligned): cuBLAS runs the GEMM on such
// operands at a fraction of its rate (measured 3.3-4.8x its aligned time, 5 random shapes on 4
// H200s; docs/gemm_overlap.md, "Unaligned K"); GemmOverlap's decomposed and fused pad K instead
// (A and B copied into zero-padded buffers, then the aligned op). The slowdown the model assumes:
inline constexpr double kUnalignedGemmSlowdown = 3.0;
// K padded to the next multiple of 8 per rank.
inline int64_t padded_k_local(int64_t k_local) { return (k_local + 7) / 8 * 8; }
// The padding copies' time: A (a_rows x K per rank) and B (N x K per rank) read and written.
double pad_copy_us(const OverlapModelInput& in, const plan::DeviceConstants& d);
// Whether `auto` pads an unaligned K: the padded op's best prediction (`padded_best_us`, the
// aligned op's own choice) plus the copies against the baseline on the unaligned operands (the
// aligned baseline's `aligned_baseline_us` with its GEMM kUnalignedGemmSlowdown times slower).
bool pad_unaligned_k(const OverlapModelInput& in, const plan::DeviceConstants& d, double aligned_baseline_us,
                     double padded_best_us);

}  // namespace weft::ops
