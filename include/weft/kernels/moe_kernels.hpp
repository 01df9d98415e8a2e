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

// Method direct (docs/moe.md, "Direct"): one kernel a direction, every row stored straight into
// its final place in the peer's symmetric buffer. Symmetric heap offsets (the same on every
// rank) and this rank's device state.
inline constexpr int kMoeDirectCtas = 64;
inline constexpr int kMoeDirectMaxWorld = 32;  // ranks (its per-rank tables live in shared memory)
struct MoeDirectArgs {
  dev::DeviceCtx ctx;
  MoeRouteArgs route;  // dispatch: the routing (ids, pos, expert_counts, bad); combine: pos
  int local = 1, top_k = 1, hidden = 8, tokens = 0;
  dev::DType dtype = dev::DType::kBF16;
  uint64_t capacity = 0;    // rows each rank may receive
  uint64_t recv_off = 0;    // [capacity, hidden]: dispatch's rows, rank-major, expert-grouped
  uint64_t back_off = 0;    // [tokens * top_k, hidden]: combine's rows, in send order
  // [2 parities][world src][world dst][local] uint64: every rank's chunk counts as tagged words,
  // (call number << 32) | rows, each its own "arrived" flag.
  uint64_t counts_off = 0;
  uint64_t sig_off = 0;  // [2][world] uint64 signals (+1 a CTA a call): rows in, rows back
  // [3]: dispatches and combines made, and dispatch's CTAs through its routing barrier (all
  // counted by the kernels themselves, so graph replays count too).
  uint64_t* calls = nullptr;
  uint32_t* slice_counts = nullptr;  // [kMoeDirectCtas][experts]: dispatch's per-slice expert counts
  int64_t* chunks = nullptr;                // out: [world][local] rows received (recv_counts())
  int64_t* ret = nullptr;                   // [world][3]: rows before source s in recv, s's send offset of
                                            // this rank's rows, rows from s (dispatch writes, combine reads)
  unsigned long long* refused = nullptr;    // ~0: none; else (rank << 40 | rows) of the first rank over capacity
  const void* x = nullptr;                  // dispatch: [tokens, hidden]
  const void* expert_out = nullptr;         // combine: [rows, hidden] in recv's layout
  const float* weights = nullptr;           // combine: [tokens, top_k]
  void* y = nullptr;                        // combine: [tokens, hidden]
};

#ifdef WEFT_HAVE_CUDA
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
// refused dispatch.
cudaError_t moe_combine_direct(const MoeDirectArgs& a, cudaStream_t s);
#endif

}  // namespace weft::kernels
