// Cache prefetches (PTX ISA, data movement instructions: prefetch). The tensor-map prefetch: ptx/tma.cuh.
#pragma once
#if defined(__CUDACC__)

namespace weft::ptx {

// Brings the line holding p into L2 (no register result, no ordering): data a later load
// will read, e.g. an epilogue's sources while the main loop runs.
__device__ __forceinline__ void prefetch_global_L2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

}  // namespace weft::ptx
#endif
