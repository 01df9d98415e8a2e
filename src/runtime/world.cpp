#include "weft/runtime/world.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <optional>
#include <vector>

#include "weft/core/error.hpp"

namespace weft {
namespace {

struct LauncherVars {
  const char* name;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;  // may be derived when absent (see below)
};

// In order of precedence.
const LauncherVars kLaunchers[] = {
    {"weft launch", "WEFT_RANK", "WEFT_WORLD_SIZE", "WEFT_LOCAL_RANK", "WEFT_LOCAL_SIZE"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

int parse_int(const std::string& key, const std::string& value) {
  char* end = nullptr;
  long v = std::strtol(value.c_str(), &end, 10);
  WEFT_REQUIRE(!value.empty() && end && *end == '\0' && v >= 0 && v < (1 << 24),
               fmt::format("environment variable {}='{}' is not a non-negative integer", key, value));
  return static_cast<int>(v);
}

std::optional<World> from_launcher(const LauncherVars& l, const EnvMap& env) {
  const char* required[] = {l.rank, l.size, l.local_rank};
  std::vector<std::string> present, missing;
  for (const char* k : required) (env.count(k) ? present : missing).push_back(k);
  if (present.empty()) return std::nullopt;
  if (!missing.empty())
    throw_invalid(__FILE__, __LINE__,
                  fmt::format("half-set {} environment: {} set but {} missing", l.name,
                              fmt::join(present, ", "), fmt::join(missing, ", ")));
  World w;
  w.source = l.name;
  w.rank = parse_int(l.rank, env.at(l.rank));
  w.size = parse_int(l.size, env.at(l.size));
  w.local_rank = parse_int(l.local_rank, env.at(l.local_rank));
  if (auto ls = env_get(env, l.local_size)) {
    // Slurm writes e.g. "4" or "4(x2)"; take the leading count.
    std::string s = *ls;
    auto paren = s.find('(');
    if (paren != std::string::npos) s = s.substr(0, paren);
    w.local_size = parse_int(l.local_size, s);
  } else {
    w.local_size = w.size;  // single node assumed when the launcher does not say
  }
  WEFT_REQUIRE(w.size >= 1, fmt::format("{}: world size {} must be at least 1", l.name, w.size));
  WEFT_REQUIRE(w.rank < w.size, fmt::format("{}: rank {} is not below world size {}", l.name, w.rank, w.size));
  WEFT_REQUIRE(w.local_size >= 1 && w.local_size <= w.size,
               fmt::format("{}: local size {} must be in [1, world size {}]", l.name, w.local_size, w.size));
  WEFT_REQUIRE(w.local_rank < w.local_size,
               fmt::format("{}: local rank {} is not below local size {}", l.name, w.local_rank, w.local_size));
  w.node = w.rank / w.local_size;
  return w;
}

}  // namespace

World world_from_env(const EnvMap& env) {
  // The first launcher whose variables appear wins: weft's own launcher may run inside a
  // Slurm allocation, torchrun inside Open MPI, and so on. Ranks whose worlds disagree are
  // caught by the bootstrap, which compares every rank's world size.
  for (const auto& l : kLaunchers)
    if (auto w = from_launcher(l, env)) return *w;
  return World{};
}

World world_from_env() { return world_from_env(current_env()); }

void check_local_ranks_fit(const World& w, int num_gpus) {
  WEFT_REQUIRE(w.local_size <= num_gpus,
               fmt::format("{} ranks on this node but only {} GPU(s): weft runs one process per GPU "
                           "(launch at most {} local ranks, or set WEFT_BACKEND=host)",
                           w.local_size, num_gpus, num_gpus));
}

}  // namespace weft
