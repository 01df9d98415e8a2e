// GPU side of the device-API micro-benchmarks (see devapi_bench.hpp); kernels in
// devapi_bench_kernels.cu.
#include <fmt/format.h>

#include <string_view>
#include <vector>

#include "weft/bench/devapi_bench.hpp"
#include "weft/bench/devapi_bench_kernels.hpp"
#include "weft/core/cuda_check.hpp"
#include "weft/kernels/runtime_kernels.hpp"

namespace weft::bench {
DevapiBenchResult bench_devapi_gpu(Backend& b, const DevapiBenchOptions& opt) {
  DevapiBenchResult res;
  res.device = b.device_name();
  res.backend = to_string(b.kind());
  res.world = b.size();
  res.reps = opt.quick ? 5 : 20;
  const uint64_t bytes = opt.quick ? (64ull << 20) : (256ull << 20);
  const uint64_t words = bytes / 4;
  auto src = b.heap().alloc<uint32_t>(words, "bench.src");
  auto dst = b.heap().alloc<uint32_t>(words, "bench.dst");
  auto sig = b.heap().alloc_signals(1, "bench.pingpong");
  auto bar = b.heap().alloc_barrier("bench.bar");
  const dev::DeviceCtx c = b.ctx();
  const int peer = (b.rank() + 1) % b.size();
  const int from = (b.rank() + b.size() - 1) % b.size();
  unsigned long long* bad = nullptr;
  WEFT_CUDA_CHECK(cudaMalloc(&bad, sizeof *bad));
  cudaEvent_t e0, e1;
  WEFT_CUDA_CHECK(cudaEventCreate(&e0));
  WEFT_CUDA_CHECK(cudaEventCreate(&e1));
  WEFT_CUDA_CHECK(kernels::bench_fill(c, src.offset, words, nullptr));
  b.synchronize();
  b.barrier();

  int sms = 0;
  WEFT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (const char* mode : {"push", "pull"}) {
    const bool push = std::string_view(mode) == "push";
    for (int ctas : {16, 32, sms, 2 * sms, 4 * sms}) {
      WEFT_CUDA_CHECK(cudaMemset(c.local<char>(dst.offset), 0, bytes));
      b.synchronize();
      b.barrier();
      std::vector<double> us;
      for (int rep = 0; rep < res.reps + 2; ++rep) {  // two warm-ups
        // The device barrier lines both GPUs up to within a microsecond or so; the events
        // then bracket only the copy kernel.
        WEFT_CUDA_CHECK(kernels::device_barrier(c, bar, nullptr));
        WEFT_CUDA_CHECK(cudaEventRecord(e0));
        if (push)
          WEFT_CUDA_CHECK(kernels::bench_push(c, peer, src.offset, dst.offset, bytes, ctas, nullptr));
        else
          WEFT_CUDA_CHECK(kernels::bench_pull(c, peer, src.offset, dst.offset, bytes, ctas, nullptr));
        WEFT_CUDA_CHECK(cudaEventRecord(e1));
        b.synchronize();
        float ms = 0;
        WEFT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (rep >= 2) us.push_back(ms * 1e3);
      }
      WEFT_CUDA_CHECK(kernels::device_barrier(c, bar, nullptr));  // every push into my dst has landed
      WEFT_CUDA_CHECK(cudaMemset(bad, 0, sizeof *bad));
      WEFT_CUDA_CHECK(kernels::bench_verify(c, dst.offset, words, push ? from : peer, bad, nullptr));
      unsigned long long nbad = 0;
      WEFT_CUDA_CHECK(cudaMemcpy(&nbad, bad, sizeof nbad, cudaMemcpyDeviceToHost));
      WEFT_CHECK(nbad == 0, fmt::format("rank {}: {} with {} CTAs moved {} wrong words", b.rank(), mode, ctas, nbad));
      BandwidthPoint p{mode, ctas, kernels::kBenchThreads, bytes, median(us), 0, true};
      p.gbps = bytes / (p.median_us * 1e-6) / 1e9;
      res.bandwidth.push_back(p);
      if (opt.progress) opt.progress(fmt::format("{} {} CTAs: {:.1f} GB/s", mode, ctas, p.gbps));
    }
  }

  if (b.size() >= 2) {
    res.latency_iters = opt.quick ? 2000 : 20000;
    std::vector<double> us;
    for (int rep = 0; rep < 4; ++rep) {
      WEFT_CUDA_CHECK(kernels::device_barrier(c, bar, nullptr));
      WEFT_CUDA_CHECK(cudaEventRecord(e0));
      if (b.rank() <= 1)
        WEFT_CUDA_CHECK(kernels::bench_pingpong(c, sig.at(0), static_cast<uint64_t>(rep) * res.latency_iters,
                                                res.latency_iters, nullptr));
      WEFT_CUDA_CHECK(cudaEventRecord(e1));
      b.synchronize();
      float ms = 0;
      WEFT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (rep >= 1) us.push_back(ms * 1e3 / res.latency_iters / 2);
    }
    res.one_way_latency_us = median(us);
    if (opt.progress) opt.progress(fmt::format("one-way signal latency: {:.2f} us", res.one_way_latency_us));
  }
  WEFT_CUDA_CHECK(kernels::device_barrier(c, bar, nullptr));
  b.synchronize();
  WEFT_CUDA_CHECK(cudaEventDestroy(e0));
  WEFT_CUDA_CHECK(cudaEventDestroy(e1));
  WEFT_CUDA_CHECK(cudaFree(bad));
  return res;
}

}  // namespace weft::bench
