// The device-API semantics suite on the nccl backend: the same scenarios as the host
// tests, as CUDA kernels, on 1 GPU and on every GPU of the machine. Skipped without GPUs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>

#include "devapi_driver.hpp"
#include "devapi_gpu_kernels.hpp"
#include "gpu_harness.hpp"
#include "rank_harness.hpp"
#include "weft/core/cuda_check.hpp"

using namespace weft;
using namespace weft::testing;

namespace {

class GpuExecutor final : public Executor {
 public:
  explicit GpuExecutor(Backend& b) : b_(b) {}
  void put_signal(Gran g, const PutArgs& a) override { finish(gpu_put_signal(g, b_.ctx(), a)); }
  void get(Gran g, const GetArgs& a) override { finish(gpu_get(g, b_.ctx(), a)); }
  void barrier_rounds(Gran g, const BarrierArgs& a) override { finish(gpu_barrier_rounds(g, b_.ctx(), a)); }
  void barrier_once(Gran g, const dev::BarrierHandle& bar) override { finish(gpu_barrier_once(g, b_.ctx(), bar)); }

 private:
  void finish(cudaError_t launched) {
    WEFT_CUDA_CHECK(launched);
    b_.synchronize();
  }
  Backend& b_;
};

std::vector<RankResult> run_devapi_ranks(int n, const std::function<void()>& fn, int64_t timeout_ms = 20000) {
  return run_gpu_ranks(n, fn, /*heap_mib=*/64, /*deadline_ms=*/300000, timeout_ms);
}

}  // namespace

class DevapiGpu : public ::testing::TestWithParam<int> {};

TEST_P(DevapiGpu, PutGetSignalBarrierSemantics) {
  const int n = GetParam() == 0 ? gpus() : GetParam();
  if (gpus() < 1 || n > gpus()) GTEST_SKIP() << "needs " << n << " GPU(s); " << gpus() << " visible";
  expect_all_ok(run_devapi_ranks(n, [] {
    auto b = make_backend();
    GpuExecutor x(*b);
    DevapiSuite suite(*b, x);
    int checks = suite.run_all();
    WEFT_CHECK(checks == 3 * (2 * static_cast<int>(default_cases().size()) + 1), "not every check ran");
    if (b->rank() == 0)
      std::printf("[gpu] %d ranks on %s: %d semantic checks passed\n", b->size(), b->device_name().c_str(), checks);
  }));
}

// 1: one GPU; 0: every GPU of the machine.
INSTANTIATE_TEST_SUITE_P(Gpus, DevapiGpu, ::testing::Values(1, 0));

TEST(DevapiGpuFaults, RankThatExitsEarlyIsNamedWithinTheDeadline) {
  if (gpus() < 2) GTEST_SKIP() << "needs 2 GPUs";
  const int n = gpus(), victim = n - 1;
  const int64_t timeout_ms = 3000;
  auto t0 = std::chrono::steady_clock::now();
  auto res = run_devapi_ranks(
      n,
      [victim] {
        auto b = make_backend();
        GpuExecutor x(*b);
        auto bar = b->heap().alloc_barrier("fault.bar");
        x.barrier_once(Gran::kBlock, bar);
        if (b->rank() == victim) _exit(0);
        x.barrier_once(Gran::kBlock, bar);
      },
      timeout_ms);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "[gpu] fault test: whole run (NCCL start-up, one barrier, victim exits) ended after %.1f s; wait deadline %.1f "
      "s\n",
      secs, timeout_ms / 1e3);
  for (const auto& r : res) {
    if (r.rank == victim) continue;
    EXPECT_EQ(r.exit_code, 1) << "rank " << r.rank << (r.killed_by_launcher ? " hung" : "");
    EXPECT_NE(r.message.find("rank " + std::to_string(victim) + " did not arrive"), std::string::npos) << r.message;
  }
}
