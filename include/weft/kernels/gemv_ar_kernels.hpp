// GEMV + AllReduce kernels (ops::GemvAllReduce, issue 23): weft's skinny GEMM (y = x * W^T for
// M <= 128 tokens, streaming W at HBM speed), the fused GEMV + all-reduce (+ residual add and
// RMSNorm) and the unfused add + RMSNorm. Launchers: raw values and a stream in, cudaError_t
// out; no allocation, no host synchronisation (graph-capturable).
//
// The fused call's symmetric state (offsets into every rank's heap, allocated by the op):
//  - receive lines: [2 parities][world sources][m_max * n / 4] 16-byte LL lines, each 8 bytes
//    of data (4 values of y's type, one source's partial product) and the call's epoch twice
//    (collective_algos.hpp's LL format); a call of epoch e uses parity e & 1. Lines are never
//    reset: stale ones carry an older epoch.
//  - epochs: one uint64 per CTA, that CTA's completed calls on this rank.
//  - norm state (epilogue): one uint64 arrival counter for the grid-wide barrier before the
//    norm (16 bytes reserved), then [2 parities][m_max][ctas] floats: each CTA's per-token sum
//    of squares, summed in CTA order by every CTA (bitwise the same on every rank). The
//    protocol and its invariants: gemv_ar_algos.hpp.
//  - LL128 lines (the set of m > kGemvSmallM, GemvArgs::ll128): per [parity][source], per
//    part, the part's words (8 bytes: 4 values of token t, columns j .. j+3; word w = t * pw/4
//    + (j - part start) / 4) packed 15 to a 128-byte line with the epoch as its 16th word
//    (collective_algos.hpp's LL128), gemv_ll128_lines_bytes for the largest layout. 15/16 of
//    the bytes on the link are data, against 1/2 for LL lines; small calls keep LL's 8-byte
//    granularity (a part of 16 columns at m <= 16 is a few lines).
// Calls of m <= kGemvSmallM run a different kernel (the register path: 16-column parts, two
// CTAs per SM) with a grid and owners of its own, so they have a second set of this state
// (GemvArgs of their own: ctas from gemv_ar_fused_small_ctas, m_max = min(m_max, kGemvSmallM)).
// Each set's invariants hold on their own: every rank makes the same sequence of calls, so the
// calls of one set are numbered alike on every rank whatever the other set's calls between them.
#pragma once
#include <cstdint>

#include "weft/device/ctx.hpp"
#include "weft/device/dtype.hpp"

#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace weft::kernels {

struct GemvArgs {
  const void* x = nullptr;  // [m, k] row-major
  const void* w = nullptr;  // [n, k] row-major (torch.nn.functional.linear's weight)
  void* y = nullptr;        // [m, n]: x * w^T (local), the all-reduced sum (fused), or RMSNorm's output (epilogue)
  int m = 0, n = 0, k = 0;  // k: this rank's depth (K / world), a multiple of 8; n a multiple of 8
  int m_max = 0;            // the receive lines' capacity in tokens
  int ctas = 0;             // fused: the grid (persistent CTAs; slices of n shared out among them)
  int ll128 = 0;            // fused: the receive lines are LL128 lines (the large set; see above)
  uint64_t lines_off = 0;   // fused: heap offset of the receive lines (gemv_lines_bytes)
  uint64_t epoch_off = 0;   // fused: heap offset of the per-CTA epochs (gemv_epochs_bytes)
  uint64_t norm_off = 0;    // fused + epilogue: heap offset of the norm state (gemv_norm_bytes)
  // Epilogue (residual == nullptr: none), in fp32 from the dtype's values, each result rounded:
  //   residual_out = y + residual (may alias residual);
  //   y = residual_out * (1 / sqrt(sum over n of residual_out^2 / n + eps)) * gamma.
  // y, residual, residual_out and gamma 8-byte aligned.
  const void* residual = nullptr;
  const void* gamma = nullptr;
  void* residual_out = nullptr;
  float eps = 1e-6f;
  uint64_t op_tag = 0;  // dev::op_tag("gemv_ar"): names the op in a timeout report
};

// The largest m of the register path's fused call (its own state; see above).
inline constexpr int kGemvSmallM = 16;

inline uint64_t gemv_lines_bytes(int world, int m_max, int n) {
  return 2ull * static_cast<uint64_t>(world) * static_cast<uint64_t>(m_max) * static_cast<uint64_t>(n) / 4 * 16;
}
// LL128 lines of one part of pw columns for m_max tokens.
WEFT_HD uint64_t gemv_ll128_lines_per_part(int m_max, int pw) {
  return (static_cast<uint64_t>(m_max) * static_cast<uint64_t>(pw / 4) + 14) / 15;
}
// LL128 receive lines: the largest layout over the part widths the kernels use (8 .. 128:
// tiles of 128 or 64 rows over clusters of 1 .. 8).
inline uint64_t gemv_ll128_lines_bytes(int world, int m_max, int n) {
  uint64_t most = 0;
  for (int pw = 8; pw <= 128; pw *= 2) {
    const uint64_t parts = (static_cast<uint64_t>(n) + static_cast<uint64_t>(pw) - 1) / static_cast<uint64_t>(pw);
    const uint64_t b = 2ull * static_cast<uint64_t>(world) * parts * gemv_ll128_lines_per_part(m_max, pw) * 128;
    most = b > most ? b : most;
  }
  return most;
}
inline uint64_t gemv_epochs_bytes(int ctas) { return 8ull * static_cast<uint64_t>(ctas); }
inline uint64_t gemv_norm_bytes(int m_max, int ctas) {
  return 16 + 2ull * 4 * static_cast<uint64_t>(m_max) * static_cast<uint64_t>(ctas);
}

// Host backend: one fused call by a.ctas host teams, the same exchange, sum and epilogue code
// as the kernel (gemv_ar_algos.hpp) after a scalar GEMV of each slice; throws TimeoutError
// naming the peer on a missed deadline. (src/ops/gemv_ar/host_fused.cpp)
void gemv_ar_host_fused(const dev::DeviceCtx& c, const GemvArgs& a, dev::DType t);

#ifdef WEFT_HAVE_CUDA
// The fused kernel's grid for n columns on this device (persistent: every CTA resident, which
// the epilogue's grid-wide barrier needs; the same for every m). 0: the kernel cannot run here
// (a CUDA query failed or its shared memory does not fit). Every rank must use the same grid.
int gemv_ar_fused_ctas(int n, int device);
// The grid of the fused calls of m <= kGemvSmallM (the register path; persistent as above), for
// receive lines of m_max <= kGemvSmallM tokens. 0: it cannot run here.
int gemv_ar_fused_small_ctas(int n, int m_max, int device);
// y = x * w^T on this rank (no communication): weft's skinny GEMM.
cudaError_t gemv_local(const GemvArgs& a, dev::DType t, cudaStream_t s);
// One fused call (a.ctas CTAs; a.m <= kGemvSmallM: the small set's args): local GEMV, LL push of every finished slice
// to every peer, the sum in rank order where it lands, the epilogue when a.residual is set. Every wait has the deadline
// c.timeout_ns (error slot, then trap).
cudaError_t gemv_ar_fused(const dev::DeviceCtx& c, const GemvArgs& a, dev::DType t, cudaStream_t s);
// Unfused epilogue: residual_out = y + residual; out = RMSNorm(residual_out) * gamma; m rows of n.
cudaError_t add_rmsnorm(const void* y, const void* residual, const void* gamma, void* residual_out, void* out, int m,
                        int n, float eps, dev::DType t, cudaStream_t s);
#endif

}  // namespace weft::kernels
