// MoE token exchange kernels (include/weft/kernels/moe_kernels.hpp; docs/moe.md, "GPU path").
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

#include "weft/device/dtype.hpp"
#include "weft/kernels/moe_kernels.hpp"

namespace weft::kernels {
namespace {

constexpr int kRouteThreads = 1024;  // one CTA: 32 warps
constexpr int kRouteWarps = kRouteThreads / 32;

// Whether pair i (token i / k, slot i % k) names a valid expert: in range and not named by an
// earlier slot of the same token.
__device__ __forceinline__ bool valid_pair(const int32_t* ids, int i, int k, int experts) {
  const int e = ids[i];
  if (e < 0 || e >= experts) return false;
  for (int j = i - i % k; j < i; ++j)
    if (ids[j] == e) return false;
  return true;
}

// Shared memory: running[E] (the next free place of each expert), base[E] (its place at the
// start of the current chunk), then [kRouteWarps][E] uint16: each warp's pairs of each expert in
// the chunk, turned in place into the warps before it (exclusive prefix).
__global__ void __launch_bounds__(kRouteThreads) route_kernel(const MoeRouteArgs a) {
  extern __shared__ unsigned char smem[];
  const int E = a.experts, k = a.top_k, pairs = a.tokens * a.top_k;
  uint32_t* running = reinterpret_cast<uint32_t*>(smem);
  uint32_t* base = running + E;
  uint16_t* wc = reinterpret_cast<uint16_t*>(base + E);
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  for (int e = tid; e < E; e += kRouteThreads) running[e] = 0;
  __syncthreads();
  // Pass 1: validity and the per-expert counts.
  for (int i = tid; i < pairs; i += kRouteThreads) {
    if (valid_pair(a.ids, i, k, E))
      atomicAdd(&running[a.ids[i]], 1u);
    else
      atomicMin(a.bad, static_cast<unsigned long long>(i));
  }
  __syncthreads();
  // The counts out, then their exclusive prefix (one warp: 16 experts a lane at most).
  for (int e = tid; e < E; e += kRouteThreads) a.expert_counts[e] = running[e];
  if (warp == 0) {
    const int per = (E + 31) / 32, e0 = lane * per;
    uint32_t sum = 0;
    for (int e = e0; e < e0 + per && e < E; ++e) sum += running[e];
    uint32_t incl = sum;
    for (int d = 1; d < 32; d *= 2) {
      const uint32_t v = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += v;
    }
    uint32_t at = incl - sum;
    for (int e = e0; e < e0 + per && e < E; ++e) {
      const uint32_t c = running[e];
      running[e] = at;
      at += c;
    }
  }
  __syncthreads();
  if (tid < a.world) {  // elements for each rank: its experts' rows
    const int L = E / a.world;
    const uint32_t end = tid + 1 < a.world ? running[(tid + 1) * L] : running[E - 1] + a.expert_counts[E - 1];
    a.send_counts[tid] = static_cast<uint64_t>(end - running[tid * L]) * static_cast<uint64_t>(a.hidden);
  }
  // Pass 2: places, a chunk of kRouteThreads pairs at a time, in pair order.
  for (int c0 = 0; c0 < pairs; c0 += kRouteThreads) {
    for (int q = tid; q < kRouteWarps * E; q += kRouteThreads) wc[q] = 0;
    for (int e = tid; e < E; e += kRouteThreads) base[e] = running[e];
    __syncthreads();
    const int i = c0 + tid;
    const int e = i < pairs && valid_pair(a.ids, i, k, E) ? a.ids[i] : -1;
    const unsigned same = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(same & ((1u << lane) - 1u));
    if (e >= 0 && rank == 0) wc[warp * E + e] = static_cast<uint16_t>(__popc(same));
    __syncthreads();
    for (int x = tid; x < E; x += kRouteThreads) {  // each expert's warps in order
      uint32_t before = 0;
      for (int w = 0; w < kRouteWarps; ++w) {
        const uint32_t n = wc[w * E + x];
        wc[w * E + x] = static_cast<uint16_t>(before);
        before += n;
      }
      running[x] += before;
    }
    __syncthreads();
    if (i < pairs) a.pos[i] = e >= 0 ? static_cast<int32_t>(base[e] + wc[warp * E + e] + rank) : -1;
    __syncthreads();
  }
}

// One CTA per pair: its token's row to its place.
__global__ void __launch_bounds__(128)
    pack_kernel(const uint4* x, const int32_t* pos, uint4* send, int top_k, int vecs) {
  const int i = static_cast<int>(blockIdx.x);
  const int p = pos[i];
  if (p < 0) return;
  const uint4* src = x + static_cast<size_t>(i / top_k) * vecs;
  uint4* dst = send + static_cast<size_t>(p) * vecs;
  for (int v = static_cast<int>(threadIdx.x); v < vecs; v += 128) dst[v] = src[v];
}

__global__ void widen_kernel(const uint32_t* in, int64_t* out, int n) {
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < n;
       i += static_cast<int>(gridDim.x * blockDim.x))
    out[i] = in[i];
}

// One CTA per token; each thread 8 elements at a time.
template <class T>
__global__ void __launch_bounds__(128)
    combine_kernel(const T* back, const int32_t* pos, const float* weights, T* y, int top_k, int hidden) {
  const int t = static_cast<int>(blockIdx.x);
  for (int h0 = 8 * static_cast<int>(threadIdx.x); h0 < hidden; h0 += 8 * 128) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int j = 0; j < top_k; ++j) {  // slot order: the same sum on every call
      const int p = pos[t * top_k + j];
      if (p < 0) continue;
      const float w = weights[t * top_k + j];
      T v[8];
      std::memcpy(v, back + static_cast<size_t>(p) * hidden + h0, sizeof(v));
      for (int q = 0; q < 8; ++q) acc[q] += w * dev::to_float(v[q]);
    }
    T o[8];
    for (int q = 0; q < 8; ++q) o[q] = dev::from_float<T>(acc[q]);
    std::memcpy(y + static_cast<size_t>(t) * hidden + h0, o, sizeof(o));
  }
}

}  // namespace

cudaError_t moe_route(const MoeRouteArgs& a, cudaStream_t s) {
  if (a.experts < 1 || a.experts > kMoeMaxExperts || a.world < 1 || a.experts % a.world != 0 || a.tokens < 0 ||
      a.top_k < 1 || a.world > kRouteThreads)
    return cudaErrorInvalidValue;
  const size_t smem = static_cast<size_t>(a.experts) * (8 + 2 * kRouteWarps);
  static const cudaError_t allowed = cudaFuncSetAttribute(route_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                          static_cast<int>(kMoeMaxExperts * (8 + 2 * kRouteWarps)));
  if (allowed != cudaSuccess) return allowed;
  route_kernel<<<1, kRouteThreads, smem, s>>>(a);
  return cudaGetLastError();
}

cudaError_t moe_pack(const void* x, const int32_t* pos, void* send, int tokens, int top_k, int hidden, size_t eb,
                     cudaStream_t s) {
  if (tokens == 0) return cudaSuccess;
  if ((static_cast<size_t>(hidden) * eb) % 16 != 0) return cudaErrorInvalidValue;
  pack_kernel<<<tokens * top_k, 128, 0, s>>>(static_cast<const uint4*>(x), pos, static_cast<uint4*>(send), top_k,
                                             static_cast<int>(static_cast<size_t>(hidden) * eb / 16));
  return cudaGetLastError();
}

cudaError_t moe_widen_counts(const uint32_t* in, int64_t* out, int n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  widen_kernel<<<(n + 255) / 256, 256, 0, s>>>(in, out, n);
  return cudaGetLastError();
}

cudaError_t moe_combine(const void* back, const int32_t* pos, const float* weights, void* y, int tokens, int top_k,
                        int hidden, dev::DType t, cudaStream_t s) {
  if (tokens == 0) return cudaSuccess;
  if (hidden % 8 != 0) return cudaErrorInvalidValue;
  if (t == dev::DType::kBF16)
    combine_kernel<dev::bf16_t><<<tokens, 128, 0, s>>>(static_cast<const dev::bf16_t*>(back), pos, weights,
                                                       static_cast<dev::bf16_t*>(y), top_k, hidden);
  else if (t == dev::DType::kF16)
    combine_kernel<dev::f16_t><<<tokens, 128, 0, s>>>(static_cast<const dev::f16_t*>(back), pos, weights,
                                                      static_cast<dev::f16_t*>(y), top_k, hidden);
  else if (t == dev::DType::kF32)
    combine_kernel<float>
        <<<tokens, 128, 0, s>>>(static_cast<const float*>(back), pos, weights, static_cast<float*>(y), top_k, hidden);
  else
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

}  // namespace weft::kernels
