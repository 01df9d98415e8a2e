// The CLI against hostile input (issue 28): every bad number is refused with a message naming
// the option and an exit status, never a signal; files that cannot be written fail the
// command; no shell sees a file name; plans are bounded; user errors carry no file:line.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <cctype>
#include <cstring>
#include <string>

#include "weft/core/error.hpp"
#include "weft/version.hpp"

namespace {

namespace fs = std::filesystem;

struct CliRun {
  int status;       // exit status; -1 when killed by a signal
  int signal;       // the signal that killed it, else 0
  std::string out;  // stdout and stderr together
  double secs;
};

CliRun run(const std::string& cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), p)) out += buf.data();
  const int st = pclose(p);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // sh reports a child killed by signal s as status 128 + s.
  const int sig = WIFSIGNALED(st) ? WTERMSIG(st) : (WIFEXITED(st) && WEXITSTATUS(st) > 128 ? WEXITSTATUS(st) - 128 : 0);
  return {WIFEXITED(st) && sig == 0 ? WEXITSTATUS(st) : -1, sig, out, secs};
}

bool has(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

const std::string kWeft = WEFT_CLI_PATH;

struct TempDir {
  std::string path;
  TempDir() {
    char d[] = "/tmp/weft-cli-hard-XXXXXX";
    path = mkdtemp(d);
  }
  ~TempDir() { fs::remove_all(path); }
};

// `s` as one word for sh: single quotes, each ' written as '\''.
std::string sh_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

// Issue 28 item 1 (and 18's negative sizes and bandwidths): each bad number is a usage error
// (status 2) naming the option and the value, never SIGFPE.
TEST(CliHardening, BadNumbersAreUsageErrorsNamingTheOption) {
  struct Case {
    std::string args, option, value;
  };
  const Case cases[] = {
      {"simulate --bytes 1000 --cols 0", "--cols", "0"},
      {"simulate --cols -3", "--cols", "-3"},
      {"simulate --bytes -5", "--bytes", "-5"},
      {"simulate --net-gbps -1", "--net-gbps", "-1"},
      {"simulate --net-gbps 0", "--net-gbps", "0"},
      {"simulate --link-gbps -2", "--link-gbps", "-2"},
      {"simulate --nodes 0", "--nodes", "0"},
      {"simulate --gpus -4", "--gpus", "-4"},
      {"simulate --rows -1", "--rows", "-1"},
      {"plan --rows 0", "--rows", "0"},
      {"plan --tile 0", "--tile", "0"},
      {"plan --split 0", "--split", "0"},
      {"plan --world 0", "--world", "0"},
      {"plan --world -2", "--world", "-2"},
      {"plan --workers -1", "--workers", "-1"},
      {"plan --gemm-n -8", "--gemm-n", "-8"},
      {"plan --gemm-k -8", "--gemm-k", "-8"},
      {"plan --rows 4611686018427387904 --world 4", "--rows", "4611686018427387904"},
      {"plan --cols 4611686018427387904", "--cols", "4611686018427387904"},
      {"plan --op gemm_rs --m 4294967296 --k 4294967296 --n 2 --world 2", "--m x --k", "4294967296"},
      {"plan --op gemv_ar --m 4294967296 --k 8 --n 4294967296 --world 1", "--m x --n", "4294967296"},
  };
  for (const Case& c : cases) {
    const CliRun r = run(kWeft + " " + c.args);
    EXPECT_EQ(r.signal, 0) << c.args << "\n" << r.out;
    EXPECT_EQ(r.status, 2) << c.args << "\n" << r.out;
    EXPECT_TRUE(has(r.out, c.option) && has(r.out, c.value)) << c.args << "\n" << r.out;
  }
}

// Item 18: --nodes x --gpus overflowing int was "world size 0".
TEST(CliHardening, WorldProductIsCheckedAndNamed) {
  CliRun r = run(kWeft + " simulate --nodes 65536 --gpus 65536");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_TRUE(has(r.out, "--nodes 65536 x --gpus 65536") && has(r.out, "4294967296")) << r.out;
  EXPECT_FALSE(has(r.out, "world size 0")) << r.out;
  r = run(kWeft + " simulate --nodes 3037000500 --gpus 3037000500");
  EXPECT_EQ(r.signal, 0) << r.out;
  EXPECT_NE(r.status, 0) << r.out;
}

// Item 11: tiles and transfers are bounded before anything is allocated, and tile counts
// beyond int are refused instead of wrapping to "0 x 1 tiles".
TEST(CliHardening, PlanSizesAreBounded) {
  CliRun r = run(kWeft + " plan --rows 1000000000 --tile 1");
  EXPECT_EQ(r.signal, 0) << r.out;
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_TRUE(has(r.out, "at most 16384") && has(r.out, "2000000000")) << r.out;
  EXPECT_LT(r.secs, 10) << r.out;

  TempDir d;
  const std::string f = d.path + "/big.plan";
  CliRun w = run(kWeft + " plan --collective all_gather --world 2 --rows 4 --cols 8 --print > " + f);
  ASSERT_EQ(w.status, 0) << w.out;
  std::string text = slurp(f);
  const size_t at = text.find("tensor out 8x8");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, 14, "tensor out 1099511627776x8");  // 2^40 rows
  std::ofstream(f) << text;
  r = run(kWeft + " plan --file " + f);
  EXPECT_EQ(r.signal, 0) << r.out;
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_FALSE(has(r.out, "0 x 1 tiles")) << r.out;
  EXPECT_TRUE(has(r.out, "8589934592 x 1 tiles")) << r.out;  // 2^40 / 128, named, not truncated
}

// Item 17: all_to_all at world 128 took minutes; the CLI now answers (here: refuses, naming
// the bound) within seconds. Worlds up to 1024 are refused before being built.
TEST(CliHardening, LargeWorldsAnswerQuickly) {
  for (const std::string args : {"plan --collective all_to_all --world 128", "simulate --collective all_to_all --nodes 16 --gpus 8",
                                 "plan --collective all_gather --algo ring --world 64",
                                 "plan --collective all_reduce --algo two-shot --world 1024"}) {
    const CliRun r = run(kWeft + " " + args);
    EXPECT_EQ(r.signal, 0) << args << "\n" << r.out;
    EXPECT_LT(r.secs, 5) << args << "\n" << r.out;
    if (r.status != 0) {
      EXPECT_TRUE(has(r.out, "at most 16384")) << args << "\n" << r.out;
    }
  }
}

// Item 12: a write that fails (a missing directory at open, a full device at write) fails the
// command, naming the path and the OS error, and "wrote" is not printed.
TEST(CliHardening, FailedWritesFailTheCommand) {
  CliRun r = run(kWeft + " plan --trace /nonexistent-weft-dir/t.json");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_TRUE(has(r.out, "/nonexistent-weft-dir/t.json") && has(r.out, "No such file or directory")) << r.out;
  EXPECT_FALSE(has(r.out, "wrote")) << r.out;
  if (fs::exists("/dev/full")) {
    r = run(kWeft + " plan --trace /dev/full");
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_TRUE(has(r.out, "/dev/full") && has(r.out, "No space left on device")) << r.out;
    EXPECT_FALSE(has(r.out, "wrote")) << r.out;
  }
  r = run("WEFT_BACKEND=host " + kWeft + " bench gemm --quick --out /dev/null/results");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_TRUE(has(r.out, "/dev/null/results") && has(r.out, "Not a directory")) << r.out;
  EXPECT_FALSE(has(r.out, "wrote")) << r.out;
}

// Item 13: the plotting script runs from an argument vector. A python3 first in PATH records
// its arguments; a shell would have run the $(...) and the `;` commands in the file name.
TEST(CliHardening, TracePngRunsNoShell) {
  TempDir d;
  const std::string bin = d.path + "/bin";
  fs::create_directory(bin);
  std::ofstream(bin + "/python3") << "#!/bin/sh\n[ \"$1\" = -c ] && exit 0\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; "
                                     "done > " << d.path << "/args\n";
  fs::permissions(bin + "/python3", fs::perms::owner_all);
  // Relative names (no '/' in a file name): the markers land in d.path if a shell runs them.
  const std::string name = "t'$(touch M1);touch M2;'.json";
  CliRun w = run("cd " + d.path + " && " + kWeft + " plan --trace " + sh_quote(name));
  ASSERT_EQ(w.status, 0) << w.out;
  ASSERT_TRUE(fs::exists(d.path + "/" + name)) << w.out;
  ASSERT_FALSE(fs::exists(d.path + "/M1"));
  CliRun r = run("cd " + d.path + " && PATH=" + bin + ":$PATH " + kWeft + " trace " + sh_quote(name) + " --png out.png");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_FALSE(fs::exists(d.path + "/M1")) << r.out;
  EXPECT_FALSE(fs::exists(d.path + "/M2")) << r.out;
  const std::string args = slurp(d.path + "/args");
  EXPECT_TRUE(has(args, "plot_timeline.py\n" + name + "\nout.png\n")) << args;
}

// Item 18: without matplotlib, one line saying so and how to install it; no traceback.
TEST(CliHardening, TracePngWithoutMatplotlibSaysSo) {
  TempDir d;
  fs::create_directory(d.path + "/matplotlib");  // shadows any installed one
  std::ofstream(d.path + "/matplotlib/__init__.py") << "raise ImportError('No module named matplotlib')\n";
  const std::string trace = d.path + "/t.json";
  ASSERT_EQ(run(kWeft + " plan --trace " + trace).status, 0);
  CliRun r = run("PYTHONPATH=" + d.path + " " + kWeft + " trace " + trace + " --png " + d.path + "/o.png");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_TRUE(has(r.out, "matplotlib") && has(r.out, "pip install matplotlib")) << r.out;
  EXPECT_FALSE(has(r.out, "Traceback")) << r.out;
  // The script alone says the same in one line.
  r = run("PYTHONPATH=" + d.path + " python3 " + WEFT_SOURCE_TREE + "/tools/plot_timeline.py " + trace + " " +
          d.path + "/o.png");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_TRUE(has(r.out, "pip install matplotlib")) << r.out;
  EXPECT_FALSE(has(r.out, "Traceback")) << r.out;
}

// Item 18: an unknown command is named, with the list of commands.
TEST(CliHardening, UnknownCommandIsNamed) {
  const CliRun r = run(kWeft + " foo");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_TRUE(has(r.out, "'foo'")) << r.out;
  for (const char* c : {"info", "launch", "bench", "trace", "plan", "simulate"}) EXPECT_TRUE(has(r.out, c)) << r.out;
}

// Item 18: `--shapes x gemm` took "gemm" as a second shape and ran `bench all`; bad and huge
// shapes are refused, naming the shape, before any rank starts or memory is allocated.
TEST(CliHardening, BenchShapesAreValidated) {
  TempDir d;
  const std::string env = "WEFT_BACKEND=host WEFT_HOST_RANKS=1 ";
  CliRun r = run(env + kWeft + " bench --shapes x gemm --quick --out " + d.path);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_TRUE(has(r.out, "'gemm'")) << r.out;
  EXPECT_FALSE(has(r.out, "push")) << r.out;  // the devapi benchmark did not run
  r = run(env + kWeft + " bench gemm --shapes x --quick --out " + d.path);
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_TRUE(has(r.out, "'x'")) << r.out;
  for (const std::string shape : {"16x9223372036854775800x16", "4000000x4000000x4000000"}) {
    for (const std::string what : {"gemm", "ag_gemm"}) {
      r = run(env + kWeft + " bench " + what + " --quick --shapes " + shape + " --out " + d.path);
      EXPECT_EQ(r.signal, 0) << r.out;
      EXPECT_NE(r.status, 0) << r.out;
      EXPECT_TRUE(has(r.out, shape)) << r.out;
      EXPECT_FALSE(has(r.out, "bad_alloc") || has(r.out, "null operand")) << r.out;
    }
  }
  r = run(env + kWeft + " bench nope --out " + d.path);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_TRUE(has(r.out, "nope")) << r.out;
}

// Item 20: `weft plan --print`'s whole output reads back with --file, giving the same plan.
TEST(CliHardening, PrintedPlanReadsBack) {
  TempDir d;
  const std::string a = d.path + "/a.plan", b = d.path + "/b.plan";
  CliRun r = run(kWeft + " plan --collective all_reduce --algo two-shot --world 3 --rows 6 --cols 4 --split 2 --print > " +
              a);
  ASSERT_EQ(r.status, 0) << r.out;
  r = run(kWeft + " plan --file " + a + " --print > " + b);
  EXPECT_EQ(r.status, 0) << r.out << slurp(a);
  EXPECT_EQ(slurp(a), slurp(b));
  EXPECT_TRUE(has(slurp(b), "verifier: ok")) << slurp(b);
}

// Item 23: `weft --version` prints the project version.
TEST(CliHardening, VersionFlag) {
  const CliRun r = run(kWeft + " --version");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(has(r.out, std::string("weft ") + weft::kVersion)) << r.out;
}

// Item 23: user errors print the message without the source location it was detected at.
TEST(CliHardening, UserErrorsCarryNoSourceLocation) {
  // "(name.cpp:123)", "(name.hpp:1)", "(name.cu:9)" anywhere in the output (no std::regex:
  // GCC 12's <regex> fails the ASan/UBSan build).
  auto location = [](const std::string& s) {
    for (size_t p = s.find('('); p != std::string::npos; p = s.find('(', p + 1)) {
      size_t i = p + 1;
      while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '_')) ++i;
      if (i == p + 1) continue;
      for (const char* ext : {".cpp:", ".hpp:", ".cu:"})
        if (s.compare(i, std::strlen(ext), ext) == 0) {
          size_t j = i + std::strlen(ext), d = j;
          while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
          if (j > d && j < s.size() && s[j] == ')') return true;
        }
    }
    return false;
  };
  for (const std::string args : {"launch -n 2", "plan --op ag_gemm --world 2", "plan --collective nope",
                                 "plan --collective all_gather --algo nope", "trace /nonexistent-weft.json"}) {
    const CliRun r = run(kWeft + " " + args);
    EXPECT_NE(r.status, 0) << args << "\n" << r.out;
    EXPECT_TRUE(has(r.out, "weft: ")) << args << "\n" << r.out;
    EXPECT_FALSE(location(r.out)) << args << "\n" << r.out;
  }
}

// The location stays in what() (logs, internal errors); message() is the text alone.
TEST(CliHardening, ErrorKeepsMessageAndLocationApart) {
  try {
    WEFT_REQUIRE(false, "bad size");
    FAIL();
  } catch (const weft::InvalidArgument& e) {
    EXPECT_STREQ(e.message(), "bad size");
    const std::string w = e.what(), head = "bad size (cli_hardening_test.cpp:";
    EXPECT_TRUE(w.compare(0, head.size(), head) == 0 && w.size() > head.size() + 1 && w.back() == ')' &&
                w.find_first_not_of("0123456789", head.size()) == w.size() - 1)
        << w;
  }
  const weft::Error plain("no location");
  EXPECT_STREQ(plain.message(), "no location");
}

// Item 22: without --out, results go to the user's data directory, not ./bench/results.
TEST(CliHardening, BenchResultsDefaultOutsideTheWorkingDirectory) {
  TempDir d;
  fs::create_directory(d.path + "/cwd");
  CliRun r = run("cd " + d.path + "/cwd && env -u XDG_DATA_HOME HOME=" + d.path + " WEFT_BACKEND=host " + kWeft +
              " bench gemm --quick");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_FALSE(fs::exists(d.path + "/cwd/bench")) << r.out;
  EXPECT_TRUE(has(r.out, "wrote " + d.path + "/.local/share/weft/results/gemm-cpu-")) << r.out;
  r = run("cd " + d.path + "/cwd && XDG_DATA_HOME=" + d.path + "/xdg WEFT_BACKEND=host " + kWeft + " bench gemm --quick");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(has(r.out, "wrote " + d.path + "/xdg/weft/results/gemm-cpu-")) << r.out;
  EXPECT_FALSE(fs::exists(d.path + "/cwd/bench")) << r.out;
}

// Item 22: the host backend's tables say they are CPU figures.
TEST(CliHardening, HostBenchTablesSayCpu) {
  TempDir d;
  const CliRun r = run("WEFT_BACKEND=host WEFT_HOST_RANKS=2 " + kWeft + " bench collectives --quick --only all_reduce --out " +
                       d.path);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(has(r.out, "host backend: CPU figures")) << r.out;
}

// Found by the CLI fuzzer (cli_fuzz_test.cpp): each case is its minimal reproducer.

// `plan --workers 1000000000` gave the verifier's progress check a slot per worker: 8 GB and
// 40 s. Workers beyond a queue's length are now free, so any count answers at once.
TEST(CliHardening, HugeWorkerCountsAnswerQuickly) {
  for (const std::string args : {"plan --workers 1000000000", "plan --workers 2147483647 --collective all_to_all --world 4",
                                 "simulate --workers 2147483647"}) {
    const CliRun r = run(kWeft + " " + args);
    EXPECT_EQ(r.status, 0) << args << "\n" << r.out;
    EXPECT_LT(r.secs, 5) << args << "\n" << r.out;
  }
}

// `trace` on JSON that is not a Chrome trace printed nlohmann's raw exception
// ("[json.exception.type_error.302] type must be string"), with no file named; a file that is
// not JSON kept the exception id too.
TEST(CliHardening, TraceOfBadJsonNamesTheFile) {
  TempDir d;
  const std::string types = d.path + "/types.json", empty = d.path + "/empty.json";
  std::ofstream(types) << R"({"traceEvents":[{"name":1,"ph":[],"pid":"x","ts":null}]})";
  std::ofstream(empty) << "";
  for (const std::string& f : {types, empty}) {
    const CliRun r = run(kWeft + " trace " + f);
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_TRUE(has(r.out, "weft: error: trace '" + f + "'")) << r.out;
    EXPECT_FALSE(has(r.out, "json.exception")) << r.out;
  }
  const CliRun r = run(kWeft + " plan --constants " + empty);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_TRUE(has(r.out, empty)) << r.out;
  EXPECT_FALSE(has(r.out, "json.exception")) << r.out;
}

// `launch -n 2147483647` forked until the process limit (or died of bad_alloc sizing the
// ranks' table); -n is bounded like WEFT_HOST_RANKS, a usage error naming the value.
TEST(CliHardening, LaunchRankCountIsBounded) {
  for (const std::string n : {"2147483647", "1025", "0", "-3"}) {
    const CliRun r = run(kWeft + " launch -n " + n + " -- true");
    EXPECT_EQ(r.status, 2) << n << "\n" << r.out;
    EXPECT_TRUE(has(r.out, "-n " + n) && has(r.out, "1 to 1024")) << n << "\n" << r.out;
    EXPECT_LT(r.secs, 5) << n << "\n" << r.out;
  }
}

// `trace /dev/full` (and `plan --file /dev/zero`, `--constants /dev/zero`) read a file that
// never ends until memory ran out; input files are read up to a bound, then refused by name.
TEST(CliHardening, EndlessInputFilesAreRefused) {
  for (const std::string args : {"trace /dev/full", "plan --file /dev/zero", "plan --constants /dev/zero"}) {
    const CliRun r = run(kWeft + " " + args);
    EXPECT_EQ(r.signal, 0) << args << "\n" << r.out;
    EXPECT_EQ(r.status, 1) << args << "\n" << r.out;
    EXPECT_TRUE(has(r.out, "/dev/") && has(r.out, "MiB; is it the right file?")) << args << "\n" << r.out;
  }
  const CliRun r = run(kWeft + " plan --file /");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_TRUE(has(r.out, "--file '/': cannot read it")) << r.out;
}
