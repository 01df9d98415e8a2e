// The cost model: device constants from JSON, the formulas and the event simulation, checked
// against values worked out by hand.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "weft/core/error.hpp"
#include "weft/plan/cost.hpp"
#include "weft/plan/schedule.hpp"
#include "weft/plan/templates.hpp"
#include "weft/plan/text.hpp"
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

// A complete constants file with `key` replaced by `value` (or dropped when value is empty;
// added when it is not one of the required keys).
std::string constants_with(const std::string& key, const std::string& value) {
  const std::pair<std::string, std::string> keys[] = {
      {"device", "\"x\""},      {"gemm_tflops", "1"},         {"hbm_gbps", "1"},
      {"sm_count", "1"},        {"signal_latency_us", "1"},   {"launch_us", "1"},
      {"write_ack_us", "1"},    {"cta_link_gbps", "1"},       {"cta_copy_gbps", "1"},
      {"cta_reduce_gbps", "1"}, {"link_gbps", R"({"sm": 1})"}};
  std::string text = "{";
  bool replaced = false;
  for (const auto& [k, v] : keys) {
    replaced |= k == key;
    const std::string& val = k == key ? value : v;
    if (val.empty()) continue;
    text += (text.size() > 1 ? ", \"" : "\"") + k + "\": " + val;
  }
  if (!replaced && !key.empty()) text += ", \"" + key + "\": " + value;  // an optional key
  return text + "}";
}

}  // namespace

TEST(PlanCost, DeviceConstantsFromJson) {
  const DeviceConstants d = device_constants_from_json(
      R"({"device": "H200", "gemm_tflops": 761, "hbm_gbps": 4800, "sm_count": 132, "signal_latency_us": 1.3,
          "link_gbps": {"sm": 360, "copy_engine": 395}, "launch_us": 1.5, "write_ack_us": 2.5,
          "cta_link_gbps": 21.5, "cta_copy_gbps": 43, "cta_reduce_gbps": 32,
          "sources": {"launch_us": "other keys are ignored"}})");
  EXPECT_EQ(d.device, "H200");
  EXPECT_EQ(d.gemm_tflops, 761);
  EXPECT_EQ(d.sm_count, 132);
  EXPECT_EQ(d.signal_latency_us, 1.3);
  EXPECT_EQ(d.link_gbps.at(Engine::kCopyEngine), 395);
  EXPECT_EQ(d.link_gbps.count(Engine::kNccl), 0u);
  EXPECT_EQ(d.launch_us, 1.5);
  EXPECT_EQ(d.write_ack_us, 2.5);
  EXPECT_EQ(d.cta_link_gbps, 21.5);
  EXPECT_EQ(d.cta_copy_gbps, 43);
  EXPECT_EQ(d.cta_reduce_gbps, 32);
  // Written out and read back, through a file.
  const std::string path = ::testing::TempDir() + "weft_plan_cost_test.json";
  std::ofstream(path) << device_constants_to_json(h200_constants());
  const DeviceConstants h = load_device_constants(path);
  std::remove(path.c_str());
  EXPECT_EQ(device_constants_to_json(h), device_constants_to_json(h200_constants()));
  EXPECT_EQ(h.link_gbps.at(Engine::kSm), 362.8);

  ASSERT_EQ(json_error(constants_with("", "")), "(parsed)");
  EXPECT_EQ(json_error(constants_with("hbm_gbps", "")), "dev.json: missing key 'hbm_gbps'");
  EXPECT_EQ(json_error(constants_with("link_gbps", R"({"nvlink": 1})")),
            "dev.json: link_gbps.nvlink: unknown engine (sm, tma, copy_engine, nccl, net)");
  EXPECT_EQ(json_error(R"({"device": "x", "gemm_tflops": -1})"), "dev.json: 'gemm_tflops' is -1 (need > 0)");
  EXPECT_EQ(json_error("{").rfind("dev.json: not JSON", 0), 0u);
  EXPECT_THROW(load_device_constants("/nonexistent/dev.json"), weft::InvalidArgument);
}

TEST(PlanCost, LoaderRejectsMissingOrBadNewKeys) {
  for (const char* key : {"launch_us", "write_ack_us", "cta_link_gbps", "cta_copy_gbps", "cta_reduce_gbps"}) {
    EXPECT_EQ(json_error(constants_with(key, "")), fmt::format("dev.json: missing key '{}'", key));
    EXPECT_EQ(json_error(constants_with(key, R"("fast")")), fmt::format("dev.json: '{}' is not a number", key));
  }
  // Latencies may be zero (a device without that cost), never negative; rates must be positive.
  EXPECT_EQ(json_error(constants_with("launch_us", "0")), "(parsed)");
  EXPECT_EQ(json_error(constants_with("write_ack_us", "-1")), "dev.json: 'write_ack_us' is -1 (need >= 0)");
  EXPECT_EQ(json_error(constants_with("launch_us", "-0.5")), "dev.json: 'launch_us' is -0.5 (need >= 0)");
  EXPECT_EQ(json_error(constants_with("cta_link_gbps", "0")), "dev.json: 'cta_link_gbps' is 0 (need > 0)");
  EXPECT_EQ(json_error(constants_with("cta_copy_gbps", "-43")), "dev.json: 'cta_copy_gbps' is -43 (need > 0)");
  EXPECT_EQ(json_error(constants_with("cta_reduce_gbps", "0")), "dev.json: 'cta_reduce_gbps' is 0 (need > 0)");
}

TEST(PlanCost, CallCostsAreOptionalInJson) {
  // Left out: the defaults (the H200 fit). Given: any subset, each key checked.
  EXPECT_EQ(device_constants_from_json(constants_with("", "")).calls, CallCosts{});
  const DeviceConstants d =
      device_constants_from_json(constants_with("call_costs", R"({"gemm_launch_us": 3, "collective_world_exp": 0})"));
  EXPECT_EQ(d.calls.gemm_launch_us, 3);
  EXPECT_EQ(d.calls.collective_world_exp, 0);
  EXPECT_EQ(d.calls.copy_us, CallCosts{}.copy_us);
  EXPECT_EQ(json_error(constants_with("call_costs", "1")), "dev.json: 'call_costs' is not an object");
  EXPECT_EQ(json_error(constants_with("call_costs", R"({"copy_us": -1})")),
            "dev.json: call_costs.copy_us must be a number >= 0");
  EXPECT_EQ(json_error(constants_with("call_costs", R"({"fused_gemm_efficiency": 0})")),
            "dev.json: call_costs.fused_gemm_efficiency must be a number > 0");
  EXPECT_EQ(json_error(constants_with("call_costs", R"({"launch_us": 1})")).rfind(
                "dev.json: call_costs.launch_us: unknown key (gemm_launch_us, copy_us, ", 0),
            0u);
  // Written out and read back with every key.
  DeviceConstants w = toy();
  w.cta_link_gbps = w.cta_copy_gbps = w.cta_reduce_gbps = 1;
  w.calls.rs_piece_us = 1.25;
  w.calls.sm_all_reduce_efficiency = 0.5;
  EXPECT_EQ(device_constants_from_json(device_constants_to_json(w)).calls, w.calls);
}

// The formulas the simulation and the ops' predictions (ops::predict_overlap) share.
TEST(PlanCost, FormulasWorkedOutByHand) {
  DeviceConstants d = toy();  // 1e8 FLOP/us, 10 SMs, HBM 1e6 B/us, sm link 1e5 B/us
  d.link_gbps[Engine::kCopyEngine] = 200;  // 2e5 B/us
  d.link_gbps[Engine::kNccl] = 50;         // 5e4 B/us
  d.cta_link_gbps = 10;
  d.calls = CallCosts{};
  d.calls.gemm_launch_us = 4;
  d.calls.copy_us = 2;
  d.calls.collective_us = 12;
  d.calls.collective_world_exp = 0.5;
  d.calls.sm_all_reduce_efficiency = 0.5;
  d.calls.sm_all_reduce_us = 8;
  EXPECT_NEAR(link_gbps(d, Engine::kNccl), 50, 0);
  EXPECT_THROW(link_gbps(d, Engine::kNet), weft::InvalidArgument);
  EXPECT_NEAR(transfer_us(d, Engine::kSm, 1e5), 1.0, 1e-12);
  EXPECT_NEAR(transfer_us(d, Engine::kSm, 1e5, 2), 5.0, 1e-12);          // 2 CTAs: 2e4 B/us
  EXPECT_NEAR(transfer_us(d, Engine::kCopyEngine, 1e5, 2), 0.5, 1e-12);  // not on the CTAs
  EXPECT_NEAR(local_copy_us(d, Engine::kSm, 1e6), 2.0, 1e-12);
  EXPECT_NEAR(local_reduce_us(d, Engine::kSm, 1e6), 3.0, 1e-12);
  EXPECT_NEAR(hbm_us(d, 1e6), 1.0, 1e-12);
  // 2*100*100*1000 = 2e7 FLOP: 0.2 us on the GPU, 2 us on one SM; the call also writes its
  // 2e4 output bytes through HBM (0.02 us; 4e4 at 4 bytes each) and pays 4 us of launch.
  EXPECT_NEAR(tile_us(d, 100, 100, 1000), 2.0, 1e-12);
  EXPECT_NEAR(gemm_us(d, 100, 100, 1000), 4.22, 1e-12);
  EXPECT_NEAR(gemm_us(d, 100, 100, 1000, 4), 4.24, 1e-12);
  EXPECT_NEAR(copy_call_us(d, 2e5), 3.0, 1e-12);
  // NCCL on 4 ranks: bus bytes 3/4 of 1e6 (twice for an all-reduce) at 5e4 B/us x (1.5)^0.5,
  // the all-gather's at 0.8 of that and the reduce-scatter's at 0.85.
  const double grow = std::sqrt(1.5);
  EXPECT_NEAR(collective_us(d, Collective::kAllGather, 4, 1e6), 0.75e6 / (5e4 * grow * 0.8) + 12, 1e-9);
  EXPECT_NEAR(collective_us(d, Collective::kReduceScatter, 4, 1e6), 0.75e6 / (5e4 * grow * 0.85) + 12, 1e-9);
  EXPECT_NEAR(collective_us(d, Collective::kAllReduce, 4, 1e6), 1.5e6 / (5e4 * grow) + 12, 1e-9);
  EXPECT_NEAR(collective_us(d, Collective::kAllReduce, 2, 1e6), 1e6 / 5e4 + 12, 1e-9);  // 2(W-1)/W = 1
  EXPECT_EQ(collective_us(d, Collective::kAllReduce, 1, 1e6), 0);
  // weft's all-reduce beside a GEMM: 2 * 1/2 * 1e6 B at half the copy engine's 2e5 B/us, + 8.
  EXPECT_NEAR(sm_all_reduce_us(d, 2, 1e6), 10.0 + 8, 1e-9);
  EXPECT_EQ(sm_all_reduce_us(d, 1, 1e6), 0);
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

namespace {

// Two ranks, the shape of weft's reduce-scatter (src/ops): each pushes its peer's block of 100000
// bytes into the peer's staging, copies its own block to `out`, then adds the staged block.
const char* kPushReduce = R"(plan push_reduce
world 2
tensor in 2x50000 input elem=2
tensor stage 2x50000 scratch elem=2
tensor out 1x50000 output elem=2 sum
signal 0.0 expect 1
signal 0.1 expect 1
signal 0.2 expect 1
signal 1.0 expect 1
signal 1.1 expect 1
signal 1.2 expect 1
on 0 chunk 0 push sm 0:in[1:2,0:50000] -> 1:stage[0:1,0:50000] signal 1.0+1
on 0 chunk 2 copy sm 0:in[0:1,0:50000] -> 0:out[0:1,0:50000] signal 0.1+1
on 0 chunk 3 reduce sm 0:stage[1:2,0:50000] -> 0:out[0:1,0:50000] signal 0.2+1 deps 2,1
on 1 chunk 1 push sm 1:in[0:1,0:50000] -> 0:stage[1:2,0:50000] signal 0.0+1
on 1 chunk 4 copy sm 1:in[1:2,0:50000] -> 1:out[0:1,0:50000] signal 1.1+1
on 1 chunk 5 reduce sm 1:stage[0:1,0:50000] -> 1:out[0:1,0:50000] signal 1.2+1 deps 4,0
)";

Prediction predict(const CommPlan& p, const DeviceConstants& d, const SimOptions& o = {}) {
  const TileSchedule s = row_schedule(p, "out", p.tensors.back().rows);
  return simulate(p, s, lower(p, s), d, o);
}

}  // namespace

TEST(PlanCost, LocalReductionReadsBothAndWrites) {
  const CommPlan p = parse_plan(kPushReduce, "push_reduce.plan");
  ASSERT_TRUE(verify(p).ok) << verify(p).text();
  // Push 100000 B at 1e5 B/us: 1 us, seen at 1 + 2 (signal). The copy (2e5 B of traffic at
  // 1e6 B/us: 0.2 us) runs meanwhile. The reduce reads stage and out and writes out: 3e5 B,
  // 0.3 us (a copy's 2e5 would give 3.2).
  const Prediction base = predict(p, toy());
  EXPECT_NEAR(base.total_us, 3.3, 1e-9);
  EXPECT_NEAR(base.comm_us, 3.3, 1e-9);
}

TEST(PlanCost, LaunchEntryBarrierAndWriteAckAddTheirLatencies) {
  const CommPlan p = parse_plan(kPushReduce, "push_reduce.plan");
  DeviceConstants d = toy();
  d.launch_us = 5;  // everything starts 5 us later
  EXPECT_NEAR(predict(p, d).total_us, 8.3, 1e-9);
  // The entry barrier waits one signal latency (2 us) before anything starts.
  EXPECT_NEAR(predict(p, d, {.entry_barrier = true}).total_us, 10.3, 1e-9);
  // The push wrote the peer's memory: its signal leaves 1.5 us later (the fence's acks).
  d.write_ack_us = 1.5;
  EXPECT_NEAR(predict(p, d).total_us, 9.8, 1e-9);
  // A ring pays the acks on every hop, like the signal latency: 3 hops of 1 us + 2 x (2 + 1.5),
  // then the last hop's own ack and signal before rank 3's tile sees it.
  const CommPlan ring = all_gather(AllGatherAlgo::kRing, 4, 1000, 50);
  DeviceConstants r = toy();
  r.write_ack_us = 1.5;
  const Prediction pr = predict(ring, r);
  EXPECT_NEAR(pr.comm_us, 3.0 + 2 * 3.5, 1e-9);
  EXPECT_NEAR(pr.total_us, 3.0 + 3 * 3.5, 1e-9);
}

TEST(PlanCost, CtasCapBandwidthsAtTheirPerCtaRates) {
  const CommPlan p = parse_plan(kPushReduce, "push_reduce.plan");
  DeviceConstants d = toy();
  d.cta_link_gbps = 10;    // 1e4 B/us per CTA
  d.cta_copy_gbps = 50;    // 5e4
  d.cta_reduce_gbps = 30;  // 3e4
  // Without a CTA count the per-CTA rates do not apply.
  EXPECT_NEAR(predict(p, d).total_us, 3.3, 1e-9);
  // 2 CTAs: push 1e5 B at 2e4 B/us = 5 us, seen at 7; copy 2e5 B at 1e5 B/us = 2 us; reduce 3e5 B
  // at 6e4 B/us = 5 us from 7: 12 us.
  EXPECT_NEAR(predict(p, d, {.ctas = 2}).total_us, 12.0, 1e-9);
  // 1 CTA: push 10 us, seen at 12; reduce 3e5 / 3e4 = 10 us: 22 us.
  EXPECT_NEAR(predict(p, d, {.ctas = 1}).total_us, 22.0, 1e-9);
  // Enough CTAs: the whole-GPU rates cap them again (push 1e5 B/us, HBM 1e6 B/us).
  EXPECT_NEAR(predict(p, d, {.ctas = 1000}).total_us, 3.3, 1e-9);

  // A remote reduce (pull and add) takes the longer of its link time and the read-modify-write
  // of its destination: reduce-scatter direct, blocks of 100000 B: copy 0.2 us, then a pull-add of
  // max(1e5 / 1e5, 2e5 / 1e4) = 20 us on 1 CTA whose reduction rate is 10 GB/s.
  const CommPlan rs = reduce_scatter(ReduceScatterAlgo::kDirect, 2, 1, 50000);
  d.cta_link_gbps = 100;
  d.cta_copy_gbps = 1000;
  d.cta_reduce_gbps = 10;
  EXPECT_NEAR(predict(rs, d).total_us, 0.2 + 1.0, 1e-9);
  EXPECT_NEAR(predict(rs, d, {.ctas = 1}).total_us, 0.2 + 20.0, 1e-9);

  // Engines other than sm do not run on the op's CTAs: a copy-engine all-gather is not capped.
  const CommPlan ce = all_gather(AllGatherAlgo::kDirect, 2, 1000, 50, {.engine = Engine::kCopyEngine});
  DeviceConstants c = toy();
  c.link_gbps[Engine::kCopyEngine] = 100;
  c.cta_link_gbps = 1;
  EXPECT_NEAR(predict(ce, c, {.ctas = 1}).comm_us, predict(ce, c).comm_us, 1e-9);
  EXPECT_NEAR(predict(ce, c).comm_us, 1.0, 1e-9);
}

// The constants compiled into the library are bench/constants/h200x2.json's, the source of
// record (read here by the absolute path CMake gives): a change to one must go to the other.
TEST(PlanCost, CompiledConstantsEqualTheJsonFile) {
  const DeviceConstants file = load_device_constants(WEFT_H200_CONSTANTS_JSON);
  const DeviceConstants built = h200_constants();
  EXPECT_EQ(built.device, file.device);
  EXPECT_EQ(built.gemm_tflops, file.gemm_tflops);
  EXPECT_EQ(built.hbm_gbps, file.hbm_gbps);
  EXPECT_EQ(built.sm_count, file.sm_count);
  EXPECT_EQ(built.signal_latency_us, file.signal_latency_us);
  EXPECT_EQ(built.link_gbps, file.link_gbps);
  EXPECT_EQ(built.launch_us, file.launch_us);
  EXPECT_EQ(built.write_ack_us, file.write_ack_us);
  EXPECT_EQ(built.cta_link_gbps, file.cta_link_gbps);
  EXPECT_EQ(built.cta_copy_gbps, file.cta_copy_gbps);
  EXPECT_EQ(built.cta_reduce_gbps, file.cta_reduce_gbps);
  EXPECT_EQ(built.calls, file.calls);
  // Every field above: the JSON writer names them all.
  EXPECT_EQ(device_constants_to_json(built), device_constants_to_json(file));
}
