#include "tuning_cache.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "weft/core/env.hpp"
#include "weft/core/error.hpp"

namespace weft::ops::detail {

namespace {

// A tuning cache is a small JSON file; anything else (a device, a FIFO, a directory, a file
// over this bound) is ignored like a broken one, never read without end.
constexpr uintmax_t kMaxCacheBytes = 64ull << 20;

nlohmann::json read_cache(const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::is_regular_file(st) || std::filesystem::file_size(path, ec) > kMaxCacheBytes || ec)
    return nlohmann::json::object();
  std::ifstream f(path);
  if (!f.good()) return nlohmann::json::object();
  try {
    auto j = nlohmann::json::parse(f);
    return j.is_object() ? j : nlohmann::json::object();
  } catch (const std::exception&) {
    return nlohmann::json::object();  // a broken cache is ignored (and rewritten by the next store)
  }
}

}  // namespace

std::string tuning_cache_path(const std::string& configured, const std::string& file) {
  if (configured == "-") return "";
  if (!configured.empty()) return configured;
  if (const std::string e = tunable_text(tunables::kTuneCache); !e.empty()) return e == "-" ? "" : e;
  if (auto x = env_var("XDG_CACHE_HOME"); x && !x->empty()) return *x + "/weft/" + file;
  if (auto h = env_var("HOME"); h && !h->empty()) return *h + "/.cache/weft/" + file;
  return "";
}

std::optional<TunedChoice> read_tuned_choice(const std::string& path, const std::string& key) {
  if (path.empty()) return std::nullopt;
  const nlohmann::json j = read_cache(path);
  const auto it = j.find(key);
  if (it == j.end() || !it->is_object()) return std::nullopt;
  const auto m = it->find("method");
  if (m == it->end() || !m->is_string() || m->get<std::string>().size() > 32) return std::nullopt;
  TunedChoice c;
  c.method = m->get<std::string>();
  if (const auto ch = it->find("chunks"); ch != it->end()) {
    if (!ch->is_number_integer()) return std::nullopt;
    const auto v = ch->get<int64_t>();
    if (v < 0 || v > 4096) return std::nullopt;
    c.chunks = static_cast<int>(v);
  }
  return c;
}

void store_tuned_choice(const std::string& path, const std::string& key, const TunedChoice& c, double us) {
  nlohmann::json j = read_cache(path);
  j[key] = {{"method", c.method}, {"chunks", c.chunks}, {"us", us}};
  std::error_code ec;
  const auto dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream f(tmp);
    WEFT_REQUIRE(f.good(), fmt::format("cannot write the tuning cache '{}'", tmp));
    f << j.dump(2) << "\n";
    f.flush();
    WEFT_REQUIRE(f.good(), fmt::format("cannot write the tuning cache '{}'", tmp));
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp);
  WEFT_REQUIRE(!ec, fmt::format("cannot write the tuning cache '{}': {}", path, ec.message()));
}

}  // namespace weft::ops::detail
