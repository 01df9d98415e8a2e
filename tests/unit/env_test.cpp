// The registry of tunables (include/weft/core/env.hpp): defaults, errors that name the
// variable, the listing, and that the library reads the environment in one file only.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "weft/core/env.hpp"
#include "weft/core/error.hpp"

using weft::EnvMap;
namespace tunables = weft::tunables;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const weft::InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument)";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::set<std::string> registry_names() {
  std::set<std::string> names;
  for (const weft::TunableInfo& t : weft::all_tunables()) names.insert(t.env);
  return names;
}

// Every C++, CUDA and header file under src/ and include/ of the source tree.
std::vector<std::filesystem::path> library_sources() {
  std::vector<std::filesystem::path> files;
  for (const char* dir : {"src", "include"})
    for (const auto& e : std::filesystem::recursive_directory_iterator(std::filesystem::path(WEFT_SOURCE_TREE) / dir)) {
      const std::string ext = e.path().extension().string();
      if (e.is_regular_file() && (ext == ".cpp" || ext == ".hpp" || ext == ".h" || ext == ".cu" || ext == ".cuh"))
        files.push_back(e.path());
    }
  return files;
}

std::string read_all(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string rel_path(const std::filesystem::path& p) {
  return std::filesystem::relative(p, WEFT_SOURCE_TREE).generic_string();
}


}  // namespace

TEST(Tunables, UnsetOrEmptyGivesTheDefault) {
  EXPECT_EQ(weft::tunable_value(tunables::kTimeoutMs, EnvMap{}), 30000);
  EXPECT_EQ(weft::tunable_value(tunables::kTimeoutMs, EnvMap{{"WEFT_TIMEOUT_MS", ""}}), 30000);
  EXPECT_EQ(weft::tunable_value(tunables::kPdl, EnvMap{}), 1);
  EXPECT_EQ(weft::tunable_value(tunables::kFusedRsPieces, EnvMap{}), 0);
  EXPECT_EQ(weft::tunable_text(tunables::kRsFold, EnvMap{}), "auto");
  EXPECT_EQ(weft::tunable_text(tunables::kOverlapEngine, EnvMap{{"WEFT_OVERLAP_ENGINE", ""}}), "copy_engine");
  EXPECT_EQ(weft::tunable_text(tunables::kGemmTune, EnvMap{}), "add");
  EXPECT_EQ(weft::tunable_text(tunables::kTuneCache, EnvMap{}), "");
  EXPECT_EQ(weft::tunable_text(tunables::kDeviceConstants, EnvMap{}), "");
  // A set value wins; other variables are not read.
  EXPECT_EQ(weft::tunable_value(tunables::kPdl, EnvMap{{"WEFT_PDL", "0"}, {"WEFT_TIMEOUT_MS", "x"}}), 0);
  EXPECT_EQ(weft::tunable_text(tunables::kRsFold, EnvMap{{"WEFT_RS_FOLD", "lt"}}), "lt");
  EXPECT_EQ(weft::tunable_text(tunables::kTuneCache, EnvMap{{"WEFT_TUNE_CACHE", "/tmp/x.json"}}), "/tmp/x.json");
}

TEST(Tunables, OutOfRangeNamesTheVariableAndTheRange) {
  const std::string pdl = error_of([] { weft::tunable_value(tunables::kPdl, EnvMap{{"WEFT_PDL", "2"}}); });
  EXPECT_TRUE(contains(pdl, "WEFT_PDL=2") && contains(pdl, "[0, 1]")) << pdl;
  const std::string t = error_of([] { weft::tunable_value(tunables::kTimeoutMs, EnvMap{{"WEFT_TIMEOUT_MS", "0"}}); });
  EXPECT_TRUE(contains(t, "WEFT_TIMEOUT_MS=0") && contains(t, "[1, 86400000]")) << t;
  const std::string neg =
      error_of([] { weft::tunable_value(tunables::kFusedRsPieces, EnvMap{{"WEFT_FUSED_RS_PIECES", "-1"}}); });
  EXPECT_TRUE(contains(neg, "WEFT_FUSED_RS_PIECES")) << neg;
  const std::string junk = error_of([] { weft::tunable_value(tunables::kPdl, EnvMap{{"WEFT_PDL", "on"}}); });
  EXPECT_TRUE(contains(junk, "WEFT_PDL='on' is not an integer")) << junk;
  const std::string huge =
      error_of([] { weft::tunable_value(tunables::kTimeoutMs, EnvMap{{"WEFT_TIMEOUT_MS", "99999999999999999999"}}); });
  EXPECT_TRUE(contains(huge, "WEFT_TIMEOUT_MS")) << huge;
}

// Issue 28, item 10: values that once wrapped (18446744073710 ms x 10^6 ns), overflowed the
// launcher's grace (2^63-1 + 5000) or were negative: each refused, naming value and range.
TEST(Tunables, TimeoutsThatOverflowedAreRefusedNamingTheValueAndTheRange) {
  for (const char* v : {"18446744073710", "9223372036854775807", "9223372036854775808", "-1", "-9223372036854775808",
                        "86400001", "99999999999999999999"}) {
    const std::string e =
        error_of([v] { weft::tunable_value(tunables::kTimeoutMs, EnvMap{{"WEFT_TIMEOUT_MS", v}}); });
    EXPECT_TRUE(contains(e, std::string("WEFT_TIMEOUT_MS=") + v) && contains(e, "[1, 86400000]")) << v << ": " << e;
  }
  EXPECT_EQ(weft::tunable_value(tunables::kTimeoutMs, EnvMap{{"WEFT_TIMEOUT_MS", "86400000"}}), 86400000);
}

// What launchers call before forking: every tunable set, integers and text.
TEST(Tunables, ValidateChecksEveryTunableSet) {
  EXPECT_NO_THROW(weft::validate_tunables(EnvMap{{"WEFT_TIMEOUT_MS", "100"}, {"WEFT_BACKEND", "host"}, {"HOME", "x"}}));
  EXPECT_TRUE(contains(error_of([] { weft::validate_tunables(EnvMap{{"WEFT_TIMEOUT_MS", "abc"}}); }), "WEFT_TIMEOUT_MS"));
  EXPECT_TRUE(contains(error_of([] { weft::validate_tunables(EnvMap{{"WEFT_BACKEND", "gpu"}}); }), "WEFT_BACKEND"));
  EXPECT_TRUE(contains(error_of([] { weft::validate_tunables(EnvMap{{"WEFT_HOST_HEAP_MIB", "1000000000"}}); }),
                       "WEFT_HOST_HEAP_MIB=1000000000 is outside"));
}

TEST(Tunables, TextOutsideTheChoicesListsThem) {
  const std::string fold = error_of([] { weft::tunable_text(tunables::kRsFold, EnvMap{{"WEFT_RS_FOLD", "fast"}}); });
  EXPECT_TRUE(contains(fold, "WEFT_RS_FOLD='fast'") && contains(fold, "auto|gather|lt|weft|1|0")) << fold;
  const std::string engine =
      error_of([] { weft::tunable_text(tunables::kOverlapEngine, EnvMap{{"WEFT_OVERLAP_ENGINE", "tma"}}); });
  EXPECT_TRUE(contains(engine, "WEFT_OVERLAP_ENGINE") && contains(engine, "copy_engine|sm")) << engine;
  // A prefix or a longer word of a choice is not the choice.
  EXPECT_THROW(weft::tunable_text(tunables::kGemmTune, EnvMap{{"WEFT_GEMM_TUNE", "ad"}}), weft::InvalidArgument);
  EXPECT_THROW(weft::tunable_text(tunables::kGemmTune, EnvMap{{"WEFT_GEMM_TUNE", "add1"}}), weft::InvalidArgument);
  EXPECT_EQ(weft::tunable_text(tunables::kGemmTune, EnvMap{{"WEFT_GEMM_TUNE", "0"}}), "0");
}

TEST(Tunables, ListingHasEveryVariableOnce) {
  const auto all = weft::all_tunables();
  const std::set<std::string> names = registry_names();
  EXPECT_EQ(names.size(), all.size()) << "a variable is declared twice";
  for (const char* v : {"WEFT_TIMEOUT_MS", "WEFT_BACKEND", "WEFT_PDL", "WEFT_RS_FOLD", "WEFT_OVERLAP_ENGINE",
                        "WEFT_GEMM_TUNE", "WEFT_FUSED_RS_PIECES", "WEFT_TUNE_CACHE", "WEFT_DEVICE_CONSTANTS"})
    EXPECT_EQ(names.count(v), 1u) << v;
  // Switches deleted with the variants they selected (docs/gemm_overlap.md).
  for (const char* v : {"WEFT_FUSED_RS", "WEFT_FUSED_RS_DIRECT", "WEFT_FUSED_RS_DEBUG", "WEFT_FUSED_RS_NOTIFY",
                        "WEFT_FUSED_PAIRS", "WEFT_RS_FOLD_DEBUG", "WEFT_RS_FOLD_CTAS", "WEFT_RS_KERNEL_SYNC",
                        "WEFT_AG_OWN_IN_PLACE"})
    EXPECT_EQ(names.count(v), 0u) << v;
  for (const auto& t : all) {
    EXPECT_FALSE(t.accepts.empty()) << t.env;
    EXPECT_TRUE(t.doc && *t.doc) << t.env;
  }
}

// Every "WEFT_..." name the library's sources spell is a tunable or one of the launcher's
// variables (read through env_get, not tunables).
TEST(Tunables, EveryVariableTheLibraryNamesIsRegistered) {
  const std::set<std::string> names = registry_names();
  const std::set<std::string> launcher = {"WEFT_RANK", "WEFT_WORLD_SIZE", "WEFT_LOCAL_RANK", "WEFT_LOCAL_SIZE",
                                          "WEFT_BOOTSTRAP_DIR", "WEFT_ERROR_FILE"};
  // Quoted names "WEFT_[A-Z0-9_]+" (a hand scan: GCC 12's std::regex trips -Wmaybe-uninitialized
  // in the sanitizer build).
  auto is_name_char = [](char ch) { return (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_'; };
  int seen = 0;
  for (const auto& p : library_sources()) {
    const std::string text = read_all(p), rel = rel_path(p);
    for (size_t at = text.find("\"WEFT_"); at != std::string::npos; at = text.find("\"WEFT_", at + 1)) {
      size_t end = at + 1;
      while (end < text.size() && is_name_char(text[end])) ++end;
      if (end >= text.size() || text[end] != '"') continue;
      const std::string v = text.substr(at + 1, end - at - 1);
      ++seen;
      EXPECT_TRUE(names.count(v) || launcher.count(v)) << rel << " names " << v << ", which is not in the registry";
    }
  }
  EXPECT_GT(seen, 10) << "the scan found no variable names: wrong source tree " << WEFT_SOURCE_TREE;
}

// `grep -rn getenv src include` finds src/core/env.cpp alone.
TEST(Tunables, OnlyEnvCppReadsTheEnvironment) {
  const auto files = library_sources();
  ASSERT_GT(files.size(), 20u) << "wrong source tree " << WEFT_SOURCE_TREE;
  bool env_cpp_reads = false;
  for (const auto& p : files) {
    const std::string text = read_all(p), rel = rel_path(p);
    if (rel == "src/core/env.cpp") {
      env_cpp_reads = contains(text, "getenv(");
      continue;
    }
    EXPECT_FALSE(contains(text, "getenv(")) << rel << " calls getenv: read through weft/core/env.hpp";
  }
  EXPECT_TRUE(env_cpp_reads) << "src/core/env.cpp no longer calls getenv: is this the right tree?";
}

// docs/tunables.md lists every tunable with its default (it is `weft info --tunables`'s output).
TEST(Tunables, DocsListEveryTunable) {
  const std::string doc = read_all(std::filesystem::path(WEFT_SOURCE_TREE) / "docs" / "tunables.md");
  ASSERT_FALSE(doc.empty());
  for (const weft::TunableInfo& t : weft::all_tunables()) {
    const std::string row =
        std::string("| `") + t.env + "` | " + (t.default_value.empty() ? "(empty)" : t.default_value) + " |";
    EXPECT_TRUE(contains(doc, row)) << "docs/tunables.md has no row " << row
                                    << ": regenerate it with `weft info --tunables`";
  }
}
