// The launcher's clean-up on every way out (issue 28, items 6 and 10): no rank outlives a
// launcher that failed, was stopped or was killed, and nothing is left in TMPDIR or /dev/shm.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/runtime/bootstrap.hpp"
#include "weft/runtime/launch.hpp"

using namespace weft;
namespace fs = std::filesystem;

namespace {

// Sets (or unsets) a variable of this process for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* k, std::optional<std::string> v) : k_(k) {
    if (const char* old = std::getenv(k)) old_ = old;
    if (v) setenv(k, v->c_str(), 1);
    else unsetenv(k);
  }
  ~ScopedEnv() {
    if (old_) setenv(k_, old_->c_str(), 1);
    else unsetenv(k_);
  }

 private:
  const char* k_;
  std::optional<std::string> old_;
};

// A fresh directory, removed with everything in it at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "weft-launch-test-XXXXXX").string();
    path = mkdtemp(t.data());
  }
  ~TempDir() { fs::remove_all(path); }
  std::vector<std::string> entries() const {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(path)) v.push_back(e.path().filename().string());
    return v;
  }
};

// The pids that ranks wrote as <dir>/pid.<rank>, waiting up to `wait_ms` for `n` of them.
std::vector<int> rank_pids(const fs::path& dir, int n, int wait_ms) {
  const auto t0 = std::chrono::steady_clock::now();
  while (true) {
    std::vector<int> pids;
    for (int r = 0; r < n; ++r) {
      std::ifstream f(dir / ("pid." + std::to_string(r)));
      int p = 0;
      if (f >> p) pids.push_back(p);
    }
    if (static_cast<int>(pids.size()) == n ||
        std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(wait_ms))
      return pids;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// True once every pid has exited (waiting up to `wait_ms`); kills survivors so that a
// failing test leaves nothing behind either.
bool all_exited(const std::vector<int>& pids, int wait_ms) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(wait_ms)) {
    bool all = true;
    for (int p : pids) all = all && process_exited(p);
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int p : pids) kill(p, SIGKILL);
  return false;
}

// A rank command that records its pid (the shell's, which exec keeps) and then sleeps.
std::vector<std::string> record_pid_and_sleep(const fs::path& dir, const std::string& before = "") {
  return {"sh", "-c", before + "echo $$ > " + dir.string() + "/pid.$WEFT_RANK.tmp && mv " + dir.string() +
                          "/pid.$WEFT_RANK.tmp " + dir.string() + "/pid.$WEFT_RANK; exec sleep 60"};
}

}  // namespace

// Item 6 and 10: a bad value is refused before any rank is forked, naming the variable, the
// value and the range; the session directory is gone.
TEST(LaunchCleanup, BadEnvironmentStartsNoRankAndLeavesNoSessionDirectory) {
  for (const char* bad : {"abc", "-5", "0", "18446744073710", "9223372036854775807", "86400001"}) {
    for (bool in_extra_env : {false, true}) {
      TempDir tmp, marks;
      ScopedEnv tmpdir("TMPDIR", tmp.path.string());
      std::optional<ScopedEnv> timeout;
      LaunchOptions opt;
      opt.nranks = 2;
      opt.quiet = true;
      if (in_extra_env) opt.extra_env["WEFT_TIMEOUT_MS"] = bad;
      else timeout.emplace("WEFT_TIMEOUT_MS", bad);
      std::string msg;
      try {
        launch_exec({"sh", "-c", "touch " + marks.path.string() + "/started.$WEFT_RANK; sleep 30"}, opt);
      } catch (const InvalidArgument& e) {
        msg = e.what();
      }
      EXPECT_NE(msg.find(std::string("WEFT_TIMEOUT_MS")), std::string::npos) << bad << ": " << msg;
      EXPECT_NE(msg.find(bad), std::string::npos) << bad << ": " << msg;
      EXPECT_TRUE(marks.entries().empty()) << "WEFT_TIMEOUT_MS=" << bad << ": ranks were started";
      EXPECT_TRUE(tmp.entries().empty()) << "WEFT_TIMEOUT_MS=" << bad << ": the session directory was left";
    }
  }
}

// Item 6: fork fails at rank 2 of 4 (as under `ulimit -u`): ranks 0 and 1 are stopped.
TEST(LaunchCleanup, ForkFailingPartwayStopsTheRanksAlreadyStarted) {
  TempDir tmp, marks;
  ScopedEnv tmpdir("TMPDIR", tmp.path.string());
  std::vector<int> started;
  LaunchOptions opt;
  opt.nranks = 4;
  opt.quiet = true;
  opt.fork_fn = [&started]() -> int {
    if (started.size() == 2) {
      errno = EAGAIN;
      return -1;
    }
    const pid_t p = fork();
    if (p > 0) started.push_back(p);
    return p;
  };
  std::string msg;
  try {
    launch_exec(record_pid_and_sleep(marks.path), opt);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("fork of rank 2 of 4"), std::string::npos) << msg;
  ASSERT_EQ(started.size(), 2u);
  EXPECT_TRUE(all_exited(started, 2000)) << "ranks started before the failed fork are still running";
  EXPECT_TRUE(tmp.entries().empty()) << "the session directory was left";
}

// Item 6: the launcher SIGKILLed: its ranks die with it (parent-death signal).
TEST(LaunchCleanup, LauncherKilledBySigkillLeavesNoRankRunning) {
  TempDir tmp, marks;
  const int n = 3;
  const pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    setenv("TMPDIR", tmp.path.c_str(), 1);
    LaunchOptions opt;
    opt.nranks = n;
    opt.quiet = true;
    launch_exec(record_pid_and_sleep(marks.path), opt);
    _exit(0);
  }
  const auto pids = rank_pids(marks.path, n, 10000);
  kill(launcher, SIGKILL);
  waitpid(launcher, nullptr, 0);
  ASSERT_EQ(static_cast<int>(pids.size()), n) << "the ranks did not start";
  EXPECT_TRUE(all_exited(pids, 3000)) << "ranks outlived their SIGKILLed launcher";
  // Its session directory cannot be removed by a SIGKILLed launcher: the next launch that
  // uses the same TMPDIR removes it.
  ScopedEnv tmpdir("TMPDIR", tmp.path.string());
  LaunchOptions opt;
  opt.nranks = 1;
  opt.quiet = true;
  auto res = launch_exec({"true"}, opt);
  EXPECT_EQ(launch_exit_code(res), 0);
  EXPECT_TRUE(tmp.entries().empty()) << "the killed launcher's session directory was never removed: "
                                     << (tmp.entries().empty() ? "" : tmp.entries().front());
}

// Item 6: SIGTERM during the fork loop (the launcher gets it as it forks rank 3 of 8):
// every rank started is stopped, no more are started, the launcher exits 128+SIGTERM, and
// nothing is left.
TEST(LaunchCleanup, StopSignalDuringTheForkLoopStopsEveryRank) {
  TempDir tmp, marks;
  const int n = 8;
  const pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    setenv("TMPDIR", tmp.path.c_str(), 1);
    LaunchOptions opt;
    opt.nranks = n;
    opt.quiet = true;
    int forks = 0;
    opt.fork_fn = [&forks]() -> int {
      if (forks++ == 3) kill(getpid(), SIGTERM);
      return fork();
    };
    auto res = launch_exec(record_pid_and_sleep(marks.path), opt);
    _exit(launch_exit_code(res));
  }
  int st = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (waitpid(launcher, &st, WNOHANG) == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (!WIFEXITED(st) && !WIFSIGNALED(st)) {
    kill(launcher, SIGKILL);
    waitpid(launcher, &st, 0);
  }
  std::vector<int> pids;
  for (const auto& e : marks.entries())
    if (e.rfind("pid.", 0) == 0 && e.find(".tmp") == std::string::npos) {
      std::ifstream f(marks.path / e);
      int p = 0;
      if (f >> p) pids.push_back(p);
    }
  EXPECT_TRUE(all_exited(pids, 3000)) << "ranks outlived a launcher stopped by SIGTERM";
  EXPECT_LE(pids.size(), 4u) << "ranks were started after the stop signal";
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGTERM)
      << "launcher " << (WIFSIGNALED(st) ? "died of signal " + std::to_string(WTERMSIG(st)) : "exited")
      << (WIFEXITED(st) ? " with " + std::to_string(WEXITSTATUS(st)) : "");
  EXPECT_TRUE(tmp.entries().empty()) << "the session directory was left";
}

// A rank killed before it could unlink its host heap segment: the launcher removes it.
TEST(LaunchCleanup, SegmentsOfKilledRanksAreRemoved) {
  LaunchOptions opt;
  opt.nranks = 2;
  opt.quiet = true;
  auto res = run_ranks(
      [] {
        const std::string name = "/weft-" + std::to_string(getpid()) + "-launchtest";
        int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
        if (fd >= 0) close(fd);
        raise(SIGKILL);
      },
      opt);
  for (const auto& r : res) {
    EXPECT_EQ(r.term_signal, SIGKILL);
    EXPECT_FALSE(fs::exists("/dev/shm/weft-" + std::to_string(r.pid) + "-launchtest")) << "rank " << r.rank;
    shm_unlink(("/weft-" + std::to_string(r.pid) + "-launchtest").c_str());
  }
}

// ---------------------------------------------------------------------------------------
// Issue 28, item 18: the same error from many ranks is printed once, with the ranks.
namespace {

// Runs a shell command; its stdout and stderr together, and its exit status.
std::pair<std::string, int> shell(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) out += buf;
  const int st = pclose(p);
  return {out, WIFEXITED(st) ? WEXITSTATUS(st) : -1};
}

size_t count_of(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

// Ranks that report through WEFT_ERROR_FILE (as weft's CLI does): one line per distinct
// message naming its ranks, compared without each rank's own "rank <r>: "; a rank killed by a
// signal is still named with its signal.
TEST(LaunchErrors, TheSameErrorFromManyRanksIsOneLineNamingThem) {
  TempDir tmp;
  ScopedEnv tmpdir("TMPDIR", tmp.path.string());
  LaunchOptions opt;
  opt.nranks = 8;
  opt.quiet = true;
  // WEFT_ERROR_FILE is "<pid> <file>": the rank writes the file its pid is paired with.
  const std::string report = "f=${WEFT_ERROR_FILE#* }; ";
  auto res = launch_exec({"sh", "-c",
                          report + "if [ $WEFT_RANK = 7 ]; then kill -9 $$; fi; "
                                   "if [ $WEFT_RANK -lt 5 ]; then echo \"rank $WEFT_RANK: the same check failed\" > $f; "
                                   "else echo 'rank 2: another error' > $f; fi; exit 1"},
                         opt);
  for (int r = 0; r < 5; ++r) EXPECT_EQ(res[r].message, "rank " + std::to_string(r) + ": the same check failed");
  const std::string out = describe_results(res);
  EXPECT_EQ(out,
            "weft launch: ranks 0-4 exited with status 1: the same check failed\n"
            "weft launch: ranks 5, 6 exited with status 1: rank 2: another error\n"
            "weft launch: rank 7 died of signal 9 (" +
                std::string(strsignal(9)) + ")\n");
  EXPECT_TRUE(tmp.entries().empty()) << "the session directory was left";
}

// The CLI relaunched as ranks (item 18's "per-rank checks after relaunch"): every rank fails
// the same way; the error is printed once, naming ranks 0-3. A command that a rank runs
// (another process than the rank) prints its own error: it is not lost when the rank exits 0.
TEST(LaunchErrors, CliRanksFailingAlikePrintTheErrorOnce) {
  TempDir tmp, out;
  const std::string env = "TMPDIR=" + tmp.path.string() + " WEFT_BACKEND=host WEFT_HOST_HEAP_MIB=1 WEFT_TIMEOUT_MS=20000 ";
  const std::string bench = std::string(WEFT_CLI_PATH) + " bench ag_gemm --quick --shapes 512x512x512 --out " +
                            out.path.string();
  const auto [all, rc] = shell(env + "WEFT_HOST_RANKS=4 " + bench);
  EXPECT_EQ(rc, 1) << all;
  EXPECT_EQ(count_of(all, "symmetric heap exhausted"), 1u) << all;
  EXPECT_NE(all.find("weft launch: ranks 0-3 exited with status 1: symmetric heap exhausted"), std::string::npos)
      << all;

  const auto [nested, nested_rc] =
      shell(env + std::string(WEFT_CLI_PATH) + " launch -n 2 -- sh -c '" + bench + "; true'");
  EXPECT_EQ(nested_rc, 0) << nested;
  EXPECT_EQ(count_of(nested, "weft: error: symmetric heap exhausted"), 2u) << nested;
  EXPECT_TRUE(tmp.entries().empty()) << "left in TMPDIR";
}
