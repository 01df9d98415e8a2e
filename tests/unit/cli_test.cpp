// The CLI end to end: weft launch, its errors, and weft bench on the host backend.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>

namespace {

struct Run {
  int status;
  std::string out;
};

Run run(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), p)) out += buf.data();
  int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

const std::string kWeft = WEFT_CLI_PATH;

}  // namespace

TEST(Cli, LaunchRunsEveryRankWithItsEnvironment) {
  auto r = run(kWeft + " launch -n 3 -- sh -c 'echo rank=$WEFT_RANK of $WEFT_WORLD_SIZE'");
  EXPECT_EQ(r.status, 0) << r.out;
  for (int i = 0; i < 3; ++i) EXPECT_NE(r.out.find("rank=" + std::to_string(i) + " of 3"), std::string::npos) << r.out;
}

TEST(Cli, LaunchReportsTheFailingRankAndItsStatus) {
  auto r = run(kWeft + " launch -n 2 -- sh -c 'exit $((WEFT_RANK * 7))'");
  EXPECT_EQ(r.status, 7) << r.out;
  EXPECT_NE(r.out.find("rank 1 exited with status 7"), std::string::npos) << r.out;
}

TEST(Cli, LaunchKillsRanksThatOutliveAFailedPeer) {
  auto r = run("WEFT_TIMEOUT_MS=200 " + kWeft + " launch -n 2 -- sh -c '[ $WEFT_RANK = 0 ] && exit 3; sleep 60'");
  EXPECT_EQ(r.status, 3) << r.out;
  EXPECT_NE(r.out.find("rank 1 was still running"), std::string::npos) << r.out;
}

TEST(Cli, LaunchWithoutCommandIsAnError) {
  auto r = run(kWeft + " launch -n 2");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("no command given"), std::string::npos) << r.out;
}

TEST(Cli, BenchOnTheHostBackendWritesJson) {
  char dir[] = "/tmp/weft-cli-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  auto r = run("WEFT_BACKEND=host WEFT_HOST_RANKS=2 " + kWeft + " bench --quick --out " + dir);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("push"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("one-way signal latency"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("all_reduce"), std::string::npos) << r.out;  // the collectives table
  auto ls = run(std::string("ls ") + dir);
  EXPECT_NE(ls.out.find(".json"), std::string::npos) << ls.out;
  run(std::string("rm -rf ") + dir);
}

TEST(Cli, InfoReportsTheBackend) {
  auto r = run("WEFT_BACKEND=host " + kWeft + " info");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("backend: host"), std::string::npos) << r.out;
}
