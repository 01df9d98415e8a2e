// The environment and weft's tunables: the one place the library reads environment variables.
//
// Every tunable is declared once, below, in WEFT_INT_TUNABLES or WEFT_TEXT_TUNABLES: its C++
// name, its variable, its default, the values it accepts, whether it is stable (a user may set
// it) or experimental (a comparison switch; may go away), and what it does. `weft info
// --tunables` and docs/tunables.md list the same table. A value outside what a tunable accepts
// is an InvalidArgument naming the variable, never a silent clamp.
//
// Environment variables that are not weft's tunables (HOME, TMPDIR, the launchers' RANK...)
// are read through env_var() or current_env(), also defined in src/core/env.cpp: `grep -rn
// getenv src include` finds that file alone.
//
// Header-only declarations of plain data: nvcc-safe (the .cu launchers include it).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace weft {

// A snapshot of the process environment; tests pass their own.
using EnvMap = std::map<std::string, std::string>;
EnvMap current_env();
std::optional<std::string> env_get(const EnvMap& env, const std::string& key);
// One variable of the process environment (not a tunable: HOME, TMPDIR, launcher variables).
std::optional<std::string> env_var(const char* name);

enum class Stability : uint8_t {
  kStable,        // part of the interface: documented in the README
  kExperimental,  // a comparison or diagnosis switch; defaults are the measured best
};

// An integer tunable in [min_value, max_value].
struct Tunable {
  const char* env;
  int64_t default_value;
  int64_t min_value;
  int64_t max_value;
  Stability stability;
  const char* doc;
};

// A text tunable; `choices` is "a|b|c", or empty for free text (a path).
struct TextTunable {
  const char* env;
  const char* default_value;
  const char* choices;
  Stability stability;
  const char* doc;
};

// X(name, variable, default, min, max, stability, doc)
#define WEFT_INT_TUNABLES(X)                                                                                          \
  X(kTimeoutMs, "WEFT_TIMEOUT_MS", 30000, 1, 86400000, kStable, "deadline of every cross-rank wait, in milliseconds") \
  X(kHostHeapMiB, "WEFT_HOST_HEAP_MIB", 256, 1, 1048576, kStable,                                                     \
    "symmetric heap per rank on the host backend (MiB; heap x ranks reserved in /dev/shm)")                           \
  X(kGpuHeapMiB, "WEFT_GPU_HEAP_MIB", 2048, 1, 1048576, kStable, "symmetric heap per rank on the nccl backend (MiB)") \
  X(kHostRanks, "WEFT_HOST_RANKS", 2, 1, 1024, kStable, "ranks that CLI commands launch on the host backend")         \
  X(kPdl, "WEFT_PDL", 1, 0, 1, kExperimental,                                                                         \
    "0: collectives and GEMMs without waits launch without programmatic dependent launch")                            \
  X(kCollCtas, "WEFT_COLL_CTAS", 0, 0, 1024, kExperimental,                                                           \
    "CTAs of every weft collective (0: by algorithm and size)")                                                       \
  X(kGemmCluster, "WEFT_GEMM_CLUSTER", 0, 0, 2, kExperimental,                                                        \
    "weft's GEMM without an order table: 1 single CTAs, 2 CTA pairs (0: by shape)")                                   \
  X(kGemmKBlock, "WEFT_GEMM_BK", 0, 0, 64, kExperimental, "weft's GEMM: 32 for 32-deep k-blocks (0 or 64: 64)")       \
  X(kGemmGroupM, "WEFT_GEMM_GROUP_M", 0, 0, 4096, kExperimental,                                                      \
    "weft's GEMM without an order table: M-blocks per raster group (0: 16)")                                          \
  X(kGemvCluster, "WEFT_GEMV_CLUSTER", 0, 0, 8, kExperimental,                                                        \
    "weft's GEMV at M > 16: CTAs per cluster splitting K, 1, 2, 4 or 8 (0: by shape)")                                \
  X(kFusedRsPieces, "WEFT_FUSED_RS_PIECES", 0, 0, 4096, kExperimental,                                                \
    "fused gemm_rs: pieces per peer block (0: by shape)")                                                             \
  X(kMoeCombinePull, "WEFT_MOE_COMBINE_PULL", 1, 0, 1, kExperimental,                                                 \
    "MoE direct combine: 1 pull the rows where every rank's lie in its symmetric heap, 0 push them back")             \
  X(kMoeDispatchOnce, "WEFT_MOE_DISPATCH_ONCE", 1, 0, 2, kExperimental,                                               \
    "MoE direct dispatch on GPUs: 0 a row per (token, expert), 2 one per (token, peer rank), 1 by the rule")          \
  X(kMoeDirectCtas, "WEFT_MOE_DIRECT_CTAS", 0, 0, 512, kExperimental,                                                 \
    "MoE direct dispatch and combine: CTAs of each kernel (0: one an SM), at most what the GPU holds at once")        \
  X(kBenchSustainMs, "WEFT_BENCH_SUSTAIN_MS", 500, 0, 600000, kStable,                                                \
    "weft bench gemm: ms of back-to-back calls before each timing (steady clock)")                                    \
  X(kBenchWeftFirst, "WEFT_BENCH_WEFT_FIRST", 0, 0, 1, kExperimental,                                                 \
    "weft bench gemm: 1 = weft times first after each shape's set-up")                                                \
  X(kBenchSleepUs, "WEFT_BENCH_SLEEP_US", 200, 0, 100000, kStable,                                                    \
    "weft bench ag_gemm|gemm_rs|gemm_ar: sleep kernel before each timed run (us)")                                    \
  X(kBenchPerRun, "WEFT_BENCH_PER_GRAPH", 0, 0, 1000, kExperimental,                                                  \
    "weft bench ag_gemm|gemm_rs|gemm_ar: calls per timed run (0: 2, 3 or 10 by size)")

// X(name, variable, default, choices, stability, doc)
#define WEFT_TEXT_TUNABLES(X)                                                                                        \
  X(kBackend, "WEFT_BACKEND", "auto", "auto|nccl|host", kStable,                                                     \
    "nccl (GPUs) or host (shared memory, worker threads); auto: nccl where GPUs and a CUDA build are")               \
  X(kTuneCache, "WEFT_TUNE_CACHE", "", "", kStable,                                                                  \
    "tuning cache that auto reads and bench --tune writes; '-': none; empty: $XDG_CACHE_HOME/weft or ~/.cache/weft") \
  X(kDeviceConstants, "WEFT_DEVICE_CONSTANTS", "", "", kStable,                                                      \
    "device constants (JSON) for the cost model; empty: the constants compiled into the library")                    \
  X(kRsFold, "WEFT_RS_FOLD", "auto", "auto|gather|lt|weft|1|0", kExperimental,                                       \
    "gemm_rs decomposed: how the peers' partial products meet the own block (auto: the cost model's rule)")          \
  X(kOverlapEngine, "WEFT_OVERLAP_ENGINE", "copy_engine", "copy_engine|sm", kExperimental,                           \
    "GEMM+communication decomposed: the engine of the transfers")                                                    \
  X(kGemmTune, "WEFT_GEMM_TUNE", "add", "0|1|add", kExperimental,                                                    \
    "decomposed cuBLAS GEMMs: 1 times every problem's candidates, add only those adding C, 0 none")

namespace tunables {
#define WEFT_DECLARE_INT_TUNABLE(name, var, def, lo, hi, stab, doc) \
  inline constexpr Tunable name{var, def, lo, hi, Stability::stab, doc};
#define WEFT_DECLARE_TEXT_TUNABLE(name, var, def, choices, stab, doc) \
  inline constexpr TextTunable name{var, def, choices, Stability::stab, doc};
WEFT_INT_TUNABLES(WEFT_DECLARE_INT_TUNABLE)
WEFT_TEXT_TUNABLES(WEFT_DECLARE_TEXT_TUNABLE)
#undef WEFT_DECLARE_INT_TUNABLE
#undef WEFT_DECLARE_TEXT_TUNABLE
}  // namespace tunables

// Reads the tunable's variable; unset or empty gives the default. Throws InvalidArgument
// naming the variable when the value is not an integer, or outside [min_value, max_value].
int64_t tunable_value(const Tunable& t, const EnvMap& env);
int64_t tunable_value(const Tunable& t);
// Reads a text tunable; unset or empty gives the default. Throws InvalidArgument naming the
// variable and the choices when the value is not one of them.
std::string tunable_text(const TextTunable& t, const EnvMap& env);
std::string tunable_text(const TextTunable& t);

// Checks every tunable set in `env` (integers in range, text among its choices); throws the
// InvalidArgument of the first bad one. Launchers call it before they start any rank.
void validate_tunables(const EnvMap& env);

// One row of the registry, for listings (`weft info --tunables`, docs/tunables.md).
struct TunableInfo {
  const char* env;
  std::string default_value;
  std::string accepts;  // "[lo, hi]" or "a|b|c" or "text"
  Stability stability;
  const char* doc;
};
// Every tunable, in declaration order (integers first).
std::vector<TunableInfo> all_tunables();

}  // namespace weft
