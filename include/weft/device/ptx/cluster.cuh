// Thread-block clusters (PTX ISA: special register %cluster_ctarank; parallel synchronization
// instructions: barrier.cluster). Addressing another CTA's shared memory (mapa) lives in the wrapper that
// uses it: mbarrier_arrive_cluster (ptx/mbarrier.cuh).
#pragma once
#if defined(__CUDACC__)
#include <cstdint>

#include "weft/device/ptx/arch.cuh"

namespace weft::ptx {
#if defined(WEFT_PTX_SM90)

// This CTA's rank in its cluster (0 .. cluster size - 1).
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Every thread of every CTA of the cluster arrives (release at cluster scope) and waits
// (acquire): barrier set-up before, remote arrives and multicasts after. Not .aligned: a
// warp's lanes may arrive at different times (a producer warp whose lane 0 ran ahead).
__device__ __forceinline__ void barrier_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

#endif
}  // namespace weft::ptx
#endif
