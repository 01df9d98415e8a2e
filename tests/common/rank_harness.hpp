// Forks N host ranks for a test and checks how each ended.
#pragma once
#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/runtime/launch.hpp"

namespace weft::testing {

inline std::vector<RankResult> run_host_ranks(int n, const std::function<void()>& fn, EnvMap extra = {},
                                              int64_t timeout_ms = 5000) {
  LaunchOptions opt;
  opt.nranks = n;
  extra["WEFT_BACKEND"] = "host";
  extra["WEFT_HOST_HEAP_MIB"] = "16";
  extra["WEFT_TIMEOUT_MS"] = std::to_string(timeout_ms);
  opt.extra_env = extra;
  opt.grace_ms = timeout_ms + 5000;
  opt.deadline_ms = 240000;  // a hang fails the test instead of the CI job
  opt.quiet = true;
  return run_ranks(fn, opt);
}

inline void expect_all_ok(const std::vector<RankResult>& res) {
  for (const auto& r : res)
    EXPECT_EQ(r.exit_code, 0) << "rank " << r.rank << (r.killed_by_launcher ? " hung and was killed" : "") << ": "
                              << r.message;
}

// What f throws: an Error's message (without its source location), another exception's what(),
// or "(no exception)".
inline std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

// Fails (WEFT_CHECK, so a rank's exit reports it) unless f throws a message containing `want`.
inline void expect_message(const std::function<void()>& f, const std::string& want) {
  const std::string got = message_of(f);
  WEFT_CHECK(got.find(want) != std::string::npos, "expected '" + want + "' in: " + got);
}

inline int world_rank() { return std::stoi(std::getenv("WEFT_RANK")); }

}  // namespace weft::testing
