// The DLRM iteration in the cost model (include/weft/plan/dlrm.hpp): the fit recovers the
// calibration that made its points, the forward's predictions follow the formulas, the
// iteration's terms behave (fused never slower, the network's share grows with the nodes),
// and bad calibration points are refused by name.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/plan/dlrm.hpp"

using namespace weft;
using namespace weft::plan;

namespace {

DlrmCalibration truth() {
  DlrmCalibration c;
  c.lookup_us = 12;
  c.lookup_gbps = 2500;
  c.a2a_us = 30;
  c.a2a_gbps = 330;
  c.copy_gbps = 4200;
  c.link_gbps = 360;
  c.push_cost = 0.3;
  return c;
}

}  // namespace

TEST(PlanDlrm, FitRecoversTheCalibrationOfItsPoints) {
  DlrmCalibration t = truth();
  t.acc_us = 40;  // the backward's accumulation, fitted from the points' bwd_baseline
  t.acc_gbps = 1800;
  std::vector<DlrmMeasured> pts;
  for (int64_t b : {65536, 2048, 16384}) {
    DlrmModel m;
    m.batch = b;
    pts.push_back(predict_dlrm_node(t, m, 2));
  }
  const DlrmCalibration c = fit_dlrm(pts, t.copy_gbps, t.link_gbps, "synthetic");
  EXPECT_NEAR(c.lookup_gbps, t.lookup_gbps, 1e-6 * t.lookup_gbps);
  EXPECT_NEAR(c.lookup_us, t.lookup_us, 1e-6);
  EXPECT_NEAR(c.a2a_gbps, t.a2a_gbps, 1e-6 * t.a2a_gbps);
  EXPECT_NEAR(c.a2a_us, t.a2a_us, 1e-6);
  EXPECT_NEAR(c.push_cost, t.push_cost, 1e-9);
  EXPECT_NEAR(c.acc_gbps, t.acc_gbps, 1e-6 * t.acc_gbps);
  EXPECT_NEAR(c.acc_us, t.acc_us, 1e-6);
  // The forward of 4096 samples on 2 GPUs by the formulas: 4096 x 216 x 128 x 4 bytes of rows.
  DlrmModel m;
  const DlrmMeasured f = predict_dlrm_node(t, m, 2);
  EXPECT_NEAR(f.lookup_us, 12 + 4096.0 * 216 * 128 * 4 / 2500e3, 1e-6);
  EXPECT_NEAR(f.all_to_all_us, 30 + 4096.0 * 26 * 128 * 4 / 2 / 330e3, 1e-6);
  EXPECT_GT(f.baseline_us, f.fused_us);
  // The node's backward is the iteration model's on one node of that many GPUs.
  const DlrmPrediction one = predict_dlrm(h200_constants(), t, m, 1, 2, 50);
  EXPECT_NEAR(f.bwd_baseline_us, one.steps[3].baseline_us, 1e-6);
  EXPECT_NEAR(f.bwd_fused_us, one.steps[3].fused_us, 1e-6);
  const double accumulate = 40 + 4096.0 * 216 * 128 * 4 / 1800e3, relayout = 2.0 * 4096 * 26 * 128 * 4 / 4200e3;
  EXPECT_NEAR(f.bwd_baseline_us, f.all_to_all_us + accumulate + relayout, 1e-3);
  EXPECT_NEAR(f.bwd_fused_us, accumulate + f.fused_us - f.lookup_us, 1e-3);
  // Points without a backward: nothing fitted, the accumulation is twice the lookups.
  for (DlrmMeasured& x : pts) x.bwd_baseline_us = x.bwd_fused_us = 0;
  const DlrmCalibration fwd_only = fit_dlrm(pts, t.copy_gbps, t.link_gbps, "forward only");
  EXPECT_EQ(fwd_only.acc_gbps, 0);
  const DlrmMeasured g = predict_dlrm_node(fwd_only, m, 2);
  EXPECT_NEAR(g.bwd_baseline_us, g.all_to_all_us + 2 * g.lookup_us + relayout, 1e-3);
}

TEST(PlanDlrm, IterationTermsBehave) {
  const DlrmCalibration c = truth();
  const DeviceConstants d = h200_constants();
  DlrmModel m;
  double last_fwd = 0;
  for (int nodes : {1, 2, 8, 128}) {
    const DlrmPrediction p = predict_dlrm(d, c, m, nodes, 8, 50);
    ASSERT_EQ(p.steps.size(), 4u);
    double b = 0, f = 0;
    for (const DlrmStep& s : p.steps) {
      EXPECT_LE(s.fused_us, s.baseline_us + 1e-9) << s.name << " at " << nodes << " nodes";
      b += s.baseline_us;
      f += s.fused_us;
    }
    EXPECT_NEAR(p.baseline_us, b, 1e-9);
    EXPECT_NEAR(p.fused_us, f, 1e-9);
    EXPECT_GE(p.steps[0].baseline_us, last_fwd);  // more of the pooled bytes cross the network
    last_fwd = p.steps[0].baseline_us;
  }
  // A faster network shrinks the exchange, never the lookups.
  const DlrmPrediction slow = predict_dlrm(d, c, m, 16, 8, 25), fast = predict_dlrm(d, c, m, 16, 8, 100);
  EXPECT_GT(slow.steps[0].baseline_us, fast.steps[0].baseline_us);
  EXPECT_GT(m.dense_params(), 1e6);
}

TEST(PlanDlrm, BadPointsAreRefused) {
  const DlrmCalibration t = truth();
  DlrmModel m;
  const DlrmMeasured one = predict_dlrm_node(t, m, 2);
  EXPECT_THROW(fit_dlrm({one}, 4200, 360, "one point"), InvalidArgument);
  DlrmMeasured zero = one;
  zero.batch = 8192;
  zero.fused_us = 0;
  try {
    fit_dlrm({one, zero}, 4200, 360, "file.json");
    FAIL() << "a point without a time was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("file.json"), std::string::npos) << e.what();
  }
}
