// Notifying a chunk: the producer side of a tile-centric op. Host backend and GPU alike.
#pragma once
#include "weft/device/atomics.hpp"
#include "weft/device/tile/chunk.hpp"

namespace weft::dev::tile {

// Adds v to the counter of `chunk` on rank `peer`, after every earlier write of this thread
// (release; cumulative: writes this thread observed through a barrier or an acquire count
// too). On this rank the release is at GPU scope -- the counter's readers are this GPU's
// threads, or kernels and copies its streams order after them; on a peer, at system scope.
// Data written by TMA or another async proxy first needs its completion and a proxy fence
// (ptx::cp_async_bulk_wait_group_publish).
WEFT_HD void notify_chunk(const DeviceCtx& c, ChunkSignals s, int32_t chunk, int peer, uint64_t v = 1) {
  uint64_t* const counter = c.ptr<uint64_t>(peer, s.at(chunk));
  if (peer == c.rank)
    add_release_gpu(counter, v);
  else
    add_release(counter, v);
}

}  // namespace weft::dev::tile
