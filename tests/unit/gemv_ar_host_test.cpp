// GEMV + AllReduce on the host backend (issue 23), world sizes 1, 2, 3, 4, 8: every M from 1 to
// 128 from one op object, methods baseline and decomposed (and fused and auto: the
// GemvArHostFused suite, which needs the host fused call, src/ops/gemv_ar/host_fused.cpp), with
// and without the epilogue, bf16 and f16, on integer data whose every result is exact, compared
// bit for bit with a reference computed here; the configurations and calls that must be refused;
// ranks that disagree; the pieces alone (GEMV, all-reduce, add + RMSNorm); `auto` and the model.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ops/gemv_ar/gemv_ar_impl.hpp"
#include "rank_harness.hpp"
#include "weft/core/error.hpp"
#include "weft/device/dtype.hpp"
#include "weft/ops/gemv_ar.hpp"
#include "weft/plan/cost.hpp"
#include "weft/runtime/backend.hpp"

using namespace weft;
using namespace weft::ops;
using namespace weft::testing;

namespace {

// Host ranks with a heap of heap_mib (decomposed prepares one all-reduce state per M).
std::vector<RankResult> run_ranks_with_heap(int n, const std::function<void()>& fn, int heap_mib = 64) {
  LaunchOptions opt;
  opt.nranks = n;
  opt.extra_env = {
      {"WEFT_BACKEND", "host"}, {"WEFT_HOST_HEAP_MIB", std::to_string(heap_mib)}, {"WEFT_TIMEOUT_MS", "20000"}};
  opt.grace_ms = 25000;
  opt.deadline_ms = 240000;
  opt.quiet = true;
  return run_ranks(fn, opt);
}

// 16-byte aligned host buffers of 16-bit elements.
struct Buf {
  std::vector<uint16_t> v;
  explicit Buf(size_t n) : v(n + 8) {}
  uint16_t* p() { return reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(v.data()) + 15) & ~uintptr_t{15}); }
};

uint16_t bits(float f, dev::DType t) {
  return t == dev::DType::kF16 ? dev::from_float<dev::f16_t>(f).bits : dev::from_float<dev::bf16_t>(f).bits;
}
float value(uint16_t b, dev::DType t) {
  return t == dev::DType::kF16 ? dev::to_float(dev::f16_t{b}) : dev::to_float(dev::bf16_t{b});
}
constexpr uint16_t kPoison = 0x7FC1;  // NaN in bf16 and f16

// Rank r's x (element i, q of its [m, k_local] slice) and w (j, q) in call e: -1, 0 or 1, so
// |y| <= K <= 128 and every partial product and sum is an integer exact in bf16.
int x_at(int r, int64_t e, int64_t i, int64_t q) { return static_cast<int>((i * 3 + q * 5 + r * 7 + e) % 3) - 1; }
int w_at(int r, int64_t e, int64_t j, int64_t q) { return static_cast<int>((j * 5 + q * 3 + r * 11 + 2 * e) % 3) - 1; }

// The epilogue's inputs are made so that residual_out = y + residual is a chosen `target` whose
// every row has a mean of squares that is a perfect square of a power of two (c^2): the norm's
// 1 / sqrt is exact and out = target / c * gamma is a small integer. Even rows: +-c everywhere;
// odd rows: +-2c in every fourth column, 0 elsewhere (n is a multiple of 8).
int target_at(int64_t e, int64_t i, int64_t j) {
  const int c = 1 << (i % 4);
  const int sign = (i + j + e) % 3 == 0 ? -1 : 1;
  if (i % 2 == 0) return sign * c;
  return j % 4 == i % 4 ? sign * 2 * c : 0;
}
int gamma_at(int64_t e, int64_t j) { return static_cast<int>((j + e) % 5) - 2; }

struct Call {
  int64_t m = 0, n = 0, k_local = 0;
  Buf x, w, y, residual, gamma, residual_out;
  std::vector<int64_t> want_y;  // the exact sum
  Call(int64_t mm, int64_t nn, int64_t kl)
      : m(mm),
        n(nn),
        k_local(kl),
        x(static_cast<size_t>(mm * kl)),
        w(static_cast<size_t>(nn * kl)),
        y(static_cast<size_t>(mm * nn)),
        residual(static_cast<size_t>(mm * nn)),
        gamma(static_cast<size_t>(nn)),
        residual_out(static_cast<size_t>(mm * nn)) {}
};

// Fills this rank's inputs for call e of m rows and the expected sum.
void fill(Call& c, dev::DType t, int rank, int world, int64_t e, bool epilogue) {
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t q = 0; q < c.k_local; ++q)
      c.x.p()[i * c.k_local + q] = bits(static_cast<float>(x_at(rank, e, i, q)), t);
  for (int64_t j = 0; j < c.n; ++j)
    for (int64_t q = 0; q < c.k_local; ++q)
      c.w.p()[j * c.k_local + q] = bits(static_cast<float>(w_at(rank, e, j, q)), t);
  c.want_y.assign(static_cast<size_t>(c.m * c.n), 0);
  for (int r = 0; r < world; ++r)
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        int64_t acc = 0;
        for (int64_t q = 0; q < c.k_local; ++q) acc += x_at(r, e, i, q) * w_at(r, e, j, q);
        c.want_y[static_cast<size_t>(i * c.n + j)] += acc;
      }
  std::fill(c.y.v.begin(), c.y.v.end(), kPoison);
  std::fill(c.residual_out.v.begin(), c.residual_out.v.end(), kPoison);
  if (!epilogue) return;
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j)
      c.residual.p()[i * c.n + j] =
          bits(static_cast<float>(target_at(e, i, j) - c.want_y[static_cast<size_t>(i * c.n + j)]), t);
  for (int64_t j = 0; j < c.n; ++j) c.gamma.p()[j] = bits(static_cast<float>(gamma_at(e, j)), t);
}

// Exact, by value (-0 equals 0; NaN, the poison, equals nothing).
void expect_eq(uint16_t got, float want, dev::DType t, const std::string& what, int64_t i, int64_t j) {
  WEFT_CHECK(value(got, t) == want,
             fmt::format("{}: [{}, {}] is {} (0x{:04x}), expected {}", what, i, j, value(got, t), got, want));
}

// Checks y (and, with the epilogue, residual_out and the normalised y) exactly, and that
// nothing past the call's m rows was written.
void check(Call& c, dev::DType t, int64_t e, bool epilogue, const std::string& what) {
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      const size_t at = static_cast<size_t>(i * c.n + j);
      if (!epilogue) {
        expect_eq(c.y.p()[at], static_cast<float>(c.want_y[at]), t, what + " y", i, j);
        continue;
      }
      const int target = target_at(e, i, j), scale = 1 << (i % 4);
      expect_eq(c.residual_out.p()[at], static_cast<float>(target), t, what + " residual_out", i, j);
      expect_eq(c.y.p()[at], static_cast<float>(target / scale * gamma_at(e, j)), t, what + " out", i, j);
    }
  const size_t end = static_cast<size_t>(c.m * c.n);
  for (size_t i = end; i < c.y.v.size() - 8; ++i)
    WEFT_CHECK(c.y.p()[i] == kPoison, fmt::format("{}: wrote past y's {} rows", what, c.m));
}

GemvRunOptions options(GemvMethod method, int64_t m, Call& c, bool epilogue) {
  GemvRunOptions o;
  o.method = method;
  o.m = m;
  if (epilogue) {
    o.residual = c.residual.p();
    o.gamma = c.gamma.p();
    o.residual_out = c.residual_out.p();
  }
  return o;
}

GemvArConfig config(int64_t n, int64_t k, int64_t m_max, dev::DType t, bool epilogue) {
  GemvArConfig c;
  c.n = n;
  c.k = k;
  c.m_max = m_max;
  c.dtype = t;
  c.epilogue = epilogue;
  c.eps = 0.f;  // the norm's 1 / sqrt is then exact on the test's data
  return c;
}

// One op per (dtype, epilogue); the calls of every M in `ms` by every method in `methods`,
// each checked exactly. Returns the checks made.
int run_ms(Backend& b, int64_t n, int64_t k, int64_t m_max, const std::vector<int64_t>& ms,
           const std::vector<GemvMethod>& methods) {
  const int rank = b.rank(), world = b.size();
  int checks = 0;
  int64_t e = 0;
  for (dev::DType t : {dev::DType::kBF16, dev::DType::kF16})
    for (bool epilogue : {false, true}) {
      GemvAllReduce op(b, config(n, k, m_max, t, epilogue));
      WEFT_CHECK(op.k_local() == k / world, "k_local");
      Call c(m_max, n, op.k_local());
      for (int64_t m : ms)
        for (GemvMethod method : methods) {
          ++e;
          c.m = m;
          fill(c, t, rank, world, e, epilogue);
          // residual may be residual_out (in place) every other call
          GemvRunOptions o = options(method, m, c, epilogue);
          if (epilogue && e % 2 == 0) {
            std::memcpy(c.residual_out.p(), c.residual.p(), static_cast<size_t>(m * n) * 2);
            o.residual = c.residual_out.p();
          }
          op.run(c.x.p(), c.w.p(), c.y.p(), o);
          check(c, t, e, epilogue,
                fmt::format("world {} N x K = {} x {} M = {} {} {} epilogue {}", world, n, k, m, to_string(method),
                            dev::dtype_name(t), epilogue ? "on" : "off"));
          ++checks;
        }
    }
  return checks;
}

std::vector<int64_t> every_m(int64_t m_max) {
  std::vector<int64_t> v;
  for (int64_t m = 1; m <= m_max; ++m) v.push_back(m);
  return v;
}

}  // namespace

class GemvArHost : public ::testing::TestWithParam<int> {};

// Every M of 1 .. 128 from one object (per dtype and epilogue), baseline and decomposed; then a
// second shape (N not a power of two, K per rank 24) at a few Ms.
TEST_P(GemvArHost, EveryMBaselineAndDecomposedIsExact) {
  const int world = GetParam();
  expect_all_ok(run_ranks_with_heap(world, [world] {
    auto b = make_backend();
    const std::vector<GemvMethod> methods{GemvMethod::kBaseline, GemvMethod::kDecomposed};
    int checks = run_ms(*b, 16, 16 * world, kGemvMaxM, every_m(kGemvMaxM), methods);
    checks += run_ms(*b, 24, 24 * world, 32, {1, 7, 32, 5}, methods);
    WEFT_CHECK(checks == 4 * 128 * 2 + 4 * 4 * 2, fmt::format("{} checks ran", checks));
  }));
}

INSTANTIATE_TEST_SUITE_P(Worlds, GemvArHost, ::testing::Values(1, 2, 3, 4, 8));

// NEEDS the host fused call (kernels::gemv_ar_host_fused, src/ops/gemv_ar/host_fused.cpp, from
// the kernels' branch): the fused method and `auto` (the fused method on the host backend), the
// same checks as above.
class GemvArHostFused : public ::testing::TestWithParam<int> {};

TEST_P(GemvArHostFused, EveryMFusedAndAutoIsExact) {
  const int world = GetParam();
  expect_all_ok(run_ranks_with_heap(world, [world] {
    auto b = make_backend();
    const std::vector<GemvMethod> methods{GemvMethod::kFused, GemvMethod::kAuto};
    int checks = run_ms(*b, 16, 16 * world, kGemvMaxM, every_m(kGemvMaxM), methods);
    checks += run_ms(*b, 24, 24 * world, 32, {1, 7, 32, 5}, methods);
    // Methods interleaved on one object: the fused call's epochs and lines are untouched by
    // the others, and the others' by it.
    checks += run_ms(*b, 40, 8 * world, 16, {16, 3, 1},
                     {GemvMethod::kFused, GemvMethod::kBaseline, GemvMethod::kFused, GemvMethod::kDecomposed});
    WEFT_CHECK(checks == 4 * 128 * 2 + 4 * 4 * 2 + 4 * 3 * 4, fmt::format("{} checks ran", checks));
  }));
}

INSTANTIATE_TEST_SUITE_P(Worlds, GemvArHostFused, ::testing::Values(1, 2, 3, 4, 8));

// The pieces alone: the local GEMV (both flavours run the CPU loop here), the all-reduce of
// either method, the unfused add + RMSNorm.
TEST(GemvArHostPieces, GemvAllReduceAndNormAloneAreExact) {
  expect_all_ok(run_ranks_with_heap(3, [] {
    auto b = make_backend();
    const int rank = b->rank(), world = b->size();
    const dev::DType t = dev::DType::kBF16;
    GemvAllReduce op(*b, config(16, 8 * world, 8, t, false));
    Call c(8, 16, op.k_local());
    int64_t e = 0;
    for (int64_t m : {int64_t{8}, int64_t{3}})
      for (GemvMethod ar : {GemvMethod::kBaseline, GemvMethod::kDecomposed})
        for (bool weft : {false, true}) {
          ++e;
          fill(c, t, rank, world, e, false);
          op.run_gemv_only(c.x.p(), c.w.p(), c.y.p(), m, weft);
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < c.n; ++j) {
              int64_t acc = 0;
              for (int64_t q = 0; q < c.k_local; ++q) acc += x_at(rank, e, i, q) * w_at(rank, e, j, q);
              expect_eq(c.y.p()[i * c.n + j], static_cast<float>(acc), t, "gemv alone", i, j);
            }
          op.run_all_reduce_only(c.y.p(), m, ar);
          c.m = m;
          check(c, t, e, false, fmt::format("gemv then all-reduce alone ({}) M = {}", to_string(ar), m));
          c.m = 8;
        }
    ++e;
    fill(c, t, rank, world, e, true);
    Buf sum(static_cast<size_t>(8 * c.n));
    for (size_t i = 0; i < c.want_y.size(); ++i) sum.p()[i] = bits(static_cast<float>(c.want_y[i]), t);
    op.run_add_rmsnorm(sum.p(), c.residual.p(), c.gamma.p(), c.residual_out.p(), c.y.p(), 8);
    check(c, t, e, true, "add + rmsnorm alone");
    expect_message([&] { op.run_all_reduce_only(c.y.p(), 8, GemvMethod::kFused); },
                   "run_all_reduce_only takes baseline or decomposed, not fused");
  }));
}

// Configurations refused at construction, each naming the value.
TEST(GemvArHostErrors, BadConfigurationsAreRefused) {
  expect_all_ok(run_ranks_with_heap(2, [] {
    auto b = make_backend();
    auto expect = [&](const GemvArConfig& c, const std::string& want) {
      expect_message([&] { GemvAllReduce op(*b, c); }, want);
    };
    const dev::DType bf = dev::DType::kBF16;
    expect(config(0, 32, 8, bf, false), "gemv_ar: n = 0 (need at least 1)");
    expect(config(16, 0, 8, bf, false), "gemv_ar: k = 0 (need at least 1)");
    expect(config(16, 33, 8, bf, false), "gemv_ar: k = 33 does not divide among 2 ranks");
    expect(config(16, 24, 8, bf, false), "K per rank = 12 is not a multiple of 8");
    expect(config(12, 32, 8, bf, false), "gemv_ar: n = 12 is not a multiple of 8");
    expect(config(16, 32, 0, bf, false), "gemv_ar: m_max = 0 is outside 1 .. 128");
    expect(config(16, 32, 129, bf, false), "gemv_ar: m_max = 129 is outside 1 .. 128");
    expect(config(16, 32, 8, dev::DType::kF32, false), "gemv_ar: dtype f32 (gemv_ar takes bf16 or f16)");
    WEFT_CHECK(parse_gemv_method("fused") == GemvMethod::kFused, "parse");
    expect_message([] { parse_gemv_method("ring"); }, "unknown method 'ring'");
  }));
}

// Calls refused, each with its reason; the op still works after them.
TEST(GemvArHostErrors, BadCallsAreRefused) {
  expect_all_ok(run_ranks_with_heap(2, [] {
    auto b = make_backend();
    const int rank = b->rank(), world = b->size();
    const dev::DType t = dev::DType::kBF16;
    GemvAllReduce plain(*b, config(16, 32, 8, t, false));
    Call c(8, 16, plain.k_local());
    fill(c, t, rank, world, 1, true);
    const auto B = GemvMethod::kBaseline;
    for (int64_t m : {int64_t{-1}, int64_t{9}, int64_t{200}})
      expect_message([&] { plain.run(c.x.p(), c.w.p(), c.y.p(), {.method = B, .m = m}); },
                     fmt::format("gemv_ar: this call's M = {} is outside 1 .. 8", m));
    expect_message([&] { plain.run(nullptr, c.w.p(), c.y.p(), {.method = B, .m = 2}); }, "gemv_ar: x: null pointer");
    expect_message([&] { plain.run(c.x.p(), c.w.p() + 1, c.y.p(), {.method = B, .m = 2}); },
                   "is not aligned to 16 bytes");
    expect_message([&] { plain.run(c.x.p(), c.w.p(), c.y.p() + 4, {.method = B, .m = 2}); }, "gemv_ar: y: pointer");
    expect_message([&] { plain.run(c.x.p(), c.w.p(), c.x.p(), {.method = B, .m = 2}); }, "y overlaps x or w");
    expect_message([&] { plain.run(c.x.p(), c.w.p(), c.w.p() + 8, {.method = B, .m = 2}); }, "y overlaps x or w");
    GemvRunOptions o = options(B, 2, c, true);
    expect_message([&] { plain.run(c.x.p(), c.w.p(), c.y.p(), o); },
                   "epilogue operands (residual, gamma, residual_out) given, but the op was made without the epilogue");
    expect_message([&] { plain.auto_choice(0); }, "auto_choice: M = 0 is outside 1 .. 8");

    GemvAllReduce norm(*b, config(16, 32, 8, t, true));
    o = options(B, 2, c, true);
    o.gamma = nullptr;
    expect_message([&] { norm.run(c.x.p(), c.w.p(), c.y.p(), o); },
                   "gemv_ar: gamma (the epilogue's operand): null pointer");
    o = options(B, 2, c, true);
    o.residual = nullptr;
    expect_message([&] { norm.run(c.x.p(), c.w.p(), c.y.p(), o); },
                   "gemv_ar: residual (the epilogue's operand): null pointer");
    expect_message([&] { norm.run(c.x.p(), c.w.p(), c.y.p(), {.method = B, .m = 2}); },
                   "gemv_ar: residual (the epilogue's operand): null pointer");
    o = options(B, 2, c, true);
    o.residual_out = c.y.p();
    expect_message([&] { norm.run(c.x.p(), c.w.p(), c.y.p(), o); }, "y overlaps residual, gamma or residual_out");
    o = options(B, 2, c, true);
    o.residual_out = c.x.p();
    expect_message([&] { norm.run(c.x.p(), c.w.p(), c.y.p(), o); }, "residual_out overlaps x, w or gamma");
    o = options(B, 2, c, true);
    o.residual = c.residual_out.p() + 8;
    expect_message([&] { norm.run(c.x.p(), c.w.p(), c.y.p(), o); },
                   "residual and residual_out overlap without being the same buffer");
    // After every refusal both ops still run exactly.
    fill(c, t, rank, world, 2, true);
    norm.run(c.x.p(), c.w.p(), c.y.p(), options(B, 8, c, true));
    check(c, t, 2, true, "epilogue after the refused calls");
    fill(c, t, rank, world, 3, false);
    plain.run(c.x.p(), c.w.p(), c.y.p(), options(B, 8, c, false));
    check(c, t, 3, false, "after the refused calls");
  }));
}

// Ranks that construct one op with different configurations, or make a first call with
// different Ms or methods, are refused on every rank, naming both.
TEST(GemvArHostErrors, RanksThatDisagreeAreRefused) {
  expect_all_ok(run_ranks_with_heap(3, [] {
    auto b = make_backend();
    const int r = b->rank();
    const dev::DType t = dev::DType::kBF16;
    expect_message([&] { GemvAllReduce op(*b, config(r == 2 ? 24 : 16, 48, 8, t, false)); },
                   "gemv_ar: ranks disagree on the configuration: rank 0 has N x K = 16 x 48, m_max 8, bf16, epilogue "
                   "off, eps 0, rank 2 has N x K = 24 x 48");
    expect_message([&] { GemvAllReduce op(*b, config(16, 48, 8, r == 1 ? dev::DType::kF16 : t, false)); },
                   "rank 1 has N x K = 16 x 48, m_max 8, f16");
    expect_message([&] { GemvAllReduce op(*b, config(16, 48, 8, t, r == 1)); },
                   "rank 1 has N x K = 16 x 48, m_max 8, "
                   "bf16, epilogue on");
    GemvAllReduce op(*b, config(16, 48, 8, t, false));
    Call c(8, 16, op.k_local());
    fill(c, t, r, 3, 1, false);
    expect_message([&] { op.run(c.x.p(), c.w.p(), c.y.p(), {.method = GemvMethod::kBaseline, .m = r == 2 ? 5 : 4}); },
                   "gemv_ar: ranks disagree on the call: rank 0 has M = 4, method baseline, rank 2 has M = 5, method "
                   "baseline");
    expect_message(
        [&] {
          op.run(c.x.p(), c.w.p(), c.y.p(),
                 {.method = r == 1 ? GemvMethod::kDecomposed : GemvMethod::kBaseline, .m = 4});
        },
        "rank 1 has M = 4, method decomposed");
    // Agreeing ranks still run, exactly.
    op.run(c.x.p(), c.w.p(), c.y.p(), {.method = GemvMethod::kBaseline, .m = 4});
    c.m = 4;
    check(c, t, 1, false, "after the refused calls");
  }));
}

// Where every M's all-reduce state does not fit in the heap, decomposed is left out and the
// op still serves the other methods.
TEST(GemvArHostDecomposed, LeftOutWhenItsStatesDoNotFit) {
  expect_all_ok(run_ranks_with_heap(
      2,
      [] {
        auto b = make_backend();
        const int rank = b->rank(), world = b->size();
        const dev::DType t = dev::DType::kBF16;
        // m_max 64 (no value blocks): fused's receive lines (8 MiB, and 2 MiB of the small set)
        // fit; decomposed's all-reduce states for M = 1 .. 64, tried first, do not.
        GemvAllReduce op(*b, config(8192, 32, 64, t, false));
        const auto avail = op.available_methods();
        WEFT_CHECK(std::find(avail.begin(), avail.end(), GemvMethod::kDecomposed) == avail.end(),
                   "decomposed should not fit in a 12 MiB heap");
        WEFT_CHECK(std::find(avail.begin(), avail.end(), GemvMethod::kBaseline) != avail.end(), "baseline");
        Call c(1, 8192, op.k_local());
        fill(c, t, rank, world, 1, false);
        expect_message([&] { op.run(c.x.p(), c.w.p(), c.y.p(), {.method = GemvMethod::kDecomposed, .m = 1}); },
                       "the decomposed method is not available: its all-reduce states for M = 1 .. 64 do not fit");
        op.run(c.x.p(), c.w.p(), c.y.p(), {.method = GemvMethod::kBaseline, .m = 1});
        check(c, t, 1, false, "baseline beside a decomposed that did not fit");
        // Its space was given back: another op's decomposed fits.
        GemvAllReduce small(*b, config(16, 32, 16, t, false));
        const auto more = small.available_methods();
        WEFT_CHECK(std::find(more.begin(), more.end(), GemvMethod::kDecomposed) != more.end(), "space not given back");
      },
      12));
}

// `auto` on the host backend is the fused method; on GPUs the model's fastest prediction.
TEST(GemvArModel, AutoAndTheAllReduceChoice) {
  expect_all_ok(run_ranks_with_heap(2, [] {
    auto b = make_backend();
    GemvAllReduce op(*b, config(16, 32, 8, dev::DType::kBF16, false));
    for (int64_t m : {int64_t{1}, int64_t{8}}) {
      const GemvAutoChoice a = op.auto_choice(m);
      WEFT_CHECK(a.method == GemvMethod::kFused && a.source == "host backend default",
                 fmt::format("host auto: {} ({})", to_string(a.method), a.source));
    }
    const auto avail = op.available_methods();
    WEFT_CHECK(avail.size() == 3, "host: every method available");
  }));
  using detail::gemv_all_reduce_method;
  EXPECT_EQ(gemv_all_reduce_method(2, 4096), Method::kLowLatency);
  EXPECT_EQ(gemv_all_reduce_method(2, 8192), Method::kLowLatency128);
  EXPECT_EQ(gemv_all_reduce_method(8, 1024), Method::kLowLatency);
  EXPECT_EQ(gemv_all_reduce_method(8, 2048), Method::kLowLatency128);
  EXPECT_EQ(gemv_all_reduce_method(1, 1 << 20), Method::kLowLatency128);
  // The shapes on the H200 constants: every prediction is positive; auto is the
  // fastest prediction; the fused call beats the library sequence at decode sizes and is not
  // picked above kGemvSmallM (the tile kernel's fixed cost and all of y after the stream: at best
  // a tie with decomposed there, measured); decomposed beats the baseline
  // at M = 1.
  const plan::DeviceConstants d = plan::h200_constants();
  for (int world : {2, 4})
    for (int64_t m : {1, 16, 17, 128}) {
      detail::GemvModelInput in{world, m, 8192, 8192 / world, 2, false, true, true};
      const GemvAutoChoice a = detail::predict_gemv(in, d);
      EXPECT_GT(a.predicted_baseline_us, 0);
      EXPECT_GT(a.predicted_decomposed_us, 0);
      EXPECT_GT(a.predicted_fused_us, 0);
      const double best = std::min({a.predicted_baseline_us, a.predicted_decomposed_us, a.predicted_fused_us});
      const double chosen = a.method == GemvMethod::kBaseline     ? a.predicted_baseline_us
                            : a.method == GemvMethod::kDecomposed ? a.predicted_decomposed_us
                                                                  : a.predicted_fused_us;
      EXPECT_EQ(chosen, best) << "world " << world << " M " << m;
      if (m == 1) {
        EXPECT_LT(a.predicted_decomposed_us, a.predicted_baseline_us) << "world " << world;
      }
      if (m <= kernels::kGemvSmallM) {
        EXPECT_LT(a.predicted_fused_us, a.predicted_baseline_us) << "world " << world << " M " << m;
      } else {
        EXPECT_NE(a.method, GemvMethod::kFused) << "world " << world << " M " << m;
      }
      in.fused_available = false;
      EXPECT_NE(detail::predict_gemv(in, d).method, GemvMethod::kFused);
      in.epilogue = true;
      EXPECT_GT(detail::predict_gemv(in, d).predicted_baseline_us, a.predicted_baseline_us);
    }
}

// The tuning cache: a recorded choice is `auto`'s for its M's token tile in the ops made after
// it, on every rank (rank 0 reads, then tells the others), and runs exactly; the other tiles
// keep the default; "-" reads none; an entry naming no method of the op is ignored.
TEST(GemvArTuning, RecordedChoiceIsAutosForItsTokenTile) {
  char dir[] = "/tmp/weft-gemv-tune-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/gemv_ar.json";
  expect_all_ok(run_ranks_with_heap(2, [path] {
    auto b = make_backend();
    const int rank = b->rank(), world = b->size();
    const dev::DType t = dev::DType::kBF16;
    GemvArConfig cfg = config(64, 16 * world, 64, t, false);
    cfg.tune_cache = path;
    {
      GemvAllReduce op(*b, cfg);
      WEFT_CHECK(op.auto_choice(5).method == GemvMethod::kFused && op.auto_choice(5).source == "host backend default",
                 "before any record: the host default");
      op.record_tuned(5, GemvMethod::kBaseline, 12.5);     // M 1 .. 8
      op.record_tuned(40, GemvMethod::kDecomposed, 20.0);  // M 33 .. 64
      expect_message([&] { op.record_tuned(5, GemvMethod::kAuto, 1.0); }, "record_tuned takes a method, not auto");
      WEFT_CHECK(op.auto_choice(5).method == GemvMethod::kFused, "an op's own choices do not change");
    }
    b->barrier();  // rank 0's store is done before any rank's next op
    GemvAllReduce op(*b, cfg);
    for (int64_t m : {1, 8, 9, 16, 17, 33, 64}) {
      const GemvAutoChoice a = op.auto_choice(m);
      const GemvMethod want = m <= 8 ? GemvMethod::kBaseline : m >= 33 ? GemvMethod::kDecomposed : GemvMethod::kFused;
      WEFT_CHECK(a.method == want, fmt::format("M {}: auto is {}, want {}", m, to_string(a.method), to_string(want)));
      WEFT_CHECK((a.source == "tuning cache " + path) == (want != GemvMethod::kFused),
                 fmt::format("M {}: source '{}'", m, a.source));
      Call c(m, 64, op.k_local());
      fill(c, t, rank, world, m, false);
      op.run(c.x.p(), c.w.p(), c.y.p(), options(GemvMethod::kAuto, m, c, false));
      check(c, t, m, false, fmt::format("auto from the tuning cache, M {}", m));
    }
    cfg.tune_cache = "-";
    GemvAllReduce none(*b, cfg);
    WEFT_CHECK(none.auto_choice(5).method == GemvMethod::kFused, "tune_cache '-' reads no cache");
    // Another epilogue setting is another key: not tuned.
    cfg.tune_cache = path;
    cfg.epilogue = true;
    GemvAllReduce epi(*b, cfg);
    WEFT_CHECK(epi.auto_choice(5).method == GemvMethod::kFused, "the epilogue op has entries of its own");
  }));
  // An entry naming an unknown method is ignored (the default decides); its neighbour, well
  // formed, is read (the key's format is the op's).
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(
        "{\"gemv_ar|host (1 ranks, shared memory)|w1|64x16|bf16|plain|m<=8\": {\"method\": \"warp-drive\"},\n"
        " \"gemv_ar|host (1 ranks, shared memory)|w1|64x16|bf16|plain|m<=16\": {\"method\": \"baseline\"}}\n",
        f);
    std::fclose(f);
  }
  expect_all_ok(run_ranks_with_heap(1, [path] {
    auto b = make_backend();
    GemvArConfig cfg = config(64, 16, 64, dev::DType::kBF16, false);
    cfg.tune_cache = path;
    GemvAllReduce op(*b, cfg);
    WEFT_CHECK(op.auto_choice(5).method == GemvMethod::kFused, "an unknown method in the cache is ignored");
    WEFT_CHECK(op.auto_choice(12).method == GemvMethod::kBaseline, "the well-formed entry beside it is read");
  }));
  std::remove(path.c_str());
  rmdir(dir);
}
