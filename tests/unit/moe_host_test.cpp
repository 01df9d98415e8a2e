// The MoE token exchange on the host backend (ops::MoeDispatchCombine; docs/moe.md): exact
// dispatch layout and counts, exact combine, for worlds 1, 2, 3, 4, 8, both methods, skewed
// routing (every token to one expert: the others receive nothing), top-k 1, 2 and 8, T = 0 and
// 1 and changing between calls; overflow and bad calls refused on every rank.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "moe_check.hpp"
#include "rank_harness.hpp"
#include "weft/core/error.hpp"
#include "weft/device/dtype.hpp"
#include "weft/ops/moe.hpp"
#include "weft/runtime/backend.hpp"

using namespace weft;
using namespace weft::ops;
using namespace weft::testing;
using namespace weft::testing::moe;

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

class MoeHost : public ::testing::TestWithParam<int> {};

// Per (experts per rank, top-k): one op, calls whose T changes (0 and 1 among them), both
// methods, mixed then skewed routing.
TEST_P(MoeHost, DispatchAndCombineAreExact) {
  const int world = GetParam();
  expect_all_ok(run_host(world, [world] {
    auto b = make_backend();
    struct Shape {
      int64_t L, k;
    };
    std::vector<Shape> shapes = {{1, 1}, {2, 2}, {3, 1}};
    if (2 * world >= 8) shapes.push_back({2, 8});  // top-8 over 2 experts a rank
    if (world < 4) shapes.push_back({8, 8});
    for (const Shape& sh : shapes)
      for (dev::DType t : {dev::DType::kBF16, dev::DType::kF32}) {
        MoeConfig cfg;
        cfg.hidden = 16;
        cfg.experts = sh.L * world;
        cfg.top_k = sh.k;
        cfg.max_tokens = 5;
        cfg.dtype = t;
        MoeDispatchCombine op(*b, cfg);
        HostMem mem;
        Routing w;
        w.world = world;
        w.E = cfg.experts;
        w.k = sh.k;
        w.H = cfg.hidden;
        for (Route route : {Route::kMixed, Route::kSkewed})
          for (int64_t e = 0; e < 4; ++e)
            for (MoeMethod m : {MoeMethod::kBaseline, MoeMethod::kDecomposed, MoeMethod::kDirect}) {
              w.route = route;
              w.e = e;
              run_and_check(
                  *b, op, w, cfg.max_tokens, m, t,
                  fmt::format("world {} E {} top-{} {} {} call {} {}", world, w.E, w.k,
                              route == Route::kSkewed ? "skewed" : "mixed", dev::dtype_name(t), e, to_string(m)),
                  mem);
            }
      }
  }));
}

INSTANTIATE_TEST_SUITE_P(Worlds, MoeHost, ::testing::Values(1, 2, 3, 4, 8));

// expert_blocks: recv in whole 128-row blocks per local expert (sources in order within), the
// blocks' experts in recv_groups(), combine from that layout -- exact, worlds 1 ... 8, experts
// that receive nothing (skewed), T changing; the default capacity fits any routing with the
// padding; baseline and decomposed refuse the layout.
TEST_P(MoeHost, ExpertBlocksAreExact) {
  const int world = GetParam();
  expect_all_ok(run_host(world, [world] {
    auto b = make_backend();
    for (const int64_t L : {int64_t{1}, int64_t{3}})
      for (const int64_t k : {int64_t{1}, int64_t{2}}) {
        if (k > L * world) continue;
        MoeConfig cfg;
        cfg.hidden = 16;
        cfg.experts = L * world;
        cfg.top_k = k;
        cfg.max_tokens = 70;  // sources' chunks that cross a block's end (world * 70 * k rows an expert at most)
        cfg.expert_blocks = true;
        MoeDispatchCombine op(*b, cfg);
        WEFT_CHECK(op.recv_capacity() == world * 70 * std::min(k, L) + L * 127, "expert_blocks' default capacity");
        HostMem mem;
        Routing w;
        w.world = world;
        w.E = cfg.experts;
        w.k = k;
        w.H = cfg.hidden;
        for (Route route : {Route::kMixed, Route::kSkewed})
          for (int64_t e : {0, 1, 5, 70})
            for (MoeMethod m : {MoeMethod::kAuto, MoeMethod::kDirect}) {
              w.route = route;
              w.e = e;
              run_and_check(*b, op, w, cfg.max_tokens, m, dev::DType::kBF16,
                            fmt::format("blocks world {} E {} top-{} {} call {} {}", world, w.E, k,
                                        route == Route::kSkewed ? "skewed" : "mixed", e, to_string(m)),
                            mem);
            }
        Rows x(1, 16, dev::DType::kBF16);
        std::vector<int32_t> ids(static_cast<size_t>(k), 0);
        for (int64_t j = 0; j < k; ++j) ids[static_cast<size_t>(j)] = static_cast<int32_t>(j);
        for (MoeMethod m : {MoeMethod::kBaseline, MoeMethod::kDecomposed})
          expect_message([&] { op.dispatch(x.p(), ids.data(), {.method = m, .tokens = 1}); },
                         "moe: expert_blocks places rows by method direct only");
      }
  }));
}

// A routing that overflows one rank's capacity is refused on every rank, naming that rank, and
// the op goes on serving calls that fit.
TEST(MoeHostErrors, OverflowIsRefusedOnEveryRank) {
  expect_all_ok(run_host(3, [] {
    auto b = make_backend();
    MoeConfig cfg;
    cfg.hidden = 8;
    cfg.experts = 3;
    cfg.top_k = 1;
    cfg.max_tokens = 4;
    cfg.recv_capacity = 5;
    MoeDispatchCombine op(*b, cfg);
    HostMem mem;
    Routing w;
    w.world = 3;
    w.E = 3;
    w.k = 1;
    w.H = 8;
    w.route = Route::kSkewed;  // every token to expert 0: rank 0 gets every rank's tokens
    w.e = 2;                   // tokens (3 r + e) % 5: 2, 0, 3 -- 5 rows, which fit
    run_and_check(*b, op, w, 4, MoeMethod::kDecomposed, dev::DType::kBF16, "fits", mem);
    Rows x(4, 8, dev::DType::kBF16);
    std::vector<int32_t> ids(4, 0);
    for (MoeMethod m : {MoeMethod::kBaseline, MoeMethod::kDecomposed, MoeMethod::kDirect})
      expect_message([&] { op.dispatch(x.p(), ids.data(), {.method = m, .tokens = 4}); },
                     "moe: dispatch refused: rank 0 would receive 12 rows, more than its recv_capacity 5");
    std::vector<float> wt(4, 1.f);
    expect_message([&] { op.combine(x.p(), wt.data(), x.p(), {.method = MoeMethod::kDecomposed, .tokens = 4}); },
                   "moe: combine needs a dispatch before it");
    w.e = 0;  // 0, 3, 1 tokens: 4 rows
    run_and_check(*b, op, w, 4, MoeMethod::kBaseline, dev::DType::kBF16, "after the refusals", mem);
    run_and_check(*b, op, w, 4, MoeMethod::kDirect, dev::DType::kBF16, "direct after the refusals", mem);
  }));
}

// Bad calls are refused on every rank, also where one rank alone is wrong (its peers would
// otherwise wait for it), and the op goes on.
TEST(MoeHostErrors, BadCallsAreRefusedOnEveryRank) {
  expect_all_ok(run_host(2, [] {
    auto b = make_backend();
    const int r = b->rank();
    expect_message(
        [&] {
          MoeConfig c;
          c.hidden = 12;
          c.experts = 2;
          c.max_tokens = 1;
          MoeDispatchCombine op(*b, c);
        },
        "moe: hidden must be a positive multiple of 8, got 12");
    MoeConfig cfg;
    cfg.hidden = 8;
    cfg.experts = 4;
    cfg.top_k = 2;
    cfg.max_tokens = 3;
    expect_message(
        [&] {
          MoeConfig c = cfg;
          c.experts = 3;
          MoeDispatchCombine op(*b, c);
        },
        "moe: experts must be a positive multiple of the world size 2, got 3");
    expect_message(
        [&] {
          MoeConfig c = cfg;
          c.top_k = 5;
          MoeDispatchCombine op(*b, c);
        },
        "moe: top_k must be in 1 ... 4, got 5");
    expect_message(
        [&] {
          MoeConfig c = cfg;
          c.max_tokens = r == 1 ? 4 : 3;
          MoeDispatchCombine op(*b, c);
        },
        "moe: ranks disagree on the configuration");
    MoeDispatchCombine op(*b, cfg);
    Rows x(3, 8, dev::DType::kBF16);
    std::vector<int32_t> ids = {0, 1, 2, 3, 1, 2};
    if (r == 1) ids[3] = 4;  // token 1, slot 1 of rank 1 names no expert
    expect_message([&] { op.dispatch(x.p(), ids.data(), {.tokens = 3}); },
                   r == 1 ? "moe: ids[1][1] = 4 is not an expert (0 ... 3)"
                          : "moe: ranks disagree on whether the dispatch call is valid");
    ids[3] = 3;
    ids[2] = 3;  // token 1 names expert 3 twice
    expect_message([&] { op.dispatch(x.p(), ids.data(), {.tokens = 3}); },
                   "moe: ids[1][1] = 3 names expert 3 again (each token's experts must differ)");
    ids = {0, 1, 2, 3, 1, 2};
    expect_message(
        [&] { op.dispatch(x.p(), ids.data(), {.tokens = r == 0 ? 4 : 3}); },
        r == 0 ? "moe: tokens must be in 0 ... 3, got 4" : "moe: ranks disagree on whether the dispatch call is valid");
    expect_message([&] { op.dispatch(x.p() + 2, ids.data(), {.tokens = 3}); }, "is not aligned");
    op.dispatch(x.p(), ids.data(), {.method = MoeMethod::kBaseline, .tokens = 3});
    std::vector<float> wt(6, 1.f);
    Rows y(3, 8, dev::DType::kBF16);
    expect_message([&] { op.combine(op.recv(), wt.data(), y.p(), {.method = MoeMethod::kBaseline, .tokens = 2}); },
                   "moe: combine of 2 tokens after a dispatch of 3");
    expect_message([&] { op.combine(op.recv(), wt.data(), y.p(), {.method = MoeMethod::kDecomposed, .tokens = 3}); },
                   "moe: combine by decomposed after a dispatch by baseline");
    WEFT_CHECK(op.recv_destinations() == nullptr, "recv_destinations() on the host backend");
    expect_message([&] { op.combine_delivered(wt.data(), y.p(), {.method = MoeMethod::kBaseline, .tokens = 3}); },
                   "moe: combine_delivered takes rows stored at recv_destinations(): GPUs with expert_blocks only");
    op.combine(op.recv(), wt.data(), y.p(), {.method = MoeMethod::kBaseline, .tokens = 3});  // recv as expert_out
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t h = 0; h < 8; ++h)
        WEFT_CHECK(get(y.p(), i * 8 + h, dev::DType::kBF16) == 2 * get(x.p(), i * 8 + h, dev::DType::kBF16),
                   "combine of the dispatched rows themselves: the row times the sum of the weights");
  }));
}

class MoeLayerHost : public ::testing::TestWithParam<int> {};

// The layer (dispatch, each expert's SwiGLU FFN, combine) exact against a per-token reference
// with the op's rounding points, both methods, bf16 and f32, mixed and skewed routing, top-k 1
// and 2 (8 where there are experts for it), T changing between calls (0 among them).
TEST_P(MoeLayerHost, ForwardMatchesThePerTokenReference) {
  const int world = GetParam();
  expect_all_ok(run_host(world, [world] {
    auto b = make_backend();
    struct Shape {
      int64_t L, k;
    };
    std::vector<Shape> shapes = {{1, 1}, {2, 2}};
    if (2 * world >= 8) shapes.push_back({2, 8});
    for (const Shape& sh : shapes)
      for (dev::DType t : {dev::DType::kBF16, dev::DType::kF32}) {
        ops::MoeLayerConfig cfg;
        cfg.moe.hidden = 16;
        cfg.moe.experts = sh.L * world;
        cfg.moe.top_k = sh.k;
        cfg.moe.max_tokens = 5;
        cfg.moe.dtype = t;
        cfg.ffn = 8;
        ops::MoeLayer layer(*b, cfg);
        HostMem mem;
        Routing w;
        w.world = world;
        w.E = cfg.moe.experts;
        w.k = sh.k;
        w.H = cfg.moe.hidden;
        for (Route route : {Route::kMixed, Route::kSkewed})
          for (int64_t e = 0; e < 3; ++e)
            for (ops::MoeLayerMethod m :
                 {ops::MoeLayerMethod::kBaseline, ops::MoeLayerMethod::kDecomposed, ops::MoeLayerMethod::kFused}) {
              w.route = route;
              w.e = e;
              run_and_check_layer(
                  *b, layer, w, cfg.moe.max_tokens, m, t, cfg.ffn,
                  fmt::format("layer world {} E {} top-{} {} {} call {} {}", world, w.E, w.k,
                              route == Route::kSkewed ? "skewed" : "mixed", dev::dtype_name(t), e, to_string(m)),
                  mem, true, 0.f);
            }
      }
  }));
}

INSTANTIATE_TEST_SUITE_P(Worlds, MoeLayerHost, ::testing::Values(1, 2, 3, 4, 8));

// Bad layer arguments: refused on every rank (one rank's bad weights included), the layer goes on.
TEST(MoeLayerHostErrors, BadArgumentsAreRefusedOnEveryRank) {
  expect_all_ok(run_host(2, [] {
    auto b = make_backend();
    const int r = b->rank();
    ops::MoeLayerConfig cfg;
    cfg.moe.hidden = 8;
    cfg.moe.experts = 2;
    cfg.moe.max_tokens = 2;
    cfg.ffn = 12;
    expect_message([&] { ops::MoeLayer layer(*b, cfg); }, "moe_layer: ffn must be a positive multiple of 8, got 12");
    cfg.ffn = r == 0 ? 8 : 16;
    expect_message([&] { ops::MoeLayer layer(*b, cfg); }, "moe_layer: ranks disagree on the ffn");
    cfg.ffn = 8;
    ops::MoeLayer layer(*b, cfg);
    Rows x(2, 8, dev::DType::kBF16), wu(2 * 8, 8, dev::DType::kBF16), wd(8, 8, dev::DType::kBF16),
        y(2, 8, dev::DType::kBF16);
    std::vector<int32_t> ids = {0, 1};
    std::vector<float> wt = {1.f, 1.f};
    expect_message(
        [&] { layer.forward(x.p(), ids.data(), wt.data(), r == 1 ? nullptr : wu.p(), wd.p(), y.p(), {.tokens = 2}); },
        r == 1 ? "moe_layer: w_up: null pointer"
               : "moe_layer: ranks disagree on whether the layer's weights are valid");
    layer.forward(x.p(), ids.data(), wt.data(), wu.p(), wd.p(), y.p(), {.tokens = 2});
  }));
}
