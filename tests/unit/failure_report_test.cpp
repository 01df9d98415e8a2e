// Issue 28 item 16: the failure report (Backend::raise_failure, docs/failure.md). After a
// timeout the survivors name the rank that actually died, not the peer their own wait named
// (a ring's predecessor, itself waiting); ranks whose calls differ after set-up (what GPUs do
// not agree on per call) get an error naming both calls, not timeouts blaming each other.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "rank_harness.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/collectives.hpp"
#include "weft/ops/gemm_overlap.hpp"
#include "weft/plan/host_executor.hpp"
#include "weft/plan/schedule.hpp"
#include "weft/plan/templates.hpp"
#include "weft/runtime/backend.hpp"

using namespace weft;
using namespace weft::testing;

namespace {

// "peer P: <message>" for a TimeoutError (the harness reports only the message).
void rethrow_naming_peer(const std::function<void()>& f) {
  try {
    f();
  } catch (const TimeoutError& e) {
    throw Error(fmt::format("TimeoutError naming rank {}: {}", e.peer(), e.what()));
  }
}

}  // namespace

// A ring all-gather on 4 ranks: rank 1 passes the call's entry barrier, moves nothing, and is
// killed mid-call. Rank 2 waits for rank 1, rank 3 for rank 2 (which forwards rank 1's share),
// rank 0 for rank 3: each survivor's own wait names its ring predecessor. The report follows
// the waits to the rank that did not join it: every survivor names rank 1, as exited.
TEST(FailureReport, RingSurvivorsNameTheRankThatDiedNotTheirPredecessor) {
  const int world = 4, victim = 1;
  const int64_t timeout_ms = 1500;
  const auto t0 = std::chrono::steady_clock::now();
  auto res = run_host_ranks(
      world,
      [timeout_ms] {
        auto backend = make_backend();
        const int rank = backend->rank();
        constexpr int64_t kM = 4, kK = 8, kN = 8;
        plan::CommPlan p = plan::all_gather(plan::AllGatherAlgo::kRing, world, kM, kK, {.splits = 1, .elem_bytes = 4});
        plan::TileSchedule s = plan::gemm_schedule(p, "out", kN, 4, 8);
        plan::Lowered lowered = plan::lower(p, s);
        if (rank == victim) {  // its chunks never move
          plan::LoweredRank& lr = lowered.ranks[victim];
          lr.transfers.clear();
          lr.transfer_waits.clear();
          lr.counter_wait_begin = {0};
          lr.counter_waits.clear();
        }
        plan::HostExecutorOptions opt;
        opt.dtype = dev::DType::kF32;
        plan::HostExecutor x(*backend, p, s, lowered, "ring_fault", opt);
        std::vector<float> a(static_cast<size_t>(kM * kK), 1.0f);
        plan::ExecCall call;
        call.input = a.data();
        call.input_tensor = x.plan().tensor_id("in");
        call.tile = [](const plan::TileEntry&, int64_t, int64_t, int64_t, int64_t) {};
        // What an op records before it launches (the executor is below the ops).
        backend->record_call("all_gather", "ring", static_cast<uint64_t>(kM * kK), static_cast<int32_t>(dev::DType::kF32),
                             false);
        if (rank == victim) {
          std::thread([timeout_ms] {
            std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms / 2));
            _exit(0);
          }).detach();
          x.run(call);  // stuck: its own copy never runs either
          return;
        }
        int own_peer = -2;
        rethrow_naming_peer([&] {
          try {
            x.run(call);
          } catch (const TimeoutError& e) {
            own_peer = e.peer();
            backend->raise_failure(e);  // what an op's boundary does (OpBase::guarded)
          }
        });
        throw Error(fmt::format("no timeout (own peer {})", own_peer));
      },
      {}, timeout_ms);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 2.0 * timeout_ms / 1000.0 + 4.0) << "the report did not end in time";
  int named_elsewhere = 0;  // survivors whose own wait named another rank than the victim
  for (const auto& r : res) {
    if (r.rank == victim) continue;
    EXPECT_EQ(r.exit_code, 1) << "rank " << r.rank << (r.killed_by_launcher ? " hung" : "");
    EXPECT_NE(r.message.find(fmt::format("TimeoutError naming rank 1: rank {}: rank 1 did not arrive (its process "
                                         "exited: pid {})",
                                         r.rank, res[victim].pid)),
              std::string::npos)
        << r.message;
    EXPECT_NE(r.message.find("all_gather of 32 f32 elements (method ring)"), std::string::npos) << r.message;
    if (r.message.find(", which waited for rank 1") != std::string::npos) ++named_elsewhere;
  }
  // The situation the report is for: at least one survivor's own wait was for a live rank.
  EXPECT_GE(named_elsewhere, 1);
}

// GPUs agree on a shape's first call only: ranks that call with different counts after both
// shapes were set up wait for signals the other never sends. The host backend does the same
// with its per-call agreement off; the failure report then names both calls, on both ranks.
TEST(FailureReport, CallsThatDifferAfterSetUpAreNamedNotTimedOut) {
  auto res = run_host_ranks(
      2,
      [] {
        auto b = make_backend();
        b->set_agree_every_call(false);
        ops::Collectives c(*b);
        std::vector<uint16_t> x(2000, 0x3F80), y(2000);
        for (uint64_t n : {1000, 2000}) c.all_reduce(x.data(), y.data(), n, dev::DType::kBF16, ops::Method::kOneShot);
        c.all_reduce(x.data(), y.data(), b->rank() == 0 ? 1000 : 2000, dev::DType::kBF16, ops::Method::kOneShot);
      },
      {}, 800);
  for (const auto& r : res) {
    EXPECT_EQ(r.exit_code, 1) << r.message;
    EXPECT_NE(r.message.find(fmt::format("rank {}: ranks disagree on the call: rank 0 runs all_reduce of 1000 bf16 "
                                         "elements (method one-shot), rank 1 runs all_reduce of 2000 bf16 elements "
                                         "(method one-shot)",
                                         r.rank)),
              std::string::npos)
        << r.message;
  }
}

// The same through GemmOverlap's boundary: a gemm_ar on a ring plan, per-call agreement off,
// rank 1 gone before the second call. Every survivor names it, as exited, with its call.
TEST(FailureReport, GemmOverlapSurvivorsNameTheRankThatExited) {
  const int victim = 1;
  auto res = run_host_ranks(
      4,
      [] {
        auto b = make_backend();
        b->set_agree_every_call(false);
        ops::GemmOverlapConfig cfg;
        cfg.op = ops::GemmOp::kGemmAr;
        cfg.m = 8;
        cfg.n = 16;
        cfg.k = 32;
        cfg.algo = "ring";
        cfg.tune_cache = "-";
        ops::GemmOverlap op(*b, cfg);
        std::vector<uint16_t> a(static_cast<size_t>(op.a_rows() * op.a_cols()), 0x3F80);
        std::vector<uint16_t> w(static_cast<size_t>(op.b_rows() * op.b_cols()), 0x3F80);
        std::vector<uint16_t> c(static_cast<size_t>(op.c_rows() * op.c_cols()));
        op.run(a.data(), w.data(), c.data(), {.method = ops::GemmMethod::kFused});
        if (b->rank() == victim) _exit(0);
        rethrow_naming_peer([&] { op.run(a.data(), w.data(), c.data(), {.method = ops::GemmMethod::kFused}); });
      },
      {}, 1000);
  for (const auto& r : res) {
    if (r.rank == victim) continue;
    EXPECT_EQ(r.exit_code, 1) << r.message;
    EXPECT_NE(r.message.find(fmt::format("TimeoutError naming rank 1: rank {}: rank 1 did not arrive (its process "
                                         "exited: pid {})",
                                         r.rank, res[victim].pid)),
              std::string::npos)
        << r.message;
    EXPECT_NE(r.message.find("call 2: gemm_ar with M = 8 (bf16, method fused)"), std::string::npos) << r.message;
  }
}
