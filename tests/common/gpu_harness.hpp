// GPU tests fork their ranks (no CUDA in the gtest process itself: a forked child could not
// use it). Helpers shared by tests/gpu/.
#pragma once
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "weft/runtime/backend.hpp"
#include "weft/runtime/launch.hpp"

namespace weft::testing {

// GPUs this machine has, counted in a forked child.
inline int gpus() {
  static int n = count_gpus_forked();
  return n;
}

// n ranks on the nccl backend with a symmetric heap of heap_mib each; waits time out after
// timeout_ms, raised by WEFT_TEST_TIMEOUT_MS for slow runs (compute-sanitizer); a rank still
// running after deadline_ms is killed (the test fails instead of hanging).
inline std::vector<RankResult> run_gpu_ranks(int n, const std::function<void()>& fn, int heap_mib, int64_t deadline_ms,
                                             int64_t timeout_ms = 20000) {
  if (const char* t = std::getenv("WEFT_TEST_TIMEOUT_MS")) timeout_ms = std::max<int64_t>(timeout_ms, std::atoll(t));
  LaunchOptions opt;
  opt.nranks = n;
  opt.extra_env = {{"WEFT_BACKEND", "nccl"},
                   {"WEFT_GPU_HEAP_MIB", std::to_string(heap_mib)},
                   {"WEFT_TIMEOUT_MS", std::to_string(timeout_ms)}};
  opt.grace_ms = timeout_ms + 10000;
  opt.deadline_ms = deadline_ms;
  opt.quiet = true;
  return run_ranks(fn, opt);
}

}  // namespace weft::testing
