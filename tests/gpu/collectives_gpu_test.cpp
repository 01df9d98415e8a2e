// Collectives on the nccl backend: the host suite's exact checks on 1 GPU and on every
// GPU, then calls captured in a CUDA graph and replayed many times with fresh inputs.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <memory>

#include "collectives_check.hpp"
#include "gpu_harness.hpp"
#include "rank_harness.hpp"
#include "weft/core/cuda_check.hpp"

using namespace weft;
using namespace weft::testing;

namespace {

class GpuMemory final : public LocalMemory {
 public:
  GpuMemory() { WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~GpuMemory() override {
    for (void* p : blocks_) cudaFree(p);
    cudaStreamDestroy(stream_);
  }
  void* alloc(size_t bytes) override {
    void* p = nullptr;
    WEFT_CUDA_CHECK(cudaMalloc(&p, bytes + 16));
    blocks_.push_back(p);
    return p;
  }
  void to_device(void* dst, const void* src, size_t bytes) override {
    WEFT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    // Pageable copies may return before the data lands; the ops run on a non-blocking stream.
    WEFT_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void to_host(void* dst, const void* src, size_t bytes) override {
    WEFT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  }
  void sync() override { WEFT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  void* stream() override { return stream_; }

 private:
  cudaStream_t stream_{};
  std::vector<void*> blocks_;
};

std::vector<RankResult> run_gpu(int n, const std::function<void()>& fn) {
  return run_gpu_ranks(n, fn, /*heap_mib=*/2048, /*deadline_ms=*/400000);
}

}  // namespace

class CollectivesGpu : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesGpu, ExactForEveryMethodDtypeAndSize) {
  const int n = GetParam() == 0 ? gpus() : GetParam();
  if (gpus() < 1 || n > gpus()) GTEST_SKIP() << "needs " << n << " GPU(s)";
  expect_all_ok(run_gpu(n, [] {
    auto b = make_backend();
    ops::Collectives ops(*b);
    GpuMemory mem;
    CollectivesSuite suite(*b, ops, mem);
    suite.run_all({0, 1, 7, 8, 13, 1000, 4099, (1u << 20) + 5});
    if (b->rank() == 0) std::printf("[gpu] collectives: %d ranks, %d exact checks passed\n", b->size(), suite.checks());
  }));
}

INSTANTIATE_TEST_SUITE_P(Gpus, CollectivesGpu, ::testing::Values(1, 0));

// Captured once, replayed many times: epochs advance inside the graph, nothing is reset,
// and every replay's result is exact for that replay's inputs.
TEST(CollectivesGpuGraph, ReplaysStayExact) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  expect_all_ok(run_gpu(gpus(), [] {
    auto b = make_backend();
    ops::Collectives ops(*b);
    GpuMemory mem;
    const int world = b->size(), me = b->rank();
    cudaStream_t s = static_cast<cudaStream_t>(mem.stream());
    // ll, ll128: the all-reduce and the all-gather of the LL protocol (flags are the epochs that
    // advance inside the graph); otherwise the all-gather is direct.
    for (ops::Method m :
         {ops::Method::kOneShot, ops::Method::kTwoShot, ops::Method::kLowLatency, ops::Method::kLowLatency128}) {
      const ops::Method ag =
          m == ops::Method::kLowLatency || m == ops::Method::kLowLatency128 ? ops::Method::kLowLatency : ops::Method::kDirect;
      for (uint64_t count : {uint64_t{4096}, uint64_t{1} << 18}) {
        const size_t bytes = count * 2;
        auto* in = static_cast<char*>(mem.alloc(bytes));
        auto* out = static_cast<char*>(mem.alloc(bytes));
        const uint64_t ag_out = b->heap().alloc_bytes(bytes * world, "graph.ag");
        auto fill = [&](int call) {
          std::vector<float> v(count);
          for (uint64_t i = 0; i < count; ++i) v[i] = input_value(me, i, call);
          auto enc = encode(v, dev::DType::kBF16);
          mem.to_device(in, enc.data(), enc.size());
        };
        fill(0);
        ops.all_reduce(in, out, count, dev::DType::kBF16, m, s);  // first call: allocates, not captured
        ops.all_gather(in, ag_out, count, dev::DType::kBF16, ag, s);
        mem.sync();
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        WEFT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        ops.all_reduce(in, out, count, dev::DType::kBF16, m, s);
        ops.all_gather(in, ag_out, count, dev::DType::kBF16, ag, s);
        WEFT_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
        WEFT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        for (int rep = 1; rep <= 25; ++rep) {
          fill(rep);
          b->barrier();  // every rank's input is in place before anyone replays
          WEFT_CUDA_CHECK(cudaGraphLaunch(exec, s));
          mem.sync();
          std::vector<char> got(bytes), ag(bytes * world);
          mem.to_host(got.data(), out, bytes);
          b->copy_to_host(ag.data(), ag_out, ag.size());
          for (uint64_t i = 0; i < count; ++i) {
            float want = 0;
            for (int p = 0; p < world; ++p) want += input_value(p, i, rep);
            WEFT_CHECK(decode(got, i, dev::DType::kBF16) == want,
                       fmt::format("rank {}: graph replay {} ({} count {}): all_reduce element {} is {}, want {}", me,
                                   rep, ops::to_string(m), count, i, decode(got, i, dev::DType::kBF16), want));
            for (int p = 0; p < world; ++p)
              WEFT_CHECK(decode(ag, p * count + i, dev::DType::kBF16) == input_value(p, i, rep),
                         fmt::format("rank {}: graph replay {}: all_gather block {} element {} wrong", me, rep, p, i));
          }
          b->barrier();  // nobody refills inputs before everyone has checked
        }
        WEFT_CUDA_CHECK(cudaGraphExecDestroy(exec));
        WEFT_CUDA_CHECK(cudaGraphDestroy(graph));
      }
    }
    if (me == 0) std::printf("[gpu] collectives: 25 graph replays x 6 shapes exact on %d ranks\n", world);
  }));
}
