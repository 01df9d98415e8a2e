// mbarrier: shared-memory barriers with arrival counts and transaction (byte) counts
// (PTX ISA, parallel synchronization instructions: mbarrier.init, .arrive, .expect_tx,
// .try_wait.parity). The fence after init:
// fence_mbarrier_init_release_cluster (ptx/fence.cuh).
#pragma once
#if defined(__CUDACC__)
#include <cstdint>

#include "weft/device/ptx/arch.cuh"

namespace weft::ptx {
#if defined(WEFT_PTX_SM90)

// Initialises the barrier to expect `count` arrivals per phase (one thread, before any use).
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}

// Arrives and adds `bytes` to the phase's expected transaction count (the producer, before
// issuing the TMA loads that complete_tx on this barrier).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

// Arrives on a barrier of this CTA (release at CTA scope: the default semantics).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// Arrives on the barrier at the same shared-memory offset in CTA `cta` of the cluster (mapa).
// No .release.cluster, as CUTLASS's remote arrive: that fence on every stage release held CTA
// pairs in lock-step (docs/gemm.md, the ladder's step 3).
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t* bar, uint32_t cta) {
  asm volatile(
      "{\n.reg .b32 ra;\n"
      "mapa.shared::cluster.u32 ra, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(smem_u32(bar)),
      "r"(cta)
      : "memory");
}

// Waits until the phase with parity `parity` has completed (try_wait's bounded suspend, in a
// loop; acquire at CTA scope). Phases alternate: a ring slot used for the n-th time waits for
// parity n & 1.
__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

#endif
}  // namespace weft::ptx
#endif
