// One spelling of each memory-ordering operation for both executors: PTX on the GPU,
// GCC atomics on the host backend (where the symmetric heap is shared memory).
#pragma once
#include "weft/device/config.hpp"
#include "weft/device/ptx/memory_order.cuh"

#if !defined(__CUDA_ARCH__)
#include <sched.h>
#include <time.h>
#endif

namespace weft::dev {

WEFT_HD uint64_t load_acquire(const uint64_t* p) {
#if defined(__CUDA_ARCH__)
  return ptx::ld_acquire_sys_global(p);
#else
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#endif
}

WEFT_HD void store_release(uint64_t* p, uint64_t v) {
#if defined(__CUDA_ARCH__)
  ptx::st_release_sys_global(p, v);
#else
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#endif
}

// Single-copy-atomic 8-byte accesses without ordering (the LL protocol's data+flag words).
WEFT_HD uint64_t load_relaxed(const uint64_t* p) {
#if defined(__CUDA_ARCH__)
  return ptx::ld_relaxed_sys_global(p);
#else
  return __atomic_load_n(p, __ATOMIC_RELAXED);
#endif
}

WEFT_HD void store_relaxed(uint64_t* p, uint64_t v) {
#if defined(__CUDA_ARCH__)
  ptx::st_relaxed_sys_global(p, v);
#else
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
#endif
}

WEFT_HD void add_release(uint64_t* p, uint64_t v) {
#if defined(__CUDA_ARCH__)
  ptx::red_release_sys_global_add(p, v);
#else
  __atomic_fetch_add(p, v, __ATOMIC_RELEASE);
#endif
}

// add_release at GPU scope: for a counter only this GPU reads (its threads, or a kernel or a
// copy its stream orders after such a reader) -- no system-wide drain.
WEFT_HD void add_release_gpu(uint64_t* p, uint64_t v) {
#if defined(__CUDA_ARCH__)
  ptx::red_release_gpu_global_add(p, v);
#else
  __atomic_fetch_add(p, v, __ATOMIC_RELEASE);
#endif
}

// Orders this thread's earlier accesses (and, being cumulative, those it observed through
// a barrier) before its later ones, across GPUs.
WEFT_HD void fence_acq_rel() {
#if defined(__CUDA_ARCH__)
  ptx::fence_acq_rel_sys();
#else
  __atomic_thread_fence(__ATOMIC_ACQ_REL);
#endif
}

WEFT_HD void fence_sc() {
#if defined(__CUDA_ARCH__)
  ptx::fence_sc_sys();
#else
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

WEFT_HD uint64_t now_ns() {
#if defined(__CUDA_ARCH__)
  return ptx::globaltimer_ns();
#else
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
#endif
}

// Called in spin loops. On the host, ranks and workers outnumber cores (CI has two):
// yield so that the producer we wait for gets to run.
WEFT_HD void spin_pause(uint32_t spins) {
#if defined(__CUDA_ARCH__)
  (void)spins;
#else
  if (spins > 16) sched_yield();
#endif
}

}  // namespace weft::dev
