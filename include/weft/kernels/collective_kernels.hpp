// Launcher of weft's collective kernels (src/kernels/collective_kernels.cu): one kernel of
// a.ctas CTAs per call; no allocation, no host synchronisation (graph-capturable).
#pragma once
#include <cuda_runtime.h>

#include "weft/kernels/collective_algos.hpp"

namespace weft::kernels {

inline constexpr int kCollThreads = coll::kCtaThreads;
cudaError_t collective(const dev::DeviceCtx& c, const coll::Args& a, dev::DType dtype, cudaStream_t s);

}  // namespace weft::kernels
