// Fuzzing the CLI's arguments and environment (issue 28): random argument vectors from a
// grammar of every command and option, with hostile values (empty, negative, zero, beyond 64
// bits, non-numeric, quotes, newlines, '%', '{}', very long, repeated, missing), and random
// WEFT_* environment values (every tunable of the registry). Each case runs the real `weft`
// binary as a child, with an environment built here (host backend, small heap, short
// timeout, HOME/TMPDIR/XDG_* in a temporary directory that is also its working directory)
// and a wall-clock limit, and checks:
//   - it exits (no signal, within the limit, nothing of it left holding its output pipes);
//   - with 0, 1, 2 or 3 (README: 2 a bad command line, 1 another error, 3 a timeout or a
//     wrong result); `weft launch` also passes on its command's status (127: not found);
//   - a non-zero exit says why on stderr, without a source location "(file.cpp:NN)" and
//     without a raw C++ exception text (std::bad_alloc, basic_string, stoi, json.exception);
//   - no sanitizer report, and no launcher session directory left in its TMPDIR.
// Seeded and bounded: WEFT_CLI_FUZZ_CASES, WEFT_CLI_FUZZ_SEED and WEFT_CLI_FUZZ_SECONDS override
// the case count, the seed and the time budget; a failure prints the case's argument vector, environment and a shell line that
// reproduces it.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "weft/core/env.hpp"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The sanitizer build runs every child several times slower: fewer cases, longer limits.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(undefined_behavior_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

constexpr int kCases = kSanitized ? 150 : 600;
constexpr double kBudgetSeconds = 45;                    // the whole test stops here, cases or not
constexpr double kCaseLimitSeconds = kSanitized ? 60 : 20;  // one child, killed after this
constexpr size_t kMaxCapture = 1 << 20;                  // bytes kept of each output stream

using Env = std::vector<std::pair<std::string, std::string>>;

struct Case {
  std::vector<std::string> argv;  // without the program
  Env env;                        // the child's whole environment
  bool launch = false;            // `weft launch`: its command's exit status passes through
};

struct Outcome {
  bool exited = false;  // by exit(), not a signal
  int code = -1;        // exit status, when exited
  int signal = 0;       // the signal that ended it
  bool timed_out = false;
  std::string out, err;
  double secs = 0;
};

int64_t env_int(const char* name, int64_t fallback) {
  const auto v = weft::env_var(name);
  if (!v || v->empty()) return fallback;
  return std::strtoll(v->c_str(), nullptr, 10);
}

// Runs WEFT_CLI_PATH with `c` in its own process group, cwd `dir`; kills the group at the limit.
Outcome run_case(const Case& c, const std::string& dir, double limit_s) {
  Outcome o;
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    o.err = std::string("pipe: ") + std::strerror(errno);
    return o;
  }
  std::vector<std::string> args{WEFT_CLI_PATH};
  args.insert(args.end(), c.argv.begin(), c.argv.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> kv;
  for (const auto& [k, v] : c.env) kv.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : kv) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err_pipe[1], 2);
  posix_spawn_file_actions_addchdir_np(&fa, dir.c_str());
  posix_spawnattr_t at;
  posix_spawnattr_init(&at);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&at, 0);
  const auto t0 = Clock::now();
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, &at, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (rc != 0) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    o.err = std::string("posix_spawn: ") + std::strerror(rc);
    return o;
  }
  // Until both pipes close: the child and anything it started (ranks) have let go of them.
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&o.out, &o.err};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    const double left = limit_s - std::chrono::duration<double>(Clock::now() - t0).count();
    if (left <= 0) {
      o.timed_out = true;
      break;
    }
    const int n = poll(fds, 2, static_cast<int>(left * 1000) + 1);
    if (n < 0 && errno == EINTR) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t got = read(fds[i].fd, buf, sizeof buf);
      if (got > 0) {
        if (sinks[i]->size() < kMaxCapture) sinks[i]->append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  if (o.timed_out) kill(-pid, SIGKILL);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  for (auto& f : fds)
    if (f.fd >= 0) close(f.fd);
  o.secs = std::chrono::duration<double>(Clock::now() - t0).count();
  o.exited = WIFEXITED(st);
  o.code = o.exited ? WEXITSTATUS(st) : -1;
  o.signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
  return o;
}

// ---- what the output must not contain ---------------------------------------------------

// "(name.cpp:123)" and the like: where an error was detected, which a user needs not see.
bool has_source_location(const std::string& s) {
  for (size_t p = s.find('('); p != std::string::npos; p = s.find('(', p + 1)) {
    size_t i = p + 1;
    while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '_')) ++i;
    if (i == p + 1) continue;
    for (const char* ext : {".cpp:", ".hpp:", ".cu:", ".h:"})
      if (s.compare(i, std::strlen(ext), ext) == 0) {
        size_t j = i + std::strlen(ext), d = j;
        while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
        if (j > d && j < s.size() && s[j] == ')') return true;
      }
  }
  return false;
}

// `word` in `s` with no letter, digit or '_' either side.
bool has_word(const std::string& s, const std::string& word) {
  auto ident = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  for (size_t p = s.find(word); p != std::string::npos; p = s.find(word, p + 1)) {
    const bool before = p > 0 && ident(s[p - 1]);
    const bool after = p + word.size() < s.size() && ident(s[p + word.size()]);
    if (!before && !after) return true;
  }
  return false;
}

// The first thing wrong with an outcome, or empty. `echoed` is every value the case passed
// (an error may quote a value that itself contains one of the texts below).
std::string judge(const Case& c, const Outcome& o, const std::string& echoed) {
  if (o.timed_out) return "still running (or its output still held open) after the time limit";
  if (!o.exited) return "killed by signal " + std::to_string(o.signal) + " (" + strsignal(o.signal) + ")";
  const bool code_ok = (o.code >= 0 && o.code <= 3) || (c.launch && o.code == 127);
  if (!code_ok) return "exit status " + std::to_string(o.code) + " is not 0, 1, 2 or 3";
  for (const char* san : {"AddressSanitizer", "UndefinedBehaviorSanitizer", "LeakSanitizer", "runtime error:"})
    if (o.err.find(san) != std::string::npos) return std::string("sanitizer report (") + san + ")";
  if (o.err.find("terminate called") != std::string::npos) return "an uncaught exception (terminate called)";
  if (o.code == 0) return {};
  bool blank = true;
  for (char ch : o.err) blank = blank && std::isspace(static_cast<unsigned char>(ch));
  if (blank) return "non-zero exit with nothing on stderr";
  if (has_source_location(o.err) && !has_source_location(echoed)) return "stderr names a source location";
  for (const char* raw : {"std::bad_alloc", "bad_alloc", "basic_string", "stoi", "stol", "stoll", "stod",
                          "json.exception", "vector::_M", "what():"})
    if (has_word(o.err, raw) && !has_word(echoed, raw)) return std::string("stderr has a raw C++ text: ") + raw;
  return {};
}

// ---- reproducing a case -----------------------------------------------------------------

// `s` as a C string literal (newlines, quotes and bytes outside ASCII escaped), cut at `max`.
std::string c_quote(const std::string& s, size_t max = 300) {
  std::string q = "\"";
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char ch = static_cast<unsigned char>(s[i]);
    if (ch == '"' || ch == '\\') q += std::string("\\") + static_cast<char>(ch);
    else if (ch == '\n') q += "\\n";
    else if (ch == '\t') q += "\\t";
    else if (ch < 32 || ch >= 127) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", ch);
      q += b;
    } else q += static_cast<char>(ch);
  }
  q += s.size() > max ? fmt::format("...\" ({} bytes)", s.size()) : std::string("\"");
  return q;
}

// `s` for sh: single-quoted ($'...' where it holds bytes a terminal mangles).
std::string sh_quote(const std::string& s) {
  bool plain = true;
  for (char ch : s) plain = plain && ch >= 32 && ch < 127;
  if (plain) {
    std::string q = "'";
    for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    return q + "'";
  }
  std::string q = "$'";
  for (char ch : s) {
    const unsigned char u = static_cast<unsigned char>(ch);
    if (ch == '\'' || ch == '\\') q += std::string("\\") + ch;
    else if (u < 32 || u >= 127) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", u);
      q += b;
    } else q += ch;
  }
  return q + "'";
}

std::string describe(const Case& c, const Outcome& o, const std::string& dir) {
  std::string s = "argv:";
  for (const auto& a : c.argv) s += fmt::format(" {}", c_quote(a));
  s += "\nenv:";
  for (const auto& [k, v] : c.env) s += fmt::format(" {}={}", k, c_quote(v));
  s += fmt::format("\nreproduce: (cd {} && env -i", sh_quote(dir));
  for (const auto& [k, v] : c.env) s += fmt::format(" {}={}", k, sh_quote(v));
  s += fmt::format(" {}", WEFT_CLI_PATH);
  for (const auto& a : c.argv) {
    if (a.size() > 2000)  // a very long value: one repeated character, written as a command
      s += fmt::format(" \"$(printf '%{}s' '' | tr ' ' {})\"", a.size(), sh_quote(a.substr(0, 1)));
    else
      s += fmt::format(" {}", sh_quote(a));
  }
  s += fmt::format(")\nexit: {}{}, {:.2f} s", o.exited ? std::to_string(o.code) : fmt::format("signal {}", o.signal),
                   o.timed_out ? " (killed at the time limit)" : "", o.secs);
  s += fmt::format("\nstderr: {}\nstdout: {}", c_quote(o.err, 2000), c_quote(o.out.substr(0, 300)));
  return s;
}

// ---- the grammar --------------------------------------------------------------------------

class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}

  size_t below(size_t n) { return static_cast<size_t>(rng_() % n); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[below(v.size())];
  }

  // Text that breaks parsers and formatters: quotes, newlines, format specifiers, shell.
  std::string odd() {
    static const std::vector<std::string> k = {
        "",          " ",         "\n",          "\t",        "'",        "\"",          "a b",      "a\nb",
        "%s%n%x%p",  "%",         "{}",          "{0}",       "{:>999999999}", "{",     "}",        "$(touch INJ)",
        "`touch INJ`", ";touch INJ", "|", "&&", "\\", "-", "--", "--help", "-h", "=", "x", "abc", "nope",
        "\xc3\xa9",  "\xff\xfe",  "\x01\x7f",    "..",        ".",        "~",           "*",        "?",
        "a,b",       ",",         ",,",          "1,2,3",     "INJ'; touch INJ; '"};
    if (chance(0.08)) return std::string(1 + below(100000), "aZ9%{'\n"[below(7)]);  // very long
    return pick(k);
  }

  // An integer value: small and valid most of the time, else hostile.
  std::string number() {
    static const std::vector<std::string> k = {
        "0",        "-0",        "+1",        "-1",        "-2",         "007",        "0x10",       "1e3",
        "1e309",    "-1e309",    "nan",       "inf",       "-inf",       "0.5",        "1.5",        " 1",
        "1 ",       "1\n",       "1,2",       "12abc",     "2147483647", "2147483648", "-2147483648", "-2147483649",
        "4294967296", "4294967297", "65536",  "1048576",   "1048577",    "4611686018427387904",  "9223372036854775807",
        "9223372036854775808",   "-9223372036854775808",   "-9223372036854775809",  "18446744073709551615",
        "18446744073709551616",  "99999999999999999999999999999999", "1000000000", "86400000", "86400001"};
    const double r = std::uniform_real_distribution<double>(0, 1)(rng_);
    if (r < 0.45) return std::to_string(1 + below(r < 0.3 ? 8 : 300));
    if (r < 0.85) return pick(k);
    if (r < 0.93) return std::string(1 + below(5000), '9');
    return odd();
  }

  // A real number (GB/s): the integers' hostility plus tiny, huge and special values.
  std::string real() {
    static const std::vector<std::string> k = {"1e-320", "1e308", "1e309", "-1e-5", "0.0", "NaN", "-nan", "Infinity",
                                               "0x1p3",  "1e",    ".",     "50",    "900", "1.5e2"};
    return chance(0.5) ? pick(k) : number();
  }

  // A GEMM shape MxKxN: tiny and valid, or malformed, zero, negative or beyond 64 bits.
  std::string shape() {
    static const std::vector<std::string> k = {
        "0x0x0",      "16x9223372036854775800x16", "x",      "1x-1x1",  "8x8",      "8x8x8x8", "8X8X8", " 8x8x8",
        "8x8x8 ",     "-8x8x8",    "1e3x1x1",  "9223372036854775807x1x1", "4294967296x4294967296x1", "xx", "8xx8",
        "3037000500x3037000500x1", "1x1x4611686018427387904", "4000000x4000000x4000000", "16x1000000000x16",
        "8x8x8,16x16x16", "+8x+8x+8", "0x10x0x10x0x10", "8x8x8x", "18446744073709551616x1x1", "1x1x1", ""};
    if (chance(0.55)) {
      static const std::vector<int> dims = {1, 2, 3, 4, 7, 8, 16, 24, 32, 48, 64};
      return std::to_string(pick(dims)) + "x" + std::to_string(pick(dims)) + "x" + std::to_string(pick(dims));
    }
    if (chance(0.2)) return number() + "x" + number() + "x" + number();
    return pick(k);
  }

  // A path the child may write: relative (its cwd is the temporary directory), or one that
  // cannot be written. Never an absolute writable path outside the temporary directory.
  std::string out_path() {
    static const std::vector<std::string> k = {
        "out",    "o/u/t",  "out.json", "",  ".",    "..",      "/dev/null/x", "/nonexistent-weft-fuzz/x", "/dev/full",
        "/proc/weft-fuzz", "a b",  "it's",   "%s{}", "-", "--out", "file.txt", "o\nut", "very/deep/a/b/c/d/e/f/g"};
    if (chance(0.05)) return std::string(5000, 'd');
    return pick(k);
  }

  // A path the child reads: prepared files in its cwd, and hostile ones.
  std::string in_path(const std::vector<std::string>& prepared) {
    static const std::vector<std::string> k = {"",        ".",         "/nonexistent-weft-fuzz", "/dev/null", "/dev/zero", "/dev/full",
                                               "/proc/self/status", "/etc",   "missing.json", "a b", "-",
                                               "--help",  "%s{}"};
    return chance(0.6) ? pick(prepared) : pick(k);
  }

  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
};

enum class Kind { kInt, kReal, kFlag, kShape, kShapes, kOut, kIn, kWord };
struct Opt {
  const char* name;
  Kind kind;
  std::vector<std::string> words = {};  // kWord: the valid choices (junk is added)
};

const std::vector<Opt> kPlanCommon = {
    {"--collective", Kind::kWord, {"all_gather", "reduce_scatter", "all_reduce", "all_to_all"}},
    {"--algo", Kind::kWord, {"direct", "ring", "bidir", "staged", "one-shot", "two-shot"}},
    {"--rows", Kind::kInt},
    {"--cols", Kind::kInt},
    {"--split", Kind::kInt},
    {"--workers", Kind::kInt},
    {"--ctas", Kind::kInt},
    {"--entry-barrier", Kind::kFlag},
    {"--gemm-n", Kind::kInt},
    {"--gemm-k", Kind::kInt},
    {"--tile", Kind::kInt},
    {"--order", Kind::kWord, {"arrival", "rotate", "plain"}},
    {"--constants", Kind::kIn},
    {"--trace", Kind::kOut},
};
const std::vector<Opt> kPlanOnly = {
    {"--world", Kind::kInt},  {"--file", Kind::kIn},   {"--print", Kind::kFlag},
    {"--op", Kind::kWord, {"ag_gemm", "gemm_rs", "gemm_ar"}},
    {"--m", Kind::kInt},      {"--k", Kind::kInt},     {"--n", Kind::kInt},
    {"--chunks", Kind::kInt},
};
const std::vector<Opt> kSimulateOnly = {
    {"--nodes", Kind::kInt}, {"--gpus", Kind::kInt},       {"--bytes", Kind::kInt},
    {"--link-gbps", Kind::kReal}, {"--net-gbps", Kind::kReal},
};
const std::vector<Opt> kBench = {
    {"--only", Kind::kWord, {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_reduce,all_gather"}},
    {"--out", Kind::kOut},
    {"--shapes", Kind::kShapes},
    {"--chunks", Kind::kInt},
    {"--trace-dir", Kind::kOut},
    {"--tune", Kind::kFlag},
    {"--data", Kind::kWord, {"random", "ints"}},
    {"--sequential", Kind::kFlag},
    {"--eager", Kind::kFlag},
    {"--quick", Kind::kFlag},
};
const std::vector<Opt> kTrace = {{"--png", Kind::kOut}};
const std::vector<Opt> kInfo = {{"--tunables", Kind::kFlag}};

struct Files {
  std::vector<std::string> plans, traces, constants;
};

std::string value_of(Gen& g, const Opt& o, const Files& f) {
  switch (o.kind) {
    case Kind::kInt: return g.number();
    case Kind::kReal: return g.real();
    case Kind::kFlag: return g.pick(std::vector<std::string>{"1", "0", "true", "yes", "2", ""});
    case Kind::kShape: return g.shape();
    case Kind::kShapes: {
      std::string s = g.shape();
      for (int i = static_cast<int>(g.below(3)); i > 0; --i) s += "," + g.shape();
      return s;
    }
    case Kind::kOut: return g.out_path();
    case Kind::kIn: {
      const std::string n = o.name;
      return g.in_path(n == "--file" ? f.plans : n == "--constants" ? f.constants : f.traces);
    }
    case Kind::kWord: return g.chance(0.75) ? g.pick(o.words) : g.odd();
  }
  return {};
}

// Appends 0..max options of `opts` in random forms: "--o v", "--o=v", "--o" with its value
// missing (last, or before another option), repeated.
void add_options(Gen& g, std::vector<std::string>& argv, const std::vector<const std::vector<Opt>*>& sets,
                 const Files& f, int max) {
  const int n = static_cast<int>(g.below(static_cast<size_t>(max) + 1));
  for (int i = 0; i < n; ++i) {
    const auto& set = *sets[g.below(sets.size())];
    const Opt& o = set[g.below(set.size())];
    const double form = std::uniform_real_distribution<double>(0, 1)(g.rng());
    if (o.kind == Kind::kFlag) {
      if (form < 0.85) argv.emplace_back(o.name);
      else argv.push_back(std::string(o.name) + "=" + value_of(g, o, f));
      continue;
    }
    if (form < 0.7) {
      argv.emplace_back(o.name);
      argv.push_back(value_of(g, o, f));
    } else if (form < 0.88) {
      argv.push_back(std::string(o.name) + "=" + value_of(g, o, f));
    } else {
      argv.emplace_back(o.name);  // its value missing: the next word (if any) is an option
    }
  }
  if (g.chance(0.06)) argv.push_back(g.odd());  // a stray word
}

// The WEFT_* variables, with random values: every tunable of the registry, and the launcher's.
void fuzz_env(Gen& g, Env& env, const Files& f) {
  std::vector<std::string> ints, texts;
  for (const auto& t : weft::all_tunables()) {
    const std::string acc = t.accepts;
    (acc.size() > 0 && acc[0] == '[' ? ints : texts).emplace_back(t.env);
  }
  auto set = [&](const std::string& k, const std::string& v) {
    for (auto& [ek, ev] : env)
      if (ek == k) {
        ev = v;
        return;
      }
    env.emplace_back(k, v);
  };
  const int n = static_cast<int>(g.below(4));
  for (int i = 0; i < n; ++i) {
    const double r = std::uniform_real_distribution<double>(0, 1)(g.rng());
    if (r < 0.55) {
      const std::string k = g.pick(ints);
      // Valid values that make a run heavy (a day's timeout, 1024 ranks, a TiB heap) are not
      // drawn: the hostile ones are refused before anything starts.
      std::string v = g.number();
      if (k == "WEFT_TIMEOUT_MS" && v.find_first_not_of("0123456789") == std::string::npos && v.size() < 19 &&
          std::strtoll(v.c_str(), nullptr, 10) > 3000)
        v = "3000";
      if ((k == "WEFT_HOST_RANKS") && v.find_first_not_of("0123456789") == std::string::npos && v.size() < 19 &&
          std::strtoll(v.c_str(), nullptr, 10) > 3 && std::strtoll(v.c_str(), nullptr, 10) <= 1024)
        v = "3";
      if ((k == "WEFT_HOST_HEAP_MIB" || k == "WEFT_GPU_HEAP_MIB") &&
          v.find_first_not_of("0123456789") == std::string::npos && v.size() < 19 &&
          std::strtoll(v.c_str(), nullptr, 10) > 64 && std::strtoll(v.c_str(), nullptr, 10) <= 1048576)
        v = "64";
      if ((k == "WEFT_BENCH_SUSTAIN_MS" || k == "WEFT_BENCH_SLEEP_US") &&
          v.find_first_not_of("0123456789") == std::string::npos && v.size() < 19 &&
          std::strtoll(v.c_str(), nullptr, 10) > 1000 && std::strtoll(v.c_str(), nullptr, 10) <= 600000)
        v = "1000";
      set(k, v);
    } else if (r < 0.85) {
      const std::string k = g.pick(texts);
      std::string v = g.odd();
      if (k == "WEFT_BACKEND" && g.chance(0.5)) v = g.pick(std::vector<std::string>{"host", "nccl", "auto", "HOST", "host "});
      if ((k == "WEFT_TUNE_CACHE" || k == "WEFT_DEVICE_CONSTANTS") && g.chance(0.5))
        v = k == "WEFT_TUNE_CACHE" ? g.pick(std::vector<std::string>{"-", "cache.json", "bad.json", "/dev/null",
                                                                       "/nonexistent-weft-fuzz/c.json", "."})
                                   : g.in_path(f.constants);
      if (k == "WEFT_BACKEND" && v.size() > 64) v = "nccl";
      set(k, v);
    } else if (r < 0.95) {
      set(g.pick(std::vector<std::string>{"WEFT_FUZZ_UNKNOWN", "WEFT_", "WEFT_TIMEOUT", "weft_timeout_ms"}), g.odd());
    } else {
      // A rank of a launch that never happened: commands that start ranks wait for peers
      // (bounded by the short timeout) or refuse the values.
      set(g.pick(std::vector<std::string>{"WEFT_RANK", "WEFT_WORLD_SIZE", "WEFT_LOCAL_RANK", "WEFT_LOCAL_SIZE"}),
          g.number());
    }
  }
}

Case make_case(Gen& g, const Env& base, const Files& f) {
  Case c;
  c.env = base;
  auto& a = c.argv;
  const double r = std::uniform_real_distribution<double>(0, 1)(g.rng());
  if (r < 0.22) {
    a.emplace_back("plan");
    add_options(g, a, {&kPlanCommon, &kPlanOnly}, f, 6);
  } else if (r < 0.38) {
    a.emplace_back("simulate");
    add_options(g, a, {&kPlanCommon, &kSimulateOnly}, f, 6);
  } else if (r < 0.66) {
    a.emplace_back("bench");
    if (g.chance(0.85))
      a.push_back(g.chance(0.85) ? g.pick(std::vector<std::string>{"all", "devapi", "collectives", "gemm", "ag_gemm",
                                                                   "gemm_rs", "gemm_ar"})
                                 : g.odd());
    // --quick always (the full sizes take minutes); --out into the temporary directory
    // unless the grammar draws its own.
    a.emplace_back("--quick");
    if (g.chance(0.8)) {
      a.emplace_back("--out");
      a.emplace_back("results");
    }
    add_options(g, a, {&kBench}, f, 4);
  } else if (r < 0.74) {
    a.emplace_back("trace");
    if (g.chance(0.9)) a.push_back(g.in_path(f.traces));
    add_options(g, a, {&kTrace}, f, 2);
  } else if (r < 0.84) {
    c.launch = true;
    a.emplace_back("launch");
    if (g.chance(0.85)) {
      a.emplace_back(g.chance(0.5) ? "-n" : "--nranks");
      std::string n = g.number();
      if (!n.empty() && n.find_first_not_of("0123456789") == std::string::npos && n.size() < 5 && std::stoi(n) > 3)
        n = "3";
      a.push_back(n);
    }
    if (g.chance(0.85)) {
      a.emplace_back("--");
      const double w = std::uniform_real_distribution<double>(0, 1)(g.rng());
      if (w < 0.3) a.emplace_back("true");
      else if (w < 0.5) a.emplace_back("false");
      else if (w < 0.65) a.emplace_back("/nonexistent-weft-fuzz/cmd");
      else if (w < 0.8) {
        a.emplace_back(WEFT_CLI_PATH);
        a.emplace_back("info");
      } else a.push_back(g.odd());
    }
  } else if (r < 0.89) {
    a.emplace_back("info");
    add_options(g, a, {&kInfo}, f, 2);
  } else {
    // Global flags, help, unknown commands, nothing at all, an option of another command.
    static const std::vector<std::vector<std::string>> k = {
        {},           {"--version"}, {"--help"},  {"-h"},         {"help"},        {"--version", "plan"},
        {"plan", "--help"}, {"bench", "-h"}, {"--"}, {"-"}, {"--nope"}, {"foo"}, {"PLAN"}, {"--rows", "3"},
        {"plan", "plan"}, {"bench", "--quick", "--out", "results", "bench"}, {"launch", "--", "--version"}};
    a = g.pick(k);
    if (g.chance(0.4)) a.insert(a.begin(), g.odd());
  }
  if (g.chance(0.7)) fuzz_env(g, c.env, f);
  return c;
}

struct TempDir {
  std::string path;
  TempDir() {
    char d[] = "/tmp/weft-cli-fuzz-XXXXXX";
    path = mkdtemp(d);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

bool plain_run(const std::string& dir, const std::vector<std::string>& argv, const Env& env) {
  Case c;
  c.argv = argv;
  c.env = env;
  const Outcome o = run_case(c, dir, 60);
  return o.exited && o.code == 0;
}

}  // namespace

TEST(CliFuzz, ArgumentsAndEnvironment) {
  TempDir t;
  const std::string work = t.path + "/work";
  for (const char* d : {"/work", "/home", "/tmp", "/bin", "/xdg-data", "/xdg-cache"}) fs::create_directories(t.path + d);
  // python3 for `trace --png`: takes its arguments, draws nothing (no matplotlib needed).
  std::ofstream(t.path + "/bin/python3") << "#!/bin/sh\nexit 0\n";
  fs::permissions(t.path + "/bin/python3", fs::perms::owner_all);

  Env base = {{"PATH", t.path + "/bin:/usr/local/bin:/usr/bin:/bin"},
              {"HOME", t.path + "/home"},
              {"TMPDIR", t.path + "/tmp"},
              {"XDG_DATA_HOME", t.path + "/xdg-data"},
              {"XDG_CACHE_HOME", t.path + "/xdg-cache"},
              {"WEFT_BACKEND", "host"},
              {"WEFT_HOST_RANKS", "2"},
              {"WEFT_HOST_HEAP_MIB", "16"},
              {"WEFT_TIMEOUT_MS", "2000"},
              {"WEFT_BENCH_SUSTAIN_MS", "0"},
              {"WEFT_TUNE_CACHE", "tune-cache.json"}};
  for (const char* k : {"ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "LD_LIBRARY_PATH"})
    if (auto v = weft::env_var(k)) base.emplace_back(k, *v);

  // Inputs for --file, trace FILE, --constants: valid ones, and each cut short and garbled.
  Files f;
  ASSERT_TRUE(plain_run(work, {"plan", "--world", "3", "--rows", "6", "--cols", "4", "--print", "--trace", "trace.json"},
                        base));
  {
    std::ifstream in(work + "/trace.json");
    std::string trace((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(work + "/trace-cut.json") << trace.substr(0, trace.size() / 2);
    std::string wrong = trace;
    for (size_t p = 0; (p = wrong.find("\"dur\":", p)) != std::string::npos; p += 6) wrong.insert(p + 6, "-");
    std::ofstream(work + "/trace-neg.json") << wrong;
  }
  std::ofstream(work + "/trace-types.json") << R"({"traceEvents":[{"name":1,"ph":[],"pid":"x","ts":null}]})";
  std::ofstream(work + "/trace-array.json") << "[1,2,3]";
  std::ofstream(work + "/plan-bad.plan") << "plan: x\nworld 99999999999\ntensor out 1x1\n";
  std::ofstream(work + "/constants-bad.json") << R"({"device":7,"link_gbps":"fast"})";
  std::ofstream(work + "/empty");
  std::ofstream(work + "/binary") << std::string("\x00\xff\x7f{[\n", 6);
  std::ofstream(work + "/bad.json") << R"({"entries":[{"chunks":"abc"}]})";
  f.plans = {"valid.plan", "plan-bad.plan", "empty", "binary", "trace.json"};
  f.traces = {"trace.json", "trace-cut.json", "trace-neg.json", "trace-types.json", "trace-array.json", "empty",
              "binary", "valid.plan"};
  f.constants = {"constants-bad.json", "empty", "binary", "trace.json", "bad.json"};
  {
    // valid.plan: `plan --print`'s output (which reads back with --file).
    Case c;
    c.argv = {"plan", "--world", "3", "--rows", "6", "--cols", "4", "--split", "2", "--print"};
    c.env = base;
    const Outcome o = run_case(c, work, 60);
    ASSERT_TRUE(o.exited && o.code == 0) << o.err;
    std::ofstream(work + "/valid.plan") << o.out;
  }

  const auto seed = static_cast<uint64_t>(env_int("WEFT_CLI_FUZZ_SEED", 28));
  const int cases = static_cast<int>(env_int("WEFT_CLI_FUZZ_CASES", kCases));
  Gen g(seed);
  const double budget_s = static_cast<double>(env_int("WEFT_CLI_FUZZ_SECONDS", static_cast<int64_t>(kBudgetSeconds)));
  const auto end = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(budget_s * 1000));
  int ran = 0, failures = 0, nonzero = 0;
  std::map<std::string, int> shown;
  for (int i = 0; i < cases && Clock::now() < end; ++i) {
    const Case c = make_case(g, base, f);
    const Outcome o = run_case(c, work, kCaseLimitSeconds);
    ++ran;
    nonzero += o.exited && o.code != 0;
    std::string echoed;
    for (const auto& a : c.argv) echoed += a + "\n";
    for (const auto& [k, v] : c.env) echoed += v + "\n";
    std::string why = judge(c, o, echoed);
    // The launcher removes its session directory (TMPDIR/weft-XXXXXX) on every way out.
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(t.path + "/tmp", ec))
      if (e.path().filename().string().rfind("weft-", 0) == 0) {
        if (why.empty()) why = "left " + e.path().string() + " behind";
        fs::remove_all(e.path(), ec);
      }
    if (!why.empty()) {
      // Each kind of failure (what went wrong, in which command) is shown twice at most.
      ++failures;
      const std::string kind = why.substr(0, why.find(':')) + " / " + (c.argv.empty() ? "" : c.argv[0]);
      if (++shown[kind] <= 2)
        ADD_FAILURE() << "case " << i << " (seed " << seed << "): " << why << "\n" << describe(c, o, work);
      if (failures >= 40) break;
    }
  }
  std::printf("cli fuzz: %d cases (seed %llu), %d exited non-zero as expected of bad input, %d failed\n", ran,
              static_cast<unsigned long long>(seed), nonzero, failures);
  // A budget too small to try anything would pass vacuously.
  EXPECT_GE(ran, std::min(cases, 50));
}
