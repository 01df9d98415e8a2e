// Named CTA barriers (PTX ISA, parallel synchronization instructions: bar.sync): a subset of the CTA's warps
// synchronises (a warpgroup) while the others run on. Id 0 is __syncthreads'; a kernel names its others.
#pragma once
#if defined(__CUDACC__)

namespace weft::ptx {

// Waits until `threads` threads (a multiple of 32) have arrived at barrier `id`; orders their
// shared and global accesses as __syncthreads does.
__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace weft::ptx
#endif
