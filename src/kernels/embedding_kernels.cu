// Embedding-bag lookup kernels (include/weft/kernels/embedding_kernels.hpp; docs/embedding_a2a.md).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include "weft/device/signal.hpp"
#include "weft/kernels/embedding_kernels.hpp"
#include "weft/kernels/runtime_kernels.hpp"

namespace weft::kernels {
namespace {

constexpr int kPoolWarps = kEmbeddingPoolWarps;
constexpr int kPoolThreads = 32 * kPoolWarps;
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

// The largest i < n with v[i] <= x (v ascending, v[0] <= x).
template <class T, class X>
__device__ __forceinline__ int last_at_most(const T* v, int n, X x) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (v[mid] <= x)
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
  const bool lane_offsets = group > kR;
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
  const bool weighted = t.psw != nullptr;
  // The run's positions relative to `first` (32-bit: a run of at most kEmbeddingPoolerBags bags
  // is taken to hold fewer than 2^31 indices).
  const int n = static_cast<int>(last - first);
  int cur = 0;                                               // the bag being summed
  int start = 0, end = static_cast<int>(off_at(1) - first);  // its indices
  // A row's first vector, or null for a position past the run or an index outside the table
  // (recorded: the lowest bad position wins). Checked once, by the lane that loaded the index.
  auto row_of = [&](int64_t x, int pos) -> const uint4* {
    if (pos >= n) return nullptr;
    if (x >= 0 && x < t.rows) return wt + x * nv;
    atomicMin(a.bad, (static_cast<unsigned long long>(t.global) << 40) | static_cast<uint64_t>(first + pos));
    return nullptr;
  };
  const bool shared_loads = group >= kU;  // the group's lanes load kU indices together
  // Shared loads: lane g (< kU) of the group loads index k + g of the batch at k one batch ahead
  // (the next batch's indices are in flight while this batch's rows are summed) and turns it
  // into a row pointer; the group's lanes take the batch's pointers by shuffles.
  int64_t mine = -1;
  float my_w = 1.f;
  if (shared_loads && g < kU && g < n) {
    mine = __ldg(t.indices + first + g);
    if (weighted) my_w = __ldg(t.psw + first + g);
  }
  for (int k = 0; k < n; k += kU) {
    const uint4* rp[kU];
    float w[kU];
    if (shared_loads) {
      const uint4* my_row = g < kU ? row_of(mine, k + g) : nullptr;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        rp[u] = reinterpret_cast<const uint4*>(
            __shfl_sync(mask, reinterpret_cast<unsigned long long>(my_row), sub * group + u));
        w[u] = weighted ? __shfl_sync(mask, my_w, sub * group + u) : 1.f;
      }
    } else {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const bool in = k + u < n;
        const int64_t x = in ? __ldg(t.indices + first + k + u) : -1;
        w[u] = in && weighted ? __ldg(t.psw + first + k + u) : 1.f;
        rp[u] = g == 0 ? row_of(x, k + u) : (x >= 0 && x < t.rows && in ? wt + x * nv : nullptr);
      }
    }
    uint4 x[kU][kV];
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int v = 0; v < kV; ++v) {
        const int vec = g + v * group;
        x[u][v] = rp[u] != nullptr && vec < nv ? __ldg(rp[u] + vec) : make_uint4(0, 0, 0, 0);
      }
    if (shared_loads) {
      mine = -1;
      my_w = 1.f;
      if (g < kU && k + kU + g < n) {
        mine = __ldg(t.indices + first + k + kU + g);
        if (weighted) my_w = __ldg(t.psw + first + k + kU + g);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (k + u >= n) break;
      while (k + u >= end) {  // the bag before is complete (empty ones too)
        store_bag<W, kV>(a, acc, row0 + static_cast<size_t>(cur * stride) * ob, g, group, nv, end - start);
#pragma unroll
        for (int v = 0; v < kV; ++v)
#pragma unroll
          for (int e = 0; e < kE; ++e) acc[v][e] = 0.f;
        ++cur;
        start = end;
        end = static_cast<int>(off_at(cur + 1) - first);
      }
      if (rp[u] == nullptr) continue;
#pragma unroll
      for (int v = 0; v < kV; ++v) {
        float f[kE];
        Vec<W>::to_float(x[u][v], f);
        if (weighted)
#pragma unroll
          for (int e = 0; e < kE; ++e) acc[v][e] = __fadd_rn(acc[v][e], __fmul_rn(w[u], f[e]));
        else  // w = 1: the product is f itself
#pragma unroll
          for (int e = 0; e < kE; ++e) acc[v][e] = __fadd_rn(acc[v][e], f[e]);
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
    if (cur + 1 < nb) end = static_cast<int>(off_at(cur + 2) - first);
  }
}

template <class W, int kV>
__global__ void __launch_bounds__(kPoolThreads, 4) pool_kernel(const __grid_constant__ EmbeddingPoolArgs a) {
  const dev::DeviceCtx& c = a.ctx;
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int64_t stride_items = static_cast<int64_t>(gridDim.x) * kPoolWarps;
  const uint64_t parity = a.push ? (a.calls[0] + 1) & 1 : 0;
  // Each table's bags a pooler takes (the host's choice, else from its average bag) and its first
  // item: the same in every CTA.
  static_assert(kEmbeddingMaxTables <= kPoolThreads, "a thread a table reads its average bag");
  __shared__ int64_t first[kEmbeddingMaxTables + 1];
  __shared__ int bags_of[kEmbeddingMaxTables];
  if (static_cast<int>(threadIdx.x) < a.n_tables && a.t[threadIdx.x].run_bags > 0) {
    bags_of[threadIdx.x] = a.t[threadIdx.x].run_bags;
  } else if (static_cast<int>(threadIdx.x) < a.n_tables) {
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
    const int ti = last_at_most(first, a.n_tables, j);  // the table that holds item j
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
  const uint4* __restrict__ src = c.local<const uint4>(a.land_off + (n & 1) * a.land_bytes);
  uint4* __restrict__ dst = static_cast<uint4*>(a.out);
  // A warp a row (no division per vector), four vectors a lane in flight.
  constexpr int kWarps = kLandThreads / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; b < a.batch;
       b += static_cast<int64_t>(gridDim.x) * kWarps) {
    const uint4* s = src + b * row_v;
    uint4* d = dst + b * row_v;
    for (int64_t v0 = lane; v0 < other_v; v0 += 4 * 32) {
      uint4 x[4];
      int64_t at[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int64_t w = v0 + 32 * k;
        at[k] = w < other_v ? (w < skip_v ? w : w + own_v) : -1;
        if (at[k] >= 0) x[k] = s[at[k]];
      }
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (at[k] >= 0) d[at[k]] = x[k];
    }
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

// ---- Backward ----

constexpr int kGradThreads = 256;
constexpr int kSumThreads = 128;
constexpr int kSumWarps = kSumThreads / 32;
constexpr int kSendThreads = 512;

// Every position's key, its bag and its own number (the sort's values); offsets checked.
__global__ void __launch_bounds__(kGradThreads) grad_keys_kernel(const __grid_constant__ EmbeddingGradArgs a) {
  __shared__ int64_t pos_base[kEmbeddingMaxTables + 1];
  __shared__ int64_t used[kEmbeddingMaxTables];  // positions a table's bags cover: offsets[bags], at most count
  for (int t = static_cast<int>(threadIdx.x); t <= a.n_tables; t += blockDim.x) {
    if (t == a.n_tables) {
      pos_base[t] = a.positions;
      continue;
    }
    const EmbeddingGradTableArgs& x = a.t[t];
    pos_base[t] = x.pos_base;
    const int64_t last = __ldg(x.offsets + a.bags);
    if (last > x.count && blockIdx.x == 0)
      atomicMin(a.bad + 2, (static_cast<unsigned long long>(x.global) << 40) | static_cast<uint64_t>(last));
    used[t] = last < x.count ? last : x.count;
  }
  __syncthreads();
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < a.positions; p += step) {
    const int t = last_at_most(pos_base, a.n_tables, p);
    const EmbeddingGradTableArgs& x = a.t[t];
    const int64_t i = p - pos_base[t];
    uint32_t key = a.keys;
    int32_t bag = -1;
    if (i < used[t] && a.bags > 0) {
      const int64_t r = __ldg(x.indices + i);
      if (r >= 0 && r < x.rows) {
        const int g = last_at_most(x.offsets, static_cast<int>(a.bags), i);
        if (__ldg(x.offsets + g) <= i && i < __ldg(x.offsets + g + 1)) {
          bag = g;
          key = x.row_base + static_cast<uint32_t>(r);
        }
      } else {
        atomicMin(a.bad, (static_cast<unsigned long long>(x.global) << 40) | static_cast<uint64_t>(i));
      }
    }
    a.key[p] = key;
    a.pos[p] = static_cast<int32_t>(p);
    a.bag_of[p] = bag;
  }
  // Offsets that decrease (their positions' bags are not found: left out).
  const int64_t checks = static_cast<int64_t>(a.n_tables) * a.bags;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < checks; k += step) {
    const EmbeddingGradTableArgs& x = a.t[k / a.bags];
    const int64_t g = k % a.bags;
    if (__ldg(x.offsets + g + 1) < __ldg(x.offsets + g))
      atomicMin(a.bad + 1, (static_cast<unsigned long long>(x.global) << 40) | static_cast<uint64_t>(g));
  }
}

// Four consecutive elements of a gradient row (f32 or bf16) as floats.
__device__ __forceinline__ void load4(const char* p, bool bf16, float* f) {
  if (!bf16) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    f[0] = v.x;
    f[1] = v.y;
    f[2] = v.z;
    f[3] = v.w;
    return;
  }
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  f[0] = __uint_as_float(v.x << 16);
  f[1] = __uint_as_float(v.x & 0xFFFF0000u);
  f[2] = __uint_as_float(v.y << 16);
  f[3] = __uint_as_float(v.y & 0xFFFF0000u);
}

// Four consecutive weights (f32, bf16 or f16) as floats, and back (each rounded once).
__device__ __forceinline__ void load_w4(const char* p, dev::DType t, float* f) {
  if (t == dev::DType::kF32) return load4(p, false, f);
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  const uint16_t h[4] = {static_cast<uint16_t>(v.x), static_cast<uint16_t>(v.x >> 16), static_cast<uint16_t>(v.y),
                         static_cast<uint16_t>(v.y >> 16)};
#pragma unroll
  for (int e = 0; e < 4; ++e) f[e] = dev::from_bits16(h[e], t);
}
__device__ __forceinline__ void store_w4(char* p, dev::DType t, const float* f) {
  if (t == dev::DType::kF32) {
    *reinterpret_cast<float4*>(p) = make_float4(f[0], f[1], f[2], f[3]);
    return;
  }
  uint16_t h[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) h[e] = dev::to_bits16(f[e], t);
  *reinterpret_cast<uint2*>(p) =
      make_uint2(h[0] | (static_cast<uint32_t>(h[1]) << 16), h[2] | (static_cast<uint32_t>(h[3]) << 16));
}

// One position's bag and factor (w_i * s, as the host's).
__device__ __forceinline__ void position_meta(const EmbeddingGradArgs& a, const EmbeddingGradTableArgs& x, int32_t p,
                                              int32_t& bag, float& f) {
  bag = a.bag_of[p];
  const int64_t i = p - x.pos_base;
  float s = 1.f;
  if (a.mean) {
    const int64_t n = __ldg(x.offsets + bag + 1) - __ldg(x.offsets + bag);
    if (n > 0) s = __fdiv_rn(1.f, static_cast<float>(n));
  }
  f = __fmul_rn(x.psw ? __ldg(x.psw + i) : 1.f, s);
}

// acc += f * bag's gradient row (lane l's vectors l, l + 32, ... of 4 elements).
template <int kV>
__device__ __forceinline__ void add_row(const EmbeddingGradArgs& a, const char* src, const EmbeddingGradTableArgs& x,
                                        int32_t bag, float f, float (&acc)[kV][4]) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const bool bf16 = a.gt == dev::DType::kBF16;
  const size_t ge = bf16 ? 2 : 4;
  const int64_t q = bag / a.batch, b = bag % a.batch;
  const char* row = q == a.ctx.rank
                        ? static_cast<const char*>(a.own) + static_cast<size_t>(b * a.own_stride + x.col) * ge
                        : src + q * a.src_rank_bytes + static_cast<size_t>(b * a.src_stride + x.col) * ge;
  float g[kV][4];
#pragma unroll
  for (int v = 0; v < kV; ++v) {
    const int vec = lane + 32 * v;
    if (vec * 4 < x.dim)
      load4(row + static_cast<size_t>(vec) * 4 * ge, bf16, g[v]);
    else
      g[v][0] = g[v][1] = g[v][2] = g[v][3] = 0.f;
  }
#pragma unroll
  for (int v = 0; v < kV; ++v)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[v][e] = __fadd_rn(acc[v][e], __fmul_rn(f, g[v][e]));
}

// What an update reads of row r before it writes it: the weights, and Adagrad's state.
template <int kV>
struct RowOld {
  float w[kV][4];
  float st[kV][4];
};

template <int kV, EmbeddingSink kS>
__device__ __forceinline__ void sink_load(const EmbeddingGradArgs& a, const EmbeddingGradTableArgs& x, int64_t r,
                                          RowOld<kV>& o) {
  if constexpr (kS == EmbeddingSink::kSgd || kS == EmbeddingSink::kAdagrad) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    const size_t wb = a.wt == dev::DType::kF32 ? 4 : 2;
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      const int vec = lane + 32 * v;
      if (vec * 4 >= x.dim) continue;
      const size_t at = static_cast<size_t>(r * x.dim + vec * 4);
      load_w4(static_cast<const char*>(x.weight) + at * wb, a.wt, o.w[v]);
      if constexpr (kS == EmbeddingSink::kAdagrad) {
        const float4 st = *reinterpret_cast<const float4*>(x.state + at);
        o.st[v][0] = st.x;
        o.st[v][1] = st.y;
        o.st[v][2] = st.z;
        o.st[v][3] = st.w;
      }
    }
  }
}

// Row r of table x gets g (its k-th distinct row) as the sink says (o: sink_load's).
template <int kV, EmbeddingSink kS>
__device__ __forceinline__ void sink_store(const EmbeddingGradArgs& a, const EmbeddingGradTableArgs& x, int64_t r,
                                           int64_t k, float (&g)[kV][4], RowOld<kV>& o) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (kS == EmbeddingSink::kSparse && lane == 0) x.rows_out[k] = r;
#pragma unroll
  for (int v = 0; v < kV; ++v) {
    const int vec = lane + 32 * v;
    if (vec * 4 >= x.dim) continue;
    const size_t at = static_cast<size_t>(r * x.dim + vec * 4);
    if constexpr (kS == EmbeddingSink::kDense || kS == EmbeddingSink::kSparse) {
      float* d = kS == EmbeddingSink::kDense ? x.dense + at : x.values + static_cast<size_t>(k * x.dim + vec * 4);
      *reinterpret_cast<float4*>(d) = make_float4(g[v][0], g[v][1], g[v][2], g[v][3]);
      continue;
    } else {
      float* w = o.w[v];
      if constexpr (kS == EmbeddingSink::kSgd) {
#pragma unroll
        for (int e = 0; e < 4; ++e) w[e] = __fsub_rn(w[e], __fmul_rn(a.lr, g[v][e]));
      } else {
        float* sv = o.st[v];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          sv[e] = __fadd_rn(sv[e], __fmul_rn(g[v][e], g[v][e]));
          const float d = __fdiv_rn(g[v][e], __fadd_rn(__fsqrt_rn(sv[e]), a.eps));
          w[e] = __fadd_rn(w[e], __fmul_rn(-a.lr, d));
        }
        *reinterpret_cast<float4*>(x.state + at) = make_float4(sv[0], sv[1], sv[2], sv[3]);
      }
      store_w4(static_cast<char*>(x.weight) + at * (a.wt == dev::DType::kF32 ? 4 : 2), a.wt, w);
    }
  }
}

// A warp takes 32 runs (distinct rows) at a time: each lane reads one run's place and its first
// position's bag and factor, then the warp sums each run's rows in order (the run's other
// positions read 32 at a time) and sinks it.
template <int kV, EmbeddingSink kS>
__global__ void __launch_bounds__(kSumThreads) grad_sums_kernel(const __grid_constant__ EmbeddingGradArgs a) {
  const dev::DeviceCtx& c = a.ctx;
  __shared__ uint32_t row_base[kEmbeddingMaxTables + 1];
  __shared__ int32_t first_run[kEmbeddingMaxTables + 1];
  const uint64_t n = a.wait ? a.calls[0] + 1 : 0;
  if (a.wait && static_cast<int>(threadIdx.x) < c.world && static_cast<int>(threadIdx.x) != c.rank)
    dev::wait_ge(c, a.sig_off + 8ull * threadIdx.x, n * static_cast<uint64_t>(a.send_ctas),
                 static_cast<int>(threadIdx.x), dev::WaitKind::kSignal, dev::op_tag("emb_bwd"));
  const int runs = *a.num_runs;
  for (int t = static_cast<int>(threadIdx.x); t <= a.n_tables; t += blockDim.x) {
    const uint32_t rb = t < a.n_tables ? a.t[t].row_base : a.keys;
    row_base[t] = rb;
    int lo = 0, hi = runs;  // the first run whose key >= rb
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (a.run_key[mid] < rb)
        lo = mid + 1;
      else
        hi = mid;
    }
    first_run[t] = lo;
  }
  __syncthreads();
  if (kS == EmbeddingSink::kSparse && blockIdx.x == 0)
    for (int t = static_cast<int>(threadIdx.x); t < a.n_tables; t += blockDim.x)
      *a.t[t].count_out = first_run[t + 1] - first_run[t];
  const int valid = first_run[a.n_tables];
  const char* src = a.wait ? c.local<const char>(a.land_off + (n & 1) * a.land_bytes) : static_cast<const char*>(a.src);
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int64_t step = static_cast<int64_t>(gridDim.x) * kSumWarps * 32;
  for (int64_t k0 = (static_cast<int64_t>(blockIdx.x) * kSumWarps + warp) * 32; k0 < valid; k0 += step) {
    const int64_t k = k0 + lane;
    int32_t start = 0, len = 0, bag = 0;
    uint32_t key = 0;
    int t = 0;
    float f = 0.f;
    if (k < valid) {
      start = a.run_start[k];
      len = a.run_len[k];
      key = a.run_key[k];
      t = last_at_most(row_base, a.n_tables, key);
      position_meta(a, a.t[t], a.pos_sorted[start], bag, f);
    }
    const int nr = valid - k0 < 32 ? static_cast<int>(valid - k0) : 32;
    for (int j = 0; j < nr; ++j) {
      const int32_t sj = __shfl_sync(0xFFFFFFFFu, start, j), lj = __shfl_sync(0xFFFFFFFFu, len, j);
      const int tj = __shfl_sync(0xFFFFFFFFu, t, j);
      const uint32_t kj = __shfl_sync(0xFFFFFFFFu, key, j);
      const EmbeddingGradTableArgs& x = a.t[tj];
      float acc[kV][4];
#pragma unroll
      for (int v = 0; v < kV; ++v) acc[v][0] = acc[v][1] = acc[v][2] = acc[v][3] = 0.f;
      add_row<kV>(a, src, x, __shfl_sync(0xFFFFFFFFu, bag, j), __shfl_sync(0xFFFFFFFFu, f, j), acc);
      for (int32_t c0 = 1; c0 < lj; c0 += 32) {  // the run's other positions
        int32_t b2 = 0;
        float f2 = 0.f;
        if (c0 + lane < lj) position_meta(a, x, a.pos_sorted[sj + c0 + lane], b2, f2);
        const int m = lj - c0 < 32 ? lj - c0 : 32;
        for (int u = 0; u < m; ++u)
          add_row<kV>(a, src, x, __shfl_sync(0xFFFFFFFFu, b2, u), __shfl_sync(0xFFFFFFFFu, f2, u), acc);
      }
      RowOld<kV> old;
      const int64_t r = static_cast<int64_t>(kj) - row_base[tj];
      sink_load<kV, kS>(a, x, r, old);
      sink_store<kV, kS>(a, x, r, k0 + j - first_run[tj], acc, old);
    }
  }
  if (a.wait) {
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(reinterpret_cast<unsigned long long*>(a.calls + 1), 1ull) == gridDim.x - 1) {
      a.calls[1] = 0;
      a.calls[0] = n;
    }
  }
}

// Owner q's columns of every sample to q (a plain buffer, or q's heap with the signals).
__global__ void __launch_bounds__(kSendThreads) grad_send_kernel(const __grid_constant__ EmbeddingGradSendArgs a) {
  const dev::DeviceCtx& c = a.ctx;
  const uint64_t parity = a.push ? (a.calls[0] + 1) & 1 : 0;
  const int64_t row_v = a.stride * static_cast<int64_t>(a.elem) / 16;
  const uint4* grad = static_cast<const uint4*>(a.grad);
  const int64_t step = static_cast<int64_t>(gridDim.x) * kSendThreads;
  for (int k = 1; k < c.world; ++k) {
    const int q = (c.rank + k) % c.world;
    if (a.dims[q] == 0) continue;
    uint4* dst = a.push ? c.ptr<uint4>(q, a.land_off + parity * a.land_bytes + c.rank * a.rank_bytes)
                        : reinterpret_cast<uint4*>(static_cast<char*>(a.send) + a.send_at[q] * a.elem);
    const int64_t dv = a.dims[q] * static_cast<int64_t>(a.elem) / 16, cv = a.cols[q] * a.elem / 16,
                  total = a.batch * dv;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * kSendThreads + threadIdx.x; i < total; i += step)
      dst[i] = grad[(i / dv) * row_v + cv + i % dv];
  }
  if (a.push) {
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < c.world && static_cast<int>(threadIdx.x) != c.rank)
      dev::signal_add(c, static_cast<int>(threadIdx.x), a.sig_off + 8ull * static_cast<uint64_t>(c.rank));
  }
}

// The sums' grid: one wave (every CTA resident: the work is split evenly by a grid stride).
template <int kV, EmbeddingSink kS>
cudaError_t launch_sums_v(const EmbeddingGradArgs& a, cudaStream_t s) {
  static const int per_sm = [] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, grad_sums_kernel<kV, kS>, kSumThreads, 0) != cudaSuccess)
      n = 1;
    return n < 1 ? 1 : n;
  }();
  grad_sums_kernel<kV, kS><<<sm_count() * per_sm, kSumThreads, 0, s>>>(a);
  return cudaGetLastError();
}

template <EmbeddingSink kS>
cudaError_t launch_sums(const EmbeddingGradArgs& a, int vectors, cudaStream_t s) {
  if (vectors <= 1) return launch_sums_v<1, kS>(a, s);
  if (vectors <= 2) return launch_sums_v<2, kS>(a, s);
  if (vectors <= 4) return launch_sums_v<4, kS>(a, s);
  return launch_sums_v<8, kS>(a, s);
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
  const int vectors = 8 / embedding_pool_ahead(a);  // the most vectors a lane holds, over the tables
  if (a.wt == dev::DType::kF32) return launch_pool<float>(a, vectors, s);
  if (a.wt == dev::DType::kBF16) return launch_pool<__nv_bfloat16>(a, vectors, s);
  return launch_pool<__half>(a, vectors, s);
}

cudaError_t embedding_land(const EmbeddingLandArgs& a, cudaStream_t s) {
  constexpr int kWarps = kLandThreads / 32;  // a warp a row
  const int grid = static_cast<int>(std::clamp<int64_t>((a.batch + kWarps - 1) / kWarps, 1, 4 * sm_count()));
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

int embedding_grad_send_ctas() { return std::max(8, sm_count() / 4); }

cudaError_t embedding_grad_send(const EmbeddingGradSendArgs& a, cudaStream_t s) {
  int grid = a.ctas;
  if (!a.push) {
    int64_t vectors = 0;
    for (int q = 0; q < a.ctx.world; ++q) vectors += a.batch * a.dims[q] * static_cast<int64_t>(a.elem) / 16;
    if (vectors == 0) return cudaSuccess;
    grid = static_cast<int>(std::clamp<int64_t>((vectors + kSendThreads - 1) / kSendThreads, 1, 2 * sm_count()));
  }
  grad_send_kernel<<<grid, kSendThreads, 0, s>>>(a);
  return cudaGetLastError();
}

size_t embedding_grad_scratch(int64_t positions) {
  const int n = static_cast<int>(positions);
  size_t sort = 0, rle = 0, scan = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, sort, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
                                  static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n);
  cub::DeviceRunLengthEncode::Encode(nullptr, rle, static_cast<const uint32_t*>(nullptr),
                                     static_cast<uint32_t*>(nullptr), static_cast<int32_t*>(nullptr),
                                     static_cast<int32_t*>(nullptr), n);
  cub::DeviceScan::ExclusiveSum(nullptr, scan, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n);
  return std::max({sort, rle, scan, size_t{256}});
}

cudaError_t embedding_grad_sort(const EmbeddingGradArgs& a, void* scratch, size_t scratch_bytes, cudaStream_t s) {
  if (a.positions == 0) return cudaMemsetAsync(a.num_runs, 0, sizeof(int32_t), s);
  const int n = static_cast<int>(a.positions);
  const int grid = static_cast<int>(std::clamp<int64_t>(
      (std::max<int64_t>(a.positions, a.n_tables * a.bags) + kGradThreads - 1) / kGradThreads, 1, 8 * sm_count()));
  grad_keys_kernel<<<grid, kGradThreads, 0, s>>>(a);
  cudaError_t e = cudaGetLastError();
  int end_bit = 1;  // the keys are <= a.keys
  while (end_bit < 32 && (a.keys >> end_bit) != 0) ++end_bit;
  size_t bytes = scratch_bytes;
  if (e == cudaSuccess)
    e = cub::DeviceRadixSort::SortPairs(scratch, bytes, a.key, a.key_sorted, a.pos, a.pos_sorted, n, 0, end_bit, s);
  bytes = scratch_bytes;
  if (e == cudaSuccess)
    e = cub::DeviceRunLengthEncode::Encode(scratch, bytes, a.key_sorted, a.run_key, a.run_len, a.num_runs, n, s);
  bytes = scratch_bytes;
  if (e == cudaSuccess) e = cub::DeviceScan::ExclusiveSum(scratch, bytes, a.run_len, a.run_start, n, s);
  return e;
}

cudaError_t embedding_grad_sums(const EmbeddingGradArgs& a, cudaStream_t s) {
  int most = 4;
  for (int t = 0; t < a.n_tables; ++t) {
    most = std::max<int>(most, a.t[t].dim);
    if (a.sink == EmbeddingSink::kDense) {
      const cudaError_t e =
          cudaMemsetAsync(a.t[t].dense, 0, static_cast<size_t>(a.t[t].rows * a.t[t].dim) * sizeof(float), s);
      if (e != cudaSuccess) return e;
    }
  }
  const int vectors = (most / 4 + 31) / 32;
  switch (a.sink) {
    case EmbeddingSink::kDense:
      return launch_sums<EmbeddingSink::kDense>(a, vectors, s);
    case EmbeddingSink::kSparse:
      return launch_sums<EmbeddingSink::kSparse>(a, vectors, s);
    case EmbeddingSink::kSgd:
      return launch_sums<EmbeddingSink::kSgd>(a, vectors, s);
    default:
      return launch_sums<EmbeddingSink::kAdagrad>(a, vectors, s);
  }
}

}  // namespace weft::kernels
