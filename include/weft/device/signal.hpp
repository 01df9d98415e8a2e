// Signals: 64-bit counters in the symmetric heap. Never reset between calls: call number
// e of an op waits for signal >= e * (notifies per call). Producers write data, then
// signal with release semantics; consumers wait with acquire semantics, under a deadline.
#pragma once
#include "weft/device/atomics.hpp"
#include "weft/device/ctx.hpp"

namespace weft {
// Host side of a timeout (defined in the runtime): throws TimeoutError built from the slot.
[[noreturn]] void raise_timeout(const dev::ErrorSlot& slot, uint64_t timeout_ns);
}  // namespace weft

namespace weft::dev {

// n consecutive signals at a heap offset (same on every rank).
struct SignalSlab {
  uint64_t offset;
  uint32_t count;
  WEFT_HD uint64_t at(uint32_t i) const { return offset + 8ull * i; }
};

#if defined(__CUDA_ARCH__)
// The GPU side of a failed wait: claims the error slot, prints (kPrint), traps. Out of line
// where it prints (a printf is a call anyway): the spin loops that may reach it stay small.
template <bool kPrint>
__device__ __noinline__ void report_failed_wait(const DeviceCtx& c, ErrorSlot s) {
  if (c.error && atomicCAS(&c.error->claimed, 0u, 1u) == 0u) {
    *c.error = s;
    __threadfence_system();
  }
  if (s.kind == static_cast<uint32_t>(WaitKind::kCapacity))
    printf("weft: rank %d: all_to_all_v refused: rank %d would receive %llu elements, the output holds %llu\n", c.rank,
           s.peer, (unsigned long long)s.observed, (unsigned long long)s.expected);
  else
    printf("weft: rank %d block %u thread %u timed out waiting for %s from rank %d: signal @%llu >= %llu, saw %llu\n",
           c.rank, s.block, s.thread, s.kind == static_cast<uint32_t>(WaitKind::kBarrier) ? "barrier" : "signal",
           s.peer, (unsigned long long)s.signal_off, (unsigned long long)s.expected, (unsigned long long)s.observed);
  __trap();
}
#endif

// Records the failed wait and stops: a trap on the GPU (the host reads the slot after the
// launch fails), an exception on the host. kPrint = false leaves out the GPU's printf and
// keeps the report inline: any call in a kernel makes ptxas serialise that kernel's every
// WGMMA (C7510), so WGMMA kernels (weft's GEMM) report through the slot alone.
// `op` (an op_tag) and `chunk` name what the wait was for, where the caller knows it.
template <bool kPrint = true>
WEFT_HD void fail_wait(const DeviceCtx& c, WaitKind kind, int peer, uint64_t off, uint64_t expected, uint64_t observed,
                       uint64_t waited_ns, uint64_t op = 0, int32_t chunk = -1) {
  ErrorSlot s{1u, c.rank, peer, static_cast<uint32_t>(kind), off, expected, observed, waited_ns, 0u, 0u, op, chunk, 0u};
#if defined(__CUDA_ARCH__)
  s.block = blockIdx.x;
  s.thread = threadIdx.x;
  if constexpr (kPrint) {
    report_failed_wait<true>(c, s);
  } else {
    if (c.error && atomicCAS(&c.error->claimed, 0u, 1u) == 0u) {
      *c.error = s;
      __threadfence_system();
    }
    __trap();
  }
#else
  if (c.error && __atomic_exchange_n(&c.error->claimed, 1u, __ATOMIC_ACQ_REL) == 0u) *c.error = s;
  raise_timeout(s, c.timeout_ns);
#endif
}

// Adds v to signal `off` on `peer`, after every earlier write of this thread.
WEFT_HD void signal_add(const DeviceCtx& c, int peer, uint64_t off, uint64_t v = 1) {
  add_release(c.ptr<uint64_t>(peer, off), v);
}

// Sets signal `off` on `peer` to v, after every earlier write of this thread.
WEFT_HD void signal_set(const DeviceCtx& c, int peer, uint64_t off, uint64_t v) {
  store_release(c.ptr<uint64_t>(peer, off), v);
}

WEFT_HD uint64_t signal_read(const DeviceCtx& c, uint64_t off) { return load_acquire(c.local<uint64_t>(off)); }

// Waits until local signal `off` >= expected; returns the value seen. `from_peer` names the
// rank expected to signal (-1 if several), for the error when the deadline passes, and so do
// `op` and `chunk` where given (tile::wait_chunk).
template <bool kPrint = true>
WEFT_HD uint64_t wait_ge(const DeviceCtx& c, uint64_t off, uint64_t expected, int from_peer,
                         WaitKind kind = WaitKind::kSignal, uint64_t op = 0, int32_t chunk = -1) {
  const uint64_t* p = c.local<uint64_t>(off);
  uint64_t v = load_acquire(p);
  if (v >= expected) return v;
  const uint64_t t0 = now_ns();
  uint32_t spins = 0;
  while ((v = load_acquire(p)) < expected) {
    spin_pause(++spins);
    if ((spins & 63u) == 0u) {
      const uint64_t waited = now_ns() - t0;
      if (waited > c.timeout_ns) fail_wait<kPrint>(c, kind, from_peer, off, expected, v, waited, op, chunk);
    }
  }
  return v;
}

// OpenSHMEM fence: puts issued before it reach each peer before puts issued after it.
WEFT_HD void fence() { fence_acq_rel(); }
// OpenSHMEM quiet: every put issued before it has completed (is visible at its peer).
WEFT_HD void quiet() { fence_sc(); }

}  // namespace weft::dev
