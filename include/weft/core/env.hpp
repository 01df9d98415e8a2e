// Tunables: each declared once with a name, an environment variable and a default.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace weft {

// A snapshot of the process environment; tests pass their own.
using EnvMap = std::map<std::string, std::string>;
EnvMap current_env();
std::optional<std::string> env_get(const EnvMap& env, const std::string& key);

struct Tunable {
  const char* env;
  int64_t default_value;
  const char* doc;
};

namespace tunables {
inline constexpr Tunable kTimeoutMs{"WEFT_TIMEOUT_MS", 30000, "deadline of every cross-rank wait, in milliseconds"};
inline constexpr Tunable kHostHeapMiB{"WEFT_HOST_HEAP_MIB", 256,
                                      "symmetric heap per rank on the host backend (MiB, sparse)"};
inline constexpr Tunable kGpuHeapMiB{"WEFT_GPU_HEAP_MIB", 2048, "symmetric heap per rank on the nccl backend (MiB)"};
inline constexpr Tunable kHostRanks{"WEFT_HOST_RANKS", 2, "ranks that CLI commands launch on the host backend"};
inline constexpr Tunable kBenchSustainMs{"WEFT_BENCH_SUSTAIN_MS", 500,
                                         "weft bench gemm: ms of back-to-back calls before each timing (steady clock)"};
inline constexpr Tunable kBenchWeftFirst{"WEFT_BENCH_WEFT_FIRST", 0,
                                         "weft bench gemm: 1 = weft times first after each shape's set-up"};
inline constexpr Tunable kBenchSleepUs{"WEFT_BENCH_SLEEP_US", 200,
                                       "weft bench ag_gemm|gemm_rs|gemm_ar: sleep kernel before each timed run (us)"};
inline constexpr Tunable kBenchPerRun{
    "WEFT_BENCH_PER_GRAPH", 0, "weft bench ag_gemm|gemm_rs|gemm_ar: calls per timed run (0: 2, 3 or 10 by size)"};
}  // namespace tunables

// Reads the tunable's variable from the environment; throws InvalidArgument if it is not an integer.
int64_t tunable_value(const Tunable& t, const EnvMap& env);
int64_t tunable_value(const Tunable& t);

}  // namespace weft
