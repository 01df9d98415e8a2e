// Chunk signals: where an op keeps the counters of its chunks (or tiles). Counter i sits at
// heap offset base + 8 i on every rank (the symmetric heap), is never reset, and call number
// `epoch` of the op waits for it to reach threshold * epoch (signal.hpp): the op's tables hold
// the per-call thresholds and stay fixed across calls and CUDA-graph replays.
#pragma once
#include "weft/device/ctx.hpp"

namespace weft::dev::tile {

struct ChunkSignals {
  uint64_t base;    // heap offset of chunk 0's counter
  uint64_t op = 0;  // op_tag of the op (named by a timeout; 0: not named)
  WEFT_HD uint64_t at(int32_t chunk) const { return base + 8ull * static_cast<uint64_t>(chunk); }
};

}  // namespace weft::dev::tile
