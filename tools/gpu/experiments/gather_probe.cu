// Probe for the embedding lookups' bandwidth bar (docs/embedding_a2a.md): how fast can one GPU
// gather random rows at all? Pooled bags of 10 random rows of fp32 (D 64 and 128), sums stored,
// with everything the real kernel has to find out (offsets, indices) taken away or pipelined:
//   ideal:     a group of lanes a bag, its 10 indices loaded at once (one per lane), then its 10
//              rows loaded at once, summed, stored (two round trips a bag);
//   pipelined: the same with the next bag's indices in flight while this bag's rows load;
//   nc256:     pipelined, rows loaded with ld.global.nc.L1::no_allocate.L2::256B.
// Footprints: 13 tables of 1M rows (the benchmark's rank) and one of 512K rows (fits no TLB
// question). Reported: GB/s of rows read and its share of a 1 GiB device copy (read + write).
//   build: mkdir -p .probe && nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -cudart static \
//            -o .probe/gather_probe tools/gpu/experiments/gather_probe.cu
//   run:   ./.probe/gather_probe   (device: kind nvidia-h200, carry .probe)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_common.cuh"  // CK

constexpr int kP = 10;  // pooling

__global__ void fill_indices(int64_t* idx, int64_t n, int64_t rows, uint64_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    idx[i] = (int64_t)(x % (uint64_t)rows);
  }
}

__device__ __forceinline__ uint4 ld_nc256(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// kG lanes a bag (kG 16-byte vectors a row), bags grid-strided.
template <int kG, int kMode>
__global__ void __launch_bounds__(128)
    gather(const uint4* __restrict__ w, const int64_t* __restrict__ idx, float4* out, int64_t bags) {
  const int lane = threadIdx.x % 32, g = lane % kG, sub = lane / kG;
  const unsigned mask = kG == 32 ? 0xFFFFFFFFu : ((1u << kG) - 1u) << (sub * kG);
  const int64_t groups = (int64_t)gridDim.x * (blockDim.x / kG);
  int64_t b = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / kG;
  int64_t mine = b < bags && g < kP ? __ldg(idx + b * kP + g) : 0;
  for (; b < bags; b += groups) {
    int64_t r[kP];
#pragma unroll
    for (int u = 0; u < kP; ++u) r[u] = __shfl_sync(mask, mine, sub * kG + u);
    if (kMode == 0) {
      // nothing ahead
    } else {
      const int64_t nb = b + groups;
      mine = nb < bags && g < kP ? __ldg(idx + nb * kP + g) : 0;
    }
    uint4 x[kP];
#pragma unroll
    for (int u = 0; u < kP; ++u) x[u] = kMode == 2 ? ld_nc256(w + r[u] * kG + g) : __ldg(w + r[u] * kG + g);
    float4 acc = make_float4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < kP; ++u) {
      acc.x += __uint_as_float(x[u].x);
      acc.y += __uint_as_float(x[u].y);
      acc.z += __uint_as_float(x[u].z);
      acc.w += __uint_as_float(x[u].w);
    }
    out[b * kG + g] = acc;
    if (kMode == 0) {
      const int64_t nb = b + groups;
      mine = nb < bags && g < kP ? __ldg(idx + nb * kP + g) : 0;
    }
  }
}

template <class F>
float time_us(F f) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  f();
  std::vector<float> t;
  for (int i = 0; i < 15; ++i) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.f);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t copy_bytes = 1ull << 30;
  void *c0, *c1;
  CK(cudaMalloc(&c0, copy_bytes));
  CK(cudaMalloc(&c1, copy_bytes));
  const float copy_us = time_us([&] { CK(cudaMemcpyAsync(c1, c0, copy_bytes, cudaMemcpyDeviceToDevice)); });
  const double copy_gbs = 2.0 * copy_bytes / copy_us / 1e3;
  CK(cudaFree(c0));
  CK(cudaFree(c1));
  std::printf("copy 1 GiB: %.1f us, %.0f GB/s (read + write)\n", copy_us, copy_gbs);
  const int64_t bags = 13ll * 8192;  // 13 tables, 2 ranks x 4096 samples
  int64_t* idx;
  CK(cudaMalloc(&idx, bags * kP * sizeof(int64_t)));
  std::printf("%-5s %-10s %-10s %10s %10s %8s\n", "D", "rows", "variant", "us", "GB/s", "of copy");
  for (int d : {64, 128}) {
    const int64_t big = 13ll << 20;
    for (int64_t rows : {big, int64_t(512) << 10}) {
      uint4* w;
      CK(cudaMalloc(&w, rows * d * 4));
      CK(cudaMemset(w, 0, rows * d * 4));
      float4* out;
      CK(cudaMalloc(&out, bags * d * 4));
      fill_indices<<<1024, 256>>>(idx, bags * kP, rows, 12345);
      CK(cudaGetLastError());
      const double bytes = double(bags) * kP * d * 4;
      const char* names[] = {"ideal", "pipelined", "nc256"};
      for (int mode = 0; mode < 3; ++mode) {
        for (int per_sm : {4, 8, 16}) {
          const int grid = sms * per_sm;
          float us = time_us([&] {
            if (d == 64) {
              if (mode == 0) gather<16, 0><<<grid, 128>>>(w, idx, out, bags);
              if (mode == 1) gather<16, 1><<<grid, 128>>>(w, idx, out, bags);
              if (mode == 2) gather<16, 2><<<grid, 128>>>(w, idx, out, bags);
            } else {
              if (mode == 0) gather<32, 0><<<grid, 128>>>(w, idx, out, bags);
              if (mode == 1) gather<32, 1><<<grid, 128>>>(w, idx, out, bags);
              if (mode == 2) gather<32, 2><<<grid, 128>>>(w, idx, out, bags);
            }
            CK(cudaGetLastError());
          });
          const double gbs = bytes / us / 1e3;
          std::printf("%-5d %-10lld %-7s/%-2d %10.1f %10.0f %7.0f%%\n", d, (long long)rows, names[mode], per_sm * 4, us,
                      gbs, 100.0 * gbs / copy_gbs);
        }
      }
      CK(cudaFree(w));
      CK(cudaFree(out));
    }
  }
  return 0;
}
