// The one place the library reads the process environment (include/weft/core/env.hpp).
#include "weft/core/env.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <string_view>

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

std::optional<std::string> env_var(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

namespace {

EnvMap one_var(const char* name) {
  EnvMap env;
  if (auto v = env_var(name)) env[name] = *v;
  return env;
}

bool is_choice(std::string_view choices, std::string_view v) {
  while (!choices.empty()) {
    const size_t bar = choices.find('|');
    if (choices.substr(0, bar) == v) return true;
    if (bar == std::string_view::npos) break;
    choices.remove_prefix(bar + 1);
  }
  return false;
}

}  // namespace

int64_t tunable_value(const Tunable& t, const EnvMap& env) {
  auto v = env_get(env, t.env);
  if (!v || v->empty()) return t.default_value;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  WEFT_REQUIRE(end && *end == '\0' && end != v->c_str(), fmt::format("{}='{}' is not an integer ({})", t.env, *v, t.doc));
  // Beyond 64 bits (ERANGE) is out of range too, never a wrapped or saturated value.
  WEFT_REQUIRE(errno != ERANGE && x >= t.min_value && x <= t.max_value,
               fmt::format("{}={} is outside [{}, {}] ({})", t.env, *v, t.min_value, t.max_value, t.doc));
  return x;
}

int64_t tunable_value(const Tunable& t) { return tunable_value(t, one_var(t.env)); }

std::string tunable_text(const TextTunable& t, const EnvMap& env) {
  auto v = env_get(env, t.env);
  if (!v || v->empty()) return t.default_value;
  if (*t.choices) {
    WEFT_REQUIRE(is_choice(t.choices, *v), fmt::format("{}='{}' is not one of {} ({})", t.env, *v, t.choices, t.doc));
  }
  return *v;
}

std::string tunable_text(const TextTunable& t) { return tunable_text(t, one_var(t.env)); }

void validate_tunables(const EnvMap& env) {
#define WEFT_VALIDATE_INT(n, ...) tunable_value(tunables::n, env);
#define WEFT_VALIDATE_TEXT(n, ...) tunable_text(tunables::n, env);
  WEFT_INT_TUNABLES(WEFT_VALIDATE_INT)
  WEFT_TEXT_TUNABLES(WEFT_VALIDATE_TEXT)
#undef WEFT_VALIDATE_INT
#undef WEFT_VALIDATE_TEXT
}

namespace {

TunableInfo info(const Tunable& t) {
  return TunableInfo{t.env, std::to_string(t.default_value), fmt::format("[{}, {}]", t.min_value, t.max_value),
                     t.stability, t.doc};
}

TunableInfo info(const TextTunable& t) {
  return TunableInfo{t.env, t.default_value, *t.choices ? t.choices : "text", t.stability, t.doc};
}

}  // namespace

std::vector<TunableInfo> all_tunables() {
  std::vector<TunableInfo> all;
#define WEFT_LIST_TUNABLE(n, ...) all.push_back(info(tunables::n));
  WEFT_INT_TUNABLES(WEFT_LIST_TUNABLE)
  WEFT_TEXT_TUNABLES(WEFT_LIST_TUNABLE)
#undef WEFT_LIST_TUNABLE
  return all;
}

}  // namespace weft
