// Embedding-bag lookup kernels (include/weft/kernels/embedding_kernels.hpp; docs/embedding_a2a.md).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "weft/device/signal.hpp"
#include "weft/kernels/embedding_kernels.hpp"

namespace weft::kernels {
namespace {

constexpr int kPoolThreads = 128;
constexpr int kPoolWarps = kPoolThreads / 32;
constexpr int kLandThreads = 512;

// A 16-byte vector of weights as floats: 4 of f32, 8 of bf16 or f16.
template <class W>
struct Vec;
template <>
struct Vec<float> {
  static constexpr int kN = 4;
  __device__ static void to_float(const uint4& v, float* f) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
  }
};
template <>
struct Vec<__nv_bfloat16> {
  static constexpr int kN = 8;
  __device__ static void to_float(const uint4& v, float* f) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
  }
};
template <>
struct Vec<__half> {
  static constexpr int kN = 8;
  __device__ static void to_float(const uint4& v, float* f) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 p = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
      f[2 * i] = p.x;
      f[2 * i + 1] = p.y;
    }
  }
};

// Stores n (4 or 8) floats at dst (16-byte aligned for f32 out, n * 2 bytes for bf16).
template <int kN>
__device__ __forceinline__ void store_row(void* dst, const float* f, bool bf16) {
  if (!bf16) {
    float4* d = static_cast<float4*>(dst);
#pragma unroll
    for (int i = 0; i < kN / 4; ++i) d[i] = make_float4(f[4 * i], f[4 * i + 1], f[4 * i + 2], f[4 * i + 3]);
    return;
  }
  uint32_t w[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) {
    const __nv_bfloat162 p = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    w[i] = *reinterpret_cast<const uint32_t*>(&p);
  }
  if constexpr (kN == 8)
    *static_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
  else
    *static_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
}

// The table that holds item j of one destination (first ascending, first[0] == 0).
__device__ __forceinline__ int table_of(const int64_t* first, int n, int64_t j) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first[mid] <= j)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Stores a pooled row's kV vectors (lane g of its group holds vectors g, g + group, ...).
template <class W, int kV>
__device__ __forceinline__ void store_bag(const EmbeddingPoolArgs& a, float (&acc)[kV][Vec<W>::kN], char* row, int g,
                                          int group, int nv, int64_t n) {
  constexpr int kE = Vec<W>::kN;
  const bool bf16 = a.ot == dev::DType::kBF16;
  const size_t ob = bf16 ? 2 : 4;
  const float scale = a.mean && n > 0 ? 1.f / static_cast<float>(n) : 1.f;
#pragma unroll
  for (int v = 0; v < kV; ++v) {
    const int vec = g + v * group;
    if (vec >= nv) continue;
    if (a.mean)
#pragma unroll
      for (int e = 0; e < kE; ++e) acc[v][e] = __fmul_rn(acc[v][e], scale);
    store_row<kE>(row + static_cast<size_t>(vec) * kE * ob, acc[v], bf16);
  }
}

// One work item: a warp's 32 / group poolers, each `group` lanes pooling kR consecutive bags of
// table ti for destination q. Lane g of a pooler holds vectors g, g + group,
// ... (kV of them) of the row. A pooler walks its bags' indices as one run -- kU rows loaded
// ahead whatever bag they belong to, the indices loaded by the group's lanes together -- and
// each bag's sum runs over its indices in order, in fp32, a rounding per product and per sum
// (__fmul_rn, __fadd_rn: no contraction, as the host's). Offsets that decrease anywhere in the
// run: recorded, and the run's bags pooled empty.
template <class W, int kV>
__device__ void pool_item(const EmbeddingPoolArgs& a, int ti, int64_t item, int kR, int q, char* dst_base,
                          int64_t stride, int64_t col0) {
  constexpr int kE = Vec<W>::kN;
  constexpr int kU = 8 / kV;  // rows loaded ahead: 8 x 16 bytes a lane
  const EmbeddingTableArgs& t = a.t[ti];
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int group = t.group, sub = lane / group, g = lane % group;
  const int64_t b0 = (item * (32 / group) + sub) * kR;
  if (b0 >= a.batch) return;
  const int nb = static_cast<int>(a.batch - b0 < kR ? a.batch - b0 : kR);
  const unsigned mask = group == 32 ? 0xFFFFFFFFu : ((1u << group) - 1u) << (sub * group);
  const int64_t bag0 = static_cast<int64_t>(q) * a.batch + b0;
  const bool bf16 = a.ot == dev::DType::kBF16;
  const size_t ob = bf16 ? 2 : 4;
  const int nv = t.dim / kE;
  char* row0 = dst_base + static_cast<size_t>(b0 * stride + col0 + t.col) * ob;
  float acc[kV][kE];
#pragma unroll
  for (int v = 0; v < kV; ++v)
#pragma unroll
    for (int e = 0; e < kE; ++e) acc[v][e] = 0.f;
  // The run's offsets, checked: lane k <= nb of the group holds offsets[bag0 + k] where the group
  // has the lanes (else they are loaded where needed).
  const bool lane_offsets = group > kEmbeddingPoolerBags;
  int64_t my_off = 0;
  if (lane_offsets && g <= nb) my_off = __ldg(t.offsets + bag0 + g);
  auto off_at = [&](int k) {
    return lane_offsets ? __shfl_sync(mask, my_off, sub * group + k) : __ldg(t.offsets + bag0 + k);
  };
  const int64_t first = off_at(0), last = off_at(nb);
  int bad_bag = -1;
  if (lane_offsets) {
    const int64_t before = __shfl_up_sync(mask, my_off, 1, group);
    const unsigned down = __ballot_sync(mask, g >= 1 && g <= nb && my_off < before) & mask;
    if (down) bad_bag = __ffs(down) - 1 - sub * group - 1;
  } else {
    for (int k = 1; k <= nb && bad_bag < 0; ++k)
      if (off_at(k) < off_at(k - 1)) bad_bag = k - 1;
  }
  if (bad_bag >= 0) {
    if (g == 0)
      atomicMin(a.bad + 1, (static_cast<unsigned long long>(t.global) << 40) | static_cast<uint64_t>(bag0 + bad_bag));
    for (int k = 0; k < nb; ++k) store_bag<W, kV>(a, acc, row0 + static_cast<size_t>(k * stride) * ob, g, group, nv, 0);
    return;
  }
  const uint4* wt = static_cast<const uint4*>(t.weight);
  int cur = 0;                             // the bag being summed
  int64_t start = first, end = off_at(1);  // its indices
  const bool shared_loads = group >= kU;   // the group's lanes load kU indices together
  // Shared loads: lane g of the group holds index i + g (g < kU) of the batch at i, loaded one
  // batch ahead (the next batch's indices are in flight while this batch's rows are summed).
  int64_t mine = -1;
  float my_w = 1.f;
  if (shared_loads && g < kU && first + g < last) {
    mine = __ldg(t.indices + first + g);
    if (t.psw) my_w = __ldg(t.psw + first + g);
  }
  for (int64_t i = first; i < last; i += kU) {
    int64_t r[kU];
    float w[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      int64_t x = -1;
      w[u] = 1.f;
      if (shared_loads) {
        x = __shfl_sync(mask, mine, sub * group + u);
        w[u] = __shfl_sync(mask, my_w, sub * group + u);
      } else if (i + u < last) {
        x = __ldg(t.indices + i + u);
        if (t.psw) w[u] = __ldg(t.psw + i + u);
      }
      r[u] = -1;
      if (i + u < last) {
        if (x >= 0 && x < t.rows)
          r[u] = x;
        else if (g == 0)
          atomicMin(a.bad, (static_cast<unsigned long long>(t.global) << 40) | static_cast<uint64_t>(i + u));
      }
    }
    uint4 x[kU][kV];
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int v = 0; v < kV; ++v) {
        const int vec = g + v * group;
        x[u][v] = r[u] >= 0 && vec < nv ? __ldg(wt + r[u] * nv + vec) : make_uint4(0, 0, 0, 0);
      }
    if (shared_loads) {
      mine = -1;
      my_w = 1.f;
      if (g < kU && i + kU + g < last) {
        mine = __ldg(t.indices + i + kU + g);
        if (t.psw) my_w = __ldg(t.psw + i + kU + g);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (i + u >= last) break;
      while (i + u >= end) {  // the bag before is complete (empty ones too)
        store_bag<W, kV>(a, acc, row0 + static_cast<size_t>(cur * stride) * ob, g, group, nv, end - start);
#pragma unroll
        for (int v = 0; v < kV; ++v)
#pragma unroll
          for (int e = 0; e < kE; ++e) acc[v][e] = 0.f;
        ++cur;
        start = end;
        end = off_at(cur + 1);
      }
      if (r[u] < 0) continue;
#pragma unroll
      for (int v = 0; v < kV; ++v) {
        float f[kE];
        Vec<W>::to_float(x[u][v], f);
#pragma unroll
        for (int e = 0; e < kE; ++e) acc[v][e] = __fadd_rn(acc[v][e], __fmul_rn(w[u], f[e]));
      }
    }
  }
  for (; cur < nb; ++cur) {  // the last bag with indices, and empty ones after it
    store_bag<W, kV>(a, acc, row0 + static_cast<size_t>(cur * stride) * ob, g, group, nv, end - start);
#pragma unroll
    for (int v = 0; v < kV; ++v)
#pragma unroll
      for (int e = 0; e < kE; ++e) acc[v][e] = 0.f;
    start = end;
    if (cur + 1 < nb) end = off_at(cur + 2);
  }
}

template <class W, int kV>
__global__ void __launch_bounds__(kPoolThreads, 4) pool_kernel(const __grid_constant__ EmbeddingPoolArgs a) {
  const dev::DeviceCtx& c = a.ctx;
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int64_t stride_items = static_cast<int64_t>(gridDim.x) * kPoolWarps;
  const uint64_t parity = a.push ? (a.calls[0] + 1) & 1 : 0;
  // Each table's bags a pooler takes (from its average bag) and its first item: the same in every CTA.
  static_assert(kEmbeddingMaxTables <= kPoolThreads, "a thread a table reads its average bag");
  __shared__ int64_t first[kEmbeddingMaxTables + 1];
  __shared__ int bags_of[kEmbeddingMaxTables];
  if (static_cast<int>(threadIdx.x) < a.n_tables) {
    const EmbeddingTableArgs& t = a.t[threadIdx.x];
    const int64_t all = static_cast<int64_t>(c.world) * a.batch;
    const int64_t nnz = __ldg(t.offsets + all) - __ldg(t.offsets);
    const int64_t r = nnz > 0 ? 64 * all / nnz : kEmbeddingPoolerBags;  // about 64 rows a run
    bags_of[threadIdx.x] = static_cast<int>(r < 1 ? 1 : r < kEmbeddingPoolerBags ? r : kEmbeddingPoolerBags);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t n = 0;
    for (int t = 0; t < a.n_tables; ++t) {
      first[t] = n;
      const int64_t per_item = (32 / a.t[t].group) * bags_of[t];
      n += (a.batch + per_item - 1) / per_item;
    }
    first[a.n_tables] = n;
  }
  __syncthreads();
  const int64_t items = first[a.n_tables];
  // Every destination's items, destination-minor: a destination's rows spread over the whole
  // kernel (with push, the link's traffic too).
  const int64_t all_items = items * a.dest_count;
  for (int64_t jj = static_cast<int64_t>(blockIdx.x) * kPoolWarps + warp; jj < all_items; jj += stride_items) {
    const int q = (a.dest_first + static_cast<int>(jj % a.dest_count)) % c.world;
    const int64_t j = jj / a.dest_count;
    char* base;
    int64_t stride, col0;
    if (q == c.rank && a.out) {
      base = static_cast<char*>(a.out);
      stride = a.out_stride;
      col0 = a.out_col;
    } else if (a.push) {
      base = c.ptr<char>(q, a.land_off + parity * a.land_bytes);
      stride = a.out_stride;
      col0 = a.out_col;
    } else {
      base = static_cast<char*>(a.send) + static_cast<size_t>(q) * a.send_dest_bytes;
      stride = a.send_stride;
      col0 = 0;
    }
    const int ti = table_of(first, a.n_tables, j);
    pool_item<W, kV>(a, ti, j - first[ti], bags_of[ti], q, base, stride, col0);
  }
  if (a.push) {  // this CTA's rows are stored: tell every peer
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < c.world && static_cast<int>(threadIdx.x) != c.rank)
      dev::signal_add(c, static_cast<int>(threadIdx.x), a.sig_off + 8ull * static_cast<uint64_t>(c.rank));
  }
}

template <class W, int kV>
cudaError_t launch_pool_v(const EmbeddingPoolArgs& a, cudaStream_t s) {
  const int grid = a.ctas > 0 ? a.ctas : embedding_pool_ctas();
  pool_kernel<W, kV><<<grid, kPoolThreads, 0, s>>>(a);
  return cudaGetLastError();
}

template <class W>
cudaError_t launch_pool(const EmbeddingPoolArgs& a, int vectors, cudaStream_t s) {
  if (vectors <= 1) return launch_pool_v<W, 1>(a, s);
  if (vectors <= 2) return launch_pool_v<W, 2>(a, s);
  if (vectors <= 4) return launch_pool_v<W, 4>(a, s);
  return launch_pool_v<W, 8>(a, s);
}

__global__ void __launch_bounds__(kLandThreads) land_kernel(const __grid_constant__ EmbeddingLandArgs a) {
  const dev::DeviceCtx& c = a.ctx;
  const uint64_t n = a.calls[0] + 1;
  if (threadIdx.x < static_cast<unsigned>(c.world) && static_cast<int>(threadIdx.x) != c.rank)
    dev::wait_ge(c, a.sig_off + 8ull * threadIdx.x, n * static_cast<uint64_t>(a.src_ctas),
                 static_cast<int>(threadIdx.x), dev::WaitKind::kSignal, dev::op_tag("emb_a2a"));
  __syncthreads();
  // Row b's vectors of 16 bytes, the own columns left out: [0, skip) and [skip + own, row).
  const int64_t row_v = a.stride * static_cast<int64_t>(a.elem) / 16, skip_v = a.skip_col * a.elem / 16,
                own_v = a.skip_cols * static_cast<int64_t>(a.elem) / 16, other_v = row_v - own_v;
  const uint4* src = c.local<const uint4>(a.land_off + (n & 1) * a.land_bytes);
  uint4* dst = static_cast<uint4*>(a.out);
  const int64_t total = a.batch * other_v;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kLandThreads + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kLandThreads) {
    const int64_t b = i / other_v, v0 = i % other_v, v = v0 < skip_v ? v0 : v0 + own_v;
    dst[b * row_v + v] = src[b * row_v + v];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(reinterpret_cast<unsigned long long*>(a.calls + 1), 1ull) == gridDim.x - 1) {
      a.calls[1] = 0;
      a.calls[0] = n;
    }
  }
}

__global__ void relayout_kernel(const __grid_constant__ EmbeddingRelayoutArgs a) {
  const int64_t row_v = a.stride * static_cast<int64_t>(a.elem) / 16;
  const uint4* recv = static_cast<const uint4*>(a.recv);
  uint4* out = static_cast<uint4*>(a.out);
  for (int s = 0; s < a.world; ++s) {
    if (s == a.skip || a.dims[s] == 0) continue;
    const int64_t dv = a.dims[s] * static_cast<int64_t>(a.elem) / 16, cv = a.cols[s] * a.elem / 16,
                  rv = a.recv_at[s] * a.elem / 16, n = a.batch * dv;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int64_t b = i / dv, j = i % dv;
      out[b * row_v + cv + j] = recv[rv + i];
    }
  }
}

int sm_count() {
  static const int n = [] {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev))
      return 132;
    return sms;
  }();
  return n;
}

}  // namespace

int embedding_pool_ctas() {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, pool_kernel<float, 8>, kPoolThreads, 0) != cudaSuccess ||
      per_sm < 1)
    per_sm = 1;
  return sm_count() * per_sm;
}

cudaError_t embedding_pool(const EmbeddingPoolArgs& a, cudaStream_t s) {
  if (a.n_tables == 0 || a.batch == 0) {
    if (!a.push) return cudaSuccess;  // nothing to pool; with push the signals still go out
  }
  int vectors = 1;  // the most vectors a lane holds, over the tables
  const int e = a.wt == dev::DType::kF32 ? 4 : 8;
  for (int i = 0; i < a.n_tables; ++i) vectors = std::max(vectors, (a.t[i].dim / e + a.t[i].group - 1) / a.t[i].group);
  if (a.wt == dev::DType::kF32) return launch_pool<float>(a, vectors, s);
  if (a.wt == dev::DType::kBF16) return launch_pool<__nv_bfloat16>(a, vectors, s);
  return launch_pool<__half>(a, vectors, s);
}

cudaError_t embedding_land(const EmbeddingLandArgs& a, cudaStream_t s) {
  const int64_t vectors = a.batch * a.stride * static_cast<int64_t>(a.elem) / 16;
  const int grid =
      static_cast<int>(std::clamp<int64_t>((vectors + kLandThreads - 1) / kLandThreads, 1, 4 * sm_count()));
  land_kernel<<<grid, kLandThreads, 0, s>>>(a);
  return cudaGetLastError();
}

cudaError_t embedding_relayout(const EmbeddingRelayoutArgs& a, cudaStream_t s) {
  const int64_t vectors = a.batch * a.stride * static_cast<int64_t>(a.elem) / 16;
  if (vectors == 0) return cudaSuccess;
  const int grid = static_cast<int>(std::clamp<int64_t>((vectors + 511) / 512, 1, 4 * sm_count()));
  relayout_kernel<<<grid, 512, 0, s>>>(a);
  return cudaGetLastError();
}

}  // namespace weft::kernels
