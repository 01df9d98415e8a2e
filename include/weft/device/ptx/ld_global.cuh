// Global loads with cache hints (PTX ISA, data movement instructions: ld, its .nc form and
// the L1 eviction priorities).
#pragma once
#if defined(__CUDACC__)
#include <cstdint>

namespace weft::ptx {

// 16 bytes of read-only global memory, not allocated in L1 (data read once: a weight streamed
// by a GEMV). The memory must not be written while the kernel runs (.nc).
__device__ __forceinline__ uint4 ld_global_nc_na_v4(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

}  // namespace weft::ptx
#endif
