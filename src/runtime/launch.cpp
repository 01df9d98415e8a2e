#include "weft/runtime/launch.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <optional>
#include <thread>

#include "weft/core/error.hpp"
#include "weft/runtime/bootstrap.hpp"

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

// Session directories are <TMPDIR>/weft-XXXXXX with a file `launcher` holding the pid of the
// launcher that made it. A launcher removes its own on every way out it lives through; one
// SIGKILLed cannot, so each new launch removes those whose launcher has exited.
void remove_stale_session_dirs(const std::string& tmp) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(tmp, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() != 11 || name.rfind("weft-", 0) != 0 || !e.is_directory(ec)) continue;
    std::ifstream f(e.path() / "launcher");
    int pid = 0;
    if (f >> pid && pid > 0 && pid != getpid() && process_exited(pid)) std::filesystem::remove_all(e.path(), ec);
  }
}

std::string make_session_dir() {
  std::string tmp = env_var("TMPDIR").value_or("");
  if (tmp.empty()) tmp = "/tmp";
  remove_stale_session_dirs(tmp);
  std::string templ = tmp + "/weft-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  WEFT_CHECK(mkdtemp(buf.data()) != nullptr, fmt::format("mkdtemp({}) failed: {}", templ, std::strerror(errno)));
  const std::string dir = buf.data();
  std::ofstream(dir + "/launcher") << getpid() << "\n";
  return dir;
}

int64_t saturating_add(int64_t a, int64_t b) {
  int64_t s = 0;
  return __builtin_add_overflow(a, b, &s) ? (b > 0 ? INT64_MAX : INT64_MIN) : s;
}

int64_t ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t).count();
}

// The file a rank writes its final error to (report_error_to_launcher).
std::string error_file(const std::string& dir, int rank) { return fmt::format("{}/error.{}", dir, rank); }

// Called in the forked rank (before exec, which keeps the pid).
void set_rank_env(int rank, const LaunchOptions& opt, const std::string& dir) {
  setenv("WEFT_RANK", std::to_string(rank).c_str(), 1);
  setenv("WEFT_WORLD_SIZE", std::to_string(opt.nranks).c_str(), 1);
  setenv("WEFT_LOCAL_RANK", std::to_string(rank).c_str(), 1);
  setenv("WEFT_LOCAL_SIZE", std::to_string(opt.nranks).c_str(), 1);
  setenv("WEFT_BOOTSTRAP_DIR", dir.c_str(), 1);
  // "<pid> <file>": only the rank's own process reports through the file; a command it runs
  // (another pid) prints its errors itself, as they would otherwise be lost when the rank
  // exits 0.
  setenv("WEFT_ERROR_FILE", fmt::format("{} {}", getpid(), error_file(dir, rank)).c_str(), 1);
  for (const auto& [k, v] : opt.extra_env) setenv(k.c_str(), v.c_str(), 1);
}

// Host heap segments are named /weft-<rank 0's pid>-<random> (host_backend.cpp); rank 0
// unlinks its own on every path it lives through. This removes those of ranks killed first.
void remove_segments_of(const std::vector<pid_t>& pids) {
  std::error_code ec;
  std::vector<std::string> prefixes;
  for (pid_t p : pids) prefixes.push_back(fmt::format("weft-{}-", p));
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    for (const auto& pre : prefixes)
      if (name.rfind(pre, 0) == 0) shm_unlink(("/" + name).c_str());
  }
}

// One launch: validated options, the session directory, stop signals held while ranks are
// forked, and clean-up on every way out (the destructor).
class RankSession {
 public:
  explicit RankSession(const LaunchOptions& opt) : opt_(opt) {
    WEFT_REQUIRE(opt.nranks >= 1, fmt::format("weft launch: -n {} must be at least 1", opt.nranks));
    // The ranks' environment, checked before anything is started: this process's, with
    // extra_env on top (what set_rank_env leaves them).
    EnvMap env = current_env();
    for (const auto& [k, v] : opt.extra_env) env[k] = v;
    validate_tunables(env);
    grace_ms_ = opt.grace_ms > 0 ? opt.grace_ms : saturating_add(tunable_value(tunables::kTimeoutMs, env), 5000);
    dir_ = make_session_dir();
    // Held from here: a stop signal during the fork loop stays pending (sigpending ends the
    // loop) and reaches on_stop_signal once the mask is restored, after which wait()
    // passes it on to every started rank.
    sigset_t stops;
    sigemptyset(&stops);
    sigaddset(&stops, SIGINT);
    sigaddset(&stops, SIGTERM);
    sigprocmask(SIG_BLOCK, &stops, &old_mask_);
    g_stop_signal = 0;
    struct sigaction sa{};
    sa.sa_handler = on_stop_signal;
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }

  ~RankSession() {
    for (size_t r = 0; r < pids_.size(); ++r)
      if (!reaped_[r]) kill_rank(pids_[r], SIGKILL);
    for (size_t r = 0; r < pids_.size(); ++r)
      if (!reaped_[r]) waitpid(pids_[r], nullptr, 0);
    for (pid_t p : pids_) kill(-p, SIGKILL);  // leftovers of ranks that exited
    sigprocmask(SIG_SETMASK, &old_mask_, nullptr);  // a pending stop signal lands in on_stop_signal
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
    remove_segments_of(pids_);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  const std::string& dir() const { return dir_; }
  int stop_signal() const { return stop_signal_; }

  // Forks the ranks, each in a process group of its own with the rank's environment set,
  // running child(rank) (which must not return). Stops early when a stop signal is pending.
  void fork_all(const std::function<void(int)>& child) {
    std::cout.flush();
    std::cerr.flush();
    const pid_t launcher = getpid();
    for (int r = 0; r < opt_.nranks; ++r) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGINT) || sigismember(&pending, SIGTERM)) break;
      const pid_t pid = opt_.fork_fn ? opt_.fork_fn() : fork();
      if (pid < 0)
        throw_errno(__FILE__, __LINE__,
                    fmt::format("weft launch: fork of rank {} of {} (the {} started are stopped)", r, opt_.nranks, r));
      if (pid == 0) {
        // The launcher's death, by any signal, kills this rank; a launcher already gone
        // before prctl took effect is seen as a new parent.
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != launcher) _exit(1);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
        setpgid(0, 0);
        set_rank_env(r, opt_, dir_);
        child(r);
        _exit(0);
      }
      setpgid(pid, pid);  // also here: no race with the child's own call
      pids_.push_back(pid);
      reaped_.push_back(false);
    }
    sigprocmask(SIG_SETMASK, &old_mask_, nullptr);  // the pending stop signal, if any, is caught now
  }

  std::vector<RankResult> wait();

 private:
  const LaunchOptions& opt_;
  int64_t grace_ms_ = 0;
  std::string dir_;
  std::vector<pid_t> pids_;
  std::vector<bool> reaped_;
  sigset_t old_mask_{};
  struct sigaction old_int_{}, old_term_{};
  int stop_signal_ = 0;
};

std::vector<RankResult> RankSession::wait() {
  const int n = static_cast<int>(pids_.size());
  std::vector<RankResult> res(opt_.nranks);
  for (int r = 0; r < opt_.nranks; ++r) res[r].rank = r;
  for (int r = n; r < opt_.nranks; ++r) res[r].exit_code = -1;  // never started (a stop signal came first)
  for (int r = n; r < opt_.nranks; ++r) res[r].killed_by_launcher = true;
  int left = n;
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  int64_t grace = grace_ms_;
  std::optional<clock::time_point> first_failure;
  auto sleep = std::chrono::microseconds(100);
  bool said_waiting = false;
  auto record = [&](int r, int st) {  // st: a waitpid status (0 when waitpid failed)
    reaped_[r] = true;
    --left;
    res[r].pid = pids_[r];
    if (WIFEXITED(st)) {
      res[r].exit_code = WEXITSTATUS(st);
    } else if (WIFSIGNALED(st)) {
      res[r].exit_code = -1;
      res[r].term_signal = WTERMSIG(st);
    }
  };
  while (left > 0) {
    bool progressed = false;
    for (int r = 0; r < n; ++r) {
      if (reaped_[r]) continue;
      int st = 0;
      pid_t p = waitpid(pids_[r], &st, WNOHANG);
      if (p == 0) continue;
      progressed = true;
      record(r, st);
      if (p < 0) res[r].exit_code = -1;  // not our child any more: nothing to report
      if (res[r].exit_code != 0 && !first_failure) first_failure = clock::now();
    }
    if (left == 0) break;
    if (g_stop_signal) {
      stop_signal_ = g_stop_signal;
      for (int r = 0; r < n; ++r)
        if (!reaped_[r]) kill_rank(pids_[r], g_stop_signal);
      g_stop_signal = 0;
      if (!first_failure) first_failure = clock::now();  // then the grace period, then SIGKILL
      grace = std::min<int64_t>(grace, 3000);
    }
    // The failed ranks' errors are printed together once every rank has exited: say why
    // nothing is printed yet when the others keep running.
    if (first_failure && !said_waiting && !opt_.quiet && !g_stop_signal && ms_since(*first_failure) > 1000) {
      said_waiting = true;
      std::cerr << fmt::format("weft launch: a rank failed; the {} still running get up to {} ms to finish "
                               "(WEFT_TIMEOUT_MS + 5 s), then their errors are printed\n",
                               left, grace);
    }
    const bool grace_over = first_failure && ms_since(*first_failure) > grace;
    const bool deadline_over = opt_.deadline_ms > 0 && ms_since(start) > opt_.deadline_ms;
    if (grace_over || deadline_over) {
      for (int r = 0; r < n; ++r)
        if (!reaped_[r]) {
          kill_rank(pids_[r], SIGKILL);
          res[r].killed_by_launcher = true;
        }
      for (int r = 0; r < n; ++r)
        if (!reaped_[r]) {
          int st = 0;
          waitpid(pids_[r], &st, 0);
          record(r, st);
          res[r].exit_code = -1;
          res[r].term_signal = SIGKILL;
        }
      break;
    }
    if (!progressed) {
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(20000));
    }
  }
  if (!stop_signal_ && g_stop_signal) stop_signal_ = g_stop_signal;
  return res;
}

// The errors the ranks wrote (error.<rank>), into their results.
void read_errors(const std::string& dir, std::vector<RankResult>& res) {
  for (auto& r : res) {
    std::ifstream f(error_file(dir, r.rank));
    if (!f) continue;
    std::stringstream ss;
    ss << f.rdbuf();
    r.message = ss.str();
    while (!r.message.empty() && (r.message.back() == '\n' || r.message.back() == ' ')) r.message.pop_back();
  }
}

// Ascending ranks as "0-3, 5, 7, 8": runs of three or more as ranges.
std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (j - i < 2) j = i;
    out += (out.empty() ? "" : ", ") + (j == i ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]));
    i = j + 1;
  }
  return out;
}

// A rank's message without its own "rank <r>: " at the start, so that the same error from
// every rank reads the same.
std::string without_own_rank(const std::string& msg, int rank) {
  const std::string own = fmt::format("rank {}: ", rank);
  return msg.rfind(own, 0) == 0 ? msg.substr(own.size()) : msg;
}

}  // namespace

bool report_error_to_launcher(const std::string& message) {
  const auto v = env_var("WEFT_ERROR_FILE");
  if (!v) return false;
  const auto space = v->find(' ');
  if (space == std::string::npos || v->substr(0, space) != std::to_string(getpid())) return false;
  const std::string file = v->substr(space + 1);
  std::ofstream f(file, std::ios::trunc);
  f << message << "\n";
  f.flush();
  return static_cast<bool>(f);
}

bool inside_launcher(const EnvMap& env) {
  for (const char* k : {"WEFT_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"})
    if (env.count(k)) return true;
  return false;
}

std::vector<RankResult> launch_exec(const std::vector<std::string>& argv, const LaunchOptions& opt) {
  WEFT_REQUIRE(!argv.empty(), "weft launch: no command given (usage: weft launch -n N -- command args...)");
  std::vector<RankResult> res;
  {
    RankSession session(opt);
    session.fork_all([&](int r) {
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      std::fprintf(stderr, "weft launch: rank %d: cannot run '%s': %s\n", r, args[0], std::strerror(errno));
      _exit(127);
    });
    res = session.wait();
    read_errors(session.dir(), res);
  }
  if (!opt.quiet && launch_exit_code(res) != 0) std::cerr << describe_results(res);
  return res;
}

std::vector<RankResult> run_ranks(const std::function<void()>& fn, const LaunchOptions& opt) {
  std::vector<RankResult> res;
  int stop_signal = 0;
  {
    RankSession session(opt);
    const std::string dir = session.dir();
    session.fork_all([&](int r) {
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
      if (code) std::ofstream(error_file(dir, r)) << msg;
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    });
    res = session.wait();
    read_errors(dir, res);
    stop_signal = session.stop_signal();
  }
  if (!opt.quiet && launch_exit_code(res) != 0) std::cerr << describe_results(res);
  // Stopped by SIGINT/SIGTERM: the ranks and their files are gone; now this process goes the
  // way the signal meant (its own disposition, restored by the session).
  if (stop_signal) raise(stop_signal);
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
  // One line per distinct outcome (how the rank ended, and its message without its own rank
  // number), naming every rank it happened to, in the order of each outcome's first rank.
  struct Outcome {
    bool passive;  // "was/were <text>" rather than "<text>"
    std::string text;
    std::vector<int> ranks;
  };
  std::vector<Outcome> outcomes;
  auto add = [&](int rank, bool passive, std::string text) {
    for (auto& o : outcomes)
      if (o.passive == passive && o.text == text) {
        o.ranks.push_back(rank);
        return;
      }
    outcomes.push_back({passive, std::move(text), {rank}});
  };
  for (const auto& r : results) {
    if (r.exit_code == 0) continue;
    const std::string msg = r.message.empty() ? "" : ": " + without_own_rank(r.message, r.rank);
    if (r.killed_by_launcher && r.pid == 0)
      add(r.rank, true, "not started (the launch was stopped)");
    else if (r.killed_by_launcher)
      add(r.rank, true, "still running after another rank failed (or the deadline); killed");
    else if (r.term_signal)
      add(r.rank, false, fmt::format("died of signal {} ({}){}", r.term_signal, strsignal(r.term_signal), msg));
    else
      add(r.rank, false, fmt::format("exited with status {}{}", r.exit_code, msg));
  }
  std::string out;
  for (const auto& o : outcomes) {
    const bool many = o.ranks.size() > 1;
    out += fmt::format("weft launch: rank{} {} {}{}\n", many ? "s" : "", rank_list(o.ranks),
                       o.passive ? (many ? "were " : "was ") : "", o.text);
  }
  return out;
}

}  // namespace weft
