// The DLRM training iteration in the cost model (`weft simulate --model dlrm`; issue 24,
// docs/embedding_a2a.md "Scale-out"): MLPerf DLRM-DCNv2 on nodes x GPUs, data parallel dense
// part, model parallel embeddings (lookups and pooled bytes spread evenly over the GPUs), the
// embedding + all-to-all forward and backward by the baseline (lookups, then NCCL's all-to-all)
// or fused (the all-to-all overlapped with the lookups, as ops::EmbeddingA2A's fused method).
// The embedding terms come from a calibration fitted on weft's own measurements (`weft bench
// embedding_a2a`'s DLRM points); the dense terms from the device constants.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "weft/plan/cost.hpp"

namespace weft::plan {

// One node's measured forward -- and backward (SGD's update; 0: not measured) --, one point of
// `weft bench embedding_a2a --shapes dlrm`.
struct DlrmMeasured {
  int world = 2;
  int64_t batch = 0;  // samples a GPU
  double lookup_us = 0, all_to_all_us = 0, baseline_us = 0, fused_us = 0;
  double bwd_baseline_us = 0, bwd_fused_us = 0;
};

// The embedding forward's terms, fitted on DlrmMeasured points (fit_dlrm):
//  lookup      = lookup_us + rows read / lookup_gbps
//  all_to_all  = a2a_us + bytes sent / a2a_gbps                        (NCCL, one node)
//  baseline    = lookup + all_to_all + relayout (out read and written at copy_gbps)
//  fused       = lookup + land (the peers' columns read and written at copy_gbps)
//                + push_cost * bytes sent / link_gbps                   (the pushes' toll on the lookups)
// and the backward's accumulation into the rows (SGD's update), fitted where the points have the
// baseline's backward (acc_gbps > 0), else twice the lookups:
//  accumulate  = acc_us + rows read / acc_gbps      (bwd_baseline - all_to_all - relayout)
//  bwd baseline = all_to_all + relayout + accumulate;  bwd fused = accumulate + (fused - lookup)
struct DlrmCalibration {
  std::string source;  // where the points came from
  double lookup_us = 0, lookup_gbps = 0, a2a_us = 0, a2a_gbps = 0, copy_gbps = 0, link_gbps = 0, push_cost = 0;
  double acc_us = 0, acc_gbps = 0;
};

struct DlrmModel {
  int64_t batch = 4096;  // samples a GPU
  int tables = 26;
  int64_t dim = 128;
  double pooling = 216.0 / 26;  // MLPerf DLRM-DCNv2's pooling factors' mean
  int64_t dense_features = 13;
  // The dense part's parameters and FLOPs a sample (bottom MLP 13-512-256-128, DCNv2's three
  // low-rank (512) cross layers on 27 x 128 features, top MLP 1024-1024-512-256-1).
  double dense_params() const;
  double dense_flops_per_sample() const;  // forward, 2 per multiply-add
};

struct DlrmStep {
  std::string name;
  double baseline_us = 0, fused_us = 0;
};
struct DlrmPrediction {
  int nodes = 1, gpus = 8;
  std::vector<DlrmStep> steps;
  double baseline_us = 0, fused_us = 0;
};

// Fits the calibration on measured points of one world (at least two batches). Throws
// InvalidArgument for fewer points or non-positive times.
DlrmCalibration fit_dlrm(const std::vector<DlrmMeasured>& points, double copy_gbps, double link_gbps,
                         const std::string& source);
// The calibration's forward and backward of one node of `world` GPUs (the calibration table's
// predictions; the backward as predict_dlrm's).
DlrmMeasured predict_dlrm_node(const DlrmCalibration& c, const DlrmModel& m, int world);
// One training iteration on nodes x gpus, the inter-node link `net_gbps` a GPU. The dense
// part's GEMMs run at `dense_efficiency` of d.gemm_tflops (small GEMMs); its gradients'
// all-reduce (NCCL's ring) overlaps the backward's dense compute. The embedding backward: the
// gradients' all-to-all, then (baseline) or beside (fused) their accumulation into the tables'
// rows (ops::EmbeddingA2A's backward with SGD's update: the calibration's accumulate).
DlrmPrediction predict_dlrm(const DeviceConstants& d, const DlrmCalibration& c, const DlrmModel& m, int nodes, int gpus,
                            double net_gbps, double dense_efficiency = 0.5);

}  // namespace weft::plan
