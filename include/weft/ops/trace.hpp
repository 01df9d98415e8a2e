// Timelines of tiles (computation) and chunks (communication): records, Chrome-trace /
// Perfetto JSON (a process per rank, a thread per SM, worker, stream or engine), and the
// summary `weft trace FILE.json` prints (per rank: communication time, computation time,
// and the fraction of communication hidden behind computation).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "weft/runtime/backend.hpp"

namespace weft::ops {

enum class TraceKind { kTile, kChunk };  // computation, communication

struct TraceEvent {
  int rank = 0;
  TraceKind kind = TraceKind::kTile;
  int64_t id = 0;         // tile index in take order, chunk id, or GEMM/transfer number
  int lane = 0;           // SM, worker, stream or engine: one timeline row per (rank, lane)
  std::string lane_name;  // e.g. "tile worker 1", "copy engine", "compute stream", "SM 17"
  std::string name;       // e.g. "tile (2,3)", "chunk 5 push 0->1", "gemm rows [0,512)"
  int64_t start_ns = 0;   // host clock (CLOCK_MONOTONIC), globaltimer, or CUDA-event offsets
  int64_t end_ns = 0;
};

// Every rank's events on every rank (collective, through the bootstrap).
std::vector<TraceEvent> gather_trace(Backend& b, const std::vector<TraceEvent>& mine);

// Chrome-trace JSON text: "X" events (ts/dur in us from the earliest start; cat "compute" for
// tiles, "comm" for chunks; args: rank, id), and "M" metadata naming processes ("rank r")
// and threads (lane names). `meta_json`, unless empty, is a JSON value (text) placed under
// the top-level key "weft"; InvalidArgument when it does not parse.
std::string to_chrome_trace(const std::vector<TraceEvent>& events, std::string_view meta_json = {});
void write_chrome_trace(const std::string& path, const std::vector<TraceEvent>& events,
                        std::string_view meta_json = {});

struct RankTraceSummary {
  int rank = 0;
  double span_us = 0;     // first start to last end
  double comm_us = 0;     // union of communication intervals
  double compute_us = 0;  // union of computation intervals
  double overlap_us = 0;  // union(comm) intersected with union(compute)
  double hidden = 0;      // overlap_us / comm_us (0 when there is no communication)
  int chunks = 0, tiles = 0;
};

// Reads a Chrome trace (JSON text): "X" events with cat "comm"/"compute"; traces without cat
// (`weft plan --trace`) count tid 1 as computation and tid 0 as communication.
// InvalidArgument when the text is not JSON or not a Chrome trace.
std::vector<RankTraceSummary> summarize_trace(std::string_view chrome_json);
std::string format_trace_summary(const std::vector<RankTraceSummary>& s);

}  // namespace weft::ops
