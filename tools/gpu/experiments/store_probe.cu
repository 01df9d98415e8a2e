// Probe for gemm_rs's direct stores (docs/gemm_overlap.md): how fast
// do stores issued the way a GEMM epilogue issues them reach a peer over NVLink? One process, 2
// GPUs, GPU 0 writing into GPU 1's memory (peer access) and, for reference, into its own.
//  bulk:  each CTA's 2 "warpgroups" (thread 0 of each 128) store 64 KiB tiles from shared memory
//         with cp.async.bulk (the TMA engine, as the GEMM's TMA stores), one bulk group per tile,
//         waiting for the previous tile's group to be read before refilling (as the epilogue);
//  plain: the same tiles by 16-byte st.global from every thread (as cuBLAS's epilogue);
//  push:  weft's push loop for comparison (four 16-byte loads in flight per thread).
// Each mode on 132 / 66 / 16 CTAs, 256 MiB in total, median of 5 runs; then the bulk mode beside
// a cuBLAS GEMM (8192 x 8192 x 4096 bf16) on another stream, and that GEMM alone.
// Its results: docs/gemm_overlap.md (the direct stores).
// Build here: nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a tools/gpu/experiments/store_probe.cu \
//               -o .gpu/store_probe -lcublas
// Run there: bash tools/gpu/experiments/store_probe.sh .gpu   (nvidia-h200-x2, carry .gpu)
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_common.cuh"  // CK

namespace {

constexpr int kTile = 64 * 1024;  // bytes a warpgroup stores per tile (64 x 256 bf16)
constexpr int kThreads = 256;     // two "warpgroups" of 128

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// bulk: thread 0 of each warpgroup stores its 64 KiB buffer tile after tile.
__global__ void bulk_store(char* dst, size_t bytes_per_cta) {
  extern __shared__ __align__(128) char smem[];
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  char* buf = smem + wg * kTile;
  for (int i = tid; i < kTile / 16; i += 128) reinterpret_cast<int4*>(buf)[i] = make_int4(i, wg, blockIdx.x, 7);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  if (tid != 0) return;
  char* base = dst + blockIdx.x * bytes_per_cta;
  for (size_t off = wg * kTile; off + kTile <= bytes_per_cta; off += 2 * kTile) {
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(base + off), "r"(smem_u32(buf)),
                 "r"(kTile)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// plain: every thread stores 16-byte vectors of its warpgroup's tile.
__global__ void plain_store(char* dst, size_t bytes_per_cta) {
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  char* base = dst + blockIdx.x * bytes_per_cta;
  const int4 v = make_int4(tid, wg, blockIdx.x, 7);
  for (size_t off = wg * kTile; off + kTile <= bytes_per_cta; off += 2 * kTile)
    for (int i = tid; i < kTile / 16; i += 128) reinterpret_cast<int4*>(base + off)[i] = v;
}

// push: four independent 16-byte loads in flight per thread before the stores.
__global__ void push_copy(char* dst, const char* src, size_t bytes_per_cta) {
  const int4* s = reinterpret_cast<const int4*>(src + blockIdx.x * bytes_per_cta);
  int4* d = reinterpret_cast<int4*>(dst + blockIdx.x * bytes_per_cta);
  const size_t n = bytes_per_cta / 16;
  for (size_t i = threadIdx.x; i < n; i += 4 * blockDim.x) {
    int4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (i + u * blockDim.x < n) v[u] = s[i + u * blockDim.x];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (i + u * blockDim.x < n) d[i + u * blockDim.x] = v[u];
  }
}

template <class F>
double median_us(cudaStream_t s, F&& launch) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  launch();  // warm-up
  CK(cudaStreamSynchronize(s));
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) {
    CK(cudaEventRecord(a, s));
    launch();
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e3);
  }
  std::sort(t.begin(), t.end());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return t[t.size() / 2];
}

}  // namespace

int main() {
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < 2) {
    std::fprintf(stderr, "store_probe: needs 2 GPUs, %d visible\n", n);
    return 2;
  }
  const size_t total = 256ull << 20;
  char *remote = nullptr, *local = nullptr, *src = nullptr;
  CK(cudaSetDevice(1));
  CK(cudaMalloc(&remote, total));
  CK(cudaSetDevice(0));
  CK(cudaDeviceEnablePeerAccess(1, 0));
  CK(cudaMalloc(&local, total));
  CK(cudaMalloc(&src, total));
  CK(cudaMemset(src, 1, total));
  CK(cudaFuncSetAttribute(bulk_store, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * kTile));
  cudaStream_t s, g;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&g, cudaStreamNonBlocking));
  std::printf("mode   target  CTAs      us    GB/s\n");
  for (const char* mode : {"bulk", "plain", "push"})
    for (char* dst : {remote, local})
      for (int ctas : {132, 66, 16}) {
        const size_t per = total / ctas / (2 * kTile) * (2 * kTile);
        auto launch = [&] {
          if (mode[0] == 'b')
            bulk_store<<<ctas, kThreads, 2 * kTile, s>>>(dst, per);
          else if (mode[1] == 'l')
            plain_store<<<ctas, kThreads, 0, s>>>(dst, per);
          else
            push_copy<<<ctas, 512, 0, s>>>(dst, src, per);
          CK(cudaGetLastError());
        };
        const double us = median_us(s, launch);
        std::printf("%-6s %-7s %4d %8.1f %7.1f\n", mode, dst == remote ? "peer" : "local", ctas, us,
                    per * ctas / (us * 1e3));
      }
  // Both directions at once (as in gemm_rs, where every rank sends its peer's rows): GPU 0 -> 1
  // and GPU 1 -> 0 together, TMA bulk stores on 132 CTAs and copy-engine copies, 8 MiB (2048 x
  // 4096 x 4096's half) and 256 MiB. Each direction timed on its own GPU's stream.
  {
    char* remote0 = nullptr;  // on GPU 0, written by GPU 1
    char* src1 = nullptr;     // on GPU 1
    CK(cudaMalloc(&remote0, total));
    CK(cudaSetDevice(1));
    CK(cudaDeviceEnablePeerAccess(0, 0));
    CK(cudaMalloc(&src1, total));
    CK(cudaMemset(src1, 1, total));
    CK(cudaFuncSetAttribute(bulk_store, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * kTile));
    cudaStream_t s1;
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    cudaEvent_t a0, b0, a1, b1;
    CK(cudaEventCreate(&a1));
    CK(cudaEventCreate(&b1));
    CK(cudaSetDevice(0));
    CK(cudaEventCreate(&a0));
    CK(cudaEventCreate(&b0));
    std::printf("\nboth directions at once (us and GB/s per direction; one direction alone for reference)\n");
    std::printf("mode   bytes      0->1 us  GB/s   1->0 us  GB/s   alone us  GB/s\n");
    for (const char* mode : {"bulk", "copy"})
      for (size_t bytes : {size_t(8) << 20, total}) {
        const int ctas = static_cast<int>(std::min<size_t>(128, bytes / (2 * kTile)));  // 8 MiB: 64
        const size_t per = bytes / ctas / (2 * kTile) * (2 * kTile);
        const size_t moved = mode[0] == 'b' ? per * ctas : bytes;
        auto go = [&](int dev, bool both) {
          // dev 0 sends to GPU 1 (remote), dev 1 sends to GPU 0 (remote0)
          for (int d = 0; d < 2; ++d) {
            if (!both && d != dev) continue;
            CK(cudaSetDevice(d));
            cudaStream_t q = d == 0 ? s : s1;
            CK(cudaEventRecord(d == 0 ? a0 : a1, q));
            if (mode[0] == 'b')
              bulk_store<<<ctas, kThreads, 2 * kTile, q>>>(d == 0 ? remote : remote0, per);
            else
              CK(cudaMemcpyAsync(d == 0 ? remote : remote0, d == 0 ? src : src1, bytes, cudaMemcpyDeviceToDevice, q));
            CK(cudaGetLastError());
            CK(cudaEventRecord(d == 0 ? b0 : b1, q));
          }
        };
        std::vector<double> t0, t1, ta;
        for (int r = 0; r < 7; ++r) {
          go(0, true);
          CK(cudaSetDevice(1));
          CK(cudaEventSynchronize(b1));
          CK(cudaSetDevice(0));
          CK(cudaEventSynchronize(b0));
          float m0 = 0, m1 = 0;
          CK(cudaEventElapsedTime(&m0, a0, b0));
          CK(cudaSetDevice(1));
          CK(cudaEventElapsedTime(&m1, a1, b1));
          CK(cudaSetDevice(0));
          go(0, false);
          CK(cudaEventSynchronize(b0));
          float ma = 0;
          CK(cudaEventElapsedTime(&ma, a0, b0));
          if (r > 0) {
            t0.push_back(m0 * 1e3);
            t1.push_back(m1 * 1e3);
            ta.push_back(ma * 1e3);
          }
        }
        for (auto* v : {&t0, &t1, &ta}) std::sort(v->begin(), v->end());
        const double u0 = t0[t0.size() / 2], u1 = t1[t1.size() / 2], ua = ta[ta.size() / 2];
        std::printf("%-6s %4zu MiB %9.1f %5.0f %9.1f %5.0f %9.1f %5.0f\n", mode, bytes >> 20, u0, moved / (u0 * 1e3),
                    u1, moved / (u1 * 1e3), ua, moved / (ua * 1e3));
      }
    CK(cudaSetDevice(0));
  }
  // One copy-engine copy into the peer split into `parts` copies on as many streams (each
  // stream may get its own engine): 2, 8 and 32 MiB, GPU 0 -> 1 alone and both directions.
  {
    constexpr int kMaxParts = 4;
    cudaStream_t q0[kMaxParts], q1[kMaxParts];
    cudaEvent_t f0[kMaxParts], f1[kMaxParts], g0, g1;
    char* remote0 = nullptr;
    char* src1 = nullptr;
    CK(cudaMalloc(&remote0, total));  // on GPU 0
    CK(cudaSetDevice(1));
    CK(cudaMalloc(&src1, total));
    for (int i = 0; i < kMaxParts; ++i) {
      CK(cudaStreamCreateWithFlags(&q1[i], cudaStreamNonBlocking));
      CK(cudaEventCreateWithFlags(&f1[i], cudaEventDisableTiming));
    }
    CK(cudaEventCreate(&g1));
    CK(cudaSetDevice(0));
    for (int i = 0; i < kMaxParts; ++i) {
      CK(cudaStreamCreateWithFlags(&q0[i], cudaStreamNonBlocking));
      CK(cudaEventCreateWithFlags(&f0[i], cudaEventDisableTiming));
    }
    CK(cudaEventCreate(&g0));
    cudaEvent_t h0, h1;
    CK(cudaEventCreate(&h0));
    CK(cudaSetDevice(1));
    CK(cudaEventCreate(&h1));
    CK(cudaSetDevice(0));
    std::printf("\ncopy engine, one copy split into parts on as many streams (us, GB/s per direction)\n");
    std::printf("bytes    parts  alone us  GB/s   both 0->1 us  GB/s\n");
    for (size_t bytes : {size_t(2) << 20, size_t(8) << 20, size_t(32) << 20})
      for (int parts : {1, 2, 4}) {
        auto issue = [&](int d) {
          CK(cudaSetDevice(d));
          cudaStream_t* q = d == 0 ? q0 : q1;
          cudaEvent_t* f = d == 0 ? f0 : f1;
          CK(cudaEventRecord(d == 0 ? g0 : g1, q[0]));
          for (int i = 1; i < parts; ++i) CK(cudaStreamWaitEvent(q[i], d == 0 ? g0 : g1, 0));
          const size_t part = bytes / parts;
          for (int i = 0; i < parts; ++i)
            CK(cudaMemcpyAsync((d == 0 ? remote : remote0) + i * part, (d == 0 ? src : src1) + i * part, part,
                               cudaMemcpyDeviceToDevice, q[i]));
          for (int i = 1; i < parts; ++i) {
            CK(cudaEventRecord(f[i], q[i]));
            CK(cudaStreamWaitEvent(q[0], f[i], 0));
          }
          CK(cudaEventRecord(d == 0 ? h0 : h1, q[0]));
        };
        std::vector<double> alone, both;
        for (int r = 0; r < 9; ++r) {
          issue(0);
          CK(cudaSetDevice(0));
          CK(cudaEventSynchronize(h0));
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, g0, h0));
          if (r > 0) alone.push_back(ms * 1e3);
          issue(0);
          issue(1);
          CK(cudaSetDevice(1));
          CK(cudaEventSynchronize(h1));
          CK(cudaSetDevice(0));
          CK(cudaEventSynchronize(h0));
          CK(cudaEventElapsedTime(&ms, g0, h0));
          if (r > 0) both.push_back(ms * 1e3);
        }
        std::sort(alone.begin(), alone.end());
        std::sort(both.begin(), both.end());
        const double ua = alone[alone.size() / 2], ub = both[both.size() / 2];
        std::printf("%3zu MiB %6d %9.1f %5.0f %14.1f %5.0f\n", bytes >> 20, parts, ua, bytes / (ua * 1e3), ub,
                    bytes / (ub * 1e3));
      }
  }
  // Beside a GEMM: the bulk stores into the peer on 16 CTAs while cuBLAS runs on the rest.
  const int M = 8192, N = 8192, K = 4096;
  __nv_bfloat16 *A, *B, *C;
  CK(cudaMalloc(&A, size_t(M) * K * 2));
  CK(cudaMalloc(&B, size_t(N) * K * 2));
  CK(cudaMalloc(&C, size_t(M) * N * 2));
  CK(cudaMemset(A, 0, size_t(M) * K * 2));
  CK(cudaMemset(B, 0, size_t(N) * K * 2));
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
  cublasSetStream(h, g);
  const float one = 1, zero = 0;
  auto gemm = [&] {
    cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, B, CUDA_R_16BF, K, A, CUDA_R_16BF, K, &zero, C,
                 CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  const double alone = median_us(g, gemm);
  const size_t per16 = (64ull << 20) / 16 / (2 * kTile) * (2 * kTile);
  cudaEvent_t a, b, c;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventCreate(&c));
  std::vector<double> both, st;
  for (int r = 0; r < 5; ++r) {
    CK(cudaDeviceSynchronize());
    CK(cudaEventRecord(a, g));
    CK(cudaStreamWaitEvent(s, a, 0));
    bulk_store<<<16, kThreads, 2 * kTile, s>>>(remote, per16);
    CK(cudaEventRecord(c, s));
    gemm();
    CK(cudaStreamWaitEvent(g, c, 0));
    CK(cudaEventRecord(b, g));
    CK(cudaEventSynchronize(b));
    float ms = 0, ms2 = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    CK(cudaEventElapsedTime(&ms2, a, c));
    both.push_back(ms * 1e3);
    st.push_back(ms2 * 1e3);
  }
  std::sort(both.begin(), both.end());
  std::sort(st.begin(), st.end());
  std::printf(
      "gemm %dx%dx%d alone %.1f us; with 64 MiB of bulk stores into the peer on 16 CTAs beside it: "
      "%.1f us in all, the stores done after %.1f us (%.1f GB/s)\n",
      M, K, N, alone, both[2], st[2], per16 * 16 / (st[2] * 1e3));
  return 0;
}
