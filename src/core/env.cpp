#include "weft/core/env.hpp"

#include <fmt/format.h>

#include <cstdlib>

#include "weft/core/error.hpp"

extern char** environ;

namespace weft {

EnvMap current_env() {
  EnvMap env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

std::optional<std::string> env_get(const EnvMap& env, const std::string& key) {
  auto it = env.find(key);
  if (it == env.end()) return std::nullopt;
  return it->second;
}

int64_t tunable_value(const Tunable& t, const EnvMap& env) {
  auto v = env_get(env, t.env);
  if (!v || v->empty()) return t.default_value;
  char* end = nullptr;
  long long x = std::strtoll(v->c_str(), &end, 10);
  WEFT_REQUIRE(end && *end == '\0', fmt::format("{}='{}' is not an integer ({})", t.env, *v, t.doc));
  return x;
}

int64_t tunable_value(const Tunable& t) {
  const char* v = std::getenv(t.env);
  EnvMap env;
  if (v) env[t.env] = v;
  return tunable_value(t, env);
}

}  // namespace weft
