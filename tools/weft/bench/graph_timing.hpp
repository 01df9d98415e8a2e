// Timing calls inside a CUDA graph, as every weft GPU benchmark does (GPU builds only).
#pragma once
#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "weft/device/barrier.hpp"
#include "weft/runtime/backend.hpp"

namespace weft::bench {

// A non-blocking stream and two timing events, made when `on` (a GPU bench; all null otherwise)
// and destroyed with the object.
struct TimingStream {
  explicit TimingStream(bool on);
  ~TimingStream();
  TimingStream(const TimingStream&) = delete;
  TimingStream& operator=(const TimingStream&) = delete;
  cudaStream_t stream = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
};

// Captures `per_graph` back-to-back `call()`s on `stream` into one graph, replays it once to
// warm up, then `reps` times: each replay after a device barrier (GPUs lined up) and a
// `sleep_ns` sleep kernel (the host enqueues the replay before the GPU reaches it), between
// events e0/e1. Returns the µs per call of each replay; ends with b.synchronize().
std::vector<double> time_graph_replays(Backend& b, dev::BarrierHandle bar, cudaStream_t stream, cudaEvent_t e0,
                                       cudaEvent_t e1, int per_graph, int reps, uint64_t sleep_ns,
                                       const std::function<void()>& call);

// µs between events e0 and e1 recorded on `stream` around `enqueue()`; waits for e1.
double event_us(cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1, const std::function<void()>& enqueue);

// GPUs lined up by `bar`, a `sleep_ns` sleep kernel (the host enqueues what follows before the
// GPU reaches it), then `enqueue()` -- `calls` calls -- between events e0/e1; synchronises;
// returns µs per call. Neither rank skew nor launch latency lands inside the events.
double timed_run(Backend& b, dev::BarrierHandle bar, cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1,
                 uint64_t sleep_ns, int calls, const std::function<void()>& enqueue);

// One captured graph of `per_graph` back-to-back `call()`s on `stream`, replayed on demand: the
// bench keeps one per method and interleaves their replays, so every method is timed under the
// same clock and power history (a method timed right after an idle gap runs at a higher clock).
class ReplayGraph {
 public:
  ReplayGraph(cudaStream_t stream, int per_graph, const std::function<void()>& call);
  ~ReplayGraph();
  ReplayGraph(const ReplayGraph&) = delete;
  ReplayGraph& operator=(const ReplayGraph&) = delete;
  // One untimed replay (no synchronisation).
  void launch();
  // One replay as a timed_run; returns µs per call.
  double timed_replay(Backend& b, dev::BarrierHandle bar, cudaEvent_t e0, cudaEvent_t e1, uint64_t sleep_ns);

 private:
  cudaStream_t stream_;
  int per_graph_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace weft::bench
#endif
