// MoE token exchange kernels (ops::MoeDispatchCombine on GPUs; docs/moe.md): the routing (a
// stable counting sort of the (token, slot) pairs by expert, on the device), the pack of the
// rows in send order, the chunk counts' conversion and combine's weighted sum. Launchers: raw
// values and a stream in, cudaError_t out; no allocation, no host synchronisation.
#pragma once
#include <cstdint>

#include "weft/device/dtype.hpp"

#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace weft::kernels {

// The most experts the routing kernel sorts by (its per-warp counts live in shared memory).
inline constexpr int kMoeMaxExperts = 512;

struct MoeRouteArgs {
  const int32_t* ids = nullptr;  // [tokens, top_k] global expert ids
  int tokens = 0, top_k = 1, experts = 1, world = 1, hidden = 8;
  int32_t* pos = nullptr;             // out [tokens * top_k]: the pair's row in send order, -1 if invalid
  uint32_t* expert_counts = nullptr;  // out [experts]: rows for each expert (rank p's experts: block p)
  uint64_t* send_counts = nullptr;    // out [world]: elements (rows * hidden) for each rank
  unsigned long long* bad = nullptr;  // the first invalid pair's index (atomicMin; ~0: none), never reset here
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
#endif

}  // namespace weft::kernels
