#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>

#include "rank_harness.hpp"
#include "weft/core/error.hpp"
#include "weft/runtime/backend.hpp"

using namespace weft;
using weft::testing::expect_all_ok;
using weft::testing::run_host_ranks;
using weft::testing::world_rank;

class BootstrapWorlds : public ::testing::TestWithParam<int> {};

TEST_P(BootstrapWorlds, AllgatherAndBroadcastCarryEveryRanksBytes) {
  const int n = GetParam();
  expect_all_ok(run_host_ranks(n, [n] {
    EnvMap env = current_env();
    auto bs = make_bootstrap(world_from_env(env), env);
    for (int round = 0; round < 20; ++round) {
      std::vector<uint64_t> all(n);
      uint64_t mine = 1000ull * round + bs->rank();
      bs->allgather(&mine, sizeof mine, all.data());
      for (int r = 0; r < n; ++r)
        WEFT_CHECK(all[r] == 1000ull * round + r, "allgather: wrong value from rank " + std::to_string(r));
      uint64_t v = bs->rank() == round % n ? 77 + round : 0;
      bs->broadcast(&v, sizeof v, round % n);
      WEFT_CHECK(v == 77ull + round, "broadcast: wrong value");
    }
  }));
}

TEST_P(BootstrapWorlds, SymmetricAllocationsShareOffsetsAndComeBackZeroed) {
  const int n = GetParam();
  expect_all_ok(run_host_ranks(n, [] {
    auto b = make_backend();
    auto t = b->heap().alloc<float>(1000, "a");
    auto u = b->heap().alloc<uint8_t>(3, "b");
    auto v = b->heap().alloc<double>(7, "c");
    WEFT_CHECK(t.offset % 256 == 0 && u.offset % 256 == 0 && v.offset % 256 == 0, "allocation not 256-byte aligned");
    WEFT_CHECK(u.offset >= t.offset + t.bytes() && v.offset >= u.offset + u.bytes(), "allocations overlap");
    std::vector<uint8_t> bytes(v.bytes(), 1);
    b->copy_to_host(bytes.data(), v.offset, bytes.size());
    for (auto x : bytes) WEFT_CHECK(x == 0, "fresh symmetric memory is not zeroed");
  }));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, BootstrapWorlds, ::testing::Values(1, 2, 3, 4, 8));

TEST(BootstrapErrors, WorldSizesThatDisagreeAreNamed) {
  auto res = run_host_ranks(4, [] {
    if (world_rank() == 2) {  // a consistent environment of its own, but another world
      setenv("WEFT_WORLD_SIZE", "3", 1);
      setenv("WEFT_LOCAL_SIZE", "3", 1);
    }
    make_backend();
  });
  for (const auto& r : res) {
    EXPECT_NE(r.exit_code, 0) << "rank " << r.rank << " should have refused the world";
    EXPECT_NE(r.message.find("world sizes disagree"), std::string::npos) << r.message;
  }
}

TEST(BootstrapErrors, RankWithABrokenEnvironmentIsNamedByThePeersWaitingForIt) {
  auto res = run_host_ranks(
      3,
      [] {
        if (world_rank() == 2) setenv("WEFT_WORLD_SIZE", "2", 1);  // rank 2 of 2: invalid
        make_backend();
      },
      {}, 1000);
  EXPECT_NE(res[2].message.find("rank 2 is not below world size 2"), std::string::npos) << res[2].message;
  for (int r : {0, 1}) EXPECT_NE(res[r].message.find("waiting for rank 2"), std::string::npos) << res[r].message;
}

TEST(BootstrapErrors, AllocationsThatDisagreeFailOnEveryRank) {
  auto res = run_host_ranks(3, [] {
    auto b = make_backend();
    b->heap().alloc<float>(world_rank() == 1 ? 2048 : 1024, "weights");
  });
  for (const auto& r : res) {
    EXPECT_EQ(r.exit_code, 1) << "rank " << r.rank;
    EXPECT_NE(r.message.find("symmetric allocation #0 disagrees across ranks"), std::string::npos) << r.message;
  }
}

TEST(BootstrapErrors, AllocationOrderThatDisagreesFails) {
  auto res = run_host_ranks(2, [] {
    auto b = make_backend();
    if (world_rank() == 0) {
      b->heap().alloc<float>(16, "x");
      b->heap().alloc<float>(16, "y");
    } else {
      b->heap().alloc<float>(16, "y");
      b->heap().alloc<float>(16, "x");
    }
  });
  for (const auto& r : res) EXPECT_NE(r.message.find("disagrees across ranks"), std::string::npos) << r.message;
}

TEST(BootstrapErrors, HeapExhaustionIsAClearError) {
  auto res = run_host_ranks(2, [] {
    auto b = make_backend();
    b->heap().alloc<uint8_t>(64ull << 20, "too big");
  });
  for (const auto& r : res) EXPECT_NE(r.message.find("symmetric heap exhausted"), std::string::npos) << r.message;
}

TEST(BootstrapErrors, RankThatNeverArrivesIsNamedWithinTheDeadline) {
  auto t0 = std::chrono::steady_clock::now();
  auto res = run_host_ranks(
      3,
      [] {
        if (world_rank() == 1) return;  // exits before the bootstrap
        make_backend();
      },
      {}, 1500);
  auto secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 1.5 + 5.0);
  for (int r : {0, 2}) {
    EXPECT_EQ(res[r].exit_code, 1);
    EXPECT_NE(res[r].message.find("rank 1"), std::string::npos) << res[r].message;
  }
}
