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

#include "rank_harness.hpp"
#include "weft/core/error.hpp"
#include "weft/device/dtype.hpp"
#include "weft/ops/embedding_a2a.hpp"
#include "weft/runtime/backend.hpp"

using namespace weft;
using namespace weft::ops;
using namespace weft::testing;

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

float round_to(float f, dev::DType t) { return t == dev::DType::kF32 ? f : dev::from_bits16(dev::to_bits16(f, t), t); }
void put(std::vector<unsigned char>& v, int64_t i, float f, dev::DType t) {
  if (t == dev::DType::kF32) {
    std::memcpy(v.data() + 4 * i, &f, 4);
  } else {
    const uint16_t b = dev::to_bits16(f, t);
    std::memcpy(v.data() + 2 * i, &b, 2);
  }
}
float get(const std::vector<unsigned char>& v, int64_t i, dev::DType t) {
  if (t == dev::DType::kF32) {
    float f;
    std::memcpy(&f, v.data() + 4 * i, 4);
    return f;
  }
  uint16_t b;
  std::memcpy(&b, v.data() + 2 * i, 2);
  return dev::from_bits16(b, t);
}

// The tables and bags every rank can compute for every rank. Rank r holds (r + 1) % 3 tables
// (rank 2 none), of dims 8, 16 or 24; table g (global) has 5 + 3g rows of small integers.
struct Model {
  int world = 1;
  int64_t batch = 3;
  std::vector<int> owner;                   // global table -> rank
  std::vector<EmbeddingTableShape> shapes;  // global order
  explicit Model(int w, int64_t b) : world(w), batch(b) {
    for (int r = 0; r < w; ++r)
      for (int t = 0; t < (r + 1) % 3; ++t) {
        owner.push_back(r);
        shapes.push_back({5 + 3 * static_cast<int64_t>(shapes.size()), 8 * (1 + (r + t) % 3)});
      }
  }
  std::vector<EmbeddingTableShape> tables_of(int r) const {
    std::vector<EmbeddingTableShape> v;
    for (size_t g = 0; g < shapes.size(); ++g)
      if (owner[g] == r) v.push_back(shapes[g]);
    return v;
  }
  static float w(size_t g, int64_t row, int64_t j) {
    return static_cast<float>((static_cast<int64_t>(g) * 7 + row * 3 + j) % 5 - 2);
  }
  // Bag `bag` of table g: its size (0 ... 3, and 100 for bag 1 of every even table) and indices.
  int64_t bag_size(size_t g, int64_t bag) const {
    return g % 2 == 0 && bag == 1 ? 100 : (static_cast<int64_t>(g) + bag) % 4;
  }
  int64_t index(size_t g, int64_t bag, int64_t i) const {
    return (static_cast<int64_t>(g) + bag * 5 + i * 3) % shapes[g].rows;  // duplicates in long bags
  }
  static float psw(size_t g, int64_t i) { return g % 2 == 1 ? static_cast<float>(i % 3 - 1 + (i % 3 == 1)) : 1.f; }
};

// One forward of `m` on this rank, checked exactly against the per-sample reference.
void run_and_check(Backend& b, const Model& m, dev::DType wt, dev::DType ot, EmbeddingPooling pool, bool weighted,
                   const std::string& what) {
  const int r = b.rank();
  EmbeddingA2AConfig cfg;
  cfg.tables = m.tables_of(r);
  cfg.batch = m.batch;
  cfg.weight_dtype = wt;
  cfg.out_dtype = ot;
  cfg.pooling = pool;
  EmbeddingA2A op(b, cfg);
  WEFT_CHECK(static_cast<size_t>(op.dims().size()) == m.shapes.size(), what + ": every rank's tables");
  const int64_t bags = m.world * m.batch;
  std::vector<std::vector<unsigned char>> weights;
  std::vector<std::vector<int64_t>> offsets, indices;
  std::vector<std::vector<float>> psws;
  std::vector<EmbeddingBagInput> in;
  for (size_t g = 0; g < m.shapes.size(); ++g) {
    if (m.owner[g] != r) continue;
    const EmbeddingTableShape& s = m.shapes[g];
    weights.emplace_back(static_cast<size_t>(s.rows * s.dim) * dev::dtype_size(wt));
    for (int64_t row = 0; row < s.rows; ++row)
      for (int64_t j = 0; j < s.dim; ++j) put(weights.back(), row * s.dim + j, Model::w(g, row, j), wt);
    offsets.emplace_back(1, 0);
    indices.emplace_back();
    psws.emplace_back();
    for (int64_t bag = 0; bag < bags; ++bag) {
      for (int64_t i = 0; i < m.bag_size(g, bag); ++i) {
        indices.back().push_back(m.index(g, bag, i));
        psws.back().push_back(Model::psw(g, static_cast<int64_t>(indices.back().size()) - 1));
      }
      offsets.back().push_back(static_cast<int64_t>(indices.back().size()));
    }
  }
  for (size_t t = 0; t < weights.size(); ++t)
    in.push_back({weights[t].data(), offsets[t].data(), indices[t].data(), weighted ? psws[t].data() : nullptr});
  std::vector<unsigned char> out(static_cast<size_t>(std::max<int64_t>(1, m.batch * op.total_dim())) *
                                 dev::dtype_size(ot));
  op.forward(in.data(), out.data());
  // The reference: sample b of this rank is bag r * batch + b of every table.
  int64_t col = 0;
  for (size_t g = 0; g < m.shapes.size(); ++g) {
    const EmbeddingTableShape& s = m.shapes[g];
    for (int64_t b = 0; b < m.batch; ++b) {
      const int64_t bag = r * m.batch + b;
      int64_t first = 0;
      for (int64_t q = 0; q < bag; ++q) first += m.bag_size(g, q);
      const int64_t n = m.bag_size(g, bag);
      for (int64_t j = 0; j < s.dim; ++j) {
        float acc = 0;
        for (int64_t i = 0; i < n; ++i)
          acc += (weighted ? Model::psw(g, first + i) : 1.f) * round_to(Model::w(g, m.index(g, bag, i), j), wt);
        if (pool == EmbeddingPooling::kMean && n > 0) acc *= 1.f / static_cast<float>(n);
        const float want = round_to(acc, ot), got = get(out, b * op.total_dim() + col + j, ot);
        WEFT_CHECK(got == want, fmt::format("{}: rank {} sample {} table {} column {}: {}, expected {}", what, r, b, g,
                                            j, got, want));
      }
    }
    col += s.dim;
  }
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
              run_and_check(*b, Model(world, batch), wt, ot, pool, weighted,
                            fmt::format("world {} batch {} weights {} out {} {}{}", world, batch, dev::dtype_name(wt),
                                        dev::dtype_name(ot), pool == EmbeddingPooling::kSum ? "sum" : "mean",
                                        weighted ? " weighted" : ""));
              ++checks;
            }
    if (b->rank() == 0) std::printf("[host] embedding_a2a: %d ranks, %d checks passed\n", world, checks);
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
