// Special registers (PTX ISA, special registers): %globaltimer, %smid.
#pragma once
#if defined(__CUDACC__)
#include <cstdint>

namespace weft::ptx {

// Nanoseconds of the global timer (coarse on some parts: ~1 µs ticks); for deadlines and traces.
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The SM this thread runs on (traces: which SM took a tile).
__device__ __forceinline__ uint32_t smid() {
  uint32_t s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

}  // namespace weft::ptx
#endif
