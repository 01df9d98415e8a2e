// What every sm_90 PTX family below needs: the feature tests and shared-memory addresses.
//
// WEFT_PTX_SM90 is defined in device code for compute capability 9.0 and later (TMA, mbarrier
// transaction counts, clusters, async-proxy fences); WEFT_PTX_SM90A in device code compiled for
// sm_90a (WGMMA, setmaxnreg). The families' wrappers exist only there: a kernel that uses them
// guards its body with the same macro (its other architectures' code is then empty), so a
// missing instruction is a compile error, never a silent no-op.
#pragma once
#if defined(__CUDACC__)
#include <cstdint>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define WEFT_PTX_SM90 1
#endif
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WEFT_PTX_SM90A 1
#endif

namespace weft::ptx {

// 32-bit .shared::cta address of a generic pointer into this CTA's shared memory (cvta).
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

}  // namespace weft::ptx
#endif
