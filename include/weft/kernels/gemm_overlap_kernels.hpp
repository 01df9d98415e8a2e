// Launchers of the small kernels ops::GemmOverlap's decomposed method puts between its
// copy-engine transfers and its cuBLAS GEMMs (src/kernels/gemm_overlap_kernels.cu):
// framework-free, raw values and a stream in, cudaError_t out; graph-capturable.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "weft/device/ctx.hpp"
#include "weft/device/dtype.hpp"

namespace weft::kernels {

inline constexpr int kOverlapListMax = 8;

// Signals to bump: (peer, heap offset, increment). The kernel starts after the stream's
// previous work (a cudaMemcpyAsync) has completed; it issues a system-scope fence, then one
// release add per entry, so a peer that sees the signal sees the copied data.
struct OverlapSignals {
  int32_t count;
  int32_t peer[kOverlapListMax];
  uint64_t off[kOverlapListMax];
  uint64_t inc[kOverlapListMax];
};

// Local signals to wait for: signal off[i] >= epoch * threshold[i], where epoch is read from
// this rank's heap word at epoch_off (a device-side call counter, so graph replays advance
// it); from[i] names the rank expected to signal (for the timeout message).
struct OverlapWaits {
  int32_t count;
  int32_t from[kOverlapListMax];
  uint64_t off[kOverlapListMax];
  int64_t threshold[kOverlapListMax];
};

// One sum of an all-reduce plan in one pass (decomposed gemm_ar: ops::detail::ar_chain_tables):
// after the waits (as overlap_wait's), dst[d][i] = sum over s of src[s][i] for every d, i < n
// (fp32 in source order, rounded once to the element type); then, once every CTA's stores are
// done, the signals (release adds by the last CTA to finish, after a system-scope fence, so a
// peer that sees one sees every CTA's stores). Pointers are this rank's or peers' (the window).
struct OverlapChain {
  int32_t nsrc = 0, ndst = 0;
  const void* src[kOverlapListMax] = {};
  void* dst[kOverlapListMax] = {};
  uint64_t n = 0;
  OverlapWaits waits{};
  OverlapSignals signals{};
  // A device word per chain, zero at first and never reset: the CTAs that finished it, over
  // every call (the last of a call is the one that makes it a multiple of the grid).
  unsigned long long* arrivals = nullptr;
};

// Every kernel of this file, loaded now (kernels::load_kernels: lazy loading).
cudaError_t overlap_preload();
// Adds 1 to the local heap word at epoch_off (one thread).
cudaError_t overlap_epoch_bump(const dev::DeviceCtx& c, uint64_t epoch_off, cudaStream_t s);
cudaError_t overlap_signal(const dev::DeviceCtx& c, const OverlapSignals& sig, cudaStream_t s);
cudaError_t overlap_wait(const dev::DeviceCtx& c, uint64_t epoch_off, const OverlapWaits& w, cudaStream_t s);
// Waits (one thread per peer) until every peer's call counter at epoch_off has reached this
// rank's, under the deadline that names the peer (op: an op_tag for the message). The
// deadline of a stream memory-operation wait on the peers, which has none of its own: beside
// it, a peer that never comes traps this kernel instead of hanging the stream.
cudaError_t overlap_peer_epochs(const dev::DeviceCtx& c, uint64_t epoch_off, uint64_t op, cudaStream_t s);
// A 2-D copy by SMs (rows x width bytes; pitches in bytes) with `ctas` CTAs, in the widest words
// (16 ... 1 bytes) the pointers, pitches and width allow: the decomposed method's fallback where
// the copy engine cannot take a pointer (WEFT_OVERLAP_ENGINE=sm), and GemmOverlap's padding of an
// unaligned K (copy engines move its narrow rows slowly).
cudaError_t overlap_copy(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows, int ctas,
                         cudaStream_t s);
// out[i] = sum over s < nslots of slots[s * slot_stride + i], i < n: fp32 sums in slot order,
// rounded once to t (bf16 or f16). Any alignment (16-byte vectors when everything allows).
// The waits w (as overlap_wait's; none when w.count is 0) are met inside the reduce kernel
// first: one launch, not a wait kernel and then the reduce.
cudaError_t overlap_wait_reduce(const dev::DeviceCtx& c, uint64_t epoch_off, const OverlapWaits& w, const void* slots,
                                uint64_t slot_stride, int nslots, void* out, uint64_t n, dev::DType t, cudaStream_t s);

// OverlapChain on `ctas` CTAs of 512 threads (coll::kCtaThreads), bf16 or f16.
cudaError_t overlap_chain(const dev::DeviceCtx& c, uint64_t epoch_off, const OverlapChain& ch, dev::DType t, int ctas,
                          cudaStream_t s);

}  // namespace weft::kernels
