// Proxy and barrier-initialisation fences (PTX ISA §9.7.13.4 membar/fence: fence.proxy.async,
// fence.mbarrier_init). The generic-proxy fences (.acq_rel, .sc): ptx/memory_order.cuh.
//
// Where a fence belongs to one operation it lives in that operation's wrapper
// (cp_async_bulk_wait_group_publish in ptx/tma.cuh; cluster_sync's release/acquire). These are
// the ones that cannot: each must be executed by every thread whose accesses it orders, before
// the barrier that hands the data to the thread issuing the asynchronous operation.
#pragma once
#if defined(__CUDACC__)
#include "weft/device/ptx/arch.cuh"

namespace weft::ptx {
#if defined(WEFT_PTX_SM90)

// This thread's generic-proxy writes to shared memory become visible to the async proxy: run
// by every thread that wrote a TMA store's (or a WGMMA operand's) source before the barrier
// after which one thread issues the store.
__device__ __forceinline__ void fence_proxy_async_shared_cta() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Orders this thread's generic-proxy accesses to global memory against its later async-proxy
// ones (and the async proxy's completed ones against its later generic ones): after acquiring
// a peer's signal, before TMA reads what the peer wrote.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

// Makes this thread's mbarrier.init visible to the cluster (other CTAs' arrives, TMA's
// complete_tx): once, after the last init, before the cluster (or CTA) barrier.
__device__ __forceinline__ void fence_mbarrier_init_release_cluster() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

#endif
}  // namespace weft::ptx
#endif
