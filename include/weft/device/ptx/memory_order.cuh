// PTX memory-ordering wrappers, named by instruction, scope and meaning.
// PTX ISA 8.x: §9.7.9.8 ld (.acquire, .volatile), §9.7.9.10 st (.release), §9.7.13.5 red
// (.release), §9.7.13.4 fence (.acq_rel / .sc). The async-proxy fences: ptx/fence.cuh.
#pragma once
#if defined(__CUDACC__)
#include <cstdint>

#include "weft/device/ptx/sreg.cuh"  // globaltimer_ns, for the deadlines of atomics.hpp's users

namespace weft::ptx {

// Acquire load at system scope: later reads see everything the releasing peer wrote.
__device__ __forceinline__ uint64_t ld_acquire_sys_global(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Release store at system scope: earlier writes of this thread are visible before the value.
__device__ __forceinline__ void st_release_sys_global(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Release add at system scope with no return value (a fire-and-forget reduction).
__device__ __forceinline__ void red_release_sys_global_add(uint64_t* p, uint64_t v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Release add at GPU scope: for a counter read on this GPU only (by its threads, or by a
// kernel or a copy the stream orders after such a reader) -- no system-wide drain.
__device__ __forceinline__ void red_release_gpu_global_add(uint64_t* p, uint64_t v) {
  asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Cumulative fence: orders every access this thread observed before it against later ones.
__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

// Sequentially consistent fence at system scope (membar.sys): all prior writes complete.
__device__ __forceinline__ void fence_sc_sys() { asm volatile("fence.sc.sys;" ::: "memory"); }

// Relaxed 64-bit load / store at system scope: single-copy atomic, no ordering. The LL
// protocol relies on exactly that: data and flag travel in one 8-byte word.
__device__ __forceinline__ uint64_t ld_relaxed_sys_global(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed_sys_global(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Volatile 64-bit load (no caching, one access per call, no ordering): a value another stream
// advances between launches (a device-side epoch). An asm statement, not a volatile pointer:
// nvcc 13 folded `dev ? *dev : x` through a volatile pointer into one load from a select of
// the two addresses, the parameter's being invalid (compute-sanitizer: a read at 0x3d0).
__device__ __forceinline__ uint64_t ld_volatile_global(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

}  // namespace weft::ptx
#endif
