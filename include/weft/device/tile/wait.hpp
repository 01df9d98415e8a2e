// Waiting for a chunk: the consumer side of a tile-centric op (a GEMM tile that needs a
// peer's rows, a copy that needs a tile's stores). Host backend and GPU alike.
#pragma once
#include "weft/device/signal.hpp"
#include "weft/device/tile/chunk.hpp"

namespace weft::dev::tile {

// Waits until this rank's counter of `chunk` reaches threshold * epoch (acquire at system
// scope: what the notifier wrote before its release is visible to this thread's later generic
// loads; a TMA read needs ptx::fence_proxy_async_global() after it), under the context's
// deadline. Past it, the context's error slot names the op (s.op), the chunk, `from_peer`
// (the rank that should have notified; -1: several), the counter and the values, and the wait
// traps (GPU) or throws (host). kPrint = false: no printf on the GPU (a WGMMA kernel: see dev::fail_wait).
// Returns the value seen.
template <bool kPrint = true>
WEFT_HD uint64_t wait_chunk(const DeviceCtx& c, ChunkSignals s, int32_t chunk, uint64_t threshold, uint64_t epoch,
                            int from_peer) {
  return wait_ge<kPrint>(c, s.at(chunk), threshold * epoch, from_peer, WaitKind::kSignal, s.op, chunk);
}

}  // namespace weft::dev::tile
