// weft's GEMM (src/kernels/gemm_sm90.cu): C[M,N] = A[M,K] * B, fp32 accumulation, C in the
// input type. Built for fusion: weft decides the order in which tiles are computed and what
// happens around each tile.
//
// sm_90a kernel: persistent (one CTA per SM, tiles taken in schedule order), warp-specialised
// (one producer warpgroup issuing TMA loads into a 4-stage shared-memory ring guarded by
// mbarriers; two consumer warpgroups issuing WGMMA m64n256k16, 64 rows each), register
// reallocation (setmaxnreg: producer 40, consumers 232), CTA pairs (clusters of 2) sharing
// B tiles through TMA multicast, epilogue through swizzled shared memory and TMA stores (or
// TMA reduce-adds). Tile 128 x 256 x 64.
// Other GPUs: a portable SIMT kernel with the same hooks (slow; correctness, not speed).
//
// Hooks (all optional; a GEMM without them is a plain GEMM):
//  - order: the tile ids (m_block * n_blocks + n_block) in the order tiles are taken
//    (a lowered TileSchedule; see gemm_positions for CTA pairs); null: grouped raster over M
//    (closed form, `group_m`). Persistent CTA i takes positions i, i + CTAs, ...
//  - wait: before the producer loads tile position p, it waits (acquire, with the context's
//    deadline; a timeout names `wait_peer[i]`) for each entry i in [wait_begin[p],
//    wait_begin[p+1]) until local signal wait_off + 8*wait_idx[i] >= wait_val[i] * wait_scale, then
//    fences the async proxy so TMA reads what the peer wrote. With wait_per_mblock the table
//    is indexed by the tile's M-block instead of p; with wait_scale_dev the scale is read from
//    device memory (a call counter advanced on the stream: graph replays wait for new data).
//    With wait_at_epilogue the waits guard only the sources: the main loop runs before them.
//  - sources (GemmArgs::src): C = A*B + the sum of the source tiles, added in fp32 and rounded
//    once, read after the tile's waits (so a source may be data a peer just delivered); only
//    rows [src_row0, src_row0 + src_rows) take them.
//  - destination: position p's tile goes to destination dest[p] & 63 (index into c[]; c[d]
//    may be a peer's buffer), at row (tile row - c_row0[d]); rows outside [0, c_rows[d])
//    are clipped. out = kReduceAdd, or kGemmDestReduce set in dest[p], adds into the
//    destination instead of storing (TMA reduce-add).
//  - notify: after the tile's stores have completed, each consumer warpgroup adds 1
//    (kGemmNotifyPerTile per tile) to signal notify_off + 8*notify_idx[p] on rank
//    notify_rank[p] (release).
//  - trace: trace[3p] = globaltimer when position p's first stage arrived, trace[3p+1] when
//    its stores were issued (or completed, with notify), trace[3p+2] = the SM.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "weft/device/ctx.hpp"

namespace weft::kernels {

enum class GemmType : int { kBF16 = 0, kF16 = 1 };
// kNK: B is W[N,K] row-major (torch.nn.functional.linear's weight); kKN: B[K,N] row-major.
enum class GemmBLayout : int { kNK = 0, kKN = 1 };
enum class GemmOut : int { kStore = 0, kReduceAdd = 1 };

inline constexpr int kGemmTileM = 128;
inline constexpr int kGemmTileN = 256;
inline constexpr int kGemmTileK = 64;
inline constexpr int kGemmMaxDests = 8;
inline constexpr int kGemmMaxSrcs = 7;
inline constexpr int kGemmNotifyPerTile = 2;   // consumer warpgroups, each notifies once
inline constexpr int8_t kGemmDestReduce = 64;  // flag in GemmHooks::dest: reduce-add this tile

struct GemmArgs {
  int m = 0, n = 0, k = 0;
  GemmType type = GemmType::kBF16;
  GemmBLayout b_layout = GemmBLayout::kNK;
  const void* a = nullptr;  // [m, k] row-major, lda elements between rows
  int64_t lda = 0;
  // Rows [a2_row0, a2_row0 + a2_rows) of A read from a2 instead (row r at a2 + (r - a2_row0) *
  // lda): a rank's own rows in place beside gathered ones. a2_row0 a multiple of 128, and
  // a2_rows too unless the range ends at m.
  const void* a2 = nullptr;
  int64_t a2_row0 = 0, a2_rows = 0;
  const void* b = nullptr;  // kNK: [n, k]; kKN: [k, n]; ldb elements between rows
  int64_t ldb = 0;
  // Destinations: c[0] is the ordinary output. ldc elements between rows (all destinations).
  void* c[kGemmMaxDests] = {};
  int64_t ldc = 0;
  int64_t c_row0[kGemmMaxDests] = {};  // first global row held by destination d
  int64_t c_rows[kGemmMaxDests] = {};  // rows destination d holds (0: m - c_row0[d])
  int num_dests = 1;
  GemmOut out = GemmOut::kStore;
  // Epilogue sources: C[row, col] = (A*B)[row, col] + sum over i < num_src of
  // src[i][row * ld_src + col] (row: this GEMM's row, 0 .. m-1), in fp32, rounded once.
  // Same type as C (16-byte aligned with ld_src % 8 == 0, else the slower register epilogue).
  const void* src[kGemmMaxSrcs] = {};
  int num_src = 0;
  int64_t ld_src = 0;
  // Only rows [src_row0, src_row0 + src_rows) of C take the sources (src_rows 0: up to m), and
  // source row = row - src_row0 (a GEMM whose other rows go elsewhere, e.g. to peers).
  // src_row0 a multiple of 128, and src_rows too unless the range ends at m.
  int64_t src_row0 = 0, src_rows = 0;
  // Closed-form raster: groups of group_m M-blocks (L2 reuse of B). 0: 16 -- a wave of 132
  // CTAs then covers ~16 M-blocks x 8 N-blocks, near the smallest footprint of A and B rows.
  int group_m = 0;
  int ctas = 0;  // persistent CTAs; 0: as many as fit at once (never more than positions)
  // 2: CTA pairs share B by TMA multicast (sm_90a); 1: single CTAs; 0: automatic (2 when
  // there are an even number of M-blocks, or at least 9; required to be explicit with an
  // order table).
  int cluster_m = 0;
  // K depth of a pipeline stage: 64 (4 stages, 128-byte swizzle) or 32 (8 stages of half the
  // size, 64-byte swizzle; single CTAs). 0: 64, or $WEFT_GEMM_BK (experiments).
  int k_block = 0;
  // Grouped GEMM (a mixture of experts' local experts, docs/moe.md "Grouped GEMM"): M-block mb
  // multiplies by group group_of[mb] of B -- B holds `groups` matrices W_g[N,K] stacked as
  // [groups * n, k] (kNK only; ldb between rows), group g's rows from g * n -- or, where
  // group_of[mb] < 0, loads, computes and stores nothing. A, C and every other hook as for one
  // GEMM (each group's rows in whole M-blocks of A and C: its block starts on a 128-row
  // boundary, the rows up to the next boundary are its padding). group_of: device memory,
  // [tiles_m] entries, read when the tile is taken (a kernel before this one on the stream may
  // write it: counts known only on the device, capturable). With CTA pairs, a pair whose two
  // M-blocks have the same group shares B by multicast; one whose groups differ loads each CTA's
  // own (an expert's blocks starting on an even M-block share throughout).
  const int32_t* group_of = nullptr;
  int groups = 0;
  // SwiGLU (a gated MLP's gate/up projection, its activation in the epilogue): B holds 2n rows
  // (per group, grouped) -- the gate's W_g [n, K], then the up projection's W_u [n, K] -- and
  // C[m, n] = silu(A W_g^T) * (A W_u^T), each product rounded to the type first (the unfused
  // path's rounding points), silu by the fast exponential, the result rounded once. A tile is
  // 128 output columns (its 256 accumulator columns: 128 gate, 128 up). kNK, one destination,
  // stores, no sources, C by TMA.
  bool swiglu = false;
  // Rows scattered (a mixture of experts' down projection storing each row at its token's rank,
  // docs/moe.md "Fused"): row r of C goes to the address row_dst[r] -- device memory, [m]
  // entries, each the first element of that row's destination (this process's view of it: a
  // peer's memory through the symmetric heap), 16-byte aligned; 0: the row is stored nowhere.
  // The epilogue's threads store the tile's rows from shared memory, 16 bytes at a time (no TMA).
  // c[0] and ldc are unused (c[0] may be null). n % 8 == 0, one destination, stores, no
  // sources, no notify or dest table. A kernel after this one on the stream sees the stores
  // (the stream orders them; a peer needs that kernel's release, e.g. a signal).
  const uint64_t* row_dst = nullptr;
};

struct GemmHooks {
  dev::DeviceCtx ctx{};                 // for signals (heap offsets, peers, deadline, error slot)
  const int32_t* order = nullptr;       // [num_tiles] tile ids, or null
  const int32_t* wait_begin = nullptr;  // [positions + 1] offsets into the entries below
  const int32_t* wait_idx = nullptr;    // per entry: signal index
  const uint64_t* wait_val = nullptr;   // per entry: wait until signal >= this
  const int32_t* wait_peer = nullptr;   // per entry: the rank expected to signal (timeout message)
  uint64_t wait_off = 0;
  uint64_t wait_scale = 1;                   // thresholds are wait_val * wait_scale (an op's epoch: tables stay fixed)
  const uint64_t* wait_scale_dev = nullptr;  // if set, the scale is *wait_scale_dev (device memory)
  bool wait_per_mblock = false;              // wait_begin has tiles_m + 1 entries, indexed by M-block
  // The waits guard only the epilogue's sources (A and B are ready at launch): the sm_90a
  // kernel runs a tile's main loop first and waits a few k-blocks before its epilogue.
  bool wait_at_epilogue = false;
  // Notify a tile once its stores have completed, checked 2 k-blocks before the end of the
  // warpgroup's next tile's main loop (or at its end) instead of right after the stores: stores
  // into a peer's memory drain while the next tile computes (sm_90a kernel, TMA epilogue; the
  // others notify at once). A notify may then come a tile later: the waits it meets must not
  // be those of the notifying CTA's own next tile beyond that point.
  bool notify_deferred = false;
  // With notify_deferred: flush at this k-block of the next tile instead (if earlier than 2
  // before its end; 0: 2 before its end). Local stores complete within a few k-blocks; a
  // count given a whole main loop late delays whoever waits for it (a copy of the piece).
  int notify_flush_kb = 0;
  const int8_t* dest = nullptr;         // [positions] destination index (| kGemmDestReduce), null: 0
  const int32_t* notify_idx = nullptr;  // [num_tiles] -1: no notify
  const int32_t* notify_rank = nullptr;
  uint64_t notify_off = 0;
  uint64_t* trace = nullptr;  // [3 * positions] or null
  // [4 * CTAs] or null (sm_90a kernel; diagnostics): per CTA, globaltimer at entry, after the
  // barrier set-up (cluster sync), when its producer issued the first TMA load, and when its
  // consumers' first stage arrived.
  uint64_t* trace_cta = nullptr;
  // The op this GEMM serves, named with the chunk and peer when a wait times out
  // (dev::op_tag("gemm_rs"); 0: not named).
  uint64_t op = 0;
  bool any() const { return order || wait_begin || dest || notify_idx || trace || trace_cta; }
};

inline int gemm_tiles_m(int m) { return (m + kGemmTileM - 1) / kGemmTileM; }
inline int gemm_tiles_n(int n) { return (n + kGemmTileN - 1) / kGemmTileN; }
// Schedule positions (the length of every per-position table). With cluster_m = 2 the
// positions come in pairs run by one CTA pair: 2q and 2q+1 must be tiles of the same N-block
// (tile ids mb * tiles_n + nb); when tiles_m is odd, each N-block has one phantom, M-block
// tiles_m, which computes on zeros and stores nothing, no hooks.
inline int gemm_positions(int m, int n, int cluster_m) {
  return (cluster_m == 2 ? 2 * ((gemm_tiles_m(m) + 1) / 2) : gemm_tiles_m(m)) * gemm_tiles_n(n);
}

// Checks the arguments (shapes, K % 8, 16-byte aligned pointers and strides) and returns
// cudaErrorInvalidValue with `why` set when they do not fit; else launches on `stream`.
// Graph-capturable: tensor maps are encoded on the host at call time, nothing is allocated.
// `force_portable` runs the portable kernel even on sm_90.
cudaError_t gemm(const GemmArgs& a, const GemmHooks& h, cudaStream_t stream, const char** why = nullptr,
                 bool force_portable = false);

// Every GEMM kernel, loaded now (kernels::load_kernels: with lazy module loading a first
// launch behind a spinning kernel can deadlock). Ops whose GEMM waits call it first.
cudaError_t gemm_preload();

// The grid of this process's last sm_90a launch: CTAs and cluster size (diagnostics).
void gemm_last_launch(int* ctas, int* cluster);

// True when the current device runs the sm_90a kernel (compute capability 9.0).
bool gemm_sm90_available();

}  // namespace weft::kernels
