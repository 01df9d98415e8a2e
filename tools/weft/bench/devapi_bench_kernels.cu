#include "weft/bench/devapi_bench_kernels.hpp"
#include "weft/device/api.hpp"

namespace weft::kernels {
namespace {

__device__ __forceinline__ uint32_t pattern(int rank, uint64_t i) {
  return static_cast<uint32_t>(rank + 1) * 0x01000193u ^ static_cast<uint32_t>(i);
}

__global__ void fill_kernel(dev::DeviceCtx c, uint64_t off, uint64_t words) {
  uint32_t* p = c.local<uint32_t>(off);
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x)
    p[i] = pattern(c.rank, i);
}

__global__ void verify_kernel(dev::DeviceCtx c, uint64_t off, uint64_t words, int owner, unsigned long long* bad) {
  const uint32_t* p = c.local<uint32_t>(off);
  unsigned long long n = 0;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x)
    n += p[i] != pattern(owner, i);
  if (n) atomicAdd(bad, n);
}

// Slice of block b: 16-byte aligned, so the vector path runs for the whole slice.
__device__ __forceinline__ void slice(uint64_t bytes, uint64_t& lo, uint64_t& hi) {
  const uint64_t per = ((bytes + gridDim.x - 1) / gridDim.x + 15) & ~15ull;  // covers all of bytes
  lo = min(bytes, per * blockIdx.x);
  hi = min(bytes, lo + per);
}

__global__ void __launch_bounds__(kBenchThreads)
    push_kernel(dev::DeviceCtx c, int peer, uint64_t src, uint64_t dst, uint64_t bytes) {
  uint64_t lo, hi;
  slice(bytes, lo, hi);
  dev::put(dev::CoopCta{}, c, peer, dst + lo, c.local<char>(src) + lo, hi - lo);
}

__global__ void __launch_bounds__(kBenchThreads)
    pull_kernel(dev::DeviceCtx c, int peer, uint64_t src, uint64_t dst, uint64_t bytes) {
  uint64_t lo, hi;
  slice(bytes, lo, hi);
  dev::get(dev::CoopCta{}, c, c.local<char>(dst) + lo, peer, src + lo, hi - lo);
}

// The counters are never reset: run k starts from base = the round trips of runs before
// it, which both ranks know. (Reading the counter here would race with the first ping.)
__global__ void pingpong_kernel(dev::DeviceCtx c, uint64_t sig, uint64_t base, int iters) {
  const int other = 1 - c.rank;
  for (int i = 1; i <= iters; ++i) {
    if (c.rank == 0) {
      dev::signal_add(c, other, sig, 1);
      dev::wait_ge(c, sig, base + i, other);
    } else {
      dev::wait_ge(c, sig, base + i, other);
      dev::signal_add(c, other, sig, 1);
    }
  }
}

}  // namespace

cudaError_t bench_fill(const dev::DeviceCtx& c, uint64_t off, uint64_t words, cudaStream_t s) {
  fill_kernel<<<264, 512, 0, s>>>(c, off, words);
  return cudaGetLastError();
}

cudaError_t bench_verify(const dev::DeviceCtx& c, uint64_t off, uint64_t words, int owner, unsigned long long* bad,
                         cudaStream_t s) {
  verify_kernel<<<264, 512, 0, s>>>(c, off, words, owner, bad);
  return cudaGetLastError();
}

cudaError_t bench_push(const dev::DeviceCtx& c, int peer, uint64_t src, uint64_t dst, uint64_t bytes, int ctas,
                       cudaStream_t s) {
  push_kernel<<<ctas, kBenchThreads, 0, s>>>(c, peer, src, dst, bytes);
  return cudaGetLastError();
}

cudaError_t bench_pull(const dev::DeviceCtx& c, int peer, uint64_t src, uint64_t dst, uint64_t bytes, int ctas,
                       cudaStream_t s) {
  pull_kernel<<<ctas, kBenchThreads, 0, s>>>(c, peer, src, dst, bytes);
  return cudaGetLastError();
}

cudaError_t bench_pingpong(const dev::DeviceCtx& c, uint64_t sig, uint64_t base, int iters, cudaStream_t s) {
  pingpong_kernel<<<1, 1, 0, s>>>(c, sig, base, iters);
  return cudaGetLastError();
}

}  // namespace weft::kernels
