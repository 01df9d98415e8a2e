// Device-API semantics scenarios, written once and run by both executors: CUDA kernels on
// the nccl backend (tests/gpu) and host worker teams on the host backend (tests/unit).
// Payloads encode their source rank, index and epoch, so misrouted or stale data shows.
#pragma once
#include "weft/device/api.hpp"

namespace weft::testing {

WEFT_HD uint8_t payload(int rank, uint64_t i, uint64_t salt) {
  uint64_t x = (static_cast<uint64_t>(rank) + 1) * 0x9E3779B97F4A7C15ull ^ (i * 0xBF58476D1CE4E5B9ull) ^ (salt * 0x94D049BB133111EBull);
  x ^= x >> 29;
  return static_cast<uint8_t>(x ^ (x >> 17) ^ (x >> 41));
}

inline constexpr uint8_t kPoison = 0xEE;

// The granularity of the group that runs a scenario on each rank.
enum class Gran { kThread, kWarp, kBlock };
inline const char* to_string(Gran g) { return g == Gran::kThread ? "thread" : g == Gran::kWarp ? "warp" : "block"; }

// Every rank puts `len` bytes of its payload into slot `rank` of every peer's dst (itself
// included), skewed to test unaligned heads and tails, then signals; every rank waits for
// all signals of this epoch.
struct PutArgs {
  uint64_t src_off, dst_off, slot_bytes, len, src_skew, dst_skew, epoch;
  dev::SignalSlab sig;
};

#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Coop>
WEFT_HD void fill_payload(Coop g, const dev::DeviceCtx& c, uint64_t off, uint64_t n, uint64_t salt) {
  uint8_t* p = c.local<uint8_t>(off);
  for (uint64_t i = static_cast<uint64_t>(g.rank()); i < n; i += static_cast<uint64_t>(g.size()))
    p[i] = payload(c.rank, i, salt);
  g.sync();
}

#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Coop>
WEFT_HD void scenario_put_signal(Coop g, const dev::DeviceCtx& c, PutArgs a) {
  fill_payload(g, c, a.src_off, a.src_skew + a.len, a.epoch);
  const uint8_t* src = c.local<uint8_t>(a.src_off) + a.src_skew;
  for (int k = 0; k < c.world; ++k) {
    const int p = (c.rank + k) % c.world;
    dev::put_signal(g, c, p, a.dst_off + a.slot_bytes * c.rank + a.dst_skew, src, a.len, a.sig.at(c.rank), 1);
  }
  if (g.rank() == 0)
    for (int p = 0; p < c.world; ++p) dev::wait_ge(c, a.sig.at(p), a.epoch, p);
  g.sync();
}

// Every rank fills its src, meets the others at a barrier, then gets every peer's src
// into slot p of its dst, and meets them again (nobody refills src while others read).
struct GetArgs {
  uint64_t src_off, dst_off, slot_bytes, len, src_skew, dst_skew, epoch;
  dev::BarrierHandle bar;
};

#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Coop>
WEFT_HD void scenario_get(Coop g, const dev::DeviceCtx& c, GetArgs a) {
  fill_payload(g, c, a.src_off, a.src_skew + a.len, a.epoch);
  dev::barrier(g, c, a.bar);
  for (int k = 0; k < c.world; ++k) {
    const int p = (c.rank + k) % c.world;
    dev::get(g, c, c.local<uint8_t>(a.dst_off + a.slot_bytes * p + a.dst_skew), p, a.src_off + a.src_skew, a.len);
  }
  dev::barrier(g, c, a.bar);
}

// Rounds of: write round's value into slot `rank` on every peer, barrier, check that
// every slot holds it, barrier. Counts mismatches into the local word at errors_off.
struct BarrierArgs {
  uint64_t slots_off, errors_off, first_value, rounds;
  dev::BarrierHandle bar;
};

#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Coop>
WEFT_HD void scenario_barrier(Coop g, const dev::DeviceCtx& c, BarrierArgs a) {
  uint64_t errors = 0;
  for (uint64_t r = 0; r < a.rounds; ++r) {
    const uint64_t v = a.first_value + r;
    if (g.rank() == 0)
      for (int p = 0; p < c.world; ++p) *c.ptr<volatile uint64_t>(p, a.slots_off + 8ull * c.rank) = v;
    dev::barrier(g, c, a.bar);
    if (g.rank() == 0)
      for (int p = 0; p < c.world; ++p) errors += *c.local<volatile uint64_t>(a.slots_off + 8ull * p) != v;
    dev::barrier(g, c, a.bar);
  }
  if (g.rank() == 0) *c.local<uint64_t>(a.errors_off) += errors;
}

// The victim rank skips the barrier (its process exits); the others must time out naming it.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Coop>
WEFT_HD void scenario_barrier_once(Coop g, const dev::DeviceCtx& c, dev::BarrierHandle bar) {
  dev::barrier(g, c, bar);
}

}  // namespace weft::testing
