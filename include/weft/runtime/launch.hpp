// Starting ranks on this node: `weft launch -n N -- cmd` (exec) and run_ranks (fork and
// call a function; used by the tests and by CLI commands that launch themselves).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "weft/core/env.hpp"

namespace weft {

struct RankResult {
  int rank = 0;
  int pid = 0;              // the rank's process id (0: never started)
  int exit_code = 0;        // -1 when killed by a signal
  int term_signal = 0;      // the signal that ended it, if any
  bool killed_by_launcher = false;
  std::string message;      // the error the rank reported (run_ranks; launch_exec: report_error_to_launcher)
};

struct LaunchOptions {
  int nranks = 1;
  EnvMap extra_env;  // set in every rank, on top of WEFT_RANK & co.
  // Once one rank has failed, the others get this long to finish before they are killed.
  int64_t grace_ms = 0;  // 0: WEFT_TIMEOUT_MS + 5 s
  // Hard limit on the whole run (0: none): a rank still alive then is killed and reported.
  int64_t deadline_ms = 0;
  bool quiet = false;  // no summary of failed ranks on stderr
  // Test seam: called instead of fork() when set (tests inject a fork that fails partway).
  std::function<int()> fork_fn;
};

// Both launchers: the environment the ranks will see (this process's, extra_env on top) is
// validated before anything is forked (a bad WEFT_TIMEOUT_MS is one InvalidArgument here, not
// one per rank); every rank gets PR_SET_PDEATHSIG(SIGKILL), so that no rank outlives a
// launcher killed by any signal; SIGINT/SIGTERM are held during the fork loop and passed on
// to the ranks after it; on every way out (a fork that fails partway, an exception, a stop
// signal) started ranks are killed and reaped, the session directory is removed, and so are
// host heap segments (/dev/shm/weft-<pid>-*) of ranks that died before removing their own.
// The parent-death signal follows the thread that forked: call these from a thread that
// outlives the ranks.

// Forks n ranks that exec argv with WEFT_RANK, WEFT_WORLD_SIZE, WEFT_LOCAL_RANK,
// WEFT_LOCAL_SIZE, a fresh WEFT_BOOTSTRAP_DIR and WEFT_ERROR_FILE; waits for all; returns
// their results, with the errors they reported (report_error_to_launcher). Unless quiet, a
// failed launch is summarised on stderr by describe_results.
std::vector<RankResult> launch_exec(const std::vector<std::string>& argv, const LaunchOptions& opt);

// Forks n ranks that each call fn() with the same environment as launch_exec. A rank
// that throws reports the exception's message and exits 1; one that returns exits 0.
// Unless quiet, a failed launch is summarised as launch_exec's is.
std::vector<RankResult> run_ranks(const std::function<void()>& fn, const LaunchOptions& opt);

// 0 when every rank exited 0, else the first failing rank's exit code (or 128+signal).
int launch_exit_code(const std::vector<RankResult>& results);
// The failed ranks, one line per distinct outcome naming every rank it happened to: "weft
// launch: ranks 0-72 exited with status 1: <message>". Messages are compared without the
// reporting rank's own leading "rank <r>: ", so the same error from every rank is one line.
std::string describe_results(const std::vector<RankResult>& results);

// A rank's final error, for the launcher that started it. Under weft launch, in the rank's
// own process (WEFT_ERROR_FILE names its pid), writes the message where the launcher reads
// it and returns true: the launcher prints it once, with every rank that reported the same.
// Otherwise (another launcher, a command the rank runs, a write that failed) returns false:
// the caller prints the error itself.
bool report_error_to_launcher(const std::string& message);

// True when this process runs as one rank of a launcher (weft, torchrun, MPI, Slurm).
bool inside_launcher(const EnvMap& env);

}  // namespace weft
