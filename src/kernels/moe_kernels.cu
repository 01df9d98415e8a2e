// MoE token exchange kernels (include/weft/kernels/moe_kernels.hpp; docs/moe.md, "GPU path").
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>

#include "weft/device/config.hpp"
#include "weft/device/dtype.hpp"
#include "weft/device/signal.hpp"
#include "weft/kernels/moe_kernels.hpp"

namespace weft::kernels {
namespace {

constexpr int kRouteThreads = 1024;  // moe_route: one CTA of 32 warps

// The last i in [0, n) with v[stride * i] <= x (v ascending, n >= 1; 0 where none is): the
// expert, chunk or block that holds position x where empty ones share their successor's start.
template <class T>
__device__ __forceinline__ int last_at_most(const T* v, int n, int64_t x, int stride = 1) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (static_cast<int64_t>(v[stride * mid]) <= x)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Whether pair i (token i / k, slot i % k) names a valid expert: in range and not named by an
// earlier slot of the same token.
__device__ __forceinline__ bool valid_pair(const int32_t* ids, int i, int k, int experts) {
  const int e = ids[i];
  if (e < 0 || e >= experts) return false;
  for (int j = i - i % k; j < i; ++j)
    if (ids[j] == e) return false;
  return true;
}

// The routing (by one CTA of kThreads threads, or one slice of the pairs per CTA). Shared memory
// (route_smem): running[E] (the next free place of each expert), base[E] (its place at the start
// of the current chunk), then [kThreads / 32][E] uint16: each warp's pairs of each expert in the
// chunk, turned in place into the warps before it (exclusive prefix).
template <int kThreads>
constexpr size_t route_smem(int experts) {
  return static_cast<size_t>(experts) * (8 + 2 * (kThreads / 32));
}
// Pass 1 over pairs [first, last): validity (an invalid pair recorded in *bad) and the
// per-expert counts added into cnt (shared, zeroed by the caller).
template <int kThreads>
__device__ void route_count(const MoeRouteArgs& a, int first, int last, uint32_t* cnt) {
  for (int i = first + static_cast<int>(threadIdx.x); i < last; i += kThreads) {
    if (valid_pair(a.ids, i, a.top_k, a.experts))
      atomicAdd(&cnt[a.ids[i]], 1u);
    else
      atomicMin(a.bad, static_cast<unsigned long long>(i));
  }
}
// v[0 .. n) into its exclusive prefix, by warp 0 (16 values a lane at most: n <= 512).
__device__ void exclusive_prefix(uint32_t* v, int n) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (threadIdx.x >= 32) return;
  const int per = (n + 31) / 32, e0 = lane * per;
  uint32_t sum = 0;
  for (int e = e0; e < e0 + per && e < n; ++e) sum += v[e];
  uint32_t incl = sum;
  for (int d = 1; d < 32; d *= 2) {
    const uint32_t x = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += x;
  }
  uint32_t at = incl - sum;
  for (int e = e0; e < e0 + per && e < n; ++e) {
    const uint32_t c = v[e];
    v[e] = at;
    at += c;
  }
}
// Pass 2 over pairs [first, last), kThreads at a time in pair order: each valid pair's place is
// running[its expert] then (the pairs before it of the same expert within the chunk: the warps
// before its warp, then its rank within its warp by __match_any_sync).
template <int kThreads>
__device__ void route_place(const MoeRouteArgs& a, int first, int last, uint32_t* running, uint32_t* base,
                            uint16_t* wc) {
  constexpr int kWarps = kThreads / 32;
  const int E = a.experts, tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  for (int c0 = first; c0 < last; c0 += kThreads) {
    for (int q = tid; q < kWarps * E; q += kThreads) wc[q] = 0;
    for (int e = tid; e < E; e += kThreads) base[e] = running[e];
    __syncthreads();
    const int i = c0 + tid;
    const int e = i < last && valid_pair(a.ids, i, a.top_k, E) ? a.ids[i] : -1;
    const unsigned same = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(same & ((1u << lane) - 1u));
    if (e >= 0 && rank == 0) wc[warp * E + e] = static_cast<uint16_t>(__popc(same));
    __syncthreads();
    for (int x = tid; x < E; x += kThreads) {  // each expert's warps in order
      uint32_t before = 0;
      for (int w = 0; w < kWarps; ++w) {
        const uint32_t n = wc[w * E + x];
        wc[w * E + x] = static_cast<uint16_t>(before);
        before += n;
      }
      running[x] += before;
    }
    __syncthreads();
    if (i < last) a.pos[i] = e >= 0 ? static_cast<int32_t>(base[e] + wc[warp * E + e] + rank) : -1;
    __syncthreads();
  }
}

// The whole routing by one CTA (moe_route).
template <int kThreads>
__device__ void route_cta(const MoeRouteArgs& a, unsigned char* smem) {
  const int E = a.experts, pairs = a.tokens * a.top_k, tid = static_cast<int>(threadIdx.x);
  uint32_t* running = reinterpret_cast<uint32_t*>(smem);
  uint32_t* base = running + E;
  uint16_t* wc = reinterpret_cast<uint16_t*>(base + E);
  for (int e = tid; e < E; e += kThreads) running[e] = 0;
  __syncthreads();
  route_count<kThreads>(a, 0, pairs, running);
  __syncthreads();
  for (int e = tid; e < E; e += kThreads) a.expert_counts[e] = running[e];
  exclusive_prefix(running, E);
  __syncthreads();
  if (a.send_counts && tid < a.world) {  // elements for each rank: its experts' rows
    const int L = E / a.world;
    const uint32_t end = tid + 1 < a.world ? running[(tid + 1) * L] : running[E - 1] + a.expert_counts[E - 1];
    a.send_counts[tid] = static_cast<uint64_t>(end - running[tid * L]) * static_cast<uint64_t>(a.hidden);
  }
  route_place<kThreads>(a, 0, pairs, running, base, wc);
}

__global__ void __launch_bounds__(kRouteThreads) route_kernel(const MoeRouteArgs a) {
  extern __shared__ unsigned char smem[];
  route_cta<kRouteThreads>(a, smem);
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

// out = the rows' weighted sum in fp32 over the slots set in `on`, in slot order (the same sum on
// every call), rounded once to T.
template <class T>
__device__ __forceinline__ void weighted_sum(const uint4 (&row)[kMoeMaxSlots], const float (&w)[kMoeMaxSlots],
                                             unsigned on, uint4* out) {
  constexpr int kPer = 16 / sizeof(T);
  float acc[kPer];
#pragma unroll
  for (int q = 0; q < kPer; ++q) acc[q] = 0.f;
#pragma unroll
  for (int j = 0; j < kMoeMaxSlots; ++j) {
    if (!(on >> j & 1u)) continue;
    T e[kPer];
    std::memcpy(e, &row[j], 16);
#pragma unroll
    for (int q = 0; q < kPer; ++q) acc[q] += w[j] * dev::to_float(e[q]);
  }
  T o[kPer];
#pragma unroll
  for (int q = 0; q < kPer; ++q) o[q] = dev::from_float<T>(acc[q]);
  std::memcpy(out, o, 16);
}

// y's 16-byte vector v of token t: the slots' rows at v summed in slot order in fp32 (all the
// slots' loads issued before the sums).
template <class T>
__device__ __forceinline__ void combine_vector(const uint4* back, const int32_t* pos, const float* weights, uint4* y,
                                               int t, int v, int top_k, int vecs) {
  uint4 row[kMoeMaxSlots];
  float w[kMoeMaxSlots];
  unsigned on = 0;
#pragma unroll
  for (int j = 0; j < kMoeMaxSlots; ++j) {
    const int p = j < top_k ? pos[t * top_k + j] : -1;
    on |= (p >= 0 ? 1u : 0u) << j;
    w[j] = p >= 0 ? weights[t * top_k + j] : 0.f;
    row[j] = p >= 0 ? back[static_cast<size_t>(p) * vecs + v] : make_uint4(0, 0, 0, 0);
  }
  weighted_sum<T>(row, w, on, &y[static_cast<size_t>(t) * vecs + v]);
}

// One thread per (token, 16-byte vector) of y; y = 0 when *refused is set (not ~0).
template <class T>
__global__ void __launch_bounds__(256)
    combine_kernel(const uint4* back, const int32_t* pos, const float* weights, uint4* y, int tokens, int top_k,
                   int vecs, const unsigned long long* refused) {
  const bool ok = !refused || *refused == ~0ull;
  const int64_t items = static_cast<int64_t>(tokens) * vecs;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x; i < items;
       i += static_cast<int64_t>(gridDim.x) * 256) {
    if (ok)
      combine_vector<T>(back, pos, weights, y, static_cast<int>(i / vecs), static_cast<int>(i % vecs), top_k, vecs);
    else
      y[i] = make_uint4(0, 0, 0, 0);
  }
}

// --- Method direct ----------------------------------------------------------------------------

constexpr int kDirectThreads = 512;
constexpr int kDirectWarps = kDirectThreads / 32;
constexpr int kSmallPairs = 4 * kDirectThreads;  // routed by every CTA whole (four chunks)

// A row of `vecs` 16-byte vectors by one warp, four loads in flight a lane.
__device__ __forceinline__ void warp_copy(uint4* dst, const uint4* src, int vecs, int lane) {
  int v = lane;
  for (; v + 96 < vecs; v += 128) {
    const uint4 a0 = src[v], a1 = src[v + 32], a2 = src[v + 64], a3 = src[v + 96];
    dst[v] = a0;
    dst[v + 32] = a1;
    dst[v + 64] = a2;
    dst[v + 96] = a3;
  }
  for (; v < vecs; v += 32) dst[v] = src[v];
}

// Rows split for the grid's warps: `parts` warps to a row when rows are few (each part at least
// 128 vectors: a lane's four loads in flight), so that a small call keeps every warp busy.
__device__ __forceinline__ int parts_per_row(int rows, int vecs, int warps) {
  if (rows <= 0) return 1;
  return max(1, min(warps / rows, vecs / 128));
}
// Part `part` of `parts` of a row of `vecs` vectors.
__device__ __forceinline__ void warp_copy_part(uint4* dst, const uint4* src, int vecs, int part, int parts, int lane) {
  const int per = (vecs + parts - 1) / parts, v0 = part * per, n = min(vecs, v0 + per) - v0;
  if (n > 0) warp_copy(dst + v0, src + v0, n, lane);
}

// Rows once a peer (MoeDirectArgs::once): this CTA's slice of the tokens, each token's row to every
// peer rank holding any of its experts (an id outside 0 ... E - 1 sends nothing; a repeated one
// nothing more), at its staging slot there. Before the routing: it needs the ids only.
__device__ void stage_rows(const MoeDirectArgs& a, uint64_t par, int vecs) {
  const int W = a.ctx.world, me = a.ctx.rank, L = a.local, k = a.top_k, G = static_cast<int>(gridDim.x);
  const int per = (a.tokens + G - 1) / G, t0 = min(a.tokens, static_cast<int>(blockIdx.x) * per),
            t1 = min(a.tokens, t0 + per);
  const int items = (t1 - t0) * (W - 1), parts = parts_per_row(items, vecs, kDirectWarps);
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const uint64_t row_bytes = 16ull * vecs;
  for (int w = static_cast<int>(threadIdx.x) / 32; w < items * parts; w += kDirectWarps) {
    const int item = w / parts, t = t0 + item / (W - 1), d = (me + 1 + item % (W - 1)) % W;
    bool there = false;
    for (int j = 0; j < k; ++j) {
      const int e = a.route.ids[t * k + j];
      there |= e >= d * L && e < (d + 1) * L;
    }
    if (!there) continue;
    warp_copy_part(a.ctx.ptr<uint4>(d, a.stage_off + ((par * W + me) * a.max_tokens + t) * row_bytes),
                   static_cast<const uint4*>(a.x) + static_cast<size_t>(t) * vecs, vecs, w % parts, parts, lane);
  }
}

// Rows once a peer, after every rank's arrival: each staged row of every source to the places its
// tagged words name (a warp, or parts of a row per warp when rows are few, loads a vector once
// and stores it to every place). tok[s]: source s's tokens this call.
__device__ void unstage_rows(const MoeDirectArgs& a, uint64_t par, uint64_t tag, int vecs, const uint32_t* tok) {
  const int W = a.ctx.world, me = a.ctx.rank, k = a.top_k, lane = static_cast<int>(threadIdx.x) % 32;
  const int gw = static_cast<int>(blockIdx.x) * kDirectWarps + static_cast<int>(threadIdx.x) / 32,
            nw = static_cast<int>(gridDim.x) * kDirectWarps;
  int items = 0;
  for (int s = 0; s < W; ++s) items += s == me ? 0 : static_cast<int>(tok[s]);
  const int parts = parts_per_row(items, vecs, nw);
  const uint64_t row_bytes = 16ull * vecs;
  for (int w = gw; w < items * parts; w += nw) {
    int t = w / parts, s = 0;
    for (; s < W; ++s) {
      const int n = s == me ? 0 : static_cast<int>(tok[s]);
      if (t < n) break;
      t -= n;
    }
    const uint64_t slot = (par * W + s) * a.max_tokens + t;
    const uint64_t v =
        lane < k ? __ldcg(a.ctx.local<const unsigned long long>(a.place_off + 8ull * (slot * k + lane))) : 0ull;
    const unsigned here = __ballot_sync(~0u, lane < k && v >> 32 == tag);
    if (!here) continue;
    uint32_t rows[kMoeMaxSlots];
    int n = 0;
#pragma unroll
    for (int j = 0; j < kMoeMaxSlots; ++j) {
      const uint32_t r = __shfl_sync(~0u, static_cast<uint32_t>(v), j);
      if (here >> j & 1u) rows[n++] = r;
    }
    const int per = (vecs + parts - 1) / parts, v0 = (w % parts) * per, nv = min(vecs, v0 + per) - v0;
    const uint4* src = a.ctx.local<const uint4>(a.stage_off + slot * row_bytes) + v0;
    uint4* recv = a.ctx.local<uint4>(a.recv_off) + v0;
    int q = lane;
    for (; q + 96 < nv; q += 128) {
      const uint4 x0 = __ldcg(src + q), x1 = __ldcg(src + q + 32), x2 = __ldcg(src + q + 64), x3 = __ldcg(src + q + 96);
      for (int j = 0; j < n; ++j) {
        uint4* d = recv + static_cast<uint64_t>(rows[j]) * vecs + q;
        d[0] = x0;
        d[32] = x1;
        d[64] = x2;
        d[96] = x3;
      }
    }
    for (; q < nv; q += 32) {
      const uint4 x0 = __ldcg(src + q);
      for (int j = 0; j < n; ++j) recv[static_cast<uint64_t>(rows[j]) * vecs + q] = x0;
    }
  }
}

// Once per call and CTA, after the CTA's stores: signal `set` of every rank counts the CTA in
// (its stores visible system-wide first). Counting the CTAs locally and signalling once from
// the last one chains two fences: slower (docs/moe.md, "Measured").
__device__ __forceinline__ void arrive(const MoeDirectArgs& a, int set) {
  __syncthreads();
  const int W = a.ctx.world, tid = static_cast<int>(threadIdx.x);
  if (tid < W) {
    dev::fence_acq_rel();
    dev::signal_add(a.ctx, tid, a.sig_off + 8ull * (static_cast<uint64_t>(set) * W + a.ctx.rank), 1);
  }
}
// The calling CTA waits until signal `set` of every rank reaches `expected`.
__device__ __forceinline__ void wait_every_rank(const MoeDirectArgs& a, int set, uint64_t expected) {
  const int W = a.ctx.world, tid = static_cast<int>(threadIdx.x);
  if (tid < W) dev::wait_ge(a.ctx, a.sig_off + 8ull * (static_cast<uint64_t>(set) * W + tid), expected, tid);
  __syncthreads();
}

// Dynamic shared memory: the routing's (route_smem<kDirectThreads>), in every CTA.
__global__ void __launch_bounds__(kDirectThreads) dispatch_direct_kernel(const __grid_constant__ MoeDirectArgs a) {
  extern __shared__ unsigned char smem[];
  __shared__ uint64_t base[kMoeDirectMaxWorld], send_off[kMoeDirectMaxWorld];
  __shared__ unsigned long long refused;
  const int W = a.ctx.world, L = a.local, me = a.ctx.rank, tid = static_cast<int>(threadIdx.x);
  // This call's number: every CTA reads the count before it arrives; CTA 0 writes the new count
  // only once every CTA of this rank has arrived (its own rank's signal), i.e. has read it.
  const uint64_t n = a.calls[0] + 1, par = n & 1;
  const uint64_t WL = static_cast<uint64_t>(W) * L;
  // The counts travel as tagged words, (n << 32) | rows, so that a word is its own "arrived"
  // flag: no fence, no separate signal.
  const uint64_t tag = static_cast<uint32_t>(n);
  const int vecs = a.hidden * (a.dtype == dev::DType::kF32 ? 4 : 2) / 16;
  const bool once = a.once && W > 1;
  if (once) stage_rows(a, par, vecs);  // the peers' rows first: they need no routing
  // The routing. Up to kSmallPairs pairs every CTA routes them all (the same places in every
  // CTA, no barrier); above, a slice of the pairs per CTA: each slice's per-expert counts, a
  // barrier of the grid (its CTAs are co-resident: the launcher keeps the grid within what the
  // GPU holds at once), then every CTA sums the counts (the totals, and the slices' before its own) and
  // places its own pairs. Either way a CTA then moves its own slice's rows.
  const int E = a.route.experts, pairs = a.tokens * a.top_k, G = static_cast<int>(gridDim.x);
  const int c = static_cast<int>(blockIdx.x), S = (pairs + G - 1) / G;
  const int first = min(pairs, c * S), last = min(pairs, first + S);
  if (pairs <= kSmallPairs) {
    route_cta<kDirectThreads>(a.route, smem);
    // The barrier's counter counts every call (its target is the call's number times the CTAs).
    if (tid == 0) atomicAdd(reinterpret_cast<unsigned long long*>(a.calls + 2), 1ull);
    __syncthreads();
  } else {
    uint32_t* running = reinterpret_cast<uint32_t*>(smem);
    uint32_t* starts = running + E;
    uint16_t* wc = reinterpret_cast<uint16_t*>(starts + E);
    for (int e = tid; e < E; e += kDirectThreads) running[e] = 0;
    __syncthreads();
    route_count<kDirectThreads>(a.route, first, last, running);
    __syncthreads();
    for (int e = tid; e < E; e += kDirectThreads) a.slice_counts[c * E + e] = running[e];
    __syncthreads();
    if (tid == 0) {
      __threadfence();
      atomicAdd(reinterpret_cast<unsigned long long*>(a.calls + 2), 1ull);
      const uint64_t t0 = dev::now_ns();
      uint32_t spins = 0;
      uint64_t v;
      while ((v = dev::load_acquire(a.calls + 2)) < n * G) {
        dev::spin_pause(++spins);
        if ((spins & 63u) == 0u && dev::now_ns() - t0 > a.ctx.timeout_ns)
          dev::fail_wait(a.ctx, dev::WaitKind::kBarrier, me, 0, n * G, v, dev::now_ns() - t0);
      }
    }
    __syncthreads();
    for (int e = tid; e < E; e += kDirectThreads) {
      uint32_t total = 0, before = 0;
      for (int q = 0; q < G; ++q) {
        const uint32_t v = __ldcg(a.slice_counts + q * E + e);  // L2: written by other SMs
        total += v;
        before += q < c ? v : 0u;
      }
      starts[e] = total;
      running[e] = before;
      if (c == 0) a.route.expert_counts[e] = total;
    }
    __syncthreads();
    exclusive_prefix(starts, E);
    __syncthreads();
    for (int e = tid; e < E; e += kDirectThreads) running[e] += starts[e];
    __syncthreads();
    route_place<kDirectThreads>(a.route, first, last, running, starts, wc);
  }
  if (blockIdx.x == 0) {  // this rank's [dst][local] counts into every rank's matrix
    for (int q = 0; q < W; ++q) {
      uint64_t* row = a.ctx.ptr<uint64_t>(q, a.counts_off + 8ull * ((par * W + me) * WL));
      for (uint64_t i = tid; i < WL; i += kDirectThreads)
        dev::store_relaxed(row + i, tag << 32 | a.route.expert_counts[i]);
    }
    if (once && tid < W)  // and this rank's tokens: the staging slots its peers read
      dev::store_relaxed(a.ctx.ptr<uint64_t>(tid, a.tok_off + 8ull * (par * W + me)),
                         tag << 32 | static_cast<uint32_t>(a.tokens));
  }
  // Every CTA: every rank's words of this call, summed per (source, destination) into rows_sd.
  __shared__ uint32_t rows_sd[kMoeDirectMaxWorld * kMoeDirectMaxWorld];
  __shared__ uint32_t tok[kMoeDirectMaxWorld];  // once: each source's tokens
  for (int i = tid; i < W * W; i += kDirectThreads) rows_sd[i] = 0;
  if (tid == 0) refused = ~0ull;
  __syncthreads();
  {
    uint64_t* M = a.ctx.local<uint64_t>(a.counts_off + 8ull * (par * W * WL));
    const uint64_t t0 = dev::now_ns();
    uint32_t spins = 0;
    for (uint64_t i = tid; i < WL * W; i += kDirectThreads) {
      uint64_t v;
      while ((v = dev::load_relaxed(M + i)) >> 32 != tag) {
        dev::spin_pause(++spins);
        if ((spins & 63u) == 0u && dev::now_ns() - t0 > a.ctx.timeout_ns)
          dev::fail_wait(a.ctx, dev::WaitKind::kSignal, static_cast<int>(i / WL),
                         a.counts_off + 8ull * (par * W * WL + i), tag << 32, v, dev::now_ns() - t0);
      }
      const uint32_t r = static_cast<uint32_t>(v);
      if (r) atomicAdd(&rows_sd[i / L], r);  // i / L = source * W + destination
    }
    if (once && tid < W) {
      const uint64_t off = a.tok_off + 8ull * (par * W + tid);
      uint64_t v;
      while ((v = dev::load_relaxed(a.ctx.local<uint64_t>(off))) >> 32 != tag) {
        dev::spin_pause(++spins);
        if ((spins & 63u) == 0u && dev::now_ns() - t0 > a.ctx.timeout_ns)
          dev::fail_wait(a.ctx, dev::WaitKind::kSignal, tid, off, tag << 32, v, dev::now_ns() - t0);
      }
      tok[tid] = static_cast<uint32_t>(v);
    }
  }
  __syncthreads();
  // Every rank's matrix is the same: every rank finds the same places and the same verdict.
  const uint64_t* M = a.ctx.local<const uint64_t>(a.counts_off + 8ull * (par * W * WL));
  auto chunk_rows = [&](int s, int d) { return static_cast<uint64_t>(rows_sd[s * W + d]); };
  auto words = [&](int s, int d, int l) {
    return static_cast<uint64_t>(static_cast<uint32_t>(M[(s * W + d) * L + l]));
  };
  // expert_blocks: this rank's chunk (d, l)'s row in d's recv less its first send-order place
  // (a pair's row = place + its send-order place), and this rank's experts' first blocks.
  __shared__ int64_t place[kMoeMaxExperts];
  __shared__ int32_t bstart[kMoeMaxExperts + 1];
  if (tid < W) {
    const int d = tid;
    uint64_t before = 0, total = 0, off = 0;
    for (int s = 0; s < W; ++s) {
      const uint64_t r = chunk_rows(s, d);
      total += r;
      if (s < me) before += r;
    }
    for (int q = 0; q < d; ++q) off += chunk_rows(me, q);
    base[d] = before;
    send_off[d] = off;
    if (a.blocks) {  // expert l's block: whole kMoeBlockRows blocks, sources in order within
      uint64_t block = 0, sent = off;
      for (int l = 0; l < L; ++l) {
        uint64_t rows = 0, lower = 0;
        for (int s = 0; s < W; ++s) {
          const uint64_t v = words(s, d, l);
          rows += v;
          lower += s < me ? v : 0;
        }
        place[d * L + l] = static_cast<int64_t>(block * kMoeBlockRows + lower) - static_cast<int64_t>(sent);
        sent += words(me, d, l);
        if (d == me) bstart[l] = static_cast<int32_t>(block);
        block += (rows + kMoeBlockRows - 1) / kMoeBlockRows;
      }
      if (d == me) bstart[L] = static_cast<int32_t>(block);
      total = block * kMoeBlockRows;  // with the padding
    }
    if (total > a.capacity) atomicMin(&refused, (static_cast<unsigned long long>(d) << 40) | total);
  }
  __syncthreads();
  const bool ok = refused == ~0ull;
  if (blockIdx.x == 0) {  // what combine and recv_counts() read
    if (tid == 0) *a.refused = refused;
    for (uint64_t i = tid; i < WL; i += kDirectThreads)
      a.chunks[i] = ok ? static_cast<int64_t>(static_cast<uint32_t>(M[((i / L) * W + me) * L + i % L])) : 0;
    if (tid < W) {
      const int s = tid;
      uint64_t before = 0, off = 0;
      for (int q = 0; q < s; ++q) before += chunk_rows(q, me);
      for (int d = 0; d < me; ++d) off += chunk_rows(s, d);
      a.ret[3 * s] = static_cast<int64_t>(before);
      a.ret[3 * s + 1] = static_cast<int64_t>(off);
      a.ret[3 * s + 2] = ok ? static_cast<int64_t>(chunk_rows(s, me)) : 0;
      if (a.blocks) {  // source s's chunk of each local expert: its first row here, its rows before it from s
        uint64_t prefix = 0;
        for (int l = 0; l < L; ++l) {
          uint64_t lower = 0;
          for (int q = 0; q < s; ++q) lower += words(q, me, l);
          a.chunk_rows[2 * (s * L + l)] =
              static_cast<int64_t>(static_cast<uint64_t>(bstart[l]) * kMoeBlockRows + lower);
          a.chunk_rows[2 * (s * L + l) + 1] = static_cast<int64_t>(prefix);
          prefix += words(s, me, l);
        }
      }
    }
    if (a.blocks)  // each block's local expert (a refused routing: none)
      for (int b = tid; b < a.groups_n; b += kDirectThreads) {
        int g = -1;
        if (ok && b < bstart[L]) g = last_at_most(bstart, L, b);
        a.groups[b] = g;
      }
  }
  if (a.blocks && a.row_dst) {
    // Each recv row's place in its source's back buffer (combine's, MoeDirectArgs::row_dst):
    // expert l's block holds source 0's chunk, then source 1's, ...; chunk (s, l) goes back to
    // s after s's rows for the ranks before this one and s's rows for the experts before l here.
    const uint64_t row_bytes = static_cast<uint64_t>(a.hidden) * (a.dtype == dev::DType::kF32 ? 4 : 2);
    const int64_t rows = static_cast<int64_t>(a.groups_n) * kMoeBlockRows;
    for (int64_t r = static_cast<int64_t>(c) * kDirectThreads + tid; r < rows;
         r += static_cast<int64_t>(G) * kDirectThreads) {
      uint64_t to = 0;
      const int b = static_cast<int>(r / kMoeBlockRows);
      if (ok && b < bstart[L]) {
        const int l = last_at_most(bstart, L, b);
        uint64_t o = static_cast<uint64_t>(r) - static_cast<uint64_t>(bstart[l]) * kMoeBlockRows;
        for (int s = 0; s < W; ++s) {
          const uint64_t v = words(s, me, l);
          if (o < v) {
            uint64_t at = o;
            for (int d = 0; d < me; ++d) at += chunk_rows(s, d);
            for (int e = 0; e < l; ++e) at += words(s, me, e);
            to = reinterpret_cast<uint64_t>(a.ctx.ptr<unsigned char>(s, a.back_off + at * row_bytes));
            break;
          }
          o -= v;
        }
      }
      a.row_dst[r] = to;
    }
  }
  if (ok) {
    const uint64_t row_bytes = 16ull * vecs;
    const int lane = tid % 32;
    // This CTA's own slice (its places are its own writes).
    const int parts = parts_per_row(last - first, vecs, kDirectWarps);
    const int32_t* pos = a.route.pos;
    for (int w = tid / 32; w < (last - first) * parts; w += kDirectWarps) {
      const int i = first + w / parts;
      const int p = pos[i];
      if (p < 0) continue;
      const int d = a.route.ids[i] / L;
      const uint64_t row = a.blocks ? static_cast<uint64_t>(place[a.route.ids[i]] + p)  // ids[i] = d * L + l
                                    : base[d] + (static_cast<uint64_t>(p) - send_off[d]);
      if (once && d != me) {  // the row is staged there: only its place
        if (lane == 0 && w % parts == 0) {
          const uint64_t slot = (par * W + me) * a.max_tokens + i / a.top_k;
          dev::store_relaxed(a.ctx.ptr<uint64_t>(d, a.place_off + 8ull * (slot * a.top_k + i % a.top_k)),
                             tag << 32 | row);
          if (a.pair_src) a.pair_src[i] = static_cast<int64_t>(static_cast<uint64_t>(d) << 40 | row);
        }
        continue;
      }
      warp_copy_part(a.ctx.ptr<uint4>(d, a.recv_off + row * row_bytes),
                     static_cast<const uint4*>(a.x) + static_cast<size_t>(i / a.top_k) * vecs, vecs, w % parts, parts,
                     lane);
      if (a.pair_src && lane == 0 && w % parts == 0)
        a.pair_src[i] = static_cast<int64_t>(static_cast<uint64_t>(d) << 40 | row);
    }
  }
  arrive(a, 0);
  if (once) {  // every CTA: every rank's staged rows and places in, then this rank's share of the copies
    wait_every_rank(a, 0, n * gridDim.x);
    if (blockIdx.x == 0 && tid == 0) a.calls[0] = n;
    if (ok) unstage_rows(a, par, tag, vecs, tok);
    return;
  }
  if (blockIdx.x == 0) {  // the kernel ends with every row in
    wait_every_rank(a, 0, n * gridDim.x);
    if (tid == 0) a.calls[0] = n;
  }
}

// combine_vector's sum for combine by pull (MoeDirectArgs::pull), `per` items of a thread at a
// time (item i, i + stride, ...): every slot's row of every item loaded first -- read where it
// lies, rank d's expert_out (at offset from[d] in d's heap), pair_src's row; through L2 -- so
// that kMoeMaxSlots loads are in flight a thread whatever top_k (a peer's rows are far), then
// each item's sum in slot order, as combine_vector's.
template <class T>
__device__ __forceinline__ void pull_items(const MoeDirectArgs& a, const uint64_t* from, uint4* y, int64_t i0,
                                           int64_t stride, int per, int64_t items, int vecs) {
  const int k = a.top_k;
  const uint64_t row_bytes = 16ull * vecs;
  uint4 row[kMoeMaxSlots];
  float w[kMoeMaxSlots];
#pragma unroll
  for (int q = 0; q < kMoeMaxSlots; ++q) {
    const int u = q / k, j = q % k;
    const int64_t i = i0 + u * stride;
    w[q] = 0.f;
    row[q] = make_uint4(0, 0, 0, 0);
    if (u >= per || i >= items) continue;
    const int t = static_cast<int>(i / vecs), v = static_cast<int>(i % vecs);
    if (a.route.pos[t * k + j] < 0) continue;
    const uint64_t e = static_cast<uint64_t>(a.pair_src[t * k + j]);
    const int d = static_cast<int>(e >> 40);
    w[q] = a.weights[t * k + j];
    row[q] = __ldcg(a.ctx.ptr<const uint4>(d, from[d] + (e & ((1ull << 40) - 1)) * row_bytes) + v);
  }
  for (int u = 0; u < per; ++u) {
    const int64_t i = i0 + u * stride;
    if (i >= items) break;
    const int t = static_cast<int>(i / vecs), v = static_cast<int>(i % vecs);
    unsigned on = 0;  // item u's slots, at q = u * k + j: in slot order, combine_vector's sum exactly
#pragma unroll
    for (int q = 0; q < kMoeMaxSlots; ++q) on |= (q / k == u && a.route.pos[t * k + q % k] >= 0 ? 1u : 0u) << q;
    weighted_sum<T>(row, w, on, &y[static_cast<size_t>(t) * vecs + v]);
  }
}

// Combine by pull: CTA 0 publishes this rank's expert_out offset, or that its rows lie outside
// its heap, to every rank (a word tagged with the call number, released after the experts'
// rows, which earlier kernels of the stream wrote); every CTA learns every rank's word -- false
// if some rank's rows are outside (every rank finds the same: every rank then pushes) -- sums its
// (token, vector) items from the rows where they lie, then counts itself done at every rank; CTA
// 0 ends the kernel once every rank's CTAs are done reading (no rank's rows change under a
// reader: the next dispatch waits for every rank as well).
template <class T>
__device__ bool combine_pull(const MoeDirectArgs& a, uint64_t n, bool ok) {
  __shared__ uint64_t from[kMoeDirectMaxWorld];
  __shared__ int everywhere;
  const int W = a.ctx.world, me = a.ctx.rank, tid = static_cast<int>(threadIdx.x);
  const uint64_t par = n & 1, tag = n & 0xFFFFFFull;
  if (tid == 0) everywhere = 1;
  if (blockIdx.x == 0 && tid < W) {  // low bits: this rank's offset / 16 + 1, or 0 (its rows elsewhere)
    dev::fence_acq_rel();
    dev::store_release(a.ctx.ptr<uint64_t>(tid, a.ready_off + 8ull * (par * W + me)),
                       tag << 40 | (a.here ? (a.expert_off >> 4) + 1 : 0));
  }
  __syncthreads();
  if (tid < W) {
    const uint64_t off = a.ready_off + 8ull * (par * W + tid);
    const uint64_t* word = a.ctx.local<const uint64_t>(off);
    const uint64_t t0 = dev::now_ns();
    uint32_t spins = 0;
    uint64_t v;
    while ((v = dev::load_acquire(word)) >> 40 != tag) {
      dev::spin_pause(++spins);
      if ((spins & 63u) == 0u && dev::now_ns() - t0 > a.ctx.timeout_ns)
        dev::fail_wait(a.ctx, dev::WaitKind::kSignal, tid, off, tag << 40, v, dev::now_ns() - t0);
    }
    const uint64_t at = v & ((1ull << 40) - 1);
    if (at == 0) everywhere = 0;
    from[tid] = (at - 1) << 4;
  }
  __syncthreads();
  if (!everywhere) return false;  // some rank's rows lie outside its heap: every rank pushes
  const int vecs = a.hidden * static_cast<int>(sizeof(T)) / 16;
  uint4* y = static_cast<uint4*>(a.y);
  const int64_t items = static_cast<int64_t>(a.tokens) * vecs;  // (token, vector) pairs, a thread each
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kDirectThreads;
  const int per = kMoeMaxSlots / a.top_k;  // items whose rows a thread has in flight at once
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kDirectThreads + tid; i < items; i += stride * per) {
    if (ok) {
      pull_items<T>(a, from, y, i, stride, per, items, vecs);
    } else {
      for (int u = 0; u < per && i + u * stride < items; ++u) y[i + u * stride] = make_uint4(0, 0, 0, 0);
    }
  }
  arrive(a, 1);
  if (blockIdx.x != 0) return true;
  wait_every_rank(a, 1, n * gridDim.x);
  if (tid == 0) a.calls[1] = n;
  return true;
}

template <class T>
__global__ void __launch_bounds__(kDirectThreads) combine_direct_kernel(const __grid_constant__ MoeDirectArgs a) {
  const int W = a.ctx.world, tid = static_cast<int>(threadIdx.x), lane = tid % 32;
  // Combines are counted apart from dispatches (a dispatch need not be followed by one), as
  // dispatch counts its calls.
  const uint64_t n = a.calls[1] + 1;
  const bool ok = *a.refused == ~0ull;
  const int vecs = a.hidden * static_cast<int>(sizeof(T)) / 16;
  const uint64_t row_bytes = 16ull * vecs;
  const int gw = static_cast<int>(blockIdx.x) * kDirectWarps + tid / 32,
            nw = static_cast<int>(gridDim.x) * kDirectWarps;
  if (a.pull && combine_pull<T>(a, n, ok)) return;
  if (ok && !a.delivered) {  // the rows from source s go back to s, at s's send offset of this rank's rows
    // Work item (j, q): row j of source (me + q) % W -- the sources interleaved, so that the
    // local copies and the pushes to every peer run side by side.
    int64_t most = 0, all = 0;
    for (int s = 0; s < W; ++s) {
      most = max(most, a.ret[3 * s + 2]);
      all += a.ret[3 * s + 2];
    }
    const int parts = parts_per_row(static_cast<int>(all), vecs, nw);
    for (int64_t w = gw; w < most * W * parts; w += nw) {
      const int64_t item = w / parts, j = item / W;
      const int s = static_cast<int>((item % W + a.ctx.rank) % W);
      if (j >= a.ret[3 * s + 2]) continue;
      int64_t from = a.ret[3 * s] + j;  // rank-major: source s's rows in a run
      if (a.blocks) {  // expert blocks: row j of source s is in the last chunk whose rows before it are <= j
        const int64_t* cr = a.chunk_rows + 2ll * s * a.local;
        const int l = last_at_most(cr + 1, a.local, j, 2);
        from = cr[2 * l] + (j - cr[2 * l + 1]);
      }
      warp_copy_part(a.ctx.ptr<uint4>(s, a.back_off + static_cast<uint64_t>(a.ret[3 * s + 1] + j) * row_bytes),
                     static_cast<const uint4*>(a.expert_out) + static_cast<size_t>(from) * vecs, vecs,
                     static_cast<int>(w % parts), parts, lane);
    }
  }
  arrive(a, 1);
  // The sum here when every CTA has a few vectors of it (else a kernel after this one, wider).
  // (Asked to pull -- a.pull -- the launcher made no second kernel.)
  const bool reduce_here = a.pull || static_cast<int64_t>(a.tokens) * vecs <= 4ll * gridDim.x * kDirectThreads;
  if (!reduce_here && blockIdx.x != 0) return;
  wait_every_rank(a, 1, n * gridDim.x);
  if (blockIdx.x == 0 && tid == 0) a.calls[1] = n;
  if (!reduce_here) return;
  const uint4* back = a.ctx.local<const uint4>(a.back_off);
  uint4* y = static_cast<uint4*>(a.y);
  const int64_t items = static_cast<int64_t>(a.tokens) * vecs;  // (token, vector) pairs, a thread each
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kDirectThreads + tid; i < items;
       i += static_cast<int64_t>(gridDim.x) * kDirectThreads) {
    const int t = static_cast<int>(i / vecs), v = static_cast<int>(i % vecs);
    if (ok)
      combine_vector<T>(back, a.route.pos, a.weights, y, t, v, a.top_k, vecs);
    else
      y[i] = make_uint4(0, 0, 0, 0);
  }
}

// --- The experts' layout (ops::MoeLayer) -------------------------------------------------

constexpr int kLayoutThreads = 512;

__global__ void __launch_bounds__(kLayoutThreads) layout_kernel(const MoeLayoutArgs a) {
  __shared__ int64_t block_start[kMoeMaxExperts + 1];  // per local expert: its first M-block
  const int W = a.world, L = a.local, tid = static_cast<int>(threadIdx.x);
  for (int l = tid; l < L; l += kLayoutThreads) {
    int64_t total = 0;
    for (int s = 0; s < W; ++s) total += a.chunks[s * L + l];
    block_start[l + 1] = (total + kMoeBlockRows - 1) / kMoeBlockRows;
  }
  if (tid == 0) block_start[0] = 0;
  __syncthreads();
  if (tid == 0) {
    for (int l = 0; l < L; ++l) block_start[l + 1] += block_start[l];
    int64_t at = 0;  // recv's rank-major order: source, then local expert
    for (int i = 0; i < W * L; ++i) {
      a.seg[2 * i] = at;
      at += a.chunks[i];
    }
  }
  __syncthreads();
  for (int l = tid; l < L; l += kLayoutThreads) {
    int64_t at = block_start[l] * kMoeBlockRows;
    for (int s = 0; s < W; ++s) {
      a.seg[2 * (s * L + l) + 1] = at;
      at += a.chunks[s * L + l];
    }
  }
  for (int t = tid; t < a.tiles; t += kLayoutThreads) {
    int g = -1;
    if (t < block_start[L]) g = last_at_most(block_start, L, t);  // the expert whose blocks hold t
    a.group_of[t] = g;
  }
}

// A warp per row of recv's layout (r < max_rows): its chunk is the last whose first row is <= r
// (empty chunks share their successor's first row).
__global__ void __launch_bounds__(256)
    permute_kernel(const uint4* src, uint4* dst, const int64_t* seg, const int64_t* chunks, int n, int64_t max_rows,
                   int vecs, bool to_experts) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t total = seg[2 * (n - 1)] + chunks[n - 1];
  const int64_t warps = static_cast<int64_t>(gridDim.x) * 8;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * 8 + threadIdx.x / 32; r < max_rows && r < total; r += warps) {
    const int lo = last_at_most(seg, n, r, 2);
    const int64_t e = seg[2 * lo + 1] + (r - seg[2 * lo]);
    const uint4* from = src + (to_experts ? r : e) * vecs;
    uint4* to = dst + (to_experts ? e : r) * vecs;
    for (int v = lane; v < vecs; v += 32) to[v] = from[v];
  }
}

// A CTA per row or a few (grid-stride over the rows), threads over a row's 16-byte vectors: rows of
// skipped M-blocks are left at once, no division per element, two vectors in flight a thread.
// SiLU by the fast exponential (__expf; the host backend's reference uses std::exp).
template <class T>
__device__ __forceinline__ uint4 swiglu8(const uint4& gv, const uint4& uv) {
  T g[8], u[8], o[8];
  std::memcpy(g, &gv, 16);
  std::memcpy(u, &uv, 16);
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    const float x = dev::to_float(g[q]);
    o[q] = dev::from_float<T>(x / (1.f + __expf(-x)) * dev::to_float(u[q]));
  }
  uint4 out;
  std::memcpy(&out, o, 16);
  return out;
}
template <class T>
__global__ void __launch_bounds__(256)
    swiglu_kernel(const uint4* h, uint4* act, const int32_t* group_of, int tiles, int vecs /* ffn / 8 */) {
  // Short rows (vecs < 256): several rows a CTA, `per` threads (whole warps) a row.
  const int per = vecs >= 256 ? 256 : (vecs + 31) / 32 * 32, nsub = 256 / per;
  const int sub = static_cast<int>(threadIdx.x) / per, t = static_cast<int>(threadIdx.x) % per;
  if (sub >= nsub) return;
  const int64_t rows = static_cast<int64_t>(tiles) * kMoeBlockRows;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * nsub + sub; r < rows;
       r += static_cast<int64_t>(gridDim.x) * nsub) {
    if (group_of[r / kMoeBlockRows] < 0) continue;
    const uint4* hg = h + r * 2 * vecs;
    uint4* a = act + r * vecs;
    int v = t;
    for (; v + per < vecs; v += 2 * per) {
      const uint4 g0 = hg[v], u0 = hg[vecs + v], g1 = hg[v + per], u1 = hg[vecs + v + per];
      a[v] = swiglu8<T>(g0, u0);
      a[v + per] = swiglu8<T>(g1, u1);
    }
    for (; v < vecs; v += per) a[v] = swiglu8<T>(hg[v], hg[vecs + v]);
  }
}

}  // namespace

cudaError_t moe_expert_layout(const MoeLayoutArgs& a, cudaStream_t s) {
  if (a.world < 1 || a.local < 1 || a.world * a.local > kMoeMaxExperts || a.tiles < 0 || !a.chunks || !a.group_of ||
      !a.seg)
    return cudaErrorInvalidValue;
  layout_kernel<<<1, kLayoutThreads, 0, s>>>(a);
  return cudaGetLastError();
}

cudaError_t moe_permute(const void* src, void* dst, const int64_t* seg, const int64_t* chunks, int chunks_n,
                        int64_t max_rows, size_t row_bytes, bool to_experts, cudaStream_t s) {
  if (chunks_n < 1 || row_bytes % 16 != 0) return cudaErrorInvalidValue;
  if (max_rows <= 0) return cudaSuccess;
  const int grid = static_cast<int>(std::min<int64_t>((max_rows + 7) / 8, 1056));
  permute_kernel<<<grid, 256, 0, s>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst), seg, chunks, chunks_n,
                                      max_rows, static_cast<int>(row_bytes / 16), to_experts);
  return cudaGetLastError();
}

cudaError_t moe_swiglu(const void* h, void* act, const int32_t* group_of, int tiles, int ffn, dev::DType t,
                       cudaStream_t s) {
  if (ffn % 8 != 0 || ffn <= 0 || tiles < 0) return cudaErrorInvalidValue;
  if (tiles == 0) return cudaSuccess;
  const int vecs = ffn / 8;
  const int grid = static_cast<int>(std::min<int64_t>(static_cast<int64_t>(tiles) * kMoeBlockRows, 4224));
  const auto* hv = static_cast<const uint4*>(h);
  auto* av = static_cast<uint4*>(act);
  if (t == dev::DType::kBF16)
    swiglu_kernel<dev::bf16_t><<<grid, 256, 0, s>>>(hv, av, group_of, tiles, vecs);
  else if (t == dev::DType::kF16)
    swiglu_kernel<dev::f16_t><<<grid, 256, 0, s>>>(hv, av, group_of, tiles, vecs);
  else
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t moe_route(const MoeRouteArgs& a, cudaStream_t s) {
  if (a.experts < 1 || a.experts > kMoeMaxExperts || a.world < 1 || a.experts % a.world != 0 || a.tokens < 0 ||
      a.top_k < 1 || a.world > kRouteThreads)
    return cudaErrorInvalidValue;
  const size_t smem = route_smem<kRouteThreads>(a.experts);
  static const cudaError_t allowed = cudaFuncSetAttribute(route_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                          static_cast<int>(route_smem<kRouteThreads>(kMoeMaxExperts)));
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

namespace {
cudaError_t combine_launch(const void* back, const int32_t* pos, const float* weights, void* y, int tokens, int top_k,
                           int hidden, dev::DType t, const unsigned long long* refused, cudaStream_t s) {
  if (tokens == 0) return cudaSuccess;
  if (hidden % 8 != 0 || top_k < 1 || top_k > kMoeMaxSlots) return cudaErrorInvalidValue;
  const int vecs = static_cast<int>(static_cast<size_t>(hidden) * dev::dtype_size(t) / 16);
  const int64_t items = static_cast<int64_t>(tokens) * vecs;
  const int grid = static_cast<int>(std::min<int64_t>((items + 255) / 256, 2048));
  const auto* b = static_cast<const uint4*>(back);
  auto* o = static_cast<uint4*>(y);
  if (t == dev::DType::kBF16)
    combine_kernel<dev::bf16_t><<<grid, 256, 0, s>>>(b, pos, weights, o, tokens, top_k, vecs, refused);
  else if (t == dev::DType::kF16)
    combine_kernel<dev::f16_t><<<grid, 256, 0, s>>>(b, pos, weights, o, tokens, top_k, vecs, refused);
  else if (t == dev::DType::kF32)
    combine_kernel<float><<<grid, 256, 0, s>>>(b, pos, weights, o, tokens, top_k, vecs, refused);
  else
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}
}  // namespace

cudaError_t moe_combine(const void* back, const int32_t* pos, const float* weights, void* y, int tokens, int top_k,
                        int hidden, dev::DType t, cudaStream_t s) {
  return combine_launch(back, pos, weights, y, tokens, top_k, hidden, t, nullptr, s);
}

namespace {
bool direct_args_ok(const MoeDirectArgs& a) {
  return a.ctx.world >= 1 && a.ctx.world <= kMoeDirectMaxWorld && a.local >= 1 && a.hidden % 8 == 0 &&
         (static_cast<size_t>(a.hidden) * dev::dtype_size(a.dtype)) % 16 == 0 && a.tokens >= 0 && a.calls &&
         a.slice_counts && a.chunks && a.ret && a.refused &&
         (!a.blocks || (a.groups && a.chunk_rows && a.groups_n >= 0)) && (!a.pull || (a.pair_src && !a.delivered));
}
// A direct kernel's grid: a.ctas (0: one an SM), at most the CTAs of `kernel` (with `smem` bytes
// of dynamic shared memory) the GPU holds at once -- CTAs wait for words that other CTAs write.
template <class K>
cudaError_t direct_grid(const MoeDirectArgs& a, K kernel, size_t smem, int* grid) {
  int dev = 0, sms = 0, per = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kernel, kDirectThreads, smem);
  if (e != cudaSuccess) return e;
  *grid = std::max(1, std::min({a.ctas > 0 ? a.ctas : sms, sms * per, kMoeDirectMaxCtas}));
  return cudaSuccess;
}
}  // namespace

cudaError_t moe_dispatch_direct(const MoeDirectArgs& a, cudaStream_t s) {
  if (!direct_args_ok(a)) return cudaErrorInvalidValue;
  const MoeRouteArgs& r = a.route;
  if (r.experts < 1 || r.experts > kMoeMaxExperts || r.world != a.ctx.world || r.experts != a.local * r.world ||
      r.tokens != a.tokens || r.top_k != a.top_k || !r.pos || !r.expert_counts || !r.bad)
    return cudaErrorInvalidValue;
  if (a.once && (a.tokens > a.max_tokens || a.capacity > 0xFFFFFFFFull)) return cudaErrorInvalidValue;
  static const cudaError_t allowed =
      cudaFuncSetAttribute(dispatch_direct_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(route_smem<kDirectThreads>(kMoeMaxExperts)));
  if (allowed != cudaSuccess) return allowed;
  int grid = 1;
  const size_t smem = route_smem<kDirectThreads>(r.experts);
  const cudaError_t e = direct_grid(a, dispatch_direct_kernel, smem, &grid);
  if (e != cudaSuccess) return e;
  dispatch_direct_kernel<<<grid, kDirectThreads, smem, s>>>(a);
  return cudaGetLastError();
}

namespace {
template <class T>
cudaError_t combine_direct_launch(const MoeDirectArgs& a, cudaStream_t s, int* grid) {
  const cudaError_t e = direct_grid(a, combine_direct_kernel<T>, 0, grid);
  if (e != cudaSuccess) return e;
  combine_direct_kernel<T><<<*grid, kDirectThreads, 0, s>>>(a);
  return cudaGetLastError();
}
}  // namespace

cudaError_t moe_combine_direct(const MoeDirectArgs& a, cudaStream_t s) {
  if (!direct_args_ok(a)) return cudaErrorInvalidValue;
  int grid = 1;
  cudaError_t e;
  if (a.dtype == dev::DType::kBF16)
    e = combine_direct_launch<dev::bf16_t>(a, s, &grid);
  else if (a.dtype == dev::DType::kF16)
    e = combine_direct_launch<dev::f16_t>(a, s, &grid);
  else if (a.dtype == dev::DType::kF32)
    e = combine_direct_launch<float>(a, s, &grid);
  else
    return cudaErrorInvalidValue;
  const int vecs = static_cast<int>(static_cast<size_t>(a.hidden) * dev::dtype_size(a.dtype) / 16);
  if (e != cudaSuccess || a.pull || static_cast<int64_t>(a.tokens) * vecs <= 4ll * grid * kDirectThreads) return e;
  return combine_launch(a.ctx.local<const void>(a.back_off), a.route.pos, a.weights, a.y, a.tokens, a.top_k, a.hidden,
                        a.dtype, a.refused, s);
}

}  // namespace weft::kernels
