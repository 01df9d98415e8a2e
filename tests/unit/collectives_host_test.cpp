// Collectives on the host backend, world sizes 1, 2, 3, 4, 8: exact results for every
// method and dtype, odd and zero sizes, unaligned pointers; bad input refused clearly.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <vector>

#include "collectives_check.hpp"
#include "weft/bench/collectives_bench.hpp"
#include "weft/ops/gemm_overlap.hpp"
#include "rank_harness.hpp"

using namespace weft;
using namespace weft::testing;

class CollectivesHost : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesHost, ExactForEveryMethodDtypeAndSize) {
  expect_all_ok(run_host_ranks(GetParam(), [] {
    auto b = make_backend();
    ops::Collectives ops(*b);
    HostMemory mem;
    CollectivesSuite suite(*b, ops, mem);
    suite.run_all({0, 1, 7, 8, 13, 1000, 4099});
    WEFT_CHECK(suite.checks() == 3 * 7 * 3 * 18 + 3 * 3 * 2 + 19,
               "not every check ran: " + std::to_string(suite.checks()));
  }));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CollectivesHost, ::testing::Values(1, 2, 3, 4, 8));

// auto for all-reduce: LL128 while a rank sends <= 4 MiB and LL128's extra link bytes over
// two-shot stay <= 2 MiB (2 ranks: up to 4 MiB, measured; 4 and 8 ranks: the cost model's
// crossovers, ~1.2 MiB and ~358 KiB), else two-shot.
TEST(CollectivesHostAuto, AllReducePicksLL128WhileItsExtraBytesAreSmall) {
  using M = ops::Method;
  struct Case {
    int world;
    uint64_t bytes;
    M want;
  };
  const std::vector<Case> cases = {
      {2, 8 << 10, M::kLowLatency128},   {2, 4 << 20, M::kLowLatency128}, {2, 8 << 20, M::kTwoShot},
      {4, 1 << 20, M::kLowLatency128},   {4, 2 << 20, M::kTwoShot},       {8, 256 << 10, M::kLowLatency128},
      {8, 512 << 10, M::kTwoShot},       {1, 8 << 10, M::kLowLatency128}};
  for (const Case& c : cases) {
    auto res = run_host_ranks(c.world, [c] {
      auto b = make_backend();
      ops::Collectives ops(*b);
      const M got = ops.auto_all_reduce(c.bytes);
      WEFT_CHECK(got == c.want, fmt::format("world {} bytes {}: auto picked {}, want {}", c.world, c.bytes,
                                            ops::to_string(got), ops::to_string(c.want)));
    });
    expect_all_ok(res);
  }
}

TEST(CollectivesHostErrors, MisalignedPointerIsRefused) {
  auto res = run_host_ranks(2, [] {
    auto b = make_backend();
    ops::Collectives ops(*b);
    alignas(16) char buf[64] = {};
    ops.all_reduce(buf + 1, buf + 1, 4, dev::DType::kBF16);
  });
  for (const auto& r : res)
    EXPECT_NE(r.message.find("is not aligned to its element size (2 bytes for bf16)"), std::string::npos) << r.message;
}

TEST(CollectivesHostErrors, NonSymmetricOutputIsRefused) {
  auto res = run_host_ranks(2, [] {
    auto b = make_backend();
    ops::Collectives ops(*b);
    alignas(16) float in[4] = {};
    ops.all_gather(in, 1ull << 20, 4, dev::DType::kF32);  // nothing allocated there
  });
  for (const auto& r : res)
    EXPECT_NE(r.message.find("all_gather output is not a symmetric allocation"), std::string::npos) << r.message;
}

TEST(CollectivesHostErrors, AllToAllVThatWouldOverflowIsRefusedEverywhere) {
  auto res = run_host_ranks(3, [] {
    auto b = make_backend();
    ops::Collectives ops(*b);
    const uint64_t cap = 10;
    const uint64_t out = b->heap().alloc_bytes(cap * 4, "a2av.out");
    std::vector<uint64_t> send(3, 3), recv(3);
    if (b->rank() == 0) send[2] = 9;  // rank 2 would receive 9 + 3 + 3 = 15 > 10; the others 9
    std::vector<float> in(20, 1.f);
    ops.all_to_all_v(in.data(), send.data(), out, cap, recv.data(), dev::DType::kF32, ops::Method::kDirect);
  });
  for (const auto& r : res)
    EXPECT_NE(r.message.find("all_to_all_v refused: rank 2 would receive 15 elements but the output holds 10"),
              std::string::npos)
        << r.message;
}

TEST(CollectivesHostErrors, UnknownMethodIsRefused) {
  try {
    ops::parse_method("ring");
    ADD_FAILURE() << "parse_method(\"ring\") returned";
  } catch (const InvalidArgument& e) {
    // The name table lists every accepted name.
    EXPECT_NE(std::string(e.what()).find("unknown method 'ring': expected auto, baseline, one-shot, two-shot, direct, "
                                         "ll or ll128"),
              std::string::npos)
        << e.what();
  }
  for (const auto& row : ops::kMethodNames) {
    EXPECT_EQ(ops::parse_method(row.name), row.value);
    EXPECT_STREQ(ops::to_string(row.value), row.name);
  }
}

// Ranks that disagree on a call's shape are told so, naming both, instead of one of them
// returning a wrong result (or both hanging).
TEST(CollectivesHostErrors, RanksThatDisagreeOnTheCountAreNamed) {
  auto res = run_host_ranks(2, [] {
    auto b = make_backend();
    ops::Collectives ops(*b);
    alignas(16) float x[64] = {};
    ops.all_reduce(x, x, b->rank() == 0 ? 64 : 32, dev::DType::kF32, ops::Method::kOneShot);
  });
  ASSERT_EQ(res.size(), 2u);
  for (const auto& r : res) {
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.message.find("collectives: ranks disagree on the call: rank 0 has all_reduce of 64 f32 elements, "
                             "method one-shot, rank 1 has all_reduce of 32 f32 elements, method one-shot"),
              std::string::npos)
        << r.message;
  }
}

TEST(CollectivesHostFaults, PeerThatSkipsACallIsNamed) {
  auto res = run_host_ranks(
      3,
      [] {
        auto b = make_backend();
        ops::Collectives ops(*b);
        alignas(16) float x[64] = {};
        ops.all_reduce(x, x, 64, dev::DType::kF32, ops::Method::kOneShot);
        if (b->rank() == 1) return;  // rank 1 skips the second call
        ops.all_reduce(x, x, 64, dev::DType::kF32, ops::Method::kOneShot);
      },
      {}, 1000);
  // The survivors name rank 1: in the call's agreement (it exited before arriving) or, where
  // there is none, in the collective's waits (it did not arrive).
  for (int r : {0, 2})
    EXPECT_TRUE(res[r].message.find("rank 1 did not arrive") != std::string::npos ||
                (res[r].message.find("rank 1 (pid") != std::string::npos &&
                 res[r].message.find("exited before arriving") != std::string::npos))
        << res[r].message;
}

// Issue 28 items 15 and 16: ranks that call with different counts, types or methods, or one
// with nothing to do (count 0), get an error naming both calls on every rank -- not success on
// one rank and a timeout or a wrong result on the other. The same for GemmOverlap's M.
TEST(CollectivesHostErrors, CallsThatDisagreeAreRefusedOnEveryRank) {
  struct Case {
    const char* what;
    std::function<void(ops::Collectives&, int)> call;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"baseline all-reduce, counts 8 / 16",
       [](ops::Collectives& c, int r) {
         std::vector<uint16_t> x(16, 0x3F80), y(16);
         c.all_reduce(x.data(), y.data(), r == 0 ? 8 : 16, dev::DType::kBF16, ops::Method::kBaseline);
       },
       "all_reduce of 8 bf16 elements"},
      {"one-shot all-reduce, count 0 on rank 1",
       [](ops::Collectives& c, int r) {
         std::vector<uint16_t> x(16, 0x3F80), y(16);
         c.all_reduce(x.data(), y.data(), r == 0 ? 16 : 0, dev::DType::kBF16, ops::Method::kOneShot);
       },
       "all_reduce of 0 bf16 elements"},
      {"reduce-scatter, methods direct / ll",
       [](ops::Collectives& c, int r) {
         std::vector<uint16_t> x(32, 0x3F80), y(16);
         c.reduce_scatter(x.data(), y.data(), 16, dev::DType::kBF16,
                          r == 0 ? ops::Method::kDirect : ops::Method::kLowLatency);
       },
       "method ll"},
  };
  for (const Case& cs : cases) {
    SCOPED_TRACE(cs.what);
    const auto res = run_host_ranks(2, [&cs] {
      auto b = make_backend();
      ops::Collectives c(*b);
      cs.call(c, b->rank());
    });
    for (const auto& r : res) {
      EXPECT_EQ(r.exit_code, 1) << "rank " << r.rank << ": " << r.message;
      EXPECT_NE(r.message.find("ranks disagree on the call"), std::string::npos) << r.message;
      EXPECT_NE(r.message.find(cs.needle), std::string::npos) << r.message;
    }
  }
  const auto res = run_host_ranks(2, [] {
    auto b = make_backend();
    ops::GemmOverlapConfig cfg;
    cfg.op = ops::GemmOp::kGemmAr;
    cfg.m = 64;
    cfg.k = 16;
    cfg.n = 8;
    cfg.m_buckets = {8};
    ops::GemmOverlap op(*b, cfg);
    std::vector<uint16_t> a(static_cast<size_t>(op.a_rows() * op.a_cols())),
        w(static_cast<size_t>(op.b_rows() * op.b_cols())), c(static_cast<size_t>(op.c_rows() * op.c_cols()));
    op.run(a.data(), w.data(), c.data(), {.m = b->rank() == 0 ? 64 : 8});
  });
  for (const auto& r : res) {
    EXPECT_EQ(r.exit_code, 1) << "rank " << r.rank << ": " << r.message;
    EXPECT_NE(r.message.find("ranks disagree on the call: rank 0 has M = 64"), std::string::npos) << r.message;
  }
}

// The bench's table: best/base is weft's best against the better of NCCL's two modes.
TEST(CollectivesBenchTable, RatioIsAgainstTheBetterNcclMode) {
  using bench::CollPoint;
  const std::vector<CollPoint> pts = {{"all_gather", "nccl", 1 << 20, 30.0, 0},
                                      {"all_gather", "nccl_symm", 1 << 20, 20.0, 0},
                                      {"all_gather", "direct", 1 << 20, 25.0, 0},
                                      {"all_gather", "auto", 1 << 20, 26.0, 0},
                                      {"all_gather", "nccl", 2 << 20, 40.0, 0},
                                      {"all_gather", "direct", 2 << 20, 30.0, 0}};
  const std::string t = bench::to_table(pts);
  // 1 MiB: 25 / min(30, 20) = 1.25 (slower than NCCL's symmetric mode); 2 MiB (no symm): 0.75.
  EXPECT_NE(t.find("1.25\n"), std::string::npos) << t;
  EXPECT_NE(t.find("0.75\n"), std::string::npos) << t;
  EXPECT_NE(t.find("20.0"), std::string::npos) << t;
}
