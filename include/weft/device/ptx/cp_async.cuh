// Non-bulk asynchronous copies global -> shared, sm_80+ (PTX ISA, data movement instructions:
// cp.async, cp.async.commit_group, cp.async.wait_group). The bulk and tensor copies: ptx/tma.cuh.
#pragma once
#if defined(__CUDACC__)
#include <cstdint>

namespace weft::ptx {

// 16 bytes from global src to shared dst, caching in L2 only (.cg: data read once). valid =
// false reads nothing and fills the 16 bytes with zeros (src-size 0); src must still be a
// global address.
__device__ __forceinline__ void cp_async_cg_16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
// Closes the group of this thread's cp.async issued since the last commit.
__device__ __forceinline__ void cp_async_commit_group() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N of this thread's groups are pending (their bytes are in shared
// memory for this thread; a barrier makes them visible to the CTA).
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

}  // namespace weft::ptx
#endif
