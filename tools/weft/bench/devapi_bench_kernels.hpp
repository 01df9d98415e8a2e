// Launchers of the device-API micro-benchmark kernels (devapi_bench_kernels.cu; part of the
// benchmark harness, not of libweft).
#pragma once
#include <cuda_runtime.h>

#include "weft/device/ctx.hpp"

namespace weft::kernels {

// Fills `words` 32-bit words at heap offset `off` with a pattern of (rank, index).
cudaError_t bench_fill(const dev::DeviceCtx& c, uint64_t off, uint64_t words, cudaStream_t s);
// Adds to *bad the number of words at `off` that are not `owner`'s pattern.
cudaError_t bench_verify(const dev::DeviceCtx& c, uint64_t off, uint64_t words, int owner, unsigned long long* bad,
                         cudaStream_t s);
// `ctas` blocks of kBenchThreads each move one contiguous slice of `bytes` with dev::put
// (push: my src to the peer's dst) or dev::get (pull: the peer's src to my dst).
inline constexpr int kBenchThreads = 512;
cudaError_t bench_push(const dev::DeviceCtx& c, int peer, uint64_t src, uint64_t dst, uint64_t bytes, int ctas,
                       cudaStream_t s);
cudaError_t bench_pull(const dev::DeviceCtx& c, int peer, uint64_t src, uint64_t dst, uint64_t bytes, int ctas,
                       cudaStream_t s);
// Ranks 0 and 1 bounce signal `sig` `iters` times (one thread each); `base` is the number
// of round trips made on this signal before.
cudaError_t bench_pingpong(const dev::DeviceCtx& c, uint64_t sig, uint64_t base, int iters, cudaStream_t s);

}  // namespace weft::kernels
