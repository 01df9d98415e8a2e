// GEMV + AllReduce kernels (include/weft/kernels/gemv_ar_kernels.hpp; docs/gemv_ar.md, "Kernels").
//
// Skinny GEMM y[m, n] = x[m, k] * W[n, k]^T for m <= 128, bound by streaming W from HBM:
//  - Swap AB: W's rows are the MMA's M side (mma.sync m16n8k16, A = 16 rows of W x 16 k,
//    row-major), the tokens its N side (B = 8 tokens x 16 k, "col" = K-contiguous x rows).
//    Both operands are K-contiguous, so each lane reads 16 contiguous bytes of a row: the sum
//    over k does not care which k a slot holds as long as A and B agree, so lane (g, q) holds
//    k = 8q .. 8q+7 of its row in 4 registers and feeds k 8q..8q+3 to one MMA and 8q+4..8q+7 to
//    the next (the ISA's slots 2q, 2q+1, 2q+8, 2q+9 of each): no ldmatrix, no shuffles.
//  - m > 16 on sm_90a (wg::): a CTA (BM / 64 consumer warpgroups + a producer warp, one per
//    SM) owns a tile of BM = 128 rows of W (64 where 128 would leave SMs idle: wg_shape); W's
//    and x's 64-k boxes come by TMA into a ring of stages, wgmma m64nMTk16 multiplies them
//    (swap AB as above, both operands K-major in shared memory). W is read once whatever m is;
//    x from L2 once per tile.
//  - m > 16 elsewhere (gemv_tile, the compute_80 PTX): a CTA (8 warps, two per SM) owns a tile
//    of 128 rows, warp w the rows 16w .. 16w+15, for all token groups of 8; each lane streams
//    its 16 bytes of rows g and g+8 of each 32-k step from global memory straight into
//    registers (ld.global.nc, no L1 allocation), the next batch in flight; x through shared
//    memory in double-buffered chunks (cp.async; 16-byte chunk c of token t's row at
//    c ^ 4 (t & 1): the fragment reads of a quarter warp hit distinct bank groups).
//  - Both fill the machine by splitting K across the CTAs of a thread-block cluster of S = 1,
//    2 or 4 (cluster_for: from the clusters the hardware holds at once and a measured cost per
//    round); the S partial tiles (fp32, in shared memory) are summed through distributed shared
//    memory in cluster-rank order (deterministic), each CTA finishing 128/S of the columns.
//  - Measured (docs/gemv_ar.md, "Kernels"): the wgmma kernel 85-94% of HBM at m = 32 .. 128
//    on 28672 x 8192 (2 x H200); the mma.sync one 20-66%.
//
// Fused call (gemv_ar_fused), m > kGemvSmallM: the same tile loop in a persistent grid (every
// CTA resident: the epilogue's grid barrier needs it), cluster c of ncl owning the 128-column
// slices c, c + ncl, ...; after each slice's cluster sum, CTA s of the cluster pushes its 128/S columns
// (a "part") to every rank as LL128 lines and goes on to its next slice. Then
// gemv_ar_algos.hpp's finish waits for, sums (rank order) and writes its parts, with the
// residual + RMSNorm epilogue. The exchange protocol and its invariants (epochs, parities, the
// norm's barrier) are in gemv_ar_algos.hpp; the host backend runs the same code. Calls of
// m <= kGemvSmallM run the register path (below) in a grid of their own, two CTAs per SM, each
// pushing its 16-row parts as it finishes them, with the op's second state set.
//
// Every kernel that takes the DeviceCtx (an array of peer bases, indexed at run time) takes it
// as a __grid_constant__ parameter: a by-value copy is spilled to each thread's local memory
// (~660 bytes per thread, written at entry), which cost microseconds per call.
//
// The unfused epilogue (add_rmsnorm): one CTA per token row, 16-byte vectors.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <type_traits>

#include "tensor_map.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/device/ptx/arch.cuh"
#include "weft/device/ptx/bar.cuh"
#include "weft/device/ptx/cluster.cuh"
#include "weft/device/ptx/cp_async.cuh"
#include "weft/device/ptx/fence.cuh"
#include "weft/device/ptx/ld_global.cuh"
#include "weft/device/ptx/mbarrier.cuh"
#include "weft/device/ptx/memory_order.cuh"
#include "weft/device/ptx/mma.cuh"
#include "weft/device/ptx/tma.cuh"
#include "weft/device/ptx/wgmma.cuh"
#include "weft/kernels/gemm.hpp"
#include "weft/kernels/gemv_ar_algos.hpp"
#include "weft/kernels/gemv_ar_kernels.hpp"
#include "weft/kernels/runtime_kernels.hpp"

namespace weft::kernels {
namespace {

constexpr int kThreads = 256;  // two CTAs per SM (16 warps streaming W)
constexpr int kWarps = kThreads / 32;
constexpr int kBN = kWarps * 16;        // rows of W (columns of y) per tile: one m16 MMA tile per warp
constexpr int kKC = 64;                 // the K split's granularity (k per cluster rank: a multiple)
constexpr int kMaxCluster = 8;          // portable cluster size
constexpr int kRedStride = kBN + 4;     // floats per token row of the partial tile (bank skew)
static_assert(kBN % (4 * kMaxCluster) == 0, "every CTA of a cluster finishes whole LL lines");

template <int MT>
struct TileCfg {
  static_assert(MT % 8 == 0 && MT >= 8 && MT <= 128, "token tile: groups of 8, at most 128");
  static constexpr int kKX = MT <= 64 ? 256 : 128;  // k per chunk of x in shared memory
  static constexpr int kXChunk = MT * kKX * 2;      // bytes of one chunk of x
  static constexpr int kPipe = 2 * kXChunk;         // double-buffered
  static constexpr int kRed = MT * kRedStride * 4;  // the partial tile, after the chunks are done
  static constexpr int kSmem = kPipe > kRed ? kPipe : kRed;
  // 32-k steps of W per batch: two batches in registers (the next one loading while the
  // current one is multiplied), with the accumulators, under 128 registers.
  static constexpr int kU = MT <= 64 ? 4 : 2;
  static_assert((kKX / 32) % kU == 0, "batches do not straddle chunks of x");
  static_assert(kSmem <= 100 * 1024, "two CTAs per SM, with the fused call's scratch");
};

// ---- the cluster (S CTAs splitting K); S == 1 on GPUs without clusters ----------------------
__device__ __forceinline__ int cluster_rank(int S) {
#if defined(WEFT_PTX_SM90)
  return S > 1 ? static_cast<int>(ptx::cluster_ctarank()) : 0;
#else
  (void)S;
  return 0;
#endif
}
__device__ __forceinline__ void cluster_sync(int S) {
#if defined(WEFT_PTX_SM90)
  if (S > 1) {
    ptx::barrier_cluster_sync();
    return;
  }
#endif
  (void)S;
  __syncthreads();
}
// 16 bytes at shared address `addr` of cluster CTA `rank` (this CTA's own when S == 1).
__device__ __forceinline__ float4 ld_cluster_f4(uint32_t addr, int rank, int S) {
#if defined(WEFT_PTX_SM90)
  if (S > 1) return ptx::ld_shared_cluster_v4_f32(addr, static_cast<uint32_t>(rank));
#endif
  (void)rank;
  (void)S;
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// Byte offset of 16-byte chunk c of token t's row (KX k) in a chunk of x: the two tokens a
// quarter warp reads (t, t+1; chunks 4s+q) land in distinct bank groups.
template <int KX>
__device__ __forceinline__ uint32_t xswz(int t, int c) {
  return static_cast<uint32_t>(t * (KX * 2) + ((c ^ ((t & 1) << 2)) << 4));
}

// The partial tile of rows [row0, row0 + kBN) of W over k in [kbeg, kend) (multiples of 8;
// empty when kbeg >= kend), written to shared memory as red[token][row] (fp32, kRedStride per
// token) for tokens < m. Warp w owns rows row0 + 16 w .. + 15 and streams them from global
// memory straight into registers (as reg_part below: lane (g, q) holds k 8q .. 8q+7 of rows g
// and g+8 of each 32-k step; ld.global.nc, no L1 allocation), the next batch of kU steps in
// flight while the current one is multiplied; x goes through shared memory in double-buffered
// chunks of kKX k (cp.async, one barrier per chunk), read by all warps. Ends with red written
// (not yet synced).
template <class T, int MT>
__device__ __forceinline__ void gemv_tile(const T* __restrict__ x, const T* __restrict__ w, int m, int n, int k,
                                          int row0, int kbeg, int kend, unsigned char* smem) {
  constexpr int U = TileCfg<MT>::kU, G = MT / 8, kKX = TileCfg<MT>::kKX, kSteps = kKX / 32;
  constexpr int kXChunk = TileCfg<MT>::kXChunk;
  constexpr bool kBF16 = std::is_same_v<T, dev::bf16_t>;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;
  const uint32_t sx = ptx::smem_u32(smem);
  const int steps = kend > kbeg ? (kend - kbeg + 31) / 32 : 0;
  const int chunks = (steps + kSteps - 1) / kSteps;
  const int batches = (steps + U - 1) / U;  // batches never straddle a chunk: kSteps % U == 0

  auto load_x = [&](int c) {
    const int kb = kbeg + c * kKX;
    const uint32_t dst = sx + static_cast<uint32_t>((c & 1) * kXChunk);
    for (int ci = tid; ci < MT * (kKX / 8); ci += kThreads) {
      const int t = ci / (kKX / 8), cc = ci % (kKX / 8), gk = kb + 8 * cc;
      const bool ok = t < m && gk < kend;
      ptx::cp_async_cg_16(dst + xswz<kKX>(t, cc), ok ? x + static_cast<size_t>(t) * k + gk : x, ok);
    }
  };
  const int ra = row0 + 16 * warp + g, rb = ra + 8;
  const bool a_ok = ra < n, b_ok = rb < n;
  const T* wa_p = w + static_cast<size_t>(a_ok ? ra : 0) * k + kbeg + 8 * q;
  const T* wb_p = w + static_cast<size_t>(b_ok ? rb : 0) * k + kbeg + 8 * q;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  auto load_w = [&](int b, uint4* wa, uint4* wb) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int st = b * U + u;
      const bool ok = st < steps && kbeg + 32 * st + 8 * q < kend;
      wa[u] = ok && a_ok ? ptx::ld_global_nc_na_v4(wa_p + 32 * st) : zero;
      wb[u] = ok && b_ok ? ptx::ld_global_nc_na_v4(wb_p + 32 * st) : zero;
    }
  };

  float acc[G][4];
#pragma unroll
  for (int j = 0; j < G; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  const int groups = (m + 7) / 8;  // token groups that hold a token (warp-uniform)
  if (chunks > 0) load_x(0);
  ptx::cp_async_commit_group();
  uint4 wa[U], wb[U], na[U], nb[U];
  if (batches > 0) load_w(0, wa, wb);
  for (int b = 0; b < batches; ++b) {
    const int st0 = b * U, c = st0 / kSteps;
    if (st0 % kSteps == 0) {              // the first batch of chunk c
      ptx::cp_async_wait_group<0>();      // chunk c (issued a chunk ago) landed for this thread
      __syncthreads();                    // ... for every thread; every warp is done with chunk c - 1
      if (c + 1 < chunks) load_x(c + 1);  // into chunk c - 1's buffer
      ptx::cp_async_commit_group();
    }
    if (b + 1 < batches) load_w(b + 1, na, nb);
    const uint32_t xb = sx + static_cast<uint32_t>((c & 1) * kXChunk);
    // Every step of the batch and every token group, branch-free (a conditional break per
    // group serialised the loads and MMAs of the groups): steps past the end are in this
    // chunk of x, whose k past kend are zeros, as are W's and those of tokens past m.
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int cs = 4 * ((st0 + u) % kSteps) + q;  // this lane's 16-byte chunk of the step
#pragma unroll
      for (int j = 0; j < G; ++j) {
        const uint4 xv = ptx::ld_shared_v4(xb + xswz<kKX>(8 * j + g, cs));
        ptx::mma_m16n8k16_f32<kBF16>(acc[j], wa[u].x, wb[u].x, wa[u].y, wb[u].y, xv.x, xv.y);  // k 8q .. 8q+3
        ptx::mma_m16n8k16_f32<kBF16>(acc[j], wa[u].z, wb[u].z, wa[u].w, wb[u].w, xv.z, xv.w);  // k 8q+4 .. 8q+7
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      wa[u] = na[u];
      wb[u] = nb[u];
    }
  }
  ptx::cp_async_wait_group<0>();
  __syncthreads();  // every warp is done with x: red reuses its bytes
  float* red = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int j = 0; j < G; ++j) {
    if (j >= groups) break;
    const int row = 16 * warp + g, tok = 8 * j + 2 * q;
    red[tok * kRedStride + row] = acc[j][0];
    red[(tok + 1) * kRedStride + row] = acc[j][1];
    red[tok * kRedStride + row + 8] = acc[j][2];
    red[(tok + 1) * kRedStride + row + 8] = acc[j][3];
  }
}

// The cluster's sum (rank order) of columns lr .. lr+3 (tile-local) of token t.
__device__ __forceinline__ void cluster_sum4(const unsigned char* smem, int t, int lr, int S, float* v) {
  const uint32_t addr = ptx::smem_u32(smem) + static_cast<uint32_t>((t * kRedStride + lr) * 4);
  float4 p[kMaxCluster];
#pragma unroll
  for (int s = 0; s < kMaxCluster; ++s)
    if (s < S) p[s] = ld_cluster_f4(addr, s, S);  // every load issued before the sum
  v[0] = v[1] = v[2] = v[3] = 0.f;
#pragma unroll
  for (int s = 0; s < kMaxCluster; ++s)
    if (s < S) {
      v[0] += p[s].x;
      v[1] += p[s].y;
      v[2] += p[s].z;
      v[3] += p[s].w;
    }
}

struct LocalParams {
  const void* x;
  const void* w;
  void* y;
  int m, n, k;
  int S;       // cluster size (K split)
  int kchunk;  // k per cluster rank, a multiple of kKC
};

// The local kernels' output: CTA s of the cluster writes its bm/S columns of the tile of bm
// rows at row0, the cluster's sum (rank order) of the partial tiles at red.
template <class T>
__device__ __forceinline__ void store_cluster_sum(const LocalParams& p, const unsigned char* red, int row0, int bm,
                                                  int s, int S) {
  const int pw = bm / S, lpt = pw / 4;
  T* y = static_cast<T*>(p.y);
  for (int i = static_cast<int>(threadIdx.x); i < p.m * lpt; i += static_cast<int>(blockDim.x)) {
    const int t = i / lpt, lr = s * pw + 4 * (i % lpt), j = row0 + lr;
    if (j >= p.n) continue;
    float v[4];
    cluster_sum4(red, t, lr, S, v);
    *reinterpret_cast<uint64_t*>(y + static_cast<size_t>(t) * p.n + j) = gemv::pack4<T>(v);
  }
}

template <class T, int MT>
__global__ void __launch_bounds__(kThreads, 2) gemv_local_kernel(const __grid_constant__ LocalParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int S = p.S, s = cluster_rank(S);
  const int row0 = static_cast<int>(blockIdx.x) / S * kBN;
  const int kbeg = s * p.kchunk, kend = std::min(p.k, kbeg + p.kchunk);
  gemv_tile<T, MT>(static_cast<const T*>(p.x), static_cast<const T*>(p.w), p.m, p.n, p.k, row0, kbeg, kend, smem);
  cluster_sync(S);  // every CTA's partial tile is written
  store_cluster_sum<T>(p, smem, row0, kBN, s, S);
  cluster_sync(S);  // no CTA leaves while another still reads its shared memory
}

template <class T, int MT>
__global__ void __launch_bounds__(kThreads, 2)
    gemv_ar_fused_kernel(const __grid_constant__ dev::DeviceCtx c, const __grid_constant__ GemvArgs a, int S,
                         int kchunk) {
  extern __shared__ __align__(128) unsigned char smem[];
  float* scratch = reinterpret_cast<float*>(smem + TileCfg<MT>::kSmem);
  const int kc = static_cast<int>(blockIdx.x), s = cluster_rank(S);
  const int cl = kc / S, ncl = static_cast<int>(gridDim.x) / S;
  const uint64_t e = gemv::epoch_begin(c, a, kc);
  const int pw = kBN / S;
  const int slices = (a.n + kBN - 1) / kBN;
  const int kbeg = s * kchunk, kend = std::min(a.k, kbeg + kchunk);
  const dev::CoopCta g;
  for (int sl = cl; sl < slices; sl += ncl) {
    const int row0 = sl * kBN;
    gemv_tile<T, MT>(static_cast<const T*>(a.x), static_cast<const T*>(a.w), a.m, a.n, a.k, row0, kbeg, kend, smem);
    cluster_sync(S);
    // Part sl * S + s (owned by CTA kc = cl * S + s: parts_of_cta's k, k + ctas, ...).
    const int j0 = row0 + s * pw, j1 = std::min(a.n, j0 + pw);
    if (j0 < j1)
      gemv::push_part<T>(g, c, a, e, pw, j0, j1,
                         [&](int t, int j, float* v) { cluster_sum4(smem, t, j - row0, S, v); });
    cluster_sync(S);  // the partial tiles are read: the next slice's ring may overwrite them
  }
  gemv::finish<T>(g, c, a, kc, pw, e, scratch);
  gemv::epoch_end(g, c, a, kc, e);
}

// ---- m > 16 on sm_90a: TMA ring + wgmma (gemv_wg_*) ---------------------------------------
// The same tiles (kBN = 128 rows of W, the K split over a cluster, the partial tile red[token]
// [row] summed through distributed shared memory) with the mainloop of weft's GEMM: one
// producer warp loads, per 64-k block, W's box [128 rows x 64 k] and x's box [MT tokens x 64 k]
// by TMA (128-byte swizzle; rows past n, tokens past m and k past the matrix read as zeros)
// into a ring of stages on mbarriers; two consumer warpgroups multiply (swap AB: wgmma
// m64nMTk16, A = 64 rows of W, B = the tokens, both K-major from shared memory) and release
// each stage once the MMAs that read it are complete. The partial tile reuses the ring's bytes
// once a tile's k-blocks are consumed; the ring restarts per tile (a persistent CTA mostly owns
// one tile). x is read from L2 once per tile, as on the other path.
namespace wg {
constexpr int kBK = 64;               // k per stage: one 128-byte swizzle span
constexpr int kSmemCap = 176 * 1024;  // the ring: one CTA per SM, >= 50 KiB left for the fused scratch
static_assert(kBN == 128 && kBK * 2 == 128, "tiles of at most 128 rows; a stage row is one swizzle span");

// BM rows of W per tile (BM / 64 consumer warpgroups: 128 where n gives enough tiles, 64 where
// half as many CTAs would leave SMs idle: wg_shape), MT tokens.
template <int BM, int MT>
struct Cfg {
  static_assert(BM == 64 || BM == 128, "one or two consumer warpgroups");
  static_assert(MT == 32 || MT == 64 || MT == 128, "the wgmma N of a token tile");
  static constexpr int kConsumerThreads = 2 * BM;         // a warpgroup per 64 rows
  static constexpr int kThreads = kConsumerThreads + 32;  // + the producer warp
  static constexpr int kWStage = BM * kBK * 2;
  static constexpr int kXStage = MT * kBK * 2;
  static constexpr int kStage = kWStage + kXStage;
  static constexpr int kStages = kSmemCap / kStage < 8 ? kSmemCap / kStage : 8;
  static constexpr int kRing = kStages * kStage;
  static constexpr int kRed = MT * kRedStride * 4;  // the partial tile, over the ring
  static_assert(kRed <= kRing, "the partial tile fits in the ring");
  static constexpr int kBars = 2 * kStages * 8;
  // Dynamic shared memory: 1024 bytes of alignment slack (128-byte swizzle), the ring, the
  // barriers (then the fused call's scratch).
  static constexpr int kSmem = 1024 + kRing + ((kBars + 127) / 128) * 128;
};

struct Maps {
  CUtensorMap w;  // W [n, k], box [BM, kBK]
  CUtensorMap x;  // x [m, k], box [MT, kBK]
};

#if defined(WEFT_PTX_SM90A)
template <class T, int MT>
__device__ __forceinline__ void mma(float* d, uint64_t da, uint64_t db) {
  constexpr bool kBF16 = std::is_same_v<T, dev::bf16_t>;
  if constexpr (MT == 32) {
    if constexpr (kBF16)
      ptx::wgmma_m64n32k16_bf16<0>(d, da, db, 1u);
    else
      ptx::wgmma_m64n32k16_f16<0>(d, da, db, 1u);
  } else if constexpr (MT == 64) {
    if constexpr (kBF16)
      ptx::wgmma_m64n64k16_bf16<0>(d, da, db, 1u);
    else
      ptx::wgmma_m64n64k16_f16<0>(d, da, db, 1u);
  } else {
    if constexpr (kBF16)
      ptx::wgmma_m64n128k16_bf16<0>(d, da, db, 1u);
    else
      ptx::wgmma_m64n128k16_f16<0>(d, da, db, 1u);
  }
}

// The CTA's ring (1024-aligned) and its barriers: full[kStages], then empty[kStages].
__device__ __forceinline__ unsigned char* ring_base(unsigned char* smem) {
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem) + 1023) & ~uintptr_t{1023});
}
template <int BM, int MT>
__device__ __forceinline__ uint64_t* bars_of(unsigned char* ring) {
  return reinterpret_cast<uint64_t*>(ring + Cfg<BM, MT>::kRing);
}
template <int BM, int MT>
__device__ __forceinline__ void init_bars(uint64_t* bars, const Maps& maps) {
  using C = Cfg<BM, MT>;
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      ptx::mbarrier_init(&bars[s], 1);                                      // full: the producer's expect_tx
      ptx::mbarrier_init(&bars[C::kStages + s], C::kConsumerThreads / 32);  // empty: a lane per consumer warp
    }
    ptx::fence_mbarrier_init_release_cluster();
  }
  if (threadIdx.x == C::kConsumerThreads) {
    ptx::prefetch_tensormap(&maps.w);
    ptx::prefetch_tensormap(&maps.x);
  }
  __syncthreads();
}

// The partial tile of rows [row0, row0 + BM) over k in [kbeg, kend) (kbeg a multiple of kBK;
// empty when kbeg >= kend) into red = ring[token][row] (fp32, kRedStride per token, all MT
// tokens). `it` counts the ring's stages used by this CTA (the same in every thread: each
// thread runs every tile's k-blocks). Ends with red written by the consumers (not yet synced).
template <class T, int BM, int MT>
__device__ __forceinline__ void tile(const Maps& maps, int row0, int kbeg, int kend, unsigned char* ring,
                                     uint64_t* bars, uint32_t& it) {
  using C = Cfg<BM, MT>;
  constexpr int kConsumerThreads = C::kConsumerThreads;
  uint64_t* full = bars;
  uint64_t* empty = bars + C::kStages;
  const int tid = threadIdx.x;
  const int kblocks = kend > kbeg ? (kend - kbeg + kBK - 1) / kBK : 0;
  if (tid >= kConsumerThreads) {  // ---- the producer warp (one lane issues) ----
    if (tid == kConsumerThreads)
      for (int kb = 0; kb < kblocks; ++kb, ++it) {
        const int s = static_cast<int>(it % C::kStages);
        ptx::mbarrier_wait_parity(&empty[s], ((it / C::kStages) & 1u) ^ 1u);  // a fresh slot passes
        unsigned char* st = ring + s * C::kStage;
        ptx::mbarrier_arrive_expect_tx(&full[s], C::kStage);
        ptx::cp_async_bulk_tensor_2d_load(st, &maps.w, &full[s], kbeg + kb * kBK, row0);
        ptx::cp_async_bulk_tensor_2d_load(st + C::kWStage, &maps.x, &full[s], kbeg + kb * kBK, 0);
      }
    else
      it += static_cast<uint32_t>(kblocks);
    return;
  }
  // ---- the consumers: warpgroup wg multiplies rows 64 wg .. 64 wg + 63 ----
  const int wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
  const uint64_t da0 = ptx::wgmma_desc_sw128(ptx::smem_u32(ring + wg * (64 * 128)), 16, 1024);
  const uint64_t db0 = ptx::wgmma_desc_sw128(ptx::smem_u32(ring + C::kWStage), 16, 1024);
  float d[MT / 2];
#pragma unroll
  for (int i = 0; i < MT / 2; ++i) d[i] = 0.f;
  auto release = [&](uint32_t used) {
    if (lane == 0) ptx::mbarrier_arrive(&empty[used % C::kStages]);
  };
  for (int kb = 0; kb < kblocks; ++kb, ++it) {
    const int s = static_cast<int>(it % C::kStages);
    ptx::mbarrier_wait_parity(&full[s], (it / C::kStages) & 1u);
    // Stage s: the stage-0 descriptors plus byte offsets in 16-byte units; step kk: 32 bytes.
    const uint64_t off = static_cast<uint64_t>(s) * (C::kStage >> 4);
    ptx::wgmma_fence();
    ptx::wgmma_fence_operand<MT / 2>(d);
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) mma<T, MT>(d, da0 + off + 2 * kk, db0 + off + 2 * kk);
    ptx::wgmma_commit_group();
    ptx::wgmma_fence_operand<MT / 2>(d);
    ptx::wgmma_wait_group<1>();  // the previous k-block's MMAs are complete: its stage is free
    if (kb > 0) release(it - 1);
  }
  ptx::wgmma_wait_group<0>();
  ptx::wgmma_fence_operand<MT / 2>(d);
  if (kblocks > 0) release(it - 1);
  ptx::bar_sync(1, kConsumerThreads);  // every warpgroup is done with the ring: red may overwrite it
  float* red = reinterpret_cast<float*>(ring);
  const int r = 64 * wg + 16 * warp + lane / 4, c = 2 * (lane % 4);
#pragma unroll
  for (int i = 0; i < MT / 2; ++i) red[(8 * (i / 4) + c + (i % 2)) * kRedStride + r + 8 * ((i / 2) % 2)] = d[i];
}
#endif

template <class T, int BM, int MT>
__global__ void __launch_bounds__(Cfg<BM, MT>::kThreads, 1)
    local_kernel(const __grid_constant__ LocalParams p, const __grid_constant__ Maps maps) {
#if defined(WEFT_PTX_SM90A)
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* ring = ring_base(smem);
  uint64_t* bars = bars_of<BM, MT>(ring);
  init_bars<BM, MT>(bars, maps);
  const int S = p.S, s = cluster_rank(S);
  const int row0 = static_cast<int>(blockIdx.x) / S * BM;
  const int kbeg = s * p.kchunk, kend = std::min(p.k, kbeg + p.kchunk);
  uint32_t it = 0;
  tile<T, BM, MT>(maps, row0, kbeg, kend, ring, bars, it);
  cluster_sync(S);  // every CTA's partial tile is written
  store_cluster_sum<T>(p, ring, row0, BM, s, S);
  cluster_sync(S);  // no CTA leaves while another still reads its shared memory
#else
  (void)p;
  (void)maps;
#endif
}

template <class T, int BM, int MT>
__global__ void __launch_bounds__(Cfg<BM, MT>::kThreads, 1)
    fused_kernel(const __grid_constant__ dev::DeviceCtx c, const __grid_constant__ GemvArgs a,
                 const __grid_constant__ Maps maps, int S, int kchunk) {
#if defined(WEFT_PTX_SM90A)
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* ring = ring_base(smem);
  uint64_t* bars = bars_of<BM, MT>(ring);
  float* scratch = reinterpret_cast<float*>(ring + (Cfg<BM, MT>::kSmem - 1024));
  init_bars<BM, MT>(bars, maps);
  const int kc = static_cast<int>(blockIdx.x), s = cluster_rank(S);
  const int cl = kc / S, ncl = static_cast<int>(gridDim.x) / S;
  const uint64_t e = gemv::epoch_begin(c, a, kc);
  const int pw = BM / S;
  const int slices = (a.n + BM - 1) / BM;
  const int kbeg = s * kchunk, kend = std::min(a.k, kbeg + kchunk);
  const dev::CoopCta g;
  uint32_t it = 0;
  for (int sl = cl; sl < slices; sl += ncl) {
    const int row0 = sl * BM;
    tile<T, BM, MT>(maps, row0, kbeg, kend, ring, bars, it);
    cluster_sync(S);
    const int j0 = row0 + s * pw, j1 = std::min(a.n, j0 + pw);
    if (j0 < j1)
      gemv::push_part<T>(g, c, a, e, pw, j0, j1,
                         [&](int t, int j, float* v) { cluster_sum4(ring, t, j - row0, S, v); });
    // The next tile's TMA loads overwrite the partial tile: order this thread's accesses to it
    // (generic proxy) before them (async proxy), then wait for every CTA's readers.
    ptx::fence_proxy_async_shared_cta();
    cluster_sync(S);
  }
  gemv::finish<T, false>(g, c, a, kc, pw, e, scratch);  // no call in a WGMMA kernel (C7510): no printf
  gemv::epoch_end(g, c, a, kc, e);
#else
  (void)c;
  (void)a;
  (void)maps;
  (void)S;
  (void)kchunk;
#endif
}
}  // namespace wg

// ---- decode sizes (m <= 16): W streamed straight into registers --------------------------
// The same swap-AB MMAs, without the shared-memory ring: each lane loads its 16 bytes of rows
// g and g+8 of a 16-row tile (and of its tokens' x) from global memory into registers, kU
// 32-k steps at a time, all loads of a batch issued before its MMAs (ld.global.nc with
// L1::no_allocate for W, which is read once; x through L1). Every warp of a CTA streams its own
// contiguous K range of one row tile, so each row is read in runs of kU x 64 bytes and no
// barrier paces the warps; the warps' partial tiles are summed in warp order (deterministic).
// A part is `pw` rows (a multiple of 16, at most 16 x kWarps): pw / 16 row tiles, the warps
// split among them, each tile's warps splitting K.

template <int MT, int NW>
struct RegCfg {
  static_assert(MT == 8 || MT == 16, "the register path serves m <= 16");
  static constexpr int kU = MT == 8 ? 8 : 4;  // 32-k steps per batch (registers: W 8 kU, x 4 kU MT/8)
  static constexpr int kRed = NW * 16 * MT;   // floats: every warp's 16 x MT partial
};
// Warps of a register-path CTA (local and fused: two CTAs resident per SM). Parts are 16 rows
// (one row tile, the warps splitting K): 16 fused warps measured slower than 8 (docs/gemv_ar.md).
constexpr int kRegWarps = 8;
constexpr int kRegPw = 16;
static_assert(32 * kRegWarps == kThreads, "resident_clusters sizes both kernels' CTAs");
// Floats of shared memory a register-path part needs: the warps' partials, then the part [MT][pw].
template <int MT, int NW>
constexpr int reg_part_floats(int pw) {
  return RegCfg<MT, NW>::kRed + MT * pw;
}

// The partial of rows [row0, row0 + pw) over all of k for tokens < m, into part[t * pw + r]
// (fp32; rows past n left unwritten). Ends with part written and synced.
template <class T, int MT, int NW>
__device__ __forceinline__ void reg_part(const T* __restrict__ x, const T* __restrict__ w, int m, int n, int k,
                                         int row0, int pw, float* smem) {
  constexpr int U = RegCfg<MT, NW>::kU, G = MT / 8;
  constexpr bool kBF16 = std::is_same_v<T, dev::bf16_t>;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int rts = pw / 16, ks = NW / rts;  // row tiles; warps per tile
  const int rt = warp % rts, kslice = warp / rts;
  const int steps = (k + 31) / 32;
  const int s0 = steps * kslice / ks, s1 = steps * (kslice + 1) / ks;
  const int ra = row0 + 16 * rt + g, rb = ra + 8;
  const bool a_ok = ra < n, b_ok = rb < n;  // (pw / 16 divides NW: every warp has a tile)
  const T* wa_p = w + static_cast<size_t>(a_ok ? ra : 0) * k + 8 * q;
  const T* wb_p = w + static_cast<size_t>(b_ok ? rb : 0) * k + 8 * q;
  float acc[G][4];
#pragma unroll
  for (int j = 0; j < G; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int s = s0; s < s1; s += U) {
    uint4 wa[U], wb[U], xv[U][G];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kk = 32 * (s + u) + 8 * q;
      const bool ok = s + u < s1 && kk < k;
      wa[u] = ok && a_ok ? ptx::ld_global_nc_na_v4(wa_p + 32 * (s + u)) : zero;
      wb[u] = ok && b_ok ? ptx::ld_global_nc_na_v4(wb_p + 32 * (s + u)) : zero;
#pragma unroll
      for (int j = 0; j < G; ++j) {
        const int tok = 8 * j + g;
        xv[u][j] = ok && tok < m ? __ldg(reinterpret_cast<const uint4*>(x + static_cast<size_t>(tok) * k + kk)) : zero;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < G; ++j) {
        ptx::mma_m16n8k16_f32<kBF16>(acc[j], wa[u].x, wb[u].x, wa[u].y, wb[u].y, xv[u][j].x, xv[u][j].y);
        ptx::mma_m16n8k16_f32<kBF16>(acc[j], wa[u].z, wb[u].z, wa[u].w, wb[u].w, xv[u][j].z, xv[u][j].w);
      }
  }
  float* red = smem;  // [warp][16 rows][MT tokens]
#pragma unroll
  for (int j = 0; j < G; ++j) {
    const int tok = 8 * j + 2 * q;
    float* r0 = red + (warp * 16 + g) * MT + tok;
    float* r8 = red + (warp * 16 + g + 8) * MT + tok;
    r0[0] = acc[j][0];
    r0[1] = acc[j][1];
    r8[0] = acc[j][2];
    r8[1] = acc[j][3];
  }
  __syncthreads();
  float* part = smem + RegCfg<MT, NW>::kRed;
  for (int i = tid; i < pw * m; i += 32 * NW) {
    const int t = i / pw, r = i % pw, tile = r / 16;
    float v = 0.f;
    for (int s = 0; s < ks; ++s) v += red[((s * rts + tile) * 16 + r % 16) * MT + t];  // warp order
    part[t * pw + r] = v;
  }
  __syncthreads();
}

template <class T, int MT>
__global__ void __launch_bounds__(32 * kRegWarps, 2)
    gemv_reg_local_kernel(const T* x, const T* w, T* y, int m, int n, int k, int pw) {
  extern __shared__ __align__(16) float fsmem[];
  const int parts = (n + pw - 1) / pw;
  for (int p = static_cast<int>(blockIdx.x); p < parts; p += static_cast<int>(gridDim.x)) {
    const int row0 = p * pw;
    reg_part<T, MT, kRegWarps>(x, w, m, n, k, row0, pw, fsmem);
    const float* part = fsmem + RegCfg<MT, kRegWarps>::kRed;
    const int lpt = pw / 4;
    for (int i = threadIdx.x; i < m * lpt; i += 32 * kRegWarps) {
      const int t = i / lpt, lr = 4 * (i % lpt), j = row0 + lr;
      if (j < n)
        *reinterpret_cast<uint64_t*>(y + static_cast<size_t>(t) * n + j) = gemv::pack4<T>(part + t * pw + lr);
    }
    __syncthreads();  // part is read before the next part overwrites it
  }
}

// The fused call for m <= kGemvSmallM: the local kernel's parts (pw rows) and residency (two
// CTAs per SM), CTA kc owning parts kc, kc + a.ctas, ... (the small state set's grid and owners,
// gemv_ar_kernels.hpp).
template <class T, int MT>
__global__ void __launch_bounds__(32 * kRegWarps, 2)
    gemv_reg_fused_kernel(const __grid_constant__ dev::DeviceCtx c, const __grid_constant__ GemvArgs a, int pw) {
  extern __shared__ __align__(16) float fsmem[];
  float* scratch = fsmem + reg_part_floats<MT, kRegWarps>(pw);
  const int kc = static_cast<int>(blockIdx.x);
  const uint64_t e = gemv::epoch_begin(c, a, kc);
  const dev::CoopCta g;
  const int parts = (a.n + pw - 1) / pw;
  for (int p = kc; p < parts; p += a.ctas) {
    const int row0 = p * pw;
    reg_part<T, MT, kRegWarps>(static_cast<const T*>(a.x), static_cast<const T*>(a.w), a.m, a.n, a.k, row0, pw, fsmem);
    const float* part = fsmem + RegCfg<MT, kRegWarps>::kRed;
    gemv::push_part<T>(g, c, a, e, pw, row0, std::min(a.n, row0 + pw), [&](int t, int j, float* v) {
      const float* src = part + t * pw + (j - row0);
      v[0] = src[0];
      v[1] = src[1];
      v[2] = src[2];
      v[3] = src[3];
    });
    __syncthreads();  // part is read before the next part overwrites it
  }
  gemv::finish<T>(g, c, a, kc, pw, e, scratch);
  gemv::epoch_end(g, c, a, kc, e);
}

// Unfused epilogue: one CTA per token row; 16-byte vectors (n % 8 == 0, 16-byte aligned rows).
// A thread's vectors are v = tid, tid + kNormThreads, ...; each pass takes them kNormBatch at a
// time, every load of a batch issued before the first is used (the stores to ro / out may alias
// nothing the loads read but the compiler cannot know: without the batches each vector's loads
// waited for the previous vector's store, one memory latency per vector). The sum of squares
// adds the values in the same order as one vector at a time (increasing v, then element).
// residual may be residual_out (in place): a vector's store follows its own loads only.
constexpr int kNormThreads = 256;
constexpr int kNormBatch = 4;  // n <= 8 * kNormThreads * kNormBatch (8192): one batch a pass

// f(v, a, b) for each of this thread's vectors v (tid, tid + kNormThreads, ... < vecs), with
// a = x[v] and b = w[v]: kNormBatch at a time, every load of a batch before the first f.
template <class F>
__device__ __forceinline__ void norm_pass(const uint4* x, const uint4* w, int vecs, F f) {
  for (int v0 = static_cast<int>(threadIdx.x); v0 < vecs; v0 += kNormBatch * kNormThreads) {
    uint4 a[kNormBatch], b[kNormBatch];
#pragma unroll
    for (int u = 0; u < kNormBatch; ++u)
      if (const int v = v0 + u * kNormThreads; v < vecs) {
        a[u] = x[v];
        b[u] = w[v];
      }
#pragma unroll
    for (int u = 0; u < kNormBatch; ++u)
      if (const int v = v0 + u * kNormThreads; v < vecs) f(v, a[u], b[u]);
  }
}

template <class T>
__global__ void __launch_bounds__(kNormThreads)
    add_rmsnorm_kernel(const T* y, const T* res, const T* gamma, T* ro, T* out, int n, float eps) {
  __shared__ float warp_sums[kNormThreads / 32];
  const size_t row = static_cast<size_t>(blockIdx.x) * n;
  const int vecs = n / 8;
  uint4* rov = reinterpret_cast<uint4*>(ro + row);
  uint4* ov = reinterpret_cast<uint4*>(out + row);
  float sq = 0.f;
  norm_pass(reinterpret_cast<const uint4*>(y + row), reinterpret_cast<const uint4*>(res + row), vecs,
            [&](int v, uint4 a, uint4 b) {
              T ea[8], eb[8];
              __builtin_memcpy(ea, &a, 16);
              __builtin_memcpy(eb, &b, 16);
              for (int i = 0; i < 8; ++i) {
                ea[i] = dev::from_float<T>(dev::to_float(ea[i]) + dev::to_float(eb[i]));
                const float f = dev::to_float(ea[i]);
                sq += f * f;
              }
              __builtin_memcpy(&a, ea, 16);
              rov[v] = a;
            });
  for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = sq;
  __syncthreads();
  float total = 0.f;
  for (int wi = 0; wi < kNormThreads / 32; ++wi) total += warp_sums[wi];
  const float inv = 1.0f / sqrtf(total / static_cast<float>(n) + eps);
  norm_pass(rov, reinterpret_cast<const uint4*>(gamma), vecs, [&](int v, uint4 a, uint4 b) {
    T ea[8], eb[8];
    __builtin_memcpy(ea, &a, 16);
    __builtin_memcpy(eb, &b, 16);
    for (int i = 0; i < 8; ++i) ea[i] = dev::from_float<T>(dev::to_float(ea[i]) * inv * dev::to_float(eb[i]));
    __builtin_memcpy(&a, ea, 16);
    ov[v] = a;
  });
}

// ---- launch helpers ------------------------------------------------------------------------
bool has_clusters(int device) {
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  return major >= 9;
}
int kchunk_for(int k, int S) { return ((k + S - 1) / S + kKC - 1) / kKC * kKC; }

template <class T, int MT>
size_t fused_smem(const GemvArgs& a, int S) {
  const int per_cta = gemv::max_parts_per_cta(a.n, kBN / S, a.ctas);
  return TileCfg<MT>::kSmem +
         sizeof(float) * static_cast<size_t>(gemv::scratch_floats(a.m_max, per_cta, kBN / S, kThreads));
}

// Lets the kernel use up to the device's opt-in shared memory: once per instantiation (not a
// stream operation, but done before any capture can start: the first call of a shape).
template <auto Kernel>
cudaError_t allow_smem() {
  static const cudaError_t once = [] {
    int device = 0, max = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&max, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max);
    return e;
  }();
  return once;
}

// A launch attribute: clusters of S CTAs along x.
cudaLaunchAttribute cluster_attr(int S) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(S);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  return attr;
}

// Clusters of S CTAs of Kernel (`threads` threads, smem bytes each) resident at once on this
// device (S = 1: CTAs); 0 when a query fails.
template <auto Kernel>
int resident_clusters(int S, size_t smem, int device, int threads = kThreads) {
  if (allow_smem<Kernel>() != cudaSuccess) return 0;
  if (S == 1) {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, Kernel, threads, smem) != cudaSuccess) return 0;
    return per_sm * sm_count(device);
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(S * 32));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr = cluster_attr(S);
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  return cudaOccupancyMaxActiveClusters(&clusters, Kernel, &cfg) == cudaSuccess ? clusters : 0;
}

// The K split of n columns (tiles of bm rows): the cluster size S in {1, 2, 4} with the
// lowest cost rounds * (1 / S + kRoundCost), rounds = tiles / resident clusters rounded up
// (resident: what the hardware reports, not sms / S -- clusters are placed within a GPC, so
// 132 SMs at one CTA each hold 30 clusters of 4, not 33), the smaller S on ties. kRoundCost, a
// round's fixed cost (launch, ring fill, the cluster's sum and stores) against streaming the
// whole K, and the candidates are measured (docs/gemv_ar.md, "K split"): on 2 x H200 S = 2 won
// or tied at N = 4096 and 8192 for K / rank 2048 .. 7168, where rounds / S alone chose S = 8
// (two rounds of 16 clusters of 8), 1.6-2.1x slower; S = 8 was never the fastest.
constexpr double kRoundCost = 0.25;
template <auto Kernel>
int cluster_for(int n, size_t smem, int device, int threads = kThreads, int bm = kBN) {
  if (!has_clusters(device)) return 1;
  static const int64_t forced = tunable_value(tunables::kGemvCluster);  // read once: launches stay cheap
  if (forced != 0) {
    WEFT_REQUIRE(forced == 1 || forced == 2 || forced == 4 || forced == 8,
                 "WEFT_GEMV_CLUSTER must be 0, 1, 2, 4 or 8 (every CTA of a cluster finishes whole lines)");
    return static_cast<int>(forced);
  }
  // Once per kernel (its smem is fixed; the GPUs of a process are taken to be alike).
  static const auto resident = [&] {
    std::array<int, 3> r{};
    for (int i = 0; i < 3; ++i) r[static_cast<size_t>(i)] = resident_clusters<Kernel>(1 << i, smem, device, threads);
    return r;
  }();
  const int tiles = (n + bm - 1) / bm;
  int best = 1;
  double best_cost = 0;
  for (int i = 0; i < 3; ++i) {
    const int S = 1 << i, c = resident[static_cast<size_t>(i)];
    if (c < 1) continue;
    const int rounds = (tiles + c - 1) / c;
    const double cost = rounds * (1.0 / S + kRoundCost);
    if (best_cost == 0 || cost < best_cost) {
      best = S;
      best_cost = cost;
    }
  }
  return best;
}
// Rows per tile and the K split of a call.
struct TileShape {
  int bm;  // rows of W per tile (the wgmma path: 128 or 64; the mma.sync path: kBN)
  int S;   // CTAs per cluster splitting K
};
// The fused call's tile shape: the same for every m (its grid and parts are), from the
// residency of the largest token tile's local kernel (the fused kernel adds a little scratch).
TileShape fused_shape(int n, int device);

template <auto Kernel, class... Args>
cudaError_t launch_threads(int grid, int S, int threads, size_t smem, cudaStream_t s, Args... args) {
  cudaError_t err = allow_smem<Kernel>();
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr = cluster_attr(S);
  cfg.attrs = &attr;
  cfg.numAttrs = S > 1 ? 1 : 0;
  err = cudaLaunchKernelEx(&cfg, Kernel, args...);
  return err != cudaSuccess ? err : cudaGetLastError();
}
template <auto Kernel, class... Args>
cudaError_t launch(int grid, int S, size_t smem, cudaStream_t s, Args... args) {
  return launch_threads<Kernel>(grid, S, kThreads, smem, s, args...);
}

// m <= 16: the register path, parts of 16 rows (one row tile, the 8 warps splitting K), as
// many CTAs as are resident, each taking parts p, p + grid, ...
template <class T, int MT>
cudaError_t reg_local(const GemvArgs& a, cudaStream_t s) {
  constexpr int pw = kRegPw;
  static const int resident = [] {
    int device = 0;
    return cudaGetDevice(&device) != cudaSuccess ? 0
                                                 : resident_clusters<gemv_reg_local_kernel<T, MT>>(
                                                       1, sizeof(float) * reg_part_floats<MT, kRegWarps>(pw), device);
  }();
  if (resident < 1) return cudaErrorInvalidConfiguration;
  const int grid = std::min((a.n + pw - 1) / pw, resident);
  return launch_threads<gemv_reg_local_kernel<T, MT>>(
      grid, 1, 32 * kRegWarps, sizeof(float) * reg_part_floats<MT, kRegWarps>(pw), s, static_cast<const T*>(a.x),
      static_cast<const T*>(a.w), static_cast<T*>(a.y), a.m, a.n, a.k, pw);
}

// The wgmma path's tile shape for n columns: tiles of 128 rows with cluster_for's K split,
// unless that grid has fewer CTAs than 3/4 of the SMs -- then tiles of 64 rows (one consumer
// warpgroup, twice the tiles): at N = 4096, 32 tiles in clusters of 2 left half the SMs idle.
template <class T, int MT>
TileShape wg_shape(int n, int device) {
  using C128 = wg::Cfg<128, MT>;
  using C64 = wg::Cfg<64, MT>;
  const int s128 = cluster_for<wg::local_kernel<T, 128, MT>>(n, C128::kSmem, device, C128::kThreads, 128);
  if (4 * ((n + 127) / 128) * s128 >= 3 * sm_count(device)) return {128, s128};
  return {64, cluster_for<wg::local_kernel<T, 64, MT>>(n, C64::kSmem, device, C64::kThreads, 64)};
}

TileShape fused_shape(int n, int device) {
  if (gemm_sm90_available()) return wg_shape<dev::bf16_t, 128>(n, device);
  return {kBN, cluster_for<gemv_local_kernel<dev::bf16_t, 128>>(n, TileCfg<128>::kSmem, device)};
}

// The tensor maps of a wgmma-path call: W [n, k] in boxes of bm rows, x [m, k] in boxes of MT
// tokens, 64 k each. False: TMA refused them (pointers not 16-byte aligned).
template <class T, int MT>
bool wg_maps(wg::Maps* maps, const GemvArgs& a, int bm) {
  const CUtensorMapDataType type =
      std::is_same_v<T, dev::bf16_t> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return tma::make_map(&maps->w, type, a.w, a.n, a.k, a.k, bm, wg::kBK) &&
         tma::make_map(&maps->x, type, a.x, a.m, a.k, a.k, MT, wg::kBK);
}

template <int BM, int MT>
size_t wg_fused_smem(const GemvArgs& a, int S) {
  const int per_cta = gemv::max_parts_per_cta(a.n, BM / S, a.ctas);
  return wg::Cfg<BM, MT>::kSmem +
         sizeof(float) * static_cast<size_t>(gemv::scratch_floats(a.m_max, per_cta, BM / S, wg::Cfg<BM, MT>::kThreads));
}

template <class T, int BM, int MT>
cudaError_t wg_local(const GemvArgs& a, int S, cudaStream_t s) {
  using C = wg::Cfg<BM, MT>;
  wg::Maps maps{};
  if (!wg_maps<T, MT>(&maps, a, BM)) return cudaErrorInvalidValue;
  LocalParams p{a.x, a.w, a.y, a.m, a.n, a.k, S, kchunk_for(a.k, S)};
  const int grid = (a.n + BM - 1) / BM * S;
  return launch_threads<wg::local_kernel<T, BM, MT>>(grid, S, C::kThreads, C::kSmem, s, p, maps);
}

template <class T, int BM, int MT>
cudaError_t wg_fused(const dev::DeviceCtx& c, const GemvArgs& a, int S, cudaStream_t s) {
  wg::Maps maps{};
  if (!wg_maps<T, MT>(&maps, a, BM)) return cudaErrorInvalidValue;
  return launch_threads<wg::fused_kernel<T, BM, MT>>(a.ctas, S, wg::Cfg<BM, MT>::kThreads, wg_fused_smem<BM, MT>(a, S),
                                                     s, c, a, maps, S, kchunk_for(a.k, S));
}

template <class T, int MT>
cudaError_t local_mt(const GemvArgs& a, cudaStream_t s) {
  if constexpr (MT <= 16) {
    return reg_local<T, MT>(a, s);
  } else {  // (not instantiated for the register path's token tiles)
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    if (gemm_sm90_available()) {
      const TileShape sh = wg_shape<T, MT>(a.n, device);
      return sh.bm == 128 ? wg_local<T, 128, MT>(a, sh.S, s) : wg_local<T, 64, MT>(a, sh.S, s);
    }
    LocalParams p{a.x, a.w, a.y, a.m, a.n, a.k, cluster_for<gemv_local_kernel<T, MT>>(a.n, TileCfg<MT>::kSmem, device),
                  0};
    p.kchunk = kchunk_for(a.k, p.S);
    const int grid = (a.n + kBN - 1) / kBN * p.S;
    return launch<gemv_local_kernel<T, MT>>(grid, p.S, TileCfg<MT>::kSmem, s, p);
  }
}

template <int MT>
size_t reg_fused_smem(int n, int m_max, int ctas) {
  return sizeof(float) * static_cast<size_t>(reg_part_floats<MT, kRegWarps>(kRegPw) +
                                             gemv::scratch_floats(m_max, gemv::max_parts_per_cta(n, kRegPw, ctas),
                                                                  kRegPw, 32 * kRegWarps));
}

template <class T, int MT>
cudaError_t fused_mt(const dev::DeviceCtx& c, const GemvArgs& a, cudaStream_t s) {
  if constexpr (MT <= kGemvSmallM) {  // the small state set (gemv_ar_fused_small_ctas's grid)
    return launch_threads<gemv_reg_fused_kernel<T, MT>>(a.ctas, 1, 32 * kRegWarps,
                                                        reg_fused_smem<MT>(a.n, a.m_max, a.ctas), s, c, a, kRegPw);
  } else {
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    const TileShape sh = fused_shape(a.n, device);
    const int S = sh.S;
    if (a.ctas % S != 0) return cudaErrorInvalidValue;  // not gemv_ar_fused_ctas's grid
    if (gemm_sm90_available()) return sh.bm == 128 ? wg_fused<T, 128, MT>(c, a, S, s) : wg_fused<T, 64, MT>(c, a, S, s);
    return launch<gemv_ar_fused_kernel<T, MT>>(a.ctas, S, fused_smem<T, MT>(a, S), s, c, a, S, kchunk_for(a.k, S));
  }
}

// The token tile: m rounded up to 8, 16, 32, 64 or 128.
template <class T, template <class, int> class F, class... Args>
cudaError_t by_mt(int m, Args&&... args) {
  if (m <= 8) return F<T, 8>::run(args...);
  if (m <= 16) return F<T, 16>::run(args...);
  if (m <= 32) return F<T, 32>::run(args...);
  if (m <= 64) return F<T, 64>::run(args...);
  return F<T, 128>::run(args...);
}
template <class T, int MT>
struct LocalF {
  static cudaError_t run(const GemvArgs& a, cudaStream_t s) { return local_mt<T, MT>(a, s); }
};
template <class T, int MT>
struct FusedF {
  static cudaError_t run(const dev::DeviceCtx& c, const GemvArgs& a, cudaStream_t s) {
    return fused_mt<T, MT>(c, a, s);
  }
};

bool shape_ok(const GemvArgs& a) {
  return a.m >= 1 && a.m <= 128 && a.n >= 8 && a.n % 8 == 0 && a.k >= 8 && a.k % 8 == 0;
}

}  // namespace

int gemv_ar_fused_ctas(int n, int device) {
  const TileShape sh = fused_shape(n, device);
  const int S = sh.S;
  const int slices = (n + sh.bm - 1) / sh.bm;
  const bool wgp = gemm_sm90_available();
  // Residency of the largest instantiation (m = 128) bounds every call's grid: the grid is the
  // same for every m (the epochs and the parts' owners are per CTA index). The scratch grows
  // with the parts per CTA, so the grid is checked again with the scratch it will have.
  int ctas = slices * S;
  for (;;) {  // ctas only shrinks (more scratch never fits more clusters): this ends
    GemvArgs probe{};
    probe.n = n;
    probe.m_max = 128;
    probe.ctas = ctas;
    const size_t smem = !wgp           ? fused_smem<dev::bf16_t, 128>(probe, S)
                        : sh.bm == 128 ? wg_fused_smem<128, 128>(probe, S)
                                       : wg_fused_smem<64, 128>(probe, S);
    int device_max = 0;
    if (cudaDeviceGetAttribute(&device_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess ||
        smem > static_cast<size_t>(device_max))
      return 0;
    const int clusters =
        !wgp ? resident_clusters<gemv_ar_fused_kernel<dev::bf16_t, 128>>(S, smem, device)
        : sh.bm == 128
            ? resident_clusters<wg::fused_kernel<dev::bf16_t, 128, 128>>(S, smem, device, wg::Cfg<128, 128>::kThreads)
            : resident_clusters<wg::fused_kernel<dev::bf16_t, 64, 128>>(S, smem, device, wg::Cfg<64, 128>::kThreads);
    if (clusters < 1) return 0;
    const int fit = std::min(clusters, slices) * S;
    if (fit >= ctas) break;
    ctas = fit;  // fewer CTAs: more parts each; check that grid again with its scratch
  }
  return ctas;
}

int gemv_ar_fused_small_ctas(int n, int m_max, int device) {
  if (m_max < 1 || m_max > kGemvSmallM) return 0;
  const int parts = gemv::parts_of(n, kRegPw);
  // Residency of every instantiation with the scratch of the grid it will have.
  auto resident = [&](int ctas) {
    const size_t s8 = reg_fused_smem<8>(n, m_max, ctas), s16 = reg_fused_smem<16>(n, m_max, ctas);
    return std::min({resident_clusters<gemv_reg_fused_kernel<dev::bf16_t, 8>>(1, s8, device),
                     resident_clusters<gemv_reg_fused_kernel<dev::bf16_t, 16>>(1, s16, device),
                     resident_clusters<gemv_reg_fused_kernel<dev::f16_t, 8>>(1, s8, device),
                     resident_clusters<gemv_reg_fused_kernel<dev::f16_t, 16>>(1, s16, device)});
  };
  int ctas = parts;
  for (;;) {  // ctas only shrinks (more parts per CTA never fits more CTAs): this ends
    const int fit = std::min(parts, resident(ctas));
    if (fit < 1) return 0;
    if (fit >= ctas) break;
    ctas = fit;
  }
  return ctas;
}

cudaError_t gemv_local(const GemvArgs& a, dev::DType t, cudaStream_t s) {
  if (!shape_ok(a)) return cudaErrorInvalidValue;
  if (t == dev::DType::kBF16) return by_mt<dev::bf16_t, LocalF>(a.m, a, s);
  if (t == dev::DType::kF16) return by_mt<dev::f16_t, LocalF>(a.m, a, s);
  return cudaErrorInvalidValue;
}

cudaError_t gemv_ar_fused(const dev::DeviceCtx& c, const GemvArgs& a, dev::DType t, cudaStream_t s) {
  if (!shape_ok(a) || a.m > a.m_max || a.ctas < 1) return cudaErrorInvalidValue;
  if (t == dev::DType::kBF16) return by_mt<dev::bf16_t, FusedF>(a.m, c, a, s);
  if (t == dev::DType::kF16) return by_mt<dev::f16_t, FusedF>(a.m, c, a, s);
  return cudaErrorInvalidValue;
}

cudaError_t add_rmsnorm(const void* y, const void* residual, const void* gamma, void* residual_out, void* out, int m,
                        int n, float eps, dev::DType t, cudaStream_t s) {
  if (m < 1 || n < 8 || n % 8 != 0) return cudaErrorInvalidValue;
  if (t == dev::DType::kBF16)
    add_rmsnorm_kernel<dev::bf16_t>
        <<<m, kNormThreads, 0, s>>>(static_cast<const dev::bf16_t*>(y), static_cast<const dev::bf16_t*>(residual),
                                    static_cast<const dev::bf16_t*>(gamma), static_cast<dev::bf16_t*>(residual_out),
                                    static_cast<dev::bf16_t*>(out), n, eps);
  else if (t == dev::DType::kF16)
    add_rmsnorm_kernel<dev::f16_t>
        <<<m, kNormThreads, 0, s>>>(static_cast<const dev::f16_t*>(y), static_cast<const dev::f16_t*>(residual),
                                    static_cast<const dev::f16_t*>(gamma), static_cast<dev::f16_t*>(residual_out),
                                    static_cast<dev::f16_t*>(out), n, eps);
  else
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

}  // namespace weft::kernels
