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

// 16 bytes (4 floats) of cluster CTA `rank`'s shared memory at this CTA's .shared address
// `addr` (the same variable there): mapa, then ld.shared::cluster. The target CTA must not
// have exited (a cluster barrier after the last remote read).
__device__ __forceinline__ float4 ld_shared_cluster_v4_f32(uint32_t addr, uint32_t rank) {
  uint32_t ra;
  float4 v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(addr), "r"(rank));
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(ra)
               : "memory");
  return v;
}

#endif
}  // namespace weft::ptx
#endif
