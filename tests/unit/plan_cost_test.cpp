// The cost model: device constants from JSON and the event simulation, checked against
// values worked out by hand from the model's formulas.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "weft/core/error.hpp"
#include "weft/plan/cost.hpp"
#include "weft/plan/schedule.hpp"
#include "weft/plan/templates.hpp"
#include "weft/plan/verify.hpp"

using namespace weft::plan;

namespace {

std::string json_error(const std::string& text) {
  try {
    device_constants_from_json(text, "dev.json");
  } catch (const weft::InvalidArgument& e) {
    return e.what();
  }
  return "(parsed)";
}

// Round numbers make the expected times easy to derive by hand.
DeviceConstants toy() {
  DeviceConstants d;
  d.device = "toy";
  d.gemm_tflops = 100;  // 1e8 FLOP/us over 10 SMs: 1e7 FLOP/us per worker
  d.hbm_gbps = 1000;    // 1e6 bytes/us
  d.signal_latency_us = 2;
  d.sm_count = 10;
  d.link_gbps = {{Engine::kSm, 100}};  // 1e5 bytes/us
  return d;
}

}  // namespace

TEST(PlanCost, DeviceConstantsFromJson) {
  const DeviceConstants d = device_constants_from_json(
      R"({"device": "H200", "gemm_tflops": 761, "hbm_gbps": 4800, "sm_count": 132, "signal_latency_us": 1.3,
          "link_gbps": {"sm": 360, "copy_engine": 395}})");
  EXPECT_EQ(d.device, "H200");
  EXPECT_EQ(d.gemm_tflops, 761);
  EXPECT_EQ(d.sm_count, 132);
  EXPECT_EQ(d.signal_latency_us, 1.3);
  EXPECT_EQ(d.link_gbps.at(Engine::kCopyEngine), 395);
  EXPECT_EQ(d.link_gbps.count(Engine::kNccl), 0u);
  // Written out and read back, through a file.
  const std::string path = ::testing::TempDir() + "weft_plan_cost_test.json";
  std::ofstream(path) << device_constants_to_json(h200_constants());
  const DeviceConstants h = load_device_constants(path);
  std::remove(path.c_str());
  EXPECT_EQ(h.device, "H200 (2x, NV18)");
  EXPECT_EQ(h.link_gbps.at(Engine::kSm), 360);
  EXPECT_EQ(h.hbm_gbps, 4800);

  EXPECT_EQ(
      json_error(R"({"device": "x", "gemm_tflops": 1, "sm_count": 1, "signal_latency_us": 1, "link_gbps": {"sm": 1}})"),
      "dev.json: missing key 'hbm_gbps'");
  EXPECT_EQ(json_error(R"({"device": "x", "gemm_tflops": 1, "hbm_gbps": 1, "sm_count": 1, "signal_latency_us": 1,
                          "link_gbps": {"nvlink": 1}})"),
            "dev.json: link_gbps.nvlink: unknown engine (sm, tma, copy_engine, nccl, net)");
  EXPECT_EQ(json_error(R"({"device": "x", "gemm_tflops": -1})"), "dev.json: 'gemm_tflops' is -1 (need > 0)");
  EXPECT_EQ(json_error("{").rfind("dev.json: not JSON", 0), 0u);
  EXPECT_THROW(load_device_constants("/nonexistent/dev.json"), weft::InvalidArgument);
}

TEST(PlanCost, AllGatherGemmTimesWorkedOutByHand) {
  // 2 ranks, 1024x1024 bf16 shards: 2 MiB. Local copy: 2*2097152 B / 1e6 B/us = 4.194304 us.
  // Push: 2097152 / 1e5 = 20.97152 us, seen 2 us later at the peer.
  // Tiles of 1024x512 with K = 1000: 2*1024*512*1000 FLOP / 1e7 FLOP/us = 104.8576 us.
  const CommPlan p = all_gather(AllGatherAlgo::kDirect, 2, 1024, 1024);
  TileSchedule s = gemm_schedule(p, "out", 512, 1024, 512);
  ASSERT_EQ(s.order[0].size(), size_t{2});
  const DeviceConstants d = toy();
  const Prediction many = simulate(p, s, lower(p, s), d, {.gemm_k = 1000});
  // Rank 0: its own block at 4.194304 + 104.8576; the peer's at 22.97152 + 104.8576.
  EXPECT_NEAR(many.comm_us, 20.97152, 1e-9);
  EXPECT_NEAR(many.rank_us[0], 127.82912, 1e-9);
  EXPECT_NEAR(many.total_us, 127.82912, 1e-9);
  ASSERT_EQ(many.events.size(), size_t{8});

  // One tile worker: row-major order makes rank 1 wait for rank 0's rows first
  // (22.97152 + 2 * 104.8576); rotating by rank starts it on its own rows (4.194304 + 2 * 104.8576).
  const Prediction row_major = simulate(p, s, lower(p, s), d, {.gemm_k = 1000, .tile_workers = 1});
  EXPECT_NEAR(row_major.rank_us[1], 232.68672, 1e-9);
  rotate_by_rank(s);
  ASSERT_TRUE(verify_schedule(p, s).ok);
  const Prediction rotated = simulate(p, s, lower(p, s), d, {.gemm_k = 1000, .tile_workers = 1});
  EXPECT_NEAR(rotated.rank_us[1], 213.909504, 1e-9);
  EXPECT_NEAR(rotated.total_us, 213.909504, 1e-9);
}

TEST(PlanCost, RingPaysLatencyPerHopDirectPaysNone) {
  // 4 ranks, 1000x50 bf16 shards = 100000 B: a push takes 1 us on the toy link.
  const DeviceConstants d = toy();
  const CommPlan direct = all_gather(AllGatherAlgo::kDirect, 4, 1000, 50);
  const CommPlan ring = all_gather(AllGatherAlgo::kRing, 4, 1000, 50);
  const TileSchedule sd = row_schedule(direct, "out", 1000);
  const TileSchedule sr = row_schedule(ring, "out", 1000);
  // Direct: three pushes share the sender's SM engine: 3 us. Ring: hop h ends at h us plus
  // (h-1) signal latencies: 3 + 2*2 = 7 us.
  EXPECT_NEAR(simulate(direct, sd, lower(direct, sd), d).comm_us, 3.0, 1e-9);
  EXPECT_NEAR(simulate(ring, sr, lower(ring, sr), d).comm_us, 7.0, 1e-9);
  // Split in 4: the ring pipelines: the last piece of hop 3 ends at 4 * 0.25 (hop 1) + 2 * (0.25 + 2).
  const CommPlan ring4 = all_gather(AllGatherAlgo::kRing, 4, 1000, 50, {.splits = 4});
  const TileSchedule s4 = row_schedule(ring4, "out", 250);
  EXPECT_NEAR(simulate(ring4, s4, lower(ring4, s4), d).comm_us, 1.0 + 2 * 2.25, 1e-9);
}

TEST(PlanCost, RefusesEngineWithoutBandwidthAndDeadlocks) {
  const CommPlan p = all_gather(AllGatherAlgo::kDirect, 2, 4, 4, {.engine = Engine::kNccl});
  const TileSchedule s = row_schedule(p, "out", 4);
  // Chunks 0 and 1 are the local copies (on the SM); chunk 2 is rank 0's push.
  try {
    simulate(p, s, lower(p, s), toy());
    FAIL();
  } catch (const weft::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("chunk 2 uses engine nccl, which device 'toy' has no bandwidth for"),
              std::string::npos)
        << e.what();
  }
  CommPlan q = all_gather(AllGatherAlgo::kRing, 3, 4, 4);
  for (auto& queue : q.queues) std::rotate(queue.begin(), queue.begin() + 2, queue.end());
  const TileSchedule sq = row_schedule(q, "out", 4);
  EXPECT_THROW(simulate(q, sq, lower(q, sq), toy(), {.comm_workers = 1}), weft::Error);
  EXPECT_NO_THROW(simulate(q, sq, lower(q, sq), toy(), {.comm_workers = 2}));
}
