// TMA: bulk tensor copies between global and shared memory described by a CUtensorMap
// (PTX ISA, data movement instructions: cp.async.bulk.tensor, cp.reduce.async.bulk.tensor,
// cp.async.bulk.commit_group / wait_group, prefetch.tensormap). Loads complete on an
// mbarrier (ptx/mbarrier.cuh: arrive_expect_tx first); stores form bulk async-groups.
//
// A store's shared-memory source must be visible to the async proxy: every thread that wrote
// it runs fence_proxy_async_shared_cta (ptx/fence.cuh) before the barrier after which one
// thread issues the store -- a fence inside the store would order the issuing thread's
// writes only.
#pragma once
#if defined(__CUDACC__)
#include <cuda.h>

#include <cstdint>

#include "weft/device/ptx/arch.cuh"
#include "weft/device/ptx/fence.cuh"

namespace weft::ptx {
#if defined(WEFT_PTX_SM90)

// Prefetches the tensor map (kernel parameter or global) into the TMA unit's cache.
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}

// Loads box (x, y) of `map` into this CTA's shared memory at dst; completes `bytes` of bar's
// transaction count.
__device__ __forceinline__ void cp_async_bulk_tensor_2d_load(void* dst, const CUtensorMap* map, uint64_t* bar, int x,
                                                             int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          smem_u32(dst)),
      "l"(map), "r"(smem_u32(bar)), "r"(x), "r"(y)
      : "memory");
}

// As cp_async_bulk_tensor_2d_load, into the same shared-memory offset (data and barrier) of
// every CTA of the cluster in cta_mask.
__device__ __forceinline__ void cp_async_bulk_tensor_2d_load_multicast(void* dst, const CUtensorMap* map, uint64_t* bar,
                                                                       int x, int y, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, "
      "%4}], [%2], %5;" ::"r"(smem_u32(dst)),
      "l"(map), "r"(smem_u32(bar)), "r"(x), "r"(y), "h"(cta_mask)
      : "memory");
}

// Stores shared memory at src to box (x, y) of `map`, in the thread's current bulk group.
__device__ __forceinline__ void cp_async_bulk_tensor_2d_store(const CUtensorMap* map, const void* src, int x, int y) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(map),
               "r"(smem_u32(src)), "r"(x), "r"(y)
               : "memory");
}

// As cp_async_bulk_tensor_2d_store, adding into the destination (element type of the map).
__device__ __forceinline__ void cp_reduce_async_bulk_tensor_2d_add(const CUtensorMap* map, const void* src, int x,
                                                                   int y) {
  asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3}], [%1];" ::"l"(map),
               "r"(smem_u32(src)), "r"(x), "r"(y)
               : "memory");
}

// Closes the thread's current bulk group (the stores issued since the last commit).
__device__ __forceinline__ void cp_async_bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until at most N of the thread's bulk groups have not finished reading their sources
// (their shared memory may be rewritten).
template <int N>
__device__ __forceinline__ void cp_async_bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// Waits until at most N of the thread's bulk groups are incomplete (their writes done).
template <int N>
__device__ __forceinline__ void cp_async_bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}

// Waits until every bulk group of this thread is complete, then fences the async proxy
// against the generic one: a release this thread issues next (a notify: weft/device/tile/)
// publishes the stores.
__device__ __forceinline__ void cp_async_bulk_wait_group_publish() {
  cp_async_bulk_wait_group<0>();
  fence_proxy_async_global();
}

#endif
}  // namespace weft::ptx
#endif
