// MoE token exchange kernels (ops::MoeDispatchCombine on GPUs; docs/moe.md): the routing (a
// stable counting sort of the (token, slot) pairs by expert, on the device), the pack of the
// rows in send order, the chunk counts' conversion and combine's weighted sum. Launchers: raw
// values and a stream in, cudaError_t out; no allocation, no host synchronisation.
#pragma once
#include <cstdint>

#include "weft/device/ctx.hpp"
#include "weft/device/dtype.hpp"

#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace weft::kernels {

// The most experts the routing kernel sorts by (its per-warp counts live in shared memory).
inline constexpr int kMoeMaxExperts = 512;
// The most slots (top_k) a token has in these kernels (ops::kMoeMaxTopK).
inline constexpr int kMoeMaxSlots = 8;

struct MoeRouteArgs {
  const int32_t* ids = nullptr;  // [tokens, top_k] global expert ids
  int tokens = 0, top_k = 1, experts = 1, world = 1, hidden = 8;
  int32_t* pos = nullptr;             // out [tokens * top_k]: the pair's row in send order, -1 if invalid
  uint32_t* expert_counts = nullptr;  // out [experts]: rows for each expert (rank p's experts: block p)
  uint64_t* send_counts = nullptr;    // out [world]: elements (rows * hidden) for each rank (optional)
  unsigned long long* bad = nullptr;  // the first invalid pair's index (atomicMin; ~0: none), never reset here
};

// The rows of an expert block (MoeConfig::expert_blocks, the layer's layout): the GEMM's M tile.
inline constexpr int kMoeBlockRows = 128;

// Method direct (docs/moe.md, "Direct"): one kernel a direction, every row stored straight into
// its final place in the peer's symmetric buffer. Symmetric heap offsets (the same on every
// rank) and this rank's device state.
inline constexpr int kMoeDirectMaxCtas = 512;  // the most CTAs of either kernel (MoeDirectArgs::ctas)
inline constexpr int kMoeDirectMaxWorld = 32;  // ranks (its per-rank tables live in shared memory)
struct MoeDirectArgs {
  dev::DeviceCtx ctx;
  MoeRouteArgs route;  // dispatch: the routing (ids, pos, expert_counts, bad); combine: pos
  int local = 1, top_k = 1, hidden = 8, tokens = 0;
  dev::DType dtype = dev::DType::kBF16;
  uint64_t capacity = 0;  // rows each rank may receive
  uint64_t recv_off = 0;  // [capacity, hidden]: dispatch's rows, rank-major, expert-grouped
  uint64_t back_off = 0;  // [tokens * top_k, hidden]: combine's rows, in send order
  // [2 parities][world src][world dst][local] uint64: every rank's chunk counts as tagged words,
  // (call number << 32) | rows, each its own "arrived" flag.
  uint64_t counts_off = 0;
  uint64_t sig_off = 0;  // [2][world] uint64 signals (+1 a CTA a call): rows in, rows back
  // [3]: dispatches and combines made, and dispatch's CTAs through its routing barrier (all
  // counted by the kernels themselves, so graph replays count too).
  uint64_t* calls = nullptr;
  uint32_t* slice_counts = nullptr;       // [kMoeDirectMaxCtas][experts]: dispatch's per-slice expert counts
  int64_t* chunks = nullptr;              // out: [world][local] rows received (recv_counts())
  int64_t* ret = nullptr;                 // [world][3]: rows before source s in recv, s's send offset of
                                          // this rank's rows, rows from s (dispatch writes, combine reads)
  unsigned long long* refused = nullptr;  // ~0: none; else (rank << 40 | rows) of the first rank over capacity
  // ops::MoeConfig::expert_blocks: recv in expert blocks of kMoeBlockRows rows; dispatch writes
  // groups [groups_n] (each block's local expert, -1 past the last) and chunk_rows [world][local]
  // (chunk (s, l)'s first row in recv, and its rows' offset among source s's: combine reads it).
  bool blocks = false;
  int32_t* groups = nullptr;
  int groups_n = 0;
  int64_t* chunk_rows = nullptr;  // [world * local][2]
  // expert_blocks, dispatch writes (optional): [groups_n * kMoeBlockRows] -- each recv row's
  // place in its token's rank's back buffer (the address in this process, the peer's through
  // the heap), 0 for padding rows (GemmArgs::row_dst: a GEMM's epilogue then stores combine's
  // rows). Combine with `delivered` takes them as stored there: it skips its copies.
  uint64_t* row_dst = nullptr;
  bool delivered = false;
  // Dispatch writes (optional): [tokens * top_k] each valid pair's row at its expert's rank,
  // (rank << 40) | row (combine's pull reads it).
  int64_t* pair_src = nullptr;
  // Combine by pull: every rank publishes whether its expert_out lies in its symmetric heap
  // (`here`, at offset expert_off) as a tagged word into every rank's [2 parities][world] words at
  // ready_off (after its experts' rows are final); where every rank's does, each thread of the
  // sum loads its token's rows straight from their ranks' heaps -- no copy back, no second pass
  // -- and the arrival signals count the ranks done reading; else every rank pushes as without
  // `pull` (the sum in this kernel). The same `pull` on every rank.
  bool pull = false, here = false;
  uint64_t expert_off = 0, ready_off = 0;
  // Dispatch, rows once a peer (docs/moe.md, "Rows once a peer"): at the kernel's start, before
  // the routing, each token's row goes once to every peer rank holding any of its experts, into
  // that rank's staging slot [parity][source][token]; once the places are known, a tagged word
  // per (token, slot) there names the slot's row in recv; after every rank's arrival each rank
  // copies its staged rows to their places. The rows a rank keeps go straight as before.
  bool once = false;
  int max_tokens = 0;
  // CTAs of either kernel (0: one an SM), at most what the GPU holds at once (CTAs wait for words
  // others write) and kMoeDirectMaxCtas. The same on every call of an op and every rank (the
  // signals count CTAs).
  int ctas = 0;
  uint64_t stage_off = 0;            // [2][world][max_tokens][hidden]
  uint64_t place_off = 0;            // [2][world][max_tokens][top_k] uint64: (call << 32) | row in recv
  uint64_t tok_off = 0;              // [2][world] uint64: (call << 32) | the source's tokens
  const void* x = nullptr;           // dispatch: [tokens, hidden]
  const void* expert_out = nullptr;  // combine: [rows, hidden] in recv's layout
  const float* weights = nullptr;    // combine: [tokens, top_k]
  void* y = nullptr;                 // combine: [tokens, hidden]
};

// The experts' layout of one rank's received rows (ops::MoeLayer; docs/moe.md, "Layer"): local
// expert l's rows -- those from source 0, then source 1, ... -- in a block of whole 128-row
// M-blocks (kernels::kGemmTileM), the blocks in expert order; the grouped GEMM reads it in place.
struct MoeLayoutArgs {
  const int64_t* chunks = nullptr;  // [world][local] rows received (recv_counts())
  int world = 1, local = 1;
  int tiles = 0;                // M-blocks of the expert-major buffer (group_of's length)
  int32_t* group_of = nullptr;  // out [tiles]: each M-block's local expert, -1 past the last
  int64_t* seg = nullptr;       // out [world * local][2]: chunk (s, l)'s first row in recv, in the experts' buffer
};

#ifdef WEFT_HAVE_CUDA
// One CTA: the layout above from the chunk counts (world * local <= kMoeMaxExperts).
cudaError_t moe_expert_layout(const MoeLayoutArgs& a, cudaStream_t s);
// Rows of row_bytes (a multiple of 16) between recv's rank-major layout and the experts' layout
// (seg, chunks: as moe_expert_layout's): to_experts: dst[seg[i][1] + j] = src[seg[i][0] + j],
// else the reverse, for every row j of every chunk i. A fixed grid over `max_rows` rows (the
// capacity): capturable, the counts read on the device.
cudaError_t moe_permute(const void* src, void* dst, const int64_t* seg, const int64_t* chunks, int chunks_n,
                        int64_t max_rows, size_t row_bytes, bool to_experts, cudaStream_t s);
// act[r][j] = silu(h[r][j]) * h[r][ffn + j] (fp32, __expf, rounded once) for the rows of the M-blocks
// whose group_of is >= 0; h [tiles * 128, 2 * ffn], act [tiles * 128, ffn]; bf16 or f16, ffn % 8 == 0.
cudaError_t moe_swiglu(const void* h, void* act, const int32_t* group_of, int tiles, int ffn, dev::DType t,
                       cudaStream_t s);

// One CTA: validates the ids (outside 0 .. experts - 1, or repeated within a token: left out,
// the first such pair recorded in *bad), counts them per expert, and gives every valid pair its
// place: experts in order, each expert's pairs in (token, slot) order. experts <= kMoeMaxExperts.
cudaError_t moe_route(const MoeRouteArgs& a, cudaStream_t s);
// send[pos[i]] = x[i / top_k] for every valid pair i (rows of hidden elements of eb bytes).
cudaError_t moe_pack(const void* x, const int32_t* pos, void* send, int tokens, int top_k, int hidden, size_t eb,
                     cudaStream_t s);
// The received chunk counts (uint32 [n], as the counts' all-to-all left them) as int64.
cudaError_t moe_widen_counts(const uint32_t* in, int64_t* out, int n, cudaStream_t s);
// y[t] = sum over slots j in order of weights[t][j] * back[pos[t * top_k + j]] (valid pairs), in
// fp32, rounded once to t's type.
cudaError_t moe_combine(const void* back, const int32_t* pos, const float* weights, void* y, int tokens, int top_k,
                        int hidden, dev::DType t, cudaStream_t s);
// Direct dispatch: the CTAs route (moe_route's order; up to 2048 pairs every CTA routes them all,
// above a slice of the pairs each with a barrier of the grid between the counts and the
// places), CTA 0 writes this rank's chunk counts into every
// rank's matrix (tagged words); once every rank's counts are in, every CTA computes every
// chunk's place (identically on every rank), refuses a routing over any rank's capacity alike
// (nothing moves, *refused set, recv_counts zero), else stores each pair's row at its place in
// its expert's rank's recv; each CTA then signals every rank, and the kernel ends when every
// rank's rows are in.
cudaError_t moe_dispatch_direct(const MoeDirectArgs& a, cudaStream_t s);
// Direct combine (after a direct dispatch): each received row (expert_out, recv's layout) back
// to its token's rank at its send-order place in back, a signal from each CTA to every rank,
// then, once every rank's rows are back, y[t] = sum over slots in order of weight * row (fp32,
// rounded once; in the kernel for small T, else in a second, wider kernel); y = 0 after a
// refused dispatch. With `delivered` the rows are already in place (a kernel before this one on
// the stream stored them at row_dst): the signals and the sum only.
cudaError_t moe_combine_direct(const MoeDirectArgs& a, cudaStream_t s);
#endif

}  // namespace weft::kernels
