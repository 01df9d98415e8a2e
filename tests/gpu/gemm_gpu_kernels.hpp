#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace weft::testing {
// sig[0..n) = v, each with release semantics (system scope), from one CTA on stream s.
cudaError_t set_signals(uint64_t* sig, int n, uint64_t v, cudaStream_t s);
}  // namespace weft::testing
