#include "weft/bench/graph_timing.hpp"

#include "weft/core/cuda_check.hpp"
#include "weft/kernels/runtime_kernels.hpp"

namespace weft::bench {

TimingStream::TimingStream(bool on) {
  if (!on) return;
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaEventCreate(&e0));
  WEFT_CUDA_CHECK(cudaEventCreate(&e1));
}

TimingStream::~TimingStream() {
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  if (stream) cudaStreamDestroy(stream);
}

double event_us(cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1, const std::function<void()>& enqueue) {
  WEFT_CUDA_CHECK(cudaEventRecord(e0, stream));
  enqueue();
  WEFT_CUDA_CHECK(cudaEventRecord(e1, stream));
  WEFT_CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  WEFT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  return ms * 1e3;
}

double timed_run(Backend& b, dev::BarrierHandle bar, cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1,
                 uint64_t sleep_ns, int calls, const std::function<void()>& enqueue) {
  WEFT_CUDA_CHECK(kernels::device_barrier(b.ctx(), bar, stream));
  WEFT_CUDA_CHECK(kernels::device_sleep(sleep_ns, stream));
  return event_us(stream, e0, e1, enqueue) / calls;
}

ReplayGraph::ReplayGraph(cudaStream_t stream, int per_graph, const std::function<void()>& call)
    : stream_(stream), per_graph_(per_graph) {
  WEFT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < per_graph; ++i) call();
  WEFT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph_));
  WEFT_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
}

ReplayGraph::~ReplayGraph() {
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
}

void ReplayGraph::launch() { WEFT_CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

double ReplayGraph::timed_replay(Backend& b, dev::BarrierHandle bar, cudaEvent_t e0, cudaEvent_t e1,
                                 uint64_t sleep_ns) {
  return timed_run(b, bar, stream_, e0, e1, sleep_ns, per_graph_, [this] { launch(); });
}

std::vector<double> time_graph_replays(Backend& b, dev::BarrierHandle bar, cudaStream_t stream, cudaEvent_t e0,
                                       cudaEvent_t e1, int per_graph, int reps, uint64_t sleep_ns,
                                       const std::function<void()>& call) {
  std::vector<double> us;
  {
    ReplayGraph g(stream, per_graph, call);
    g.launch();  // warm-up
    WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int r = 0; r < reps; ++r) us.push_back(g.timed_replay(b, bar, e0, e1, sleep_ns));
  }
  b.synchronize();
  return us;
}

}  // namespace weft::bench
