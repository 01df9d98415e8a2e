// Cooperative groups that share one put/get/barrier: a thread, a warp, a CTA on the GPU,
// or a team of worker threads on the host backend. Each has rank(), size(), sync().
#pragma once
#include "weft/device/config.hpp"

namespace weft::dev {

struct CoopThread {
  WEFT_HD int rank() const { return 0; }
  WEFT_HD int size() const { return 1; }
  WEFT_HD void sync() const {}
};

#if defined(__CUDACC__)
struct CoopWarp {
  __device__ __forceinline__ int rank() const { return threadIdx.x & 31; }
  __device__ __forceinline__ int size() const { return 32; }
  __device__ __forceinline__ void sync() const { __syncwarp(); }
};

struct CoopCta {
  __device__ __forceinline__ int rank() const { return threadIdx.x; }
  __device__ __forceinline__ int size() const { return blockDim.x; }
  __device__ __forceinline__ void sync() const { __syncthreads(); }
};
#endif

}  // namespace weft::dev
