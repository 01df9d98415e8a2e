// The device-API semantics suite on the host backend, for world sizes 1, 2, 3, 4 and 8,
// and the fault tests: a rank that exits early, a rank that is slow.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "devapi_driver.hpp"
#include "host_executor.hpp"
#include "rank_harness.hpp"
#include "weft/device/tile/notify.hpp"
#include "weft/device/tile/wait.hpp"

using namespace weft;
using namespace weft::testing;

class DevapiHost : public ::testing::TestWithParam<int> {};

TEST_P(DevapiHost, PutGetSignalBarrierSemantics) {
  expect_all_ok(run_host_ranks(GetParam(), [] {
    auto b = make_backend();
    HostExecutor x(*b);
    DevapiSuite suite(*b, x);
    int checks = suite.run_all();
    WEFT_CHECK(checks == 3 * (2 * static_cast<int>(default_cases().size()) + 1), "not every check ran");
  }));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DevapiHost, ::testing::Values(1, 2, 3, 4, 8));

TEST(DevapiHostFaults, RankThatExitsEarlyIsNamedByEveryWaiterWithinTheDeadline) {
  const int n = 4, victim = 2;
  const int64_t timeout_ms = 1500;
  auto t0 = std::chrono::steady_clock::now();
  auto res = run_host_ranks(
      n,
      [] {
        auto b = make_backend();
        HostExecutor x(*b);
        auto bar = b->heap().alloc_barrier("fault.bar");
        x.barrier_once(Gran::kBlock, bar);  // everyone meets once
        if (world_rank() == victim) _exit(0);  // then the victim dies
        x.barrier_once(Gran::kBlock, bar);
      },
      {}, timeout_ms);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, timeout_ms / 1000.0 + 5.0) << "the waiters did not give up within the deadline";
  for (const auto& r : res) {
    if (r.rank == victim) continue;
    EXPECT_EQ(r.exit_code, 1) << "rank " << r.rank << (r.killed_by_launcher ? " hung" : "");
    EXPECT_NE(r.message.find("rank 2 did not arrive"), std::string::npos) << r.message;
    EXPECT_NE(r.message.find("barrier wait timed out"), std::string::npos) << r.message;
  }
}

TEST(DevapiHostFaults, SignalWaitNamesTheSilentProducer) {
  auto res = run_host_ranks(
      2,
      [] {
        auto b = make_backend();
        auto sig = b->heap().alloc_signals(2, "fault.sig");
        if (world_rank() == 0) dev::wait_ge(b->ctx(), sig.at(1), 1, 1);  // rank 1 never signals
      },
      {}, 800);
  EXPECT_EQ(res[0].exit_code, 1);
  EXPECT_NE(res[0].message.find("signal wait timed out"), std::string::npos) << res[0].message;
  EXPECT_NE(res[0].message.find("rank 1 did not arrive"), std::string::npos) << res[0].message;
  EXPECT_NE(res[0].message.find("expected >= 1, observed 0"), std::string::npos) << res[0].message;
}

// Tile primitives: a chunk's counter reaches threshold * epoch through notifies from a peer and
// from this rank; a chunk never notified times out with the op, the chunk and the peer named.
TEST(DevapiHostFaults, ChunkWaitNamesOpChunkAndPeer) {
  auto res = run_host_ranks(
      2,
      [] {
        auto b = make_backend();
        auto sig = b->heap().alloc_signals(3, "fault.chunks");
        const dev::tile::ChunkSignals chunks{sig.offset, dev::op_tag("gemm_rs")};
        const auto& c = b->ctx();
        if (world_rank() == 1) {
          for (int i = 0; i < 2; ++i) dev::tile::notify_chunk(c, chunks, 0, 0);  // epoch 2 of threshold 1
          return;
        }
        WEFT_CHECK(dev::tile::wait_chunk(c, chunks, 0, 1, 2, 1) == 2, "chunk 0 should read 2");
        dev::tile::notify_chunk(c, chunks, 2, 0, 3);
        WEFT_CHECK(dev::tile::wait_chunk(c, chunks, 2, 1, 3, 0) == 3, "chunk 2 should read 3");
        dev::tile::wait_chunk(c, chunks, 1, 1, 3, 1);  // nobody notifies chunk 1
      },
      {}, 800);
  EXPECT_EQ(res[1].exit_code, 0) << res[1].message;
  EXPECT_EQ(res[0].exit_code, 1);
  EXPECT_NE(res[0].message.find("signal wait timed out"), std::string::npos) << res[0].message;
  EXPECT_NE(res[0].message.find("rank 1 did not arrive (gemm_rs chunk 1: signal at heap offset"), std::string::npos)
      << res[0].message;
  EXPECT_NE(res[0].message.find("expected >= 3, observed 0"), std::string::npos) << res[0].message;
}

TEST(DevapiHostFaults, SlowRankWithinTheDeadlineIsNotAnError) {
  expect_all_ok(run_host_ranks(
      3,
      [] {
        auto b = make_backend();
        HostExecutor x(*b);
        auto bar = b->heap().alloc_barrier("slow.bar");
        if (world_rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(700));
        for (int i = 0; i < 3; ++i) x.barrier_once(Gran::kThread, bar);
      },
      {}, 3000));
}

TEST(DevapiHostFaults, FailureInOneTeamWorkerDoesNotHangItsTeam) {
  expect_all_ok(run_host_ranks(1, [] {
    bool threw = false;
    try {
      host_launch(2, 4, [](CoopHostTeam t, int block) {
        if (block == 1 && t.rank() == 2) throw InvalidArgument("worker 2 of block 1 failed");
        t.sync();
        t.sync();
      });
    } catch (const InvalidArgument& e) {
      threw = std::string(e.what()).find("worker 2 of block 1") != std::string::npos;
    }
    WEFT_CHECK(threw, "the worker's own error was not the one reported");
  }));
}
