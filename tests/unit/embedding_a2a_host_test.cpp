// Embedding-bag lookups + all-to-all on the host backend (ops::EmbeddingA2A; issue 24): exact
// against a per-sample reference for worlds 1, 2, 3, 4, 8 on integer tables -- ranks with no
// table and with several of different dims, empty bags, a bag of 100 indices, duplicate
// indices, per-sample weights, sum and mean, every weight and output dtype; bad calls refused
// on every rank, naming the table and the position.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "embedding_check.hpp"
#include "rank_harness.hpp"
#include "weft/core/error.hpp"
#include "weft/device/dtype.hpp"
#include "weft/ops/embedding_a2a.hpp"
#include "weft/runtime/backend.hpp"

using namespace weft;
using namespace weft::ops;
using namespace weft::testing;
using namespace weft::testing::embedding;

namespace {

std::vector<RankResult> run_host(int n, const std::function<void()>& fn) {
  LaunchOptions opt;
  opt.nranks = n;
  opt.extra_env = {{"WEFT_BACKEND", "host"}, {"WEFT_HOST_HEAP_MIB", "64"}, {"WEFT_TIMEOUT_MS", "20000"}};
  opt.grace_ms = 25000;
  opt.deadline_ms = 240000;
  opt.quiet = true;
  return run_ranks(fn, opt);
}

}  // namespace

class EmbeddingA2AHost : public ::testing::TestWithParam<int> {};

TEST_P(EmbeddingA2AHost, ForwardIsExact) {
  const int world = GetParam();
  expect_all_ok(run_host(world, [world] {
    auto b = make_backend();
    int checks = 0;
    for (int64_t batch : {3, 0, 1})
      for (dev::DType wt : {dev::DType::kF32, dev::DType::kBF16, dev::DType::kF16})
        for (dev::DType ot : {dev::DType::kF32, dev::DType::kBF16})
          for (EmbeddingPooling pool : {EmbeddingPooling::kSum, EmbeddingPooling::kMean})
            for (bool weighted : {false, true}) {
              HostMem mem;
              run_and_check(*b, Model(world, batch), wt, ot, pool, weighted,
                            fmt::format("world {} batch {} weights {} out {} {}{}", world, batch, dev::dtype_name(wt),
                                        dev::dtype_name(ot), pool == EmbeddingPooling::kSum ? "sum" : "mean",
                                        weighted ? " weighted" : ""),
                            mem, static_cast<EmbeddingA2AMethod>(checks % 4));  // the host runs each as the baseline
              ++checks;
            }
    if (b->rank() == 0) std::printf("[host] embedding_a2a: %d ranks, %d checks passed\n", world, checks);
  }));
}

// The backward: the exact transpose, in the op's order, for every dtype, pooling and weighting,
// into every sink (dense, sparse, SGD's and Adagrad's updates).
TEST_P(EmbeddingA2AHost, BackwardIsExact) {
  const int world = GetParam();
  expect_all_ok(run_host(world, [world] {
    auto b = make_backend();
    int checks = 0;
    for (EmbeddingGradKind kind :
         {EmbeddingGradKind::kDense, EmbeddingGradKind::kSparse, EmbeddingGradKind::kSgd, EmbeddingGradKind::kAdagrad})
      for (int64_t batch : {3, 0, 1})
        for (dev::DType wt : {dev::DType::kF32, dev::DType::kBF16})
          for (dev::DType ot : {dev::DType::kF32, dev::DType::kBF16})
            for (EmbeddingPooling pool : {EmbeddingPooling::kSum, EmbeddingPooling::kMean})
              for (bool weighted : {false, true}) {
                if (kind != EmbeddingGradKind::kDense && batch == 1) continue;
                HostMem mem;
                run_and_check_backward(
                    *b, Model(world, batch), wt, ot, pool, weighted,
                    fmt::format("backward world {} batch {} weights {} grads {} {}{}", world, batch,
                                dev::dtype_name(wt), dev::dtype_name(ot),
                                pool == EmbeddingPooling::kSum ? "sum" : "mean", weighted ? " weighted" : ""),
                    mem, EmbeddingA2AMethod::kAuto, kind);
                ++checks;
              }
    if (b->rank() == 0) std::printf("[host] embedding_a2a backward: %d ranks, %d checks passed\n", world, checks);
  }));
}

INSTANTIATE_TEST_SUITE_P(Worlds, EmbeddingA2AHost, ::testing::Values(1, 2, 3, 4, 8));

// A bad call on one rank alone is refused on every rank (its peers would otherwise wait for it),
// naming the table and the position there; the op goes on.
TEST(EmbeddingA2AHostErrors, BadCallsAreRefusedOnEveryRank) {
  expect_all_ok(run_host(3, [] {
    auto b = make_backend();
    const int r = b->rank();
    const std::string disagree = "ranks disagree on whether";
    expect_message(
        [&] {
          EmbeddingA2AConfig c;
          c.batch = 2;
          c.tables = {{4, r == 1 ? 12 : 16}};
          EmbeddingA2A op(*b, c);
        },
        r == 1 ? "embedding_a2a: table 0's dim must be a multiple of 8 in 8 ... 1024, got 12" : disagree);
    expect_message(
        [&] {
          EmbeddingA2AConfig c;
          c.batch = r == 2 ? 3 : 2;
          EmbeddingA2A op(*b, c);
        },
        "embedding_a2a: ranks disagree on the configuration");
    EmbeddingA2AConfig c;
    c.batch = 1;
    c.tables = {{4, 8}};
    EmbeddingA2A op(*b, c);
    std::vector<float> w(32, 1.f);
    std::vector<int64_t> off = {0, 1, 2, 3}, idx = {0, 3, 1};
    std::vector<float> out(static_cast<size_t>(op.total_dim()), 0.f);
    EmbeddingBagInput in{w.data(), off.data(), idx.data(), nullptr};
    if (r == 1) idx[2] = 4;  // outside the table's 4 rows
    expect_message([&] { op.forward(&in, out.data()); },
                   r == 1 ? "embedding_a2a: table 0 (global 1): indices[2] = 4 is outside 0 ... 3" : disagree);
    idx[2] = 1;
    if (r == 0) off = {0, 2, 1, 3};
    expect_message([&] { op.forward(&in, out.data()); },
                   r == 0 ? "embedding_a2a: table 0 (global 0): offsets decrease at bag 1 (2 then 1)" : disagree);
    off = {0, 1, 2, 3};
    op.forward(&in, out.data());  // the op goes on: every bag one row of ones
    for (float v : out) WEFT_CHECK(v == 1.f, "after the refusals");
  }));
}
