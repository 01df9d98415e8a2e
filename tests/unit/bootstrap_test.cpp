#include <gtest/gtest.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>

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

// ---------------------------------------------------------------------------------------
// Sizes from users: checked arithmetic, never a wrapped bound (issue 28, item 2).
TEST(SymmetricHeapBounds, HugeRequestsAreRefusedNamingTheRequestAndTheCapacity) {
  expect_all_ok(run_host_ranks(2, [] {
    auto b = make_backend();
    auto& heap = b->heap();
    heap.alloc<float>(10, "small");  // offset > 0 from here on: offset + bytes would wrap
    const size_t before = heap.used();
    auto refused = [&](const std::function<void()>& f, const std::string& name) {
      try {
        f();
      } catch (const InvalidArgument& e) {
        const std::string m = e.what();
        WEFT_CHECK(m.find(name) != std::string::npos && m.find(std::to_string(heap.capacity())) != std::string::npos,
                   "the refusal does not name '" + name + "' and the capacity: " + m);
        return;
      }
      WEFT_CHECK(false, "a request for '" + name + "' that cannot fit was accepted");
    };
    refused([&] { heap.alloc_bytes(SIZE_MAX - 100, "wraps"); }, "wraps");
    refused([&] { heap.alloc_bytes(SIZE_MAX, "max"); }, "max");
    refused([&] { heap.alloc_bytes(heap.capacity() - 1, "just over"); }, "just over");
    refused([&] { heap.alloc<float>(SIZE_MAX / 2, "count overflow"); }, "count overflow");
    refused([&] { heap.alloc<double>((SIZE_MAX >> 3) + 2, "count overflow 2"); }, "count overflow 2");
    refused([&] { heap.alloc_bytes(1, "huge align", size_t{1} << 63); }, "huge align");
    WEFT_CHECK(heap.used() == before, "a refused request used heap space");
    auto t = heap.alloc<float>(16, "after");  // the heap still works, and the ranks still agree
    WEFT_CHECK(t.offset >= before, "allocation after refusals overlaps");
  }));
}

// The heap size is agreed at start-up (item 3): a mismatch is named on every rank.
TEST(HostBackendStart, HeapSizesThatDisagreeAreNamedOnEveryRank) {
  auto res = run_host_ranks(3, [] {
    if (world_rank() == 2) setenv("WEFT_HOST_HEAP_MIB", "32", 1);  // the others have 16
    make_backend();
  });
  for (const auto& r : res) {
    EXPECT_EQ(r.exit_code, 1) << "rank " << r.rank << " accepted a world with heaps of different sizes";
    EXPECT_NE(r.message.find("disagree on the symmetric heap size"), std::string::npos) << r.message;
    EXPECT_NE(r.message.find("WEFT_HOST_HEAP_MIB=16"), std::string::npos) << r.message;
    EXPECT_NE(r.message.find("WEFT_HOST_HEAP_MIB=32"), std::string::npos) << r.message;
    EXPECT_NE(r.message.find("rank 2"), std::string::npos) << r.message;
  }
}

namespace {
// /dev/shm entries whose name starts with weft-<pid>-: the host heap segments rank `pid` made.
std::vector<std::string> segments_of(int pid) {
  std::vector<std::string> found;
  const std::string prefix = "weft-" + std::to_string(pid) + "-";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec))
    if (e.path().filename().string().rfind(prefix, 0) == 0) found.push_back(e.path().string());
  return found;
}
}  // namespace

// /dev/shm too small for heap x ranks (item 4): an error at start-up naming /dev/shm, the
// size and the variable, on every rank; never SIGBUS later. The heap asked for here is more
// than /dev/shm has free, which no machine can grant.
TEST(HostBackendStart, DevShmTooSmallIsAnErrorAtStartUp) {
  struct statvfs vfs{};
  ASSERT_EQ(statvfs("/dev/shm", &vfs), 0);
  const uint64_t free_mib = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize >> 20;
  const uint64_t per_rank = free_mib / 2 + 64;  // x 2 ranks > free
  if (per_rank > static_cast<uint64_t>(tunables::kHostHeapMiB.max_value)) GTEST_SKIP() << "/dev/shm is huge";
  auto res = run_host_ranks(
      2,
      [per_rank] {
        setenv("WEFT_HOST_HEAP_MIB", std::to_string(per_rank).c_str(), 1);  // the harness sets 16
        try {
          make_backend();
        } catch (...) {
          WEFT_CHECK(segments_of(getpid()).empty(), "the refused segment was left in /dev/shm");
          throw;
        }
      });
  for (const auto& r : res) {
    EXPECT_EQ(r.exit_code, 1) << "rank " << r.rank << ": a heap larger than /dev/shm was accepted";
    EXPECT_NE(r.message.find("/dev/shm"), std::string::npos) << r.message;
    EXPECT_NE(r.message.find("WEFT_HOST_HEAP_MIB=" + std::to_string(per_rank)), std::string::npos) << r.message;
    EXPECT_NE(r.message.find(std::to_string(per_rank * 2 << 20)), std::string::npos) << r.message;  // bytes needed
  }
}

// A rank that dies during start-up (item 5): rank 0, which made the segment, removes it
// when the name broadcast fails.
TEST(HostBackendStart, NoSegmentOutlivesAPeerThatDiesDuringStartUp) {
  auto res = run_host_ranks(
      2,
      [] {
        EnvMap env = current_env();
        if (world_rank() == 1) {
          // Through make_backend's agreement (backend kind, heap MiB), then gone before
          // rank 0's broadcast of the segment's name.
          auto bs = make_bootstrap(world_from_env(env), env);
          int64_t mine[2] = {static_cast<int64_t>(BackendKind::kHost), 16};
          int64_t all[4];
          bs->allgather(mine, sizeof mine, all);
          _exit(0);
        }
        bool failed = false;
        try {
          make_backend();
        } catch (const TimeoutError&) {
          failed = true;
        }
        WEFT_CHECK(failed, "rank 0 started without its peer");
        const auto left = segments_of(getpid());
        WEFT_CHECK(left.empty(), "start-up failure left " + (left.empty() ? "" : left.front()));
      },
      {}, 1000);
  EXPECT_EQ(res[0].exit_code, 0) << res[0].message;
}
