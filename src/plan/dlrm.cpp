// The DLRM iteration in the cost model (include/weft/plan/dlrm.hpp).
#include "weft/plan/dlrm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "weft/core/error.hpp"

namespace weft::plan {

namespace {

constexpr double kF32 = 4;

// Bytes of rows one GPU reads for the forward's lookups (its share of the global batch's).
double rows_read(const DlrmModel& m) { return static_cast<double>(m.batch) * m.tables * m.pooling * m.dim * kF32; }
// Pooled bytes one GPU sends to the other `world - 1` (its tables' share of every sample).
double pooled_sent(const DlrmModel& m, int world) {
  return static_cast<double>(m.batch) * m.tables * m.dim * kF32 * (world - 1) / world;
}
// The output one GPU writes ([batch][tables * dim]).
double out_bytes(const DlrmModel& m) { return static_cast<double>(m.batch) * m.tables * m.dim * kF32; }

// The backward's accumulation of the gradients into the rows (DlrmCalibration).
double accumulate_us(const DlrmCalibration& c, const DlrmModel& m, double lookup_us) {
  return c.acc_gbps > 0 ? c.acc_us + rows_read(m) / (c.acc_gbps * 1e3) : 2.0 * lookup_us;
}

double layers_params(const std::vector<int64_t>& widths) {
  double p = 0;
  for (size_t i = 0; i + 1 < widths.size(); ++i)
    p += static_cast<double>(widths[i]) * static_cast<double>(widths[i + 1]) + static_cast<double>(widths[i + 1]);
  return p;
}

}  // namespace

double DlrmModel::dense_params() const {
  const int64_t features = (tables + 1) * dim;
  const double bottom = layers_params({dense_features, 512, 256, dim});
  const double cross = 3.0 * (2.0 * static_cast<double>(features) * 512 + static_cast<double>(features));
  const double top = layers_params({features, 1024, 1024, 512, 256, 1});
  return bottom + cross + top;
}

double DlrmModel::dense_flops_per_sample() const { return 2.0 * dense_params(); }

DlrmCalibration fit_dlrm(const std::vector<DlrmMeasured>& points, double copy_gbps, double link_gbps,
                         const std::string& source) {
  WEFT_REQUIRE(points.size() >= 2,
               fmt::format("dlrm calibration: {} point(s) of {}; it needs two batches or more", points.size(), source));
  WEFT_REQUIRE(copy_gbps > 0 && link_gbps > 0, "dlrm calibration: the copy and link rates must be positive");
  const int world = points.front().world;
  DlrmCalibration c;
  c.source = source;
  c.copy_gbps = copy_gbps;
  c.link_gbps = link_gbps;
  DlrmModel m;
  // lookup and all-to-all: a line (a fixed cost and a rate) through the smallest and the largest
  // batch; push_cost: least squares over every point.
  std::vector<DlrmMeasured> p = points;
  std::sort(p.begin(), p.end(), [](const DlrmMeasured& a, const DlrmMeasured& b) { return a.batch < b.batch; });
  for (const DlrmMeasured& x : p)
    WEFT_REQUIRE(x.world == world && x.batch > 0 && x.lookup_us > 0 && x.all_to_all_us > 0 && x.baseline_us > 0 &&
                     x.fused_us > 0,
                 fmt::format("dlrm calibration: a point of {} has no time, or another world", source));
  m.batch = p.back().batch;
  DlrmModel lo = m;
  lo.batch = p.front().batch;
  const double r0 = rows_read(lo), r1 = rows_read(m);
  WEFT_REQUIRE(p.back().lookup_us > p.front().lookup_us,
               fmt::format("dlrm calibration: the lookups of {} do not grow with the batch", source));
  c.lookup_gbps = (r1 - r0) / ((p.back().lookup_us - p.front().lookup_us) * 1e3);
  c.lookup_us = std::max(0.0, p.front().lookup_us - r0 / (c.lookup_gbps * 1e3));
  const double b0 = pooled_sent(lo, world), b1 = pooled_sent(m, world);
  const double t0 = p.front().all_to_all_us, t1 = p.back().all_to_all_us;
  WEFT_REQUIRE(b1 > b0 && t1 > t0,
               fmt::format("dlrm calibration: the all-to-all of {} does not grow with the batch", source));
  c.a2a_gbps = (b1 - b0) / ((t1 - t0) * 1e3);
  c.a2a_us = std::max(0.0, t0 - b0 / (c.a2a_gbps * 1e3));
  double num = 0, den = 0;
  for (const DlrmMeasured& x : p) {
    DlrmModel q = m;
    q.batch = x.batch;
    const double push = pooled_sent(q, world) / (link_gbps * 1e3);
    const double rest = x.fused_us - x.lookup_us - 2.0 * out_bytes(q) * (world - 1) / world / (copy_gbps * 1e3);
    num += push * rest;
    den += push * push;
  }
  c.push_cost = den > 0 ? std::max(0.0, num / den) : 0;
  // The backward's accumulation: a line through the smallest and the largest batch of the
  // baseline's backward less its exchange (the forward's all-to-all, measured) and re-layout.
  if (p.front().bwd_baseline_us > 0 && p.back().bwd_baseline_us > 0) {
    auto acc = [&](const DlrmMeasured& x, const DlrmModel& q) {
      const double relayout = world > 1 ? 2.0 * out_bytes(q) / (copy_gbps * 1e3) : 0;
      return x.bwd_baseline_us - (world > 1 ? x.all_to_all_us : 0) - relayout;
    };
    const double a0 = acc(p.front(), lo), a1 = acc(p.back(), m);
    if (a1 > a0 && a0 > 0) {
      c.acc_gbps = (r1 - r0) / ((a1 - a0) * 1e3);
      c.acc_us = std::max(0.0, a0 - r0 / (c.acc_gbps * 1e3));
    }
  }
  return c;
}

DlrmMeasured predict_dlrm_node(const DlrmCalibration& c, const DlrmModel& m, int world) {
  DlrmMeasured r;
  r.world = world;
  r.batch = m.batch;
  r.lookup_us = c.lookup_us + rows_read(m) / (c.lookup_gbps * 1e3);
  const double sent = pooled_sent(m, world);
  r.all_to_all_us = world > 1 ? c.a2a_us + sent / (c.a2a_gbps * 1e3) : 0;
  r.baseline_us = r.lookup_us + r.all_to_all_us + (world > 1 ? 2.0 * out_bytes(m) / (c.copy_gbps * 1e3) : 0);
  r.fused_us = r.lookup_us + (world > 1 ? 2.0 * out_bytes(m) * (world - 1) / world / (c.copy_gbps * 1e3) +
                                              c.push_cost * sent / (c.link_gbps * 1e3)
                                        : 0);
  const double relayout = world > 1 ? 2.0 * out_bytes(m) / (c.copy_gbps * 1e3) : 0;
  const double accumulate = accumulate_us(c, m, r.lookup_us);
  r.bwd_baseline_us = r.all_to_all_us + relayout + accumulate;
  r.bwd_fused_us = accumulate + (r.fused_us - r.lookup_us);  // the accumulation with the forward's toll and land
  return r;
}

DlrmPrediction predict_dlrm(const DeviceConstants& d, const DlrmCalibration& c, const DlrmModel& m, int nodes, int gpus,
                            double net_gbps, double dense_efficiency) {
  WEFT_REQUIRE(nodes >= 1 && gpus >= 1 && net_gbps > 0 && dense_efficiency > 0,
               "dlrm: nodes and gpus must be positive, and so the network's rate and the dense efficiency");
  DlrmPrediction p;
  p.nodes = nodes;
  p.gpus = gpus;
  const int world = nodes * gpus;
  // The exchange: of a GPU's pooled bytes, the share for GPUs of its own node goes over NVLink at
  // the calibrated NCCL rate, the rest over the network; both at once.
  const double sent = pooled_sent(m, world);
  const double intra = world > 1 ? sent * (gpus - 1) / (world - 1) : 0, inter = sent - intra;
  const double a2a = world > 1 ? c.a2a_us + std::max(intra / (c.a2a_gbps * 1e3), inter / (net_gbps * 1e3)) : 0;
  const double lookup = c.lookup_us + rows_read(m) / (c.lookup_gbps * 1e3);
  const double relayout = world > 1 ? 2.0 * out_bytes(m) / (c.copy_gbps * 1e3) : 0;
  const double land = world > 1 ? 2.0 * out_bytes(m) * (world - 1) / world / (c.copy_gbps * 1e3) : 0;
  // fused: the exchange beside the lookups; the pushes over NVLink cost the lookups as measured,
  // the network's share overlaps them too.
  const double toll = c.push_cost * intra / (c.link_gbps * 1e3);
  const double fwd_base = lookup + a2a + relayout;
  const double fwd_fused = std::max(lookup + toll, inter > 0 ? a2a : 0.0) + land;
  // backward: the pooled gradients back (the same bytes), their accumulation into the rows.
  const double accumulate = accumulate_us(c, m, lookup);
  const double bwd_base = a2a + relayout + accumulate;
  const double bwd_fused = std::max(accumulate + toll, inter > 0 ? a2a : 0.0) + land;
  // The dense part, data parallel: forward and backward (twice the forward) GEMMs, the
  // gradients' all-reduce (ring: 2 (W - 1) / W of them through the slowest link) beside the
  // backward.
  const double flops = m.dense_flops_per_sample() * static_cast<double>(m.batch);
  const double fwd_dense = flops / (d.gemm_tflops * dense_efficiency * 1e6);
  const double bwd_dense = 2.0 * fwd_dense;
  const double grads = m.dense_params() * kF32;
  const double ring_gbps = nodes > 1 ? net_gbps : link_gbps(d, Engine::kNccl);
  const double all_reduce = world > 1 ? 2.0 * grads * (world - 1) / world / (ring_gbps * 1e3) : 0;
  p.steps = {
      {"embedding + all-to-all forward", fwd_base, fwd_fused},
      {"dense forward (bottom MLP, interaction, top MLP)", fwd_dense, fwd_dense},
      {"dense backward | gradients' all-reduce", std::max(bwd_dense, all_reduce), std::max(bwd_dense, all_reduce)},
      {"embedding + all-to-all backward", bwd_base, bwd_fused}};
  for (const DlrmStep& s : p.steps) {
    p.baseline_us += s.baseline_us;
    p.fused_us += s.fused_us;
  }
  return p;
}

}  // namespace weft::plan
