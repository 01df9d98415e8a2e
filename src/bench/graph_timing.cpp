#include "weft/bench/graph_timing.hpp"

#include "weft/core/cuda_check.hpp"
#include "weft/kernels/runtime_kernels.hpp"

namespace weft::bench {

std::vector<double> time_graph_replays(Backend& b, dev::BarrierHandle bar, cudaStream_t stream, cudaEvent_t e0,
                                       cudaEvent_t e1, int per_graph, int reps, uint64_t sleep_ns,
                                       const std::function<void()>& call) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  WEFT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < per_graph; ++i) call();
  WEFT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  WEFT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  WEFT_CUDA_CHECK(cudaGraphLaunch(exec, stream));  // warm-up
  WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> us;
  for (int r = 0; r < reps; ++r) {
    // Line the GPUs up, then keep the stream busy while the host enqueues the timed graph:
    // neither rank skew nor launch latency lands inside the events.
    WEFT_CUDA_CHECK(kernels::device_barrier(b.ctx(), bar, stream));
    WEFT_CUDA_CHECK(kernels::device_sleep(sleep_ns, stream));
    WEFT_CUDA_CHECK(cudaEventRecord(e0, stream));
    WEFT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    WEFT_CUDA_CHECK(cudaEventRecord(e1, stream));
    WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
    float ms = 0;
    WEFT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    us.push_back(ms * 1e3 / per_graph);
  }
  WEFT_CUDA_CHECK(cudaGraphExecDestroy(exec));
  WEFT_CUDA_CHECK(cudaGraphDestroy(graph));
  b.synchronize();
  return us;
}

}  // namespace weft::bench
