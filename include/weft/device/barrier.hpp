// Barrier across ranks, by one cooperative group per rank. Each rank counts the arrivals
// of every peer in its own slot; barrier number e waits for every slot >= e. Nothing is
// ever reset, so a barrier costs one signal to each peer and one wait per peer.
#pragma once
#include "weft/device/coop.hpp"
#include "weft/device/signal.hpp"

namespace weft::dev {

struct BarrierHandle {
  uint64_t slots_off;  // world signals, symmetric: slot p counts arrivals of rank p
  uint64_t epoch_off;  // this rank's count of completed barriers (read and written locally)
};

// All ranks must call it with the same handle, each with one group. The group's writes
// before it are visible to every peer after it.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Coop>
WEFT_HD void barrier(Coop g, const DeviceCtx& c, BarrierHandle b) {
  g.sync();
  if (g.rank() == 0) {
    uint64_t* epoch = c.local<uint64_t>(b.epoch_off);
    const uint64_t e = *epoch + 1;
    fence_acq_rel();
    for (int k = 1; k < c.world; ++k) signal_add(c, (c.rank + k) % c.world, b.slots_off + 8ull * c.rank, 1);
    for (int k = 1; k < c.world; ++k) {
      const int p = (c.rank + k) % c.world;
      wait_ge(c, b.slots_off + 8ull * p, e, p, WaitKind::kBarrier);
    }
    *epoch = e;
  }
  g.sync();
}

}  // namespace weft::dev
