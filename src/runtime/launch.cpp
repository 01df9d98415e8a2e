#include "weft/runtime/launch.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "weft/core/error.hpp"

namespace weft {
namespace {

// Set by SIGINT/SIGTERM while ranks run: the launcher passes the signal on to every rank.
volatile sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

// Ranks run in process groups of their own, so that a kill reaches whatever they started
// (a shell's children too) and nothing is left holding the terminal or a pipe.
void kill_rank(pid_t pid, int sig) {
  if (kill(-pid, sig) != 0) kill(pid, sig);
}

std::string make_session_dir() {
  const std::string tmp = env_var("TMPDIR").value_or("");
  std::string templ = (tmp.empty() ? std::string("/tmp") : tmp) + "/weft-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  WEFT_CHECK(mkdtemp(buf.data()) != nullptr, fmt::format("mkdtemp({}) failed: {}", templ, std::strerror(errno)));
  return buf.data();
}

void set_rank_env(int rank, const LaunchOptions& opt, const std::string& dir) {
  setenv("WEFT_RANK", std::to_string(rank).c_str(), 1);
  setenv("WEFT_WORLD_SIZE", std::to_string(opt.nranks).c_str(), 1);
  setenv("WEFT_LOCAL_RANK", std::to_string(rank).c_str(), 1);
  setenv("WEFT_LOCAL_SIZE", std::to_string(opt.nranks).c_str(), 1);
  setenv("WEFT_BOOTSTRAP_DIR", dir.c_str(), 1);
  for (const auto& [k, v] : opt.extra_env) setenv(k.c_str(), v.c_str(), 1);
}

std::vector<RankResult> wait_all(const std::vector<pid_t>& pids, const LaunchOptions& opt) {
  const int n = static_cast<int>(pids.size());
  std::vector<RankResult> res(n);
  std::vector<bool> done(n, false);
  int left = n;
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  int64_t grace = opt.grace_ms > 0 ? opt.grace_ms : tunable_value(tunables::kTimeoutMs) + 5000;
  std::optional<clock::time_point> first_failure;
  auto sleep = std::chrono::microseconds(100);
  while (left > 0) {
    bool progressed = false;
    for (int r = 0; r < n; ++r) {
      if (done[r]) continue;
      int st = 0;
      pid_t p = waitpid(pids[r], &st, WNOHANG);
      if (p == 0) continue;
      done[r] = true;
      --left;
      progressed = true;
      res[r].rank = r;
      res[r].pid = pids[r];
      if (p < 0) {
        res[r].exit_code = -1;
      } else if (WIFEXITED(st)) {
        res[r].exit_code = WEXITSTATUS(st);
      } else if (WIFSIGNALED(st)) {
        res[r].exit_code = -1;
        res[r].term_signal = WTERMSIG(st);
      }
      if (res[r].exit_code != 0 && !first_failure) first_failure = clock::now();
    }
    if (left == 0) break;
    const auto now = clock::now();
    const bool grace_over =
        first_failure && std::chrono::duration_cast<std::chrono::milliseconds>(now - *first_failure).count() > grace;
    const bool deadline_over =
        opt.deadline_ms > 0 &&
        std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count() > opt.deadline_ms;
    if (g_stop_signal) {
      for (int r = 0; r < n; ++r)
        if (!done[r]) kill_rank(pids[r], g_stop_signal);
      g_stop_signal = 0;
      if (!first_failure) first_failure = now;  // then the grace period, then SIGKILL
      grace = std::min<int64_t>(grace, 3000);
    }
    if (grace_over || deadline_over) {
      for (int r = 0; r < n; ++r)
        if (!done[r]) {
          kill_rank(pids[r], SIGKILL);
          res[r].killed_by_launcher = true;
        }
      for (int r = 0; r < n; ++r)
        if (!done[r]) {
          int st = 0;
          waitpid(pids[r], &st, 0);
          res[r].rank = r;
          res[r].pid = pids[r];
          res[r].exit_code = -1;
          res[r].term_signal = SIGKILL;
          done[r] = true;
        }
      for (int r = 0; r < n; ++r) kill(-pids[r], SIGKILL);  // leftovers of ranks that exited
      break;
    }
    if (!progressed) {
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(20000));
    }
  }
  return res;
}

// Forks opt.nranks children, each in a process group of its own with the rank's
// environment set, running child(rank) (which must not return). Returns their pids.
std::vector<pid_t> fork_ranks(const LaunchOptions& opt, const std::string& dir,
                              const std::function<void(int)>& child) {
  std::cout.flush();
  std::cerr.flush();
  std::vector<pid_t> pids;
  for (int r = 0; r < opt.nranks; ++r) {
    pid_t pid = fork();
    WEFT_SYSCHECK(pid);
    if (pid == 0) {
      setpgid(0, 0);
      set_rank_env(r, opt, dir);
      child(r);
      _exit(0);
    }
    setpgid(pid, pid);  // also here: no race with the child's own call
    pids.push_back(pid);
  }
  return pids;
}

}  // namespace

bool inside_launcher(const EnvMap& env) {
  for (const char* k : {"WEFT_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"})
    if (env.count(k)) return true;
  return false;
}

std::vector<RankResult> launch_exec(const std::vector<std::string>& argv, const LaunchOptions& opt) {
  WEFT_REQUIRE(!argv.empty(), "weft launch: no command given (usage: weft launch -n N -- command args...)");
  WEFT_REQUIRE(opt.nranks >= 1, fmt::format("weft launch: -n {} must be at least 1", opt.nranks));
  const std::string dir = make_session_dir();
  const auto pids = fork_ranks(opt, dir, [&](int r) {
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "weft launch: rank %d: cannot run '%s': %s\n", r, args[0], std::strerror(errno));
    _exit(127);
  });
  struct sigaction sa{}, old_int{}, old_term{};
  sa.sa_handler = on_stop_signal;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  auto res = wait_all(pids, opt);
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  std::filesystem::remove_all(dir);
  if (!opt.quiet && launch_exit_code(res) != 0) std::cerr << describe_results(res);
  return res;
}

std::vector<RankResult> run_ranks(const std::function<void()>& fn, const LaunchOptions& opt) {
  WEFT_REQUIRE(opt.nranks >= 1, "run_ranks needs at least one rank");
  const std::string dir = make_session_dir();
  const auto pids = fork_ranks(opt, dir, [&](int r) {
    int code = 0;
    std::string msg;
    try {
      fn();
    } catch (const std::exception& e) {
      msg = e.what();
      code = 1;
    } catch (...) {
      msg = "unknown exception";
      code = 1;
    }
    if (code) {
      std::ofstream(fmt::format("{}/error.{}", dir, r)) << msg;
      if (!opt.quiet) std::fprintf(stderr, "[rank %d] error: %s\n", r, msg.c_str());
    }
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(code);
  });
  auto res = wait_all(pids, opt);
  for (auto& r : res) {
    std::ifstream f(fmt::format("{}/error.{}", dir, r.rank));
    if (f) {
      std::stringstream ss;
      ss << f.rdbuf();
      r.message = ss.str();
    }
  }
  std::filesystem::remove_all(dir);
  return res;
}

int launch_exit_code(const std::vector<RankResult>& results) {
  for (const auto& r : results) {
    if (r.exit_code > 0) return r.exit_code;
    if (r.exit_code < 0) return 128 + r.term_signal;
  }
  return 0;
}

std::string describe_results(const std::vector<RankResult>& results) {
  std::string out;
  for (const auto& r : results) {
    if (r.exit_code == 0) continue;
    if (r.killed_by_launcher)
      out += fmt::format("weft launch: rank {} was still running after another rank failed (or the deadline); "
                         "killed\n",
                         r.rank);
    else if (r.term_signal)
      out += fmt::format("weft launch: rank {} died of signal {} ({})\n", r.rank, r.term_signal,
                         strsignal(r.term_signal));
    else
      out += fmt::format("weft launch: rank {} exited with status {}{}\n", r.rank, r.exit_code,
                         r.message.empty() ? "" : ": " + r.message);
  }
  return out;
}

}  // namespace weft
