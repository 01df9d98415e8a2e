// The file bootstrap's directory (issue 28, item 7): under torchrun each bootstrap has a
// directory of its own that is removed when its ranks are done, after a rank died too, and by
// the next bootstrap when every rank was killed; files of an earlier attempt or bootstrap in
// the same directory are never read. Ranks are forked children of the test, which plays
// torchrun's agent (their parent), with environments of their own (no process variable read).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/runtime/bootstrap.hpp"

using namespace weft;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "weft-bs-test-XXXXXX").string();
    path = mkdtemp(t.data());
  }
  ~TempDir() { fs::remove_all(path); }
  std::vector<std::string> entries() const {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(path)) v.push_back(e.path().filename().string());
    return v;
  }
};

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The pid of a process that has exited and been reaped.
int dead_pid() {
  const pid_t p = fork();
  if (p == 0) _exit(0);
  waitpid(p, nullptr, 0);
  return p;
}

// torchrun's variables for rank `r` of `n` on one node, TMPDIR = `base`.
EnvMap torchrun_env(int r, int n, const fs::path& base, int restart, const std::string& run_id = "job") {
  return {{"RANK", std::to_string(r)},
          {"WORLD_SIZE", std::to_string(n)},
          {"LOCAL_RANK", std::to_string(r)},
          {"LOCAL_WORLD_SIZE", std::to_string(n)},
          {"TORCHELASTIC_RUN_ID", run_id},
          {"MASTER_PORT", "29500"},
          {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart)},
          {"TMPDIR", base.string()},
          {"WEFT_TIMEOUT_MS", "5000"}};
}

// weft launch's variables: the directory is given (and owned by the launcher).
EnvMap given_dir_env(int r, int n, const fs::path& dir) {
  return {{"WEFT_RANK", std::to_string(r)},       {"WEFT_WORLD_SIZE", std::to_string(n)},
          {"WEFT_LOCAL_RANK", std::to_string(r)}, {"WEFT_LOCAL_SIZE", std::to_string(n)},
          {"WEFT_BOOTSTRAP_DIR", dir.string()},   {"WEFT_TIMEOUT_MS", "5000"}};
}

// Forks n ranks running fn(rank); returns each rank's error ("" when it returned). A rank
// still running after 30 s is killed and reported.
std::vector<std::string> run_forked(int n, const std::function<void(int)>& fn) {
  TempDir msgs;
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t p = fork();
    if (p == 0) {
      int code = 0;
      try {
        fn(r);
      } catch (const std::exception& e) {
        std::ofstream(msgs.path / std::to_string(r)) << e.what();
        code = 1;
      }
      _exit(code);
    }
    pids.push_back(p);
  }
  std::vector<std::string> errors(n);
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < n; ++r) {
    int st = 0;
    while (waitpid(pids[r], &st, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(30)) {
        kill(pids[r], SIGKILL);
        waitpid(pids[r], &st, 0);
        errors[r] = "hung; killed";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!errors[r].empty()) continue;
    std::ifstream f(msgs.path / std::to_string(r));
    std::stringstream ss;
    ss << f.rdbuf();
    errors[r] = ss.str();
    if (errors[r].empty() && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) errors[r] = "exited abnormally";
  }
  return errors;
}

void expect_ok(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// Allgathers `rounds` rounds of values 1000 * round + rank and checks them.
void exchange(Bootstrap& bs, int rounds) {
  for (int round = 0; round < rounds; ++round) {
    std::vector<uint64_t> all(bs.size());
    const uint64_t mine = 1000ull * round + bs.rank();
    bs.allgather(&mine, sizeof mine, all.data());
    for (int r = 0; r < bs.size(); ++r)
      WEFT_CHECK(all[r] == 1000ull * round + r,
                 "round " + std::to_string(round) + ": rank " + std::to_string(r) + " sent " + std::to_string(all[r]));
  }
}

// The torchrun directories under `base` (what this rank's bootstrap made, while it lives).
std::vector<std::string> torchrun_dirs(const fs::path& base) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(base))
    if (e.path().filename().string().rfind("weft-torchrun-", 0) == 0) v.push_back(e.path().filename().string());
  return v;
}

// Waits (up to 5 s) until `peer`'s process has exited.
void wait_exited(const Bootstrap& bs, int peer) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!bs.peer_exited(peer)) {
    WEFT_CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5), "the peer did not exit");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

// Clean exit: the directory is made under TMPDIR and gone once every rank has destroyed its
// bootstrap. A run id with path characters stays one name inside TMPDIR.
TEST(TorchrunBootstrap, DirectoryIsRemovedWhenEveryRankIsDone) {
  TempDir base;
  const int n = 3;
  expect_ok(run_forked(n, [&](int r) {
    EnvMap env = torchrun_env(r, n, base.path, 0, "../run/id");
    auto bs = make_bootstrap(world_from_env(env), env);
    exchange(*bs, 5);
    const auto dirs = torchrun_dirs(base.path);
    WEFT_CHECK(dirs.size() == 1, "expected one bootstrap directory under TMPDIR, found: " + joined(dirs));
    bs->barrier();  // nobody removes it before every rank looked
  }));
  EXPECT_TRUE(base.entries().empty()) << "left behind: " << joined(base.entries());
}

// A rank died (exited without destroying its bootstrap): the survivors remove the directory.
TEST(TorchrunBootstrap, DirectoryIsRemovedWhenARankDiedAndTheOthersAreDone) {
  TempDir base;
  const int n = 3;
  expect_ok(run_forked(n, [&](int r) {
    EnvMap env = torchrun_env(r, n, base.path, 0);
    auto bs = make_bootstrap(world_from_env(env), env);
    exchange(*bs, 3);
    const auto dirs = torchrun_dirs(base.path);
    WEFT_CHECK(dirs.size() == 1, "expected one bootstrap directory under TMPDIR, found: " + joined(dirs));
    bs->barrier();
    if (r == 1) _exit(0);  // no destructor: as if killed
    wait_exited(*bs, 1);
  }));
  EXPECT_TRUE(base.entries().empty()) << "left behind: " << joined(base.entries());
}

// Every rank killed, then an elastic restart (same agent, run id and port; the restart count
// one higher): the new attempt works, and removes the dead attempt's directory with its own,
// and that of an agent that has exited; a live agent's directory is kept.
TEST(TorchrunBootstrap, RestartRemovesTheKilledAttemptAndDeadAgentsDirectories) {
  TempDir base;
  const int n = 2;
  expect_ok(run_forked(n, [&](int r) {
    EnvMap env = torchrun_env(r, n, base.path, 0);
    auto bs = make_bootstrap(world_from_env(env), env);
    exchange(*bs, 2);
    bs->barrier();
    _exit(0);  // killed: nobody removes the directory
  }));
  ASSERT_EQ(torchrun_dirs(base.path).size(), 1u) << "the killed attempt's directory should be left for this test";
  const fs::path dead_agent = base.path / ("weft-torchrun-" + std::to_string(dead_pid()) + "-job-29500-0-0");
  fs::create_directory(dead_agent);
  std::ofstream(dead_agent / "0.0") << "stale";
  // pid 1 never exits; no attempt of this run.
  const fs::path live_agent = base.path / "weft-torchrun-1-other-29500-0-0";
  fs::create_directory(live_agent);
  const fs::path unrelated = base.path / "weft-torchrunner";
  fs::create_directory(unrelated);

  expect_ok(run_forked(n, [&](int r) {
    EnvMap env = torchrun_env(r, n, base.path, 1);
    auto bs = make_bootstrap(world_from_env(env), env);
    exchange(*bs, 4);
  }));
  EXPECT_FALSE(fs::exists(dead_agent)) << "the directory of an agent that exited was kept";
  EXPECT_TRUE(fs::exists(live_agent)) << "the directory of a live agent's run was removed";
  EXPECT_TRUE(fs::exists(unrelated));
  fs::remove(live_agent);
  fs::remove(unrelated);
  EXPECT_TRUE(base.entries().empty()) << "left behind: " << joined(base.entries());
}

// Files of an attempt that died in the same directory (the names of an older weft, and a
// session whose rank 0 has exited, with its round files): the new attempt reads none of them,
// even when its rank 0 comes last.
TEST(FileBootstrapStaleFiles, FilesOfADeadAttemptInTheSameDirectoryAreNotRead) {
  TempDir dir;
  const int n = 3;
  const int dead = dead_pid();
  const std::string stale_nonce = "00000000deadbeef";
  std::ofstream(dir.path / "session") << dead << " 1 " << this_host_hash() << " " << stale_nonce << "\n";
  for (int r = 0; r < n; ++r) {
    PeerInfo info{n, n, dead, this_host_hash()};
    for (const std::string& prefix : {std::string(), stale_nonce + "."}) {
      std::ofstream(dir.path / (prefix + "0." + std::to_string(r)), std::ios::binary)
          .write(reinterpret_cast<const char*>(&info), sizeof info);
      for (int round = 1; round < 10; ++round) {
        const uint64_t wrong = 999999;
        std::ofstream(dir.path / (prefix + std::to_string(round) + "." + std::to_string(r)), std::ios::binary)
            .write(reinterpret_cast<const char*>(&wrong), sizeof wrong);
      }
    }
  }
  expect_ok(run_forked(n, [&](int r) {
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EnvMap env = given_dir_env(r, n, dir.path);
    auto bs = make_bootstrap(world_from_env(env), env);
    exchange(*bs, 9);
  }));
  EXPECT_TRUE(fs::is_directory(dir.path)) << "a directory given by the launcher was removed";
}

// Two bootstraps of the same ranks, one after the other, in one directory (two backends of
// one program): the second never reads the first's files, though its rank 0 is the same live
// process and comes last.
TEST(FileBootstrapStaleFiles, AnEarlierBootstrapOfTheSameRanksIsNotRead) {
  TempDir dir;
  const int n = 3;
  expect_ok(run_forked(n, [&](int r) {
    EnvMap env = given_dir_env(r, n, dir.path);
    {
      auto first = make_bootstrap(world_from_env(env), env);
      const uint64_t mine = 999999;
      std::vector<uint64_t> all(n);
      first->allgather(&mine, sizeof mine, all.data());
    }
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto second = make_bootstrap(world_from_env(env), env);
    exchange(*second, 3);
  }));
}

// A session whose rank 0 is still running is another run's: rank 0 refuses to share it.
TEST(FileBootstrapStaleFiles, ADirectoryInUseByALiveRunIsRefused) {
  TempDir dir;
  // This test process plays the other run's live rank 0.
  std::string ticks;
  {
    std::ifstream f("/proc/self/stat");
    std::string line;
    std::getline(f, line);
    std::istringstream fields(line.substr(line.rfind(')') + 1));
    for (int i = 3; i <= 22; ++i) fields >> ticks;
  }
  std::ofstream(dir.path / "session") << getpid() << " " << ticks << " " << this_host_hash() << " 0123456789abcdef\n";
  auto errors = run_forked(2, [&](int r) {
    EnvMap env = given_dir_env(r, 2, dir.path);
    env["WEFT_TIMEOUT_MS"] = "500";
    make_bootstrap(world_from_env(env), env);
  });
  EXPECT_NE(errors[0].find("is in use by another run"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("waiting for rank 0"), std::string::npos) << errors[1];
}
