// weft's GEMM: the sm_90a kernel (TMA + mbarrier ring + WGMMA, warp-specialised,
// persistent), the portable kernel, and the launcher. See include/weft/kernels/gemm.hpp.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "tensor_map.hpp"
#include "weft/core/env.hpp"
#include "weft/device/ptx/arch.cuh"
#include "weft/device/ptx/bar.cuh"
#include "weft/device/ptx/cluster.cuh"
#include "weft/device/ptx/fence.cuh"
#include "weft/device/ptx/launch_control.cuh"
#include "weft/device/ptx/mbarrier.cuh"
#include "weft/device/ptx/memory_order.cuh"
#include "weft/device/ptx/prefetch.cuh"
#include "weft/device/ptx/sreg.cuh"
#include "weft/device/ptx/tma.cuh"
#include "weft/device/ptx/wgmma.cuh"
#include "weft/device/tile/notify.hpp"
#include "weft/device/tile/wait.hpp"
#include "weft/kernels/gemm.hpp"
#include "weft/kernels/runtime_kernels.hpp"

namespace weft::kernels {
namespace {

constexpr int BM = kGemmTileM, BN = kGemmTileN, BK = kGemmTileK;
// The ring: BKV-deep k-blocks. 64: 4 stages of 48 KiB, 128-byte swizzle; 32: 8 stages of
// 24 KiB, 64-byte swizzle (A, W[N,K]) -- the same bytes in flight, in finer steps, so fewer
// of them are tied up by the k-block being multiplied and the one awaiting release.
template <int BKV>
struct Ring {
  static constexpr int kStages = BKV == 64 ? 4 : 8;
  static constexpr int kAStage = BM * BKV * 2;
  static constexpr int kBStage = BN * BKV * 2;
  static constexpr int kRow = BKV * 2;  // bytes of a K-major row in shared memory (= the swizzle span)
};
constexpr int kStages = 4;
constexpr int kConsumers = 2;                     // warpgroups of 64 rows each
constexpr int kThreads = 128 * (kConsumers + 1);  // + the producer warpgroup
constexpr int kAStage = BM * BK * 2;              // bytes: 16 KiB
constexpr int kBStage = BN * BK * 2;              // 32 KiB
constexpr int kEpiCols = 128;                     // epilogue: a half tile (64 x 128) per warpgroup at a time
constexpr int kEpiBytes = 64 * kEpiCols * 2;      // 16 KiB per consumer warpgroup
constexpr int kSmemBytes = kStages * (kAStage + kBStage) + kConsumers * kEpiBytes + 1024 /*align*/ + 256 /*barriers*/;
static_assert(Ring<32>::kStages * (Ring<32>::kAStage + Ring<32>::kBStage) == kStages * (kAStage + kBStage));
static_assert(Ring<32>::kRow == 64 && Ring<64>::kRow == 128, "a K-major row is one swizzle span");
static_assert(Ring<64>::kStages == kStages && Ring<64>::kAStage == kAStage && Ring<64>::kBStage == kBStage);

struct TensorMaps {
  CUtensorMap a;
  CUtensorMap b;
  CUtensorMap c[kGemmMaxDests];
  CUtensorMap src;  // source 0, when src_tma: read into the epilogue buffer by TMA
  CUtensorMap a2;   // rows [a2_row0, a2_row0 + a2_rows) of A, when a2_rows > 0
};

struct KernelParams {
  int m, n, k;
  int tiles_m, tiles_n, num_positions;
  int group_m;
  int cluster;     // 1, or 2: CTA pairs on M-blocks (2i, 2i+1) of one N-block share B by multicast
  int k_block;     // 64 (4 stages) or 32 (8 stages, single CTAs)
  int b_kn;        // B is [K, N]
  int reduce_add;  // reduce-add instead of store
  int direct_c;    // C's rows are not 16-byte multiples: store from registers, not TMA
  void* c[kGemmMaxDests];
  int64_t ldc;
  int64_t c_row0[kGemmMaxDests];
  int64_t c_rows[kGemmMaxDests];
  const void* src[kGemmMaxSrcs];  // epilogue sources (GemmArgs::src)
  int num_src;
  int64_t ld_src;
  int src_tma;              // source 0 through TMA into the epilogue buffer (the others: register loads)
  int src_row0, src_rows;   // GemmArgs::src_row0 / src_rows (src_rows resolved: > 0)
  int a2_row0, a2_rows;     // GemmArgs::a2's rows (a2_rows 0: none)
  const int32_t* group_of;  // GemmArgs::group_of (null: one B)
  // GemmArgs::swiglu: a tile is 128 output columns from 128 gate and 128 up rows of B (the
  // second B box starts n rows after the first); a group's B is 2n rows.
  int swiglu;
  int tile_cols;            // output columns a tile: 256, or 128 with swiglu
  int b_second;             // rows from a tile's first B box to its second: 128, or n with swiglu
  int group_rows;           // rows of B a group: n, or 2n with swiglu
  const uint64_t* row_dst;  // GemmArgs::row_dst (null: C by destination)
  GemmHooks hooks;
};

// Groups of `group` rows of a rows x cols grid, cols inner, rows innermost (L2 reuse).
__host__ __device__ inline void raster(int pos, int rows, int cols, int group, int& r, int& c) {
  const int per_group = group * cols;
  const int first = (pos / per_group) * group;
  const int gsize = rows - first < group ? rows - first : group;
  const int in = pos % per_group;
  r = first + in % gsize;
  c = in / gsize;
}

// Tile of schedule position `pos`: from the order table, or the closed-form raster (with
// clusters, over M-block pairs; position 2q + c is M-block 2*pair + c). An M-block at or past
// tiles_m is a phantom (the odd pair's partner): it loads and multicasts, stores nothing.
// M-block and N-block of tile id `id` (m_block * tiles_n + n_block: GemmHooks::order's entries).
__host__ __device__ inline void tile_of_id(const KernelParams& p, int id, int& mb, int& nb) {
  mb = id / p.tiles_n;
  nb = id % p.tiles_n;
}
__host__ __device__ inline void tile_coords(const KernelParams& p, int pos, int& mb, int& nb) {
  if (p.hooks.order) return tile_of_id(p, p.hooks.order[pos], mb, nb);
  if (p.cluster == 2) {
    int pm;
    raster(pos / 2, (p.tiles_m + 1) / 2, p.tiles_n, p.group_m / 2 > 0 ? p.group_m / 2 : 1, pm, nb);
    mb = 2 * pm + pos % 2;
    return;
  }
  raster(pos, p.tiles_m, p.tiles_n, p.group_m, mb, nb);
}

// Per-position hooks shared by both kernels.
__device__ inline void hook_wait(const KernelParams& p, int pos, int mb) {
  const GemmHooks& h = p.hooks;
  if (!h.wait_begin) return;
  const int at = h.wait_per_mblock ? mb : pos;
  // The op's epoch (the scale of every threshold), from device memory where a stream advances
  // it (ld_volatile_global says why not through a volatile pointer).
  uint64_t epoch = h.wait_scale;
  if (h.wait_scale_dev) epoch = ptx::ld_volatile_global(h.wait_scale_dev);
  for (int i = h.wait_begin[at]; i < h.wait_begin[at + 1]; ++i)
    // No printf in this kernel (see dev::fail_wait): a timeout reports through the slot.
    dev::tile::wait_chunk<false>(h.ctx, {h.wait_off, h.op}, h.wait_idx[i], h.wait_val[i], epoch,
                                 h.wait_peer ? h.wait_peer[i] : -1);
}
// Element (row, col) of source i as fp32 (L2, not L1: a peer may have just written it).
template <class T>
__device__ inline float src_elem(const KernelParams& p, int i, int64_t row, int64_t col) {
  const T* q = static_cast<const T*>(p.src[i]) + (row - p.src_row0) * p.ld_src + col;
  const unsigned short bits = __ldcg(reinterpret_cast<const unsigned short*>(q));
  return static_cast<float>(*reinterpret_cast<const T*>(&bits));
}
// Whether M-block mb's tiles add the sources (their rows lie in [src_row0, src_row0 + src_rows)).
__device__ inline bool has_src(const KernelParams& p, int mb) {
  const int r = mb * BM;
  return p.num_src > 0 && r >= p.src_row0 && r < p.src_row0 + p.src_rows;
}
// Grouped GEMM (GemmArgs::group_of): whether the tile of M-block mb and N-block nb runs, the
// first row of B (W[N,K]'s) this CTA multiplies by, and -- CTA pairs -- whether the pair shares
// that B by multicast. A CTA pair runs a position unless both of its M-blocks are skipped; the
// pair multicasts B where both M-blocks have the same group, else each CTA loads its own group's
// B (a skipped M-block beside a running one computes with its partner's B, stores nothing).
// Both CTAs of a pair reach the same verdict (they read the same two entries).
struct BTile {
  int row;
  bool run, shared;
};
template <int CM>
__device__ inline BTile b_tile(const KernelParams& p, int mb, int nb) {
  if (!p.group_of) return {nb * p.tile_cols, true, CM == 2};
  const int own = mb < p.tiles_m ? p.group_of[mb] : -1;
  if (CM == 1) return {own * p.group_rows + nb * p.tile_cols, own >= 0, false};
  const int mate = (mb ^ 1) < p.tiles_m ? p.group_of[mb ^ 1] : -1;
  const int g = own >= 0 ? own : mate;
  return {g * p.group_rows + nb * p.tile_cols, g >= 0, own == mate};
}
__device__ inline void hook_notify(const KernelParams& p, int pos) {
  const GemmHooks& h = p.hooks;
  if (!h.notify_idx) return;
  const int idx = h.notify_idx[pos];
  if (idx < 0) return;
  // A count on this GPU is read by its own kernels (e.g. the fused gemm_rs's piece waits,
  // before a copy of what it guards): released at GPU scope; a peer's at system scope.
  dev::tile::notify_chunk(h.ctx, {h.notify_off}, idx, h.notify_rank ? h.notify_rank[pos] : h.ctx.rank);
}
// Position pos's GemmHooks::dest entry (destination index | kGemmDestReduce; 0 without a
// table), its destination index, and whether it reduce-adds.
__device__ inline int8_t hook_dest_bits(const KernelParams& p, int pos) {
  return p.hooks.dest ? p.hooks.dest[pos] : int8_t{0};
}
__device__ inline int dest_index(int8_t bits) { return bits & (kGemmDestReduce - 1); }
__device__ inline bool dest_reduce(const KernelParams& p, int8_t bits) {
  return p.reduce_add || (bits & kGemmDestReduce);
}
// Programmatic dependent launch is for GEMMs without waits only: one that waits for another
// stream's work keeps the ordinary launch, so that neither it nor a successor holds SMs early
// that the work it waits for could need (docs/gemm.md: what was measured).
__host__ __device__ inline bool gemm_pdl(const GemmHooks& h) { return h.wait_begin == nullptr; }

// ---- sm_90a: helpers (the PTX wrappers: weft/device/ptx/) --------------------------------
#if defined(WEFT_PTX_SM90A)
// Whether position (mb)'s results are stored: not a phantom, not a skipped M-block.
__device__ inline bool stores_tile(const KernelParams& p, int mb) {
  return mb < p.tiles_m && (!p.group_of || p.group_of[mb] >= 0);
}
// The tile's waits (hook_wait), then the async-proxy fence: the TMA loads that follow read what
// the peers wrote.
__device__ __forceinline__ void hook_wait_for_tma(const KernelParams& p, int pos, int mb) {
  hook_wait(p, pos, mb);
  ptx::fence_proxy_async_global();
}

template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// d[i], d[i + 1] += the two elements packed in `bits` (a 4-byte load of C's type).
template <class T>
__device__ __forceinline__ void add_packed(float* d, int i, uint32_t bits) {
  T two[2];
  *reinterpret_cast<uint32_t*>(two) = bits;
  d[i] += static_cast<float>(two[0]);
  d[i + 1] += static_cast<float>(two[1]);
}

// Adds sources first .. num_src-1 to the accumulator half h (n8 blocks 16h .. 16h+15) of this
// thread: rows row and row + 8, columns col + 8 jj + {0, 1}. A source's 32 loads go out
// before its adds (one L2 latency); the consumers run at 168 registers, 128 of them the
// accumulators, which leaves room for these 32 and no more.
template <class T>
__device__ __forceinline__ void add_sources(const KernelParams& p, float* d, int h, int row, int col, int first) {
#pragma unroll 1
  for (int i = first; i < p.num_src; ++i) {
    const T* base = static_cast<const T*>(p.src[i]);
    uint32_t v[32];
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int rr = row + 8 * e, cc = col + 8 * (16 * h + j);
        const T* a = base + static_cast<int64_t>(rr - p.src_row0) * p.ld_src + cc;
        v[2 * j + e] = rr >= p.m || cc >= p.n ? 0u
                       : cc + 1 < p.n         ? __ldcg(reinterpret_cast<const unsigned int*>(a))
                                      : static_cast<uint32_t>(__ldcg(reinterpret_cast<const unsigned short*>(a)));
      }
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) add_packed<T>(d, 4 * (16 * h + j) + 2 * e, v[2 * j + e]);
  }
}
#endif

// ---- sm_90a kernel ---------------------------------------------------------------------
// CM = 2: launched as clusters of two CTAs taking positions 2q and 2q+1 (M-blocks 2i, 2i+1
// of one N-block); each producer loads its own A and half of B, multicasting that half into
// both CTAs, so B crosses L2 once per pair. A stage is refilled only after the consumers of
// both CTAs released it (their arrivals go to both CTAs' `empty` barriers).
template <class T, int BKN, int CM, int BKV>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_sm90_kernel(const __grid_constant__ KernelParams p, const __grid_constant__ TensorMaps maps) {
#if defined(WEFT_PTX_SM90A)
  constexpr int kStages = Ring<BKV>::kStages, kAStage = Ring<BKV>::kAStage, kBStage = Ring<BKV>::kBStage;
  constexpr int kRow = Ring<BKV>::kRow, BK = BKV;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* sa = smem;                    // [kStages][BM][BK] swizzled
  uint8_t* sb = sa + kStages * kAStage;  // [kStages][BN][BK] (or 4 boxes [BK][64])
  uint8_t* se = sb + kStages * kBStage;  // [kConsumers][2 boxes][64][64]
  uint64_t* full = reinterpret_cast<uint64_t*>(se + kConsumers * kEpiBytes);
  uint64_t* empty = full + kStages;
  uint64_t* srcbar = empty + kStages;       // [kConsumers]: a source half-tile landed in epi
  uint64_t* waitbar = srcbar + kConsumers;  // the producer met the tile's waits (wait_at_epilogue)
  uint64_t* waitfree = waitbar + 1;         // both consumer warpgroups saw waitbar's last phase

  uint64_t* const tcta = p.hooks.trace_cta ? p.hooks.trace_cta + 4 * blockIdx.x : nullptr;
  if (tcta && threadIdx.x == 0) tcta[0] = ptx::globaltimer_ns();
  const int wg = threadIdx.x / 128;  // 0..kConsumers-1: consumers; kConsumers: producer
  const int tid = threadIdx.x % 128;
  const int kblocks = (p.k + BK - 1) / BK;
  const uint32_t crank = CM == 2 ? ptx::cluster_ctarank() : 0u;
  // Positions of this CTA: CTA-pairs walk pairs of positions.
  const int first =
      CM == 2 ? static_cast<int>(blockIdx.x / 2) * 2 + static_cast<int>(crank) : static_cast<int>(blockIdx.x);
  const int step = CM == 2 ? static_cast<int>(gridDim.x / 2) * 2 : static_cast<int>(gridDim.x);

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(&full[s], 1);
      ptx::mbarrier_init(&empty[s], kConsumers * 4 * CM);  // lane 0 of every consumer warp of the cluster
    }
    for (int w = 0; w < kConsumers; ++w) ptx::mbarrier_init(&srcbar[w], 1);
    ptx::mbarrier_init(waitbar, 1);
    ptx::mbarrier_init(waitfree, kConsumers);
    ptx::fence_mbarrier_init_release_cluster();
  }
  if (CM == 2)
    ptx::barrier_cluster_sync();
  else
    __syncthreads();
  if (tcta && threadIdx.x == 0) tcta[1] = ptx::globaltimer_ns();

  // GemmHooks::wait_at_epilogue: a second producer thread (warp 1), beside the one issuing the
  // loads, meets a tile's waits and arrives on waitbar; the main loop never waits for them, and
  // the wait table and signal loads never hold up the next tile's loads. The consumers wait
  // on waitbar (shared memory, once per position) two k-blocks before the epilogue, then read
  // the sources. The slow part -- the table and signal loads -- stays off the consumers.
  const bool epi_waits = p.hooks.wait_begin && p.hooks.wait_at_epilogue;
  if (wg == kConsumers) {
    // ---- producer ----
    ptx::setmaxnreg_dec<40>();
    // GemmHooks::wait_at_epilogue: meet position pos's waits and hand them to the consumers,
    // one waitbar phase per position, never ahead of them (waitfree: nothing else throttles this
    // thread, which would otherwise run positions ahead).
    auto hand_over_waits = [&](int pos, int mb, uint32_t& arrivals) {
      if (mb < p.tiles_m) hook_wait_for_tma(p, pos, mb);
      if (arrivals > 0) ptx::mbarrier_wait_parity(waitfree, (arrivals - 1) & 1u);
      ptx::mbarrier_arrive(waitbar);
      ++arrivals;
    };
    if (tid == 0) {
      ptx::prefetch_tensormap(&maps.a);
      ptx::prefetch_tensormap(&maps.b);
      // Everything above overlaps the previous kernel's tail under programmatic dependent
      // launch; the first global access (signals, A, B) waits for it.
      ptx::griddepcontrol_wait();
      uint32_t it = 0;
      for (int pos = first; pos < p.num_positions; pos += step) {
        int mb, nb;
        tile_coords(p, pos, mb, nb);
        const BTile bt = b_tile<CM>(p, mb, nb);
        if (!bt.run) continue;  // skipped M-blocks of a grouped GEMM (the consumers skip them too)
        if (p.hooks.wait_begin && mb < p.tiles_m && !epi_waits) hook_wait_for_tma(p, pos, mb);
        const bool a2 = p.a2_rows > 0 && mb * BM >= p.a2_row0 && mb * BM < p.a2_row0 + p.a2_rows;
        if (it == 0 && tcta) tcta[2] = ptx::globaltimer_ns();  // the first loads go out now (empty ring)
        for (int kb = 0; kb < kblocks; ++kb, ++it) {
          const int s = it % kStages;
          const uint32_t ph = (it / kStages) & 1u;
          ptx::mbarrier_wait_parity(&empty[s], ph ^ 1u);
          ptx::mbarrier_arrive_expect_tx(&full[s], kAStage + kBStage);
          if (a2)
            ptx::cp_async_bulk_tensor_2d_load(sa + s * kAStage, &maps.a2, &full[s], kb * BK, mb * BM - p.a2_row0);
          else
            ptx::cp_async_bulk_tensor_2d_load(sa + s * kAStage, &maps.a, &full[s], kb * BK, mb * BM);
          uint8_t* bs = sb + s * kBStage;
          if (CM == 2 && bt.shared) {
            // This CTA's half of B (128 of the 256 columns), into both CTAs.
            if (BKN) {
#pragma unroll
              for (int j = 2 * crank; j < 2 * crank + 2; ++j)
                ptx::cp_async_bulk_tensor_2d_load_multicast(bs + j * (64 * BK * 2), &maps.b, &full[s], nb * BN + j * 64,
                                                            kb * BK, 0x3);
            } else {
              ptx::cp_async_bulk_tensor_2d_load_multicast(bs + crank * (BN / 2) * kRow, &maps.b, &full[s], kb * BK,
                                                          bt.row + static_cast<int>(crank) * p.b_second, 0x3);
            }
          } else if (BKN) {
#pragma unroll
            for (int j = 0; j < BN / 64; ++j)
              ptx::cp_async_bulk_tensor_2d_load(bs + j * (64 * BK * 2), &maps.b, &full[s], nb * BN + j * 64, kb * BK);
          } else {
            // All of B into this CTA alone (single CTAs; a pair whose M-blocks' groups differ).
            ptx::cp_async_bulk_tensor_2d_load(bs, &maps.b, &full[s], kb * BK, bt.row);
            ptx::cp_async_bulk_tensor_2d_load(bs + (BN / 2) * kRow, &maps.b, &full[s], kb * BK, bt.row + p.b_second);
          }
        }
      }
    } else if (tid == 32 && epi_waits) {
      // The epilogue waits, position by position, beside the loads.
      ptx::griddepcontrol_wait();
      uint32_t arrivals = 0;
      for (int pos = first; pos < p.num_positions; pos += step) {
        int mb, nb;
        tile_coords(p, pos, mb, nb);
        if (!b_tile<CM>(p, mb, nb).run) continue;
        hand_over_waits(pos, mb, arrivals);
      }
    }
  } else {
    // ---- consumers ----
    ptx::setmaxnreg_inc<232>();
    ptx::griddepcontrol_wait();  // before any global access (sources, stores, counts)
    const int warp = tid / 32, lane = tid % 32;
    uint8_t* epi = se + wg * kEpiBytes;
    // Descriptors of stage 0 (this warpgroup's 64 rows of A; B).
    const uint64_t da0 = BKV == 64 ? ptx::wgmma_desc_sw128(ptx::smem_u32(sa + wg * (64 * kRow)), 16, 1024)
                                   : ptx::wgmma_desc_sw64(ptx::smem_u32(sa + wg * (64 * kRow)), 512);
    const uint64_t db0 = BKN         ? ptx::wgmma_desc_sw128(ptx::smem_u32(sb), 64 * BK * 2, 1024)
                         : BKV == 64 ? ptx::wgmma_desc_sw128(ptx::smem_u32(sb), 16, 1024)
                                     : ptx::wgmma_desc_sw64(ptx::smem_u32(sb), 512);
    float d[128];
    uint32_t it = 0;
    uint32_t src_uses = 0;  // completions of srcbar[wg] waited for
    // Source 0's half h of tile (mb, nb) into this warpgroup's epilogue buffer (tid 0), once the
    // buffer's previous store has been read.
    auto load_src_half = [&](int mb_, int nb_, int h) {
      ptx::cp_async_bulk_wait_group_read<0>();
      ptx::mbarrier_arrive_expect_tx(&srcbar[wg], kEpiBytes);
      const int x = nb_ * BN + h * kEpiCols, y = mb_ * BM + wg * 64 - p.src_row0;
      ptx::cp_async_bulk_tensor_2d_load(epi, &maps.src, &srcbar[wg], x, y);
      ptx::cp_async_bulk_tensor_2d_load(epi + 64 * 128, &maps.src, &srcbar[wg], x + 64, y);
    };
    auto release = [&](int s) {
      if (lane != 0) return;
      ptx::mbarrier_arrive(&empty[s]);
      if (CM == 2) ptx::mbarrier_arrive_cluster(&empty[s], crank ^ 1u);
    };
    // The k-block at which a tile's sources are first touched: 2 (early, under the main loop),
    // or, with waits at the epilogue, 2 before the last (once the producer met the waits).
    const int src_kb = epi_waits ? (kblocks > 2 ? kblocks - 2 : 0) : (kblocks > 2 ? 2 : kblocks - 1);
    uint32_t waits_met = 0;  // completions of waitbar waited for
    // GemmHooks::notify_deferred: the position whose notify waits for its stores to complete
    // (met 2 k-blocks before the end of the next position's main loop, before that position's
    // epilogue waits, or at the end), so the stores drain -- over NVLink, for a peer's buffer --
    // while the next tile computes. Uniform over the warpgroup; tid 0 notifies.
    int pending = -1;
    const int flush_late = kblocks > 2 ? kblocks - 2 : 0;
    const int flush_kb =
        p.hooks.notify_flush_kb > 0 && p.hooks.notify_flush_kb < flush_late ? p.hooks.notify_flush_kb : flush_late;
    auto flush_notify = [&]() {
      if (pending < 0) return;
      if (tid == 0) {
        ptx::cp_async_bulk_wait_group_publish();  // this warpgroup's stores of that tile are complete
        hook_notify(p, pending);
      }
      pending = -1;
    };
    // With an order table, each position's tile id is loaded one tile ahead (loaded at the
    // tile's start, order[pos] held up the next main loop: docs/gemm.md), and its destination
    // at the tile's start (not after the main loop).
    int next_id = p.hooks.order && first < p.num_positions ? p.hooks.order[first] : 0;
    for (int pos = first; pos < p.num_positions; pos += step) {
      int mb, nb;
      if (p.hooks.order) {
        tile_of_id(p, next_id, mb, nb);
        if (pos + step < p.num_positions) next_id = p.hooks.order[pos + step];
      } else {
        tile_coords(p, pos, mb, nb);
      }
      const bool tile_src = mb < p.tiles_m && has_src(p, mb);
      // Whether this position counts, and where it goes (read now, used after the main loop).
      const bool tile_notifies = p.hooks.notify_idx && mb < p.tiles_m && p.hooks.notify_idx[pos] >= 0;
      const int8_t dest_bits = hook_dest_bits(p, pos);
      // This CTA's last tile: the stream's next kernel may launch (programmatic dependent launch).
      if (pos + step >= p.num_positions && wg == 0 && gemm_pdl(p.hooks)) ptx::griddepcontrol_launch_dependents();
      if (!b_tile<CM>(p, mb, nb).run) continue;  // skipped M-blocks: the producer loaded nothing
#pragma unroll
      for (int i = 0; i < 128; ++i) d[i] = 0.f;
      for (int kb = 0; kb < kblocks; ++kb, ++it) {
        const int s = it % kStages;
        const uint32_t ph = (it / kStages) & 1u;
        ptx::mbarrier_wait_parity(&full[s], ph);
        if (kb == 0 && p.hooks.trace && wg == 0 && tid == 0) p.hooks.trace[3 * pos] = ptx::globaltimer_ns();
        if (it == 0 && tcta && wg == 0 && tid == 0) tcta[3] = ptx::globaltimer_ns();
        if (kb == flush_kb) flush_notify();
        if (kb == src_kb && epi_waits) {
          // The producer met this tile's waits (GemmHooks::wait_at_epilogue): the main loop ran
          // while the peers' data came; every thread's source reads come after this.
          ptx::mbarrier_wait_parity(waitbar, waits_met & 1u);
          ++waits_met;
          // Every thread of the warpgroup has seen this phase before waitfree lets the waiting
          // thread complete the next one: a thread still polling this phase's parity after two
          // more completions would see the parity come round and poll forever (hit on one H100
          // once the waits left the loading thread, which the ring had throttled).
          ptx::bar_sync(1 + wg, 128);
          if (tid == 0) {
            ptx::mbarrier_arrive(waitfree);
            ptx::fence_proxy_async_global();
          }
        }
        // Source 0's first half early, under the main loop (the previous tile's stores from the
        // buffer have long been read by k-block 2), or right after the waits.
        if (kb == src_kb && tile_src && p.src_tma) {
          if (tid == 0) load_src_half(mb, nb, 0);
          __syncwarp();
        }
        if (kb == (epi_waits ? src_kb : 0) && tile_src && !p.direct_c) {
          // The tile's sources into L2 (its waits are done: its first stage arrived), so the
          // epilogue's loads hit L2: this warpgroup's 64 rows x 512 bytes, 2 lines per thread.
          for (int i = 0; i < p.num_src; ++i)
#pragma unroll
            for (int l = 0; l < 2; ++l) {
              const int line = 2 * tid + l, row = mb * BM + wg * 64 + line / 4;
              const int col = nb * BN + (line % 4) * 64;
              if (row < p.m && col < p.n)
                ptx::prefetch_global_L2(static_cast<const T*>(p.src[i]) + (row - p.src_row0) * p.ld_src + col);
            }
        }
        // Stage s, step kk: the stage-0 descriptors plus offsets in 16-byte units (the start
        // address field; shared memory < 256 KiB, so it never carries into the next field).
        const uint64_t da_s = da0 + static_cast<uint64_t>(s) * (kAStage >> 4);
        const uint64_t db_s = db0 + static_cast<uint64_t>(s) * (kBStage >> 4);
        ptx::wgmma_fence();
        ptx::wgmma_fence_operand<128>(d);
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
          const uint64_t da = da_s + static_cast<uint64_t>(kk * 2);                   // 32 bytes of K
          const uint64_t db = db_s + static_cast<uint64_t>(BKN ? kk * 128 : kk * 2);  // kn: 16 rows of 128 bytes
          if constexpr (std::is_same_v<T, __nv_bfloat16>)
            ptx::wgmma_m64n256k16_bf16<BKN>(d, da, db, 1u);
          else
            ptx::wgmma_m64n256k16_f16<BKN>(d, da, db, 1u);
        }
        ptx::wgmma_commit_group();
        ptx::wgmma_fence_operand<128>(d);
        ptx::wgmma_wait_group<1>();
        if (kb > 0) release((it - 1) % kStages);
      }
      ptx::wgmma_wait_group<0>();
      ptx::wgmma_fence_operand<128>(d);
      if (kblocks > 0) release((it - 1) % kStages);
      if (!stores_tile(p, mb)) continue;  // phantom partner, skipped M-block: nothing to store

      const int dest = dest_index(dest_bits);
      const bool reduce = dest_reduce(p, dest_bits);
      const int r = warp * 16 + lane / 4;
      const int t0 = lane % 4;
      if (p.direct_c) {
        // ---- epilogue from registers (C rows not 16-byte multiples): element stores ----
        T* c = static_cast<T*>(p.c[dest]);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int64_t grow = static_cast<int64_t>(mb) * BM + wg * 64 + r + 8 * half;
          const int64_t lr = grow - p.c_row0[dest];
          if (grow >= p.m || lr < 0 || lr >= p.c_rows[dest]) continue;
#pragma unroll
          for (int jj = 0; jj < 32; ++jj)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int col = nb * BN + 8 * jj + 2 * t0 + e;
              if (col >= p.n) continue;
              T* out = c + lr * p.ldc + col;
              float acc = d[4 * jj + 2 * half + e];
              if (has_src(p, mb))
                for (int i = 0; i < p.num_src; ++i) acc += src_elem<T>(p, i, grow, col);
              const T v = static_cast<T>(acc);
              if (reduce)
                atomicAdd(out, v);
              else
                *out = v;
            }
        }
        if (p.hooks.notify_idx) {
          ptx::bar_sync(1 + wg, 128);
          if (tid == 0) {
            dev::fence_acq_rel();
            hook_notify(p, pos);
          }
        }
        continue;
      }
      // ---- epilogue: two halves of 64 x 128, each as two swizzled 64 x 64 boxes, TMA ----
      const CUtensorMap* cmap = &maps.c[dest];
      const int row0 = static_cast<int>(static_cast<int64_t>(mb) * BM + wg * 64 - p.c_row0[dest]);
      if (p.swiglu) {
        // Columns 0..127 of the accumulator are the gate's, 128..255 the up projection's for the
        // same output columns (n8 blocks j and j + 16 of this thread): each product rounded to
        // the type (the unfused path's h), then silu(gate) * up into the first half.
#pragma unroll
        for (int j = 0; j < 16; ++j)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const float g = static_cast<float>(static_cast<T>(d[4 * j + q]));
            const float u = static_cast<float>(static_cast<T>(d[4 * (j + 16) + q]));
            d[4 * j + q] = g / (1.f + __expf(-g)) * u;
          }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (h == 1 && p.swiglu) break;  // one half: 128 output columns
        if (p.src_tma && tile_src) {
          // Source 0's half h is (or, for h = 1, is now being) loaded into the buffer, in the
          // layout this thread writes: add what sits at the addresses it is about to write.
          if (h == 1 && tid == 0) load_src_half(mb, nb, 1);
          ptx::mbarrier_wait_parity(&srcbar[wg], src_uses & 1u);
          ++src_uses;
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            const uint8_t* box = epi + (j / 8) * (64 * 128);
            const int chunk = (j % 8) ^ (r % 8);
#pragma unroll
            for (int e = 0; e < 2; ++e)
              add_packed<T>(d, 4 * (h * 16 + j) + 2 * e,
                            *reinterpret_cast<const uint32_t*>(box + (r + 8 * e) * 128 + chunk * 16 + t0 * 4));
          }
          if (p.num_src > 1) add_sources<T>(p, d, h, mb * BM + wg * 64 + r, nb * BN + 2 * t0, 1);
        } else {
          if (tile_src) add_sources<T>(p, d, h, mb * BM + wg * 64 + r, nb * BN + 2 * t0, 0);
          if (tid == 0) ptx::cp_async_bulk_wait_group_read<0>();  // the previous store from this buffer has been read
          ptx::bar_sync(1 + wg, 128);
        }
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const int jj = h * 16 + j;  // n8 block of the accumulator
          uint8_t* box = epi + (j / 8) * (64 * 128);
          const int chunk = (j % 8) ^ (r % 8);
          *reinterpret_cast<uint32_t*>(box + r * 128 + chunk * 16 + t0 * 4) = pack2<T>(d[4 * jj + 0], d[4 * jj + 1]);
          *reinterpret_cast<uint32_t*>(box + (r + 8) * 128 + chunk * 16 + t0 * 4) =
              pack2<T>(d[4 * jj + 2], d[4 * jj + 3]);
        }
        if (p.row_dst) {
          // GemmArgs::row_dst: 16 threads a row, each a 16-byte piece (the swizzle undone),
          // rows in turn: 256 contiguous bytes of a destination row per 16 threads.
          ptx::bar_sync(1 + wg, 128);
          const int col0 = nb * p.tile_cols + h * kEpiCols;
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const int idx = tid + 128 * i, rr = idx / 16, q = idx % 16;
            const int64_t grow = static_cast<int64_t>(mb) * BM + wg * 64 + rr;
            const int col = col0 + (q / 8) * 64 + (q % 8) * 8;
            if (grow >= p.m || col >= p.n) continue;
            const uint64_t to = p.row_dst[grow];
            if (to == 0) continue;
            const uint4 v =
                *reinterpret_cast<const uint4*>(epi + (q / 8) * (64 * 128) + rr * 128 + ((q % 8) ^ (rr % 8)) * 16);
            *reinterpret_cast<uint4*>(to + static_cast<uint64_t>(col) * sizeof(T)) = v;
          }
          continue;  // the next half (or tile) rewrites the buffer after its barrier
        }
        ptx::fence_proxy_async_shared_cta();
        ptx::bar_sync(1 + wg, 128);
        if (tid == 0) {
          const int col = nb * p.tile_cols + h * kEpiCols;
          if (reduce) {
            ptx::cp_reduce_async_bulk_tensor_2d_add(cmap, epi, col, row0);
            ptx::cp_reduce_async_bulk_tensor_2d_add(cmap, epi + 64 * 128, col + 64, row0);
          } else {
            ptx::cp_async_bulk_tensor_2d_store(cmap, epi, col, row0);
            ptx::cp_async_bulk_tensor_2d_store(cmap, epi + 64 * 128, col + 64, row0);
          }
          ptx::cp_async_bulk_commit_group();
        }
      }
      if (p.hooks.notify_idx) {
        // Only a position that counts waits for its stores (a warpgroup-wide stall: tid 0's
        // wait holds the next tile's first WGMMA).
        if (tile_notifies) {
          pending = pos;
          if (!p.hooks.notify_deferred) flush_notify();  // at once: the stores complete, then the count
        }
      }
      if (p.hooks.trace && wg == 0 && tid == 0) {
        p.hooks.trace[3 * pos + 1] = ptx::globaltimer_ns();
        p.hooks.trace[3 * pos + 2] = ptx::smid();
      }
    }
    if (tid == 0) ptx::cp_async_bulk_wait_group<0>();
    flush_notify();
  }
  // Neither CTA of a pair leaves while the other may still multicast into it or arrive on
  // its barriers.
  if (CM == 2) ptx::barrier_cluster_sync();
#endif
}

// ---- portable kernel: one 128 x 256 tile per CTA at a time, as 8 sub-tiles of 64 x 64,
// 256 threads, 4 x 4 outputs per thread. Same schedule and hooks as the sm_90a kernel.
template <class T>
__device__ __forceinline__ float ld_f(const T* p) {
  return static_cast<float>(*p);
}
template <class T>
__global__ void __launch_bounds__(256) gemm_portable_kernel(const KernelParams p, const T* __restrict__ a, int64_t lda,
                                                            const T* __restrict__ b, int64_t ldb, GemmArgs args) {
  constexpr int TM = 64, TN = 64, TK = 16;
  __shared__ float as[TK][TM + 1];
  __shared__ float bs[TK][TN + 1];
  __shared__ float bsu[TK][TN + 1];  // swiglu: the up projection's B
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  for (int pos = blockIdx.x; pos < p.num_positions; pos += gridDim.x) {
    int mb, nb;
    tile_coords(p, pos, mb, nb);
    if (mb >= p.tiles_m) continue;         // a phantom of a table built for CTA pairs
    const BTile bt = b_tile<1>(p, mb, 0);  // B's first row for this M-block (grouped: its group's)
    if (!bt.run) continue;
    const int brow0 = bt.row;
    const int tn = p.tile_cols;  // a tile's output columns (swiglu: 128, from 128 gate and 128 up rows)
    if (threadIdx.x == 0) hook_wait(p, pos, mb);
    if (threadIdx.x == 0 && p.hooks.trace) p.hooks.trace[3 * pos] = ptx::globaltimer_ns();
    __syncthreads();
    const int dest = dest_index(hook_dest_bits(p, pos));
    T* c = static_cast<T*>(args.c[dest]);
    const int64_t rows = args.c_rows[dest];
    for (int sub = 0; sub < (BM / TM) * (tn / TN); ++sub) {
      const int m0 = mb * BM + (sub / (tn / TN)) * TM, n0 = nb * tn + (sub % (tn / TN)) * TN;
      if (m0 >= p.m || n0 >= p.n) continue;
      float acc[4][4] = {}, accu[4][4] = {};  // accu: swiglu's up projection
      for (int k0 = 0; k0 < p.k; k0 += TK) {
        for (int i = threadIdx.x; i < TM * TK; i += 256) {
          const int r = i / TK, kk = i % TK;
          const int gm = m0 + r, gk = k0 + kk, gn = n0 + r;
          const T* arow = gm >= p.a2_row0 && gm < p.a2_row0 + p.a2_rows
                              ? static_cast<const T*>(args.a2) + static_cast<int64_t>(gm - p.a2_row0) * lda
                              : a + static_cast<int64_t>(gm) * lda;
          as[kk][r] = (gm < p.m && gk < p.k) ? ld_f(arow + gk) : 0.f;
          float bv = 0.f, bu = 0.f;
          if (gn < p.n && gk < p.k) {
            bv = p.b_kn ? ld_f(b + gk * ldb + gn) : ld_f(b + static_cast<int64_t>(brow0 + gn) * ldb + gk);
            if (p.swiglu) bu = ld_f(b + static_cast<int64_t>(brow0 + p.n + gn) * ldb + gk);
          }
          bs[kk][r] = bv;
          bsu[kk][r] = bu;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TK; ++kk)
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              acc[i][j] += as[kk][ty * 4 + i] * bs[kk][tx * 4 + j];
              if (p.swiglu) accu[i][j] += as[kk][ty * 4 + i] * bsu[kk][tx * 4 + j];
            }
        __syncthreads();
      }
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) {
          const int gm = m0 + ty * 4 + i, gn = n0 + tx * 4 + j;
          const int64_t lr = gm - p.c_row0[dest];
          if (gm >= p.m || gn >= p.n) continue;
          if (!p.row_dst && (lr < 0 || lr >= rows)) continue;
          if (p.row_dst && p.row_dst[gm] == 0) continue;  // GemmArgs::row_dst: the row goes nowhere
          T* out = p.row_dst ? reinterpret_cast<T*>(p.row_dst[gm]) + gn : c + lr * args.ldc + gn;
          float v = acc[i][j];
          if (p.swiglu) {  // the products rounded to T, then silu(gate) * up (the sm_90a epilogue's)
            const float g = static_cast<float>(static_cast<T>(v)), u = static_cast<float>(static_cast<T>(accu[i][j]));
            v = g / (1.f + __expf(-g)) * u;
          }
          if (has_src(p, mb))
            for (int q = 0; q < p.num_src; ++q) v += src_elem<T>(p, q, gm, gn);
          if (dest_reduce(p, hook_dest_bits(p, pos)))
            atomicAdd(out, static_cast<T>(v));
          else
            *out = static_cast<T>(v);
        }
    }
    if (p.hooks.notify_idx) {
      __threadfence_system();
      __syncthreads();
      // As many notifies per tile as the sm_90a kernel (one per consumer warpgroup).
      if (threadIdx.x == 0)
        for (int w = 0; w < kGemmNotifyPerTile; ++w) hook_notify(p, pos);
    }
    if (threadIdx.x == 0 && p.hooks.trace) {
      p.hooks.trace[3 * pos + 1] = ptx::globaltimer_ns();
      p.hooks.trace[3 * pos + 2] = ptx::smid();
    }
    __syncthreads();
  }
}

// ---- host side -------------------------------------------------------------------------
using tma::encode_fn;
using tma::make_map;

int g_last_ctas = 0, g_last_cluster = 0;

template <class T, int BKN, int CM, int BKV>
cudaError_t launch_sm90(const GemmArgs& a, const KernelParams& kp, const TensorMaps& maps, cudaStream_t stream) {
  auto kern = gemm_sm90_kernel<T, BKN, CM, BKV>;
  static int max_ctas = 0;  // per instantiation: CTAs that fit at once (clusters counted)
  if (max_ctas == 0) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (e != cudaSuccess) return e;
    if (CM == 2) {
      e = cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 0);
      cudaLaunchConfig_t cfg{};
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = 2;
      attr.val.clusterDim.y = 1;
      attr.val.clusterDim.z = 1;
      cfg.gridDim = dim3(2 * 66);
      cfg.blockDim = dim3(kThreads);
      cfg.dynamicSmemBytes = kSmemBytes;
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      int clusters = 0;
      e = cudaOccupancyMaxActiveClusters(&clusters, kern, &cfg);
      if (e != cudaSuccess) return e;
      max_ctas = 2 * clusters;
    } else {
      max_ctas = sm_count();
    }
  }
  int ctas = std::min(kp.num_positions, a.ctas > 0 ? std::min(a.ctas, max_ctas) : max_ctas);
  if (CM == 2) ctas = std::max(2, ctas & ~1);
  g_last_ctas = ctas;
  g_last_cluster = CM;
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[2] = {};
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = CM;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  // Programmatic dependent launch (gemm_pdl): this kernel's launch and set-up may overlap the
  // previous kernel of the stream (its CTAs wait in griddepcontrol.wait before any global
  // access).
  const bool pdl = pdl_enabled() && gemm_pdl(kp.hooks);
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.gridDim = dim3(ctas);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmemBytes;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 2 : 1;
  return cudaLaunchKernelEx(&cfg, kern, kp, maps);
}

template <class T>
cudaError_t launch(const GemmArgs& a, const KernelParams& kp, bool sm90, cudaStream_t stream, const char** why) {
  if (sm90) {
    TensorMaps maps{};
    const auto dt = a.type == GemmType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    const int bk = kp.k_block;
    const auto sw = bk == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
    bool ok = make_map(&maps.a, dt, a.a, a.m, a.k, a.lda, BM, bk, sw);
    if (ok && kp.a2_rows > 0) ok = make_map(&maps.a2, dt, a.a2, a.a2_rows, a.k, a.lda, BM, bk, sw);
    ok = ok && (a.b_layout == GemmBLayout::kKN
                    ? make_map(&maps.b, dt, a.b, a.k, a.n, a.ldb, bk, 64)
                    : make_map(&maps.b, dt, a.b, static_cast<int64_t>(a.swiglu ? 2 * a.n : a.n) * std::max(1, a.groups),
                               a.k, a.ldb, BN / 2, bk, sw));
    for (int d = 0; ok && !kp.direct_c && !a.row_dst && d < a.num_dests; ++d)
      ok = make_map(&maps.c[d], dt, a.c[d], a.c_rows[d], a.n, a.ldc, 64, 64);
    if (ok && kp.src_tma) ok = make_map(&maps.src, dt, a.src[0], kp.src_rows, a.n, a.ld_src, 64, 64);
    if (!ok) {
      if (why) *why = "cuTensorMapEncodeTiled refused a tensor map (pointer, stride or shape)";
      return cudaErrorInvalidValue;
    }
    const bool kn = a.b_layout == GemmBLayout::kKN;
    if (bk == 32)  // single CTAs only
      return kn ? launch_sm90<T, 1, 1, 32>(a, kp, maps, stream) : launch_sm90<T, 0, 1, 32>(a, kp, maps, stream);
    if (kp.cluster == 2)
      return kn ? launch_sm90<T, 1, 2, 64>(a, kp, maps, stream) : launch_sm90<T, 0, 2, 64>(a, kp, maps, stream);
    return kn ? launch_sm90<T, 1, 1, 64>(a, kp, maps, stream) : launch_sm90<T, 0, 1, 64>(a, kp, maps, stream);
  }
  const int ctas = std::min(kp.num_positions, (a.ctas > 0 ? a.ctas : sm_count() * 4));
  gemm_portable_kernel<T>
      <<<ctas, 256, 0, stream>>>(kp, static_cast<const T*>(a.a), a.lda, static_cast<const T*>(a.b), a.ldb, a);
  return cudaGetLastError();
}

// The kernels launch() may pick for element type T: portable first, then the sm_90a ones.
template <class T>
std::vector<const void*> kernels_of() {
  return {reinterpret_cast<const void*>(gemm_portable_kernel<T>),
          reinterpret_cast<const void*>(gemm_sm90_kernel<T, 0, 1, 64>),
          reinterpret_cast<const void*>(gemm_sm90_kernel<T, 1, 1, 64>),
          reinterpret_cast<const void*>(gemm_sm90_kernel<T, 0, 2, 64>),
          reinterpret_cast<const void*>(gemm_sm90_kernel<T, 1, 2, 64>),
          reinterpret_cast<const void*>(gemm_sm90_kernel<T, 0, 1, 32>),
          reinterpret_cast<const void*>(gemm_sm90_kernel<T, 1, 1, 32>)};
}

}  // namespace

cudaError_t gemm_preload() {
  for (auto fns : {kernels_of<__nv_bfloat16>(), kernels_of<__half>()}) {
    if (!gemm_sm90_available()) fns.resize(1);  // sm_90a code loads only there
    if (const cudaError_t e = load_kernels(fns.data(), fns.size()); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

void gemm_last_launch(int* ctas, int* cluster) {
  *ctas = g_last_ctas;
  *cluster = g_last_cluster;
}

bool gemm_sm90_available() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return major == 9 && minor == 0;
}

// Rows [row0, row0 + rows) start on a 128-row block and end on one (or at m): the rule for
// a2's rows and the sources' rows (whole M-blocks take them or not).
static bool whole_blocks(int64_t row0, int64_t rows, int64_t m) {
  return row0 % kGemmTileM == 0 && (rows % kGemmTileM == 0 || row0 + rows == m);
}

cudaError_t gemm(const GemmArgs& a, const GemmHooks& h, cudaStream_t stream, const char** why, bool force_portable) {
  auto refuse = [&](const char* w) {
    if (why) *why = w;
    return cudaErrorInvalidValue;
  };
  if (a.m < 0 || a.n < 0 || a.k < 0) return refuse("negative dimension");
  if (a.m == 0 || a.n == 0) return cudaSuccess;
  if (a.k % 8 != 0) return refuse("K must be a multiple of 8 (16-byte rows for TMA)");
  if (a.num_dests < 1 || a.num_dests > kGemmMaxDests) return refuse("num_dests must be in [1, 8]");
  const int64_t bcols = a.b_layout == GemmBLayout::kKN ? a.n : a.k;
  if (a.lda < a.k || a.ldb < bcols || (!a.row_dst && a.ldc < a.n))
    return refuse("a leading dimension is smaller than the row");
  // TMA needs 16-byte row strides and bases; where A or B cannot give them, the portable
  // kernel runs instead (same results and hooks, slower).
  auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) != 0; };
  if (!a.a || !a.b) return refuse("A and B must be non-null");
  if (a.a2_rows < 0 || a.a2_row0 < 0 || a.a2_row0 + a.a2_rows > a.m) return refuse("a2's rows are outside A");
  if (a.a2_rows > 0 && !a.a2) return refuse("a2 must be non-null when a2_rows > 0");
  if (a.a2_rows > 0 && !whole_blocks(a.a2_row0, a.a2_rows, a.m))
    return refuse("a2's rows must start on a 128-row block and end on one (or at m)");
  const bool tma_ab =
      a.lda % 8 == 0 && a.ldb % 8 == 0 && !misaligned(a.a) && !misaligned(a.b) && (a.a2_rows == 0 || !misaligned(a.a2));
  GemmArgs args = a;
  // C rows that are not 16-byte multiples (or a C not 16-byte aligned) cannot be TMA-stored:
  // the kernel then stores from registers (correct, slower).
  bool direct_c = a.ldc % 8 != 0;
  if (a.row_dst &&
      (a.num_dests != 1 || a.out != GemmOut::kStore || a.num_src > 0 || a.n % 8 != 0 || h.notify_idx || h.dest))
    return refuse("row_dst takes n % 8 == 0, one destination, stores, no sources, no notify or dest table");
  for (int d = 0; d < a.num_dests; ++d) {
    if (a.row_dst) break;  // C's rows go to row_dst: c[0] unused
    if (!a.c[d]) return refuse("every destination C must be non-null");
    if (misaligned(a.c[d])) direct_c = true;
    if (args.c_rows[d] == 0) args.c_rows[d] = a.m - a.c_row0[d];
    if (args.c_rows[d] <= 0) return refuse("a destination holds no rows");
  }
  if (a.cluster_m < 0 || a.cluster_m > 2) return refuse("cluster_m must be 0 (auto), 1 or 2");
  if (a.k_block != 0 && a.k_block != 32 && a.k_block != 64) return refuse("k_block must be 0 (auto), 32 or 64");
  if (a.cluster_m == 0 && h.order) return refuse("with an order table, say which cluster_m the table was built for");
  if (a.group_of && a.groups < 1) return refuse("a grouped GEMM needs groups >= 1");
  if (a.swiglu && (a.b_layout != GemmBLayout::kNK || a.num_src > 0 || a.out != GemmOut::kStore || a.num_dests != 1))
    return refuse("swiglu takes B as W[2N,K] (kNK), one destination, stores, no sources");
  if (a.group_of && a.b_layout != GemmBLayout::kNK) return refuse("a grouped GEMM takes B as W[N,K] (kNK) only");
  if (a.num_src < 0 || a.num_src > kGemmMaxSrcs) return refuse("num_src must be in [0, 7]");
  if (a.num_src > 0 && a.ld_src < a.n) return refuse("ld_src is smaller than the row");
  const int64_t src_rows = a.src_rows > 0 ? a.src_rows : a.m - a.src_row0;
  if (a.num_src > 0 && (a.src_row0 < 0 || src_rows <= 0 || a.src_row0 + src_rows > a.m))
    return refuse("the sources' rows are outside C");
  if (a.num_src > 0 && !whole_blocks(a.src_row0, src_rows, a.m))
    return refuse("the sources' rows must start on a 128-row block and end on one (or at m)");
  for (int i = 0; i < a.num_src; ++i) {
    if (!a.src[i]) return refuse("every source must be non-null");
    // The TMA-stored epilogue reads sources two elements at a time: other sources take the
    // epilogue from registers, as C does.
    if (misaligned(a.src[i]) || a.ld_src % 8 != 0) direct_c = true;
  }

  if (a.swiglu && direct_c) return refuse("swiglu stores C by TMA: C and its rows must be 16-byte aligned");
  KernelParams kp{};
  kp.m = a.m;
  kp.n = a.n;
  kp.k = a.k;
  kp.tiles_m = gemm_tiles_m(a.m);
  kp.swiglu = a.swiglu ? 1 : 0;
  kp.tile_cols = a.swiglu ? BN / 2 : BN;
  kp.b_second = a.swiglu ? a.n : BN / 2;
  kp.group_rows = a.swiglu ? 2 * a.n : a.n;
  kp.tiles_n = gemm_tiles_n(a.swiglu ? 2 * a.n : a.n);  // swiglu: 128-column tiles
  const bool sm90 = !force_portable && tma_ab && gemm_sm90_available();
  // Automatic: CTA pairs sharing B by multicast where there are M-blocks to pair (an odd
  // count leaves one phantom partner: accepted from 9 M-blocks). Under a sustained load the
  // GEMM is power-capped and pairs, moving 25% fewer bytes through L2, hold a higher clock
  // (docs/gemm.md, step 7).
  const bool pairs = kp.tiles_m >= 2 && (kp.tiles_m % 2 == 0 || kp.tiles_m >= 9);
  kp.cluster = a.cluster_m == 0 ? (pairs ? 2 : 1) : a.cluster_m;
  // Experiments: WEFT_GEMM_CLUSTER=1|2 overrides the automatic choice (not a table's).
  // The experiment switches are read once per process: this runs on every launch.
  static const int64_t env_cluster = tunable_value(tunables::kGemmCluster);
  static const int64_t env_k_block = tunable_value(tunables::kGemmKBlock);
  static const int64_t env_group_m = tunable_value(tunables::kGemmGroupM);
  if (env_cluster > 0 && a.cluster_m == 0) kp.cluster = static_cast<int>(env_cluster);
  if (!sm90 && !h.order) kp.cluster = 1;  // the portable kernel has no clusters (tables keep their layout)
  kp.k_block = a.k_block == 32 ? 32 : 64;
  if (a.k_block == 0 && env_k_block == 32) kp.k_block = 32;
  if (kp.k_block == 32) kp.cluster = kp.cluster == 2 && h.order ? -1 : 1;
  if (kp.cluster < 0) return refuse("k_block 32 runs single CTAs: the order table was built for CTA pairs");
  kp.num_positions = gemm_positions(a.m, a.swiglu ? 2 * a.n : a.n, kp.cluster);
  kp.group_m = a.group_m > 0 ? a.group_m : 16;
  // Experiments: WEFT_GEMM_GROUP_M=g overrides the closed-form raster's group (not a table's).
  if (env_group_m > 0 && !h.order) kp.group_m = static_cast<int>(env_group_m);
  kp.direct_c = direct_c && !a.row_dst;  // row_dst: rows stored by the threads, 16 bytes at a time
  kp.row_dst = a.row_dst;
  for (int d = 0; d < kGemmMaxDests; ++d) {
    kp.c[d] = args.c[d];
    kp.c_rows[d] = args.c_rows[d];
  }
  kp.ldc = a.ldc;
  kp.b_kn = a.b_layout == GemmBLayout::kKN;
  kp.reduce_add = a.out == GemmOut::kReduceAdd;
  for (int d = 0; d < kGemmMaxDests; ++d) kp.c_row0[d] = args.c_row0[d];
  for (int i = 0; i < kGemmMaxSrcs; ++i) kp.src[i] = i < a.num_src ? a.src[i] : nullptr;
  kp.num_src = a.num_src;
  kp.ld_src = a.ld_src;
  kp.src_row0 = static_cast<int>(a.src_row0);
  kp.src_rows = static_cast<int>(src_rows);
  kp.a2_row0 = static_cast<int>(a.a2_row0);
  kp.a2_rows = static_cast<int>(a.a2_rows);
  kp.group_of = a.group_of;
  // Source 0 by TMA where C is TMA-stored (same box and swizzle as the stores).
  kp.src_tma = a.num_src > 0 && !direct_c && sm90;
  kp.hooks = h;
  // With K = 0 there is no k-block to meet the waits in: meet them before the tile.
  if (a.k == 0) kp.hooks.wait_at_epilogue = false;
  if (a.type == GemmType::kBF16) return launch<__nv_bfloat16>(args, kp, sm90, stream, why);
  return launch<__half>(args, kp, sm90, stream, why);
}

}  // namespace weft::kernels
