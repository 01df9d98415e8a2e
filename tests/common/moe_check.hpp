// The MoE exchange's checks, shared by the host and GPU tests (tests/unit/moe_host_test.cpp,
// tests/gpu/moe_gpu_test.cpp): a routing every rank can compute for every rank, and one
// dispatch + combine checked exactly against the layout ops/moe.hpp promises.
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "op_mem.hpp"
#include "weft/core/error.hpp"
#include "weft/device/dtype.hpp"
#include "weft/kernels/moe_kernels.hpp"
#include "weft/ops/moe.hpp"
#include "weft/runtime/backend.hpp"

namespace weft::testing::moe {

using ops::MoeDispatchCombine;
using ops::MoeMethod;

using testing::HostMem;
using testing::Mem;

enum class Route { kMixed, kSkewed };

// Every rank's inputs of call e, known to every rank (the test's reference needs the others').
struct Routing {
  int world = 1;
  int64_t E = 1, k = 1, H = 8;
  Route route = Route::kMixed;
  int64_t e = 0;
  // Token t of rank r: slot j's expert (distinct within a token), its row, its weights.
  int32_t id(int r, int64_t t, int64_t j) const {
    if (route == Route::kSkewed) return static_cast<int32_t>(j);  // slot 0: expert 0 for every token
    return static_cast<int32_t>((r * 7 + t * 3 + e + j) % E);     // j consecutive: distinct
  }
  float x(int r, int64_t t, int64_t h) const { return static_cast<float>((r * 5 + t * 3 + h + e) % 3) - 1.f; }
  float w(int r, int64_t t, int64_t j) const { return 0.5f * static_cast<float>(1 + (t + j + r) % 2); }
  static float factor(int64_t expert) { return static_cast<float>(expert % 3 + 1); }
  int64_t tokens(int r, int64_t max) const { return (r * 3 + e) % (max + 1); }
};

struct Rows {  // 16-byte aligned rows of any dtype
  std::vector<unsigned char> v;
  size_t eb;
  int64_t H;
  Rows(int64_t n, int64_t h, dev::DType t)
      : v(static_cast<size_t>(std::max<int64_t>(n, 1) * h) * 4 + 16), eb(dev::dtype_size(t)), H(h) {}
  unsigned char* p() {
    return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(v.data()) + 15) & ~uintptr_t{15});
  }
  const unsigned char* p() const { return const_cast<Rows*>(this)->p(); }
};
inline void put(unsigned char* base, int64_t i, float f, dev::DType t) {
  if (t == dev::DType::kF32) return std::memcpy(base + 4 * i, &f, 4), void();
  const uint16_t b = t == dev::DType::kF16 ? dev::from_float<dev::f16_t>(f).bits : dev::from_float<dev::bf16_t>(f).bits;
  std::memcpy(base + 2 * i, &b, 2);
}
inline float get(const unsigned char* base, int64_t i, dev::DType t) {
  if (t == dev::DType::kF32) {
    float f;
    std::memcpy(&f, base + 4 * i, 4);
    return f;
  }
  uint16_t b;
  std::memcpy(&b, base + 2 * i, 2);
  return t == dev::DType::kF16 ? dev::to_float(dev::f16_t{b}) : dev::to_float(dev::bf16_t{b});
}

// Rank r's inputs of call w.e with T tokens: x [T, H], ids and weights [T, top_k].
struct CallInputs {
  Rows x;
  std::vector<int32_t> ids;
  std::vector<float> wt;
};
inline CallInputs inputs_of(const Routing& w, int r, int64_t T, dev::DType t) {
  const int64_t k = w.k, H = w.H;
  CallInputs in{Rows(T, H, t), std::vector<int32_t>(static_cast<size_t>(std::max<int64_t>(T * k, 1))),
                std::vector<float>(static_cast<size_t>(std::max<int64_t>(T * k, 1)))};
  for (int64_t i = 0; i < T; ++i) {
    for (int64_t h = 0; h < H; ++h) put(in.x.p(), i * H + h, w.x(r, i, h), t);
    for (int64_t j = 0; j < k; ++j) {
      in.ids[static_cast<size_t>(i * k + j)] = w.id(r, i, j);
      in.wt[static_cast<size_t>(i * k + j)] = w.w(r, i, j);
    }
  }
  return in;
}

// One dispatch + combine of call w.e on this rank, checked exactly: recv's rows and counts
// against the layout the header promises, y against the weighted sums (small integers and
// halves: exact in every dtype).
inline void run_and_check(Backend& b, MoeDispatchCombine& op, const Routing& w, int64_t max_tokens, MoeMethod m,
                          dev::DType t, const std::string& what, const Mem& mem) {
  const int r = b.rank();
  const int64_t L = w.E / w.world, H = w.H, k = w.k;
  const int64_t T = w.tokens(r, max_tokens);
  CallInputs in = inputs_of(w, r, T, t);
  Rows& x = in.x;
  const std::vector<int32_t>& ids = in.ids;
  const std::vector<float>& wt = in.wt;
  const size_t eb = dev::dtype_size(t), xb = static_cast<size_t>(T * H) * eb, pb = static_cast<size_t>(T * k);
  void* x_op = mem.alloc(std::max<size_t>(xb, 16));
  auto* ids_op = static_cast<int32_t*>(mem.alloc(std::max<size_t>(pb * 4, 16)));
  auto* wt_op = static_cast<float*>(mem.alloc(std::max<size_t>(pb * 4, 16)));
  mem.to(x_op, x.p(), xb);
  mem.to(ids_op, ids.data(), pb * 4);
  mem.to(wt_op, wt.data(), pb * 4);
  op.dispatch(x_op, ids_op, {.method = m, .tokens = T, .stream = mem.stream});
  // The expected receive layout: source-major, local expert, then the source's (token, slot) order.
  std::vector<int64_t> want_counts(static_cast<size_t>(w.world * L), 0);
  for (int s = 0; s < w.world; ++s)
    for (int64_t le = 0; le < L; ++le)
      for (int64_t i = 0; i < w.tokens(s, max_tokens); ++i)
        for (int64_t j = 0; j < k; ++j) want_counts[static_cast<size_t>(s * L + le)] += w.id(s, i, j) == r * L + le;
  int64_t rows = 0;
  for (int64_t n : want_counts) rows += n;
  WEFT_CHECK(op.recv_rows() == rows, fmt::format("{}: {} rows received, expected {}", what, op.recv_rows(), rows));
  std::vector<int64_t> counts(want_counts.size());
  mem.from(counts.data(), op.recv_counts(), counts.size() * 8);
  for (size_t i = 0; i < want_counts.size(); ++i)
    WEFT_CHECK(counts[i] == want_counts[i],
               fmt::format("{}: recv_counts[{}] = {}, expected {}", what, i, counts[i], want_counts[i]));
  // Where chunk (s, le) starts in recv: rank-major, or (expert_blocks) in expert le's block --
  // whole kMoeBlockRows-row blocks in expert order -- after the lower sources' chunks.
  const bool blocks = op.config().expert_blocks;
  const int64_t BR = kernels::kMoeBlockRows;
  std::vector<int64_t> start(want_counts.size(), 0);
  int64_t extent = 0;  // rows of recv in use
  if (blocks) {
    for (int64_t le = 0; le < L; ++le) {
      int64_t at = extent;
      for (int s = 0; s < w.world; ++s) {
        start[static_cast<size_t>(s * L + le)] = at;
        at += want_counts[static_cast<size_t>(s * L + le)];
      }
      extent += (at - extent + BR - 1) / BR * BR;
    }
    std::vector<int32_t> groups(static_cast<size_t>((op.recv_capacity() + BR - 1) / BR));
    mem.from(groups.data(), op.recv_groups(), groups.size() * 4);
    for (size_t b = 0; b < groups.size(); ++b) {
      int32_t want = -1;
      for (int64_t le = 0; le < L; ++le) {
        int64_t n = 0;
        for (int s = 0; s < w.world; ++s) n += want_counts[static_cast<size_t>(s * L + le)];
        const int64_t first = start[static_cast<size_t>(le)];  // source 0's chunk: the block's start
        if (n > 0 && static_cast<int64_t>(b) * BR >= first && static_cast<int64_t>(b) * BR < first + n)
          want = static_cast<int32_t>(le);
      }
      WEFT_CHECK(groups[b] == want, fmt::format("{}: recv_groups[{}] = {}, expected {}", what, b, groups[b], want));
    }
  } else {
    for (size_t c = 0; c < start.size(); ++c) {
      start[c] = extent;
      extent += want_counts[c];
    }
  }
  Rows recv(extent, H, t);
  mem.from(recv.p(), op.recv(), static_cast<size_t>(extent * H) * eb);
  for (int s = 0; s < w.world; ++s)
    for (int64_t le = 0; le < L; ++le) {
      int64_t row = start[static_cast<size_t>(s * L + le)];
      for (int64_t i = 0; i < w.tokens(s, max_tokens); ++i)
        for (int64_t j = 0; j < k; ++j) {
          if (w.id(s, i, j) != r * L + le) continue;
          for (int64_t h = 0; h < H; ++h)
            WEFT_CHECK(get(recv.p(), row * H + h, t) == w.x(s, i, h),
                       fmt::format("{}: recv row {} (source {} token {} slot {}) element {}", what, row, s, i, j, h));
          ++row;
        }
    }
  // The experts: row times factor(expert), into a buffer of the test's (recv's layout; the
  // blocks' padding rows zero).
  Rows out(extent, H, t);
  for (int s = 0; s < w.world; ++s)
    for (int64_t le = 0; le < L; ++le)
      for (int64_t q = 0; q < want_counts[static_cast<size_t>(s * L + le)]; ++q) {
        const int64_t at = start[static_cast<size_t>(s * L + le)] + q;
        for (int64_t h = 0; h < H; ++h)
          put(out.p(), at * H + h, get(recv.p(), at * H + h, t) * Routing::factor(r * L + le), t);
      }
  // Odd calls: the experts write recv in place (a GPU direct combine then pulls the rows from
  // the ranks' heaps); even calls: a buffer of the test's -- but call 2 in place on odd ranks only
  // (the ranks' rows partly outside the heaps: a GPU direct combine pushes them on every rank).
  const bool in_place = w.e == 2 ? r % 2 == 1 : w.e % 2 == 1;
  void* out_op = in_place ? const_cast<void*>(op.recv())
                              : mem.alloc(std::max<size_t>(static_cast<size_t>(extent * H) * eb, 16));
  void* y_op = mem.alloc(std::max<size_t>(xb, 16));
  mem.to(out_op, out.p(), static_cast<size_t>(extent * H) * eb);
  op.combine(out_op, wt_op, y_op, {.method = m, .tokens = T, .stream = mem.stream});
  Rows y(T, H, t);
  mem.from(y.p(), y_op, xb);
  for (int64_t i = 0; i < T; ++i)
    for (int64_t h = 0; h < H; ++h) {
      float want = 0;
      for (int64_t j = 0; j < k; ++j) want += w.w(r, i, j) * w.x(r, i, h) * Routing::factor(w.id(r, i, j));
      WEFT_CHECK(get(y.p(), i * H + h, t) == want,
                 fmt::format("{}: y[{}][{}] = {}, expected {}", what, i, h, get(y.p(), i * H + h, t), want));
    }
}

// The layer's expert weights, known to every rank: W_up[e] [2F, H], W_down[e] [H, F].
inline float w_up(int64_t e, int64_t j, int64_t h) { return 0.125f * static_cast<float>((e + 2 * j + 3 * h) % 5 - 2); }
inline float w_down(int64_t e, int64_t i, int64_t j) { return 0.25f * static_cast<float>((2 * e + i + 3 * j) % 5 - 2); }

// One MoeLayer::forward of call w.e on this rank, y checked against a per-token reference of
// every rank's inputs and weights: `rounded` -- the op's rounding points (h, SiLU * up and the
// expert's output rounded to the dtype, fp32 sums in index order): exact (tol 0) on the host
// backend; else an fp32 reference without them, within tol * (largest |y|).
inline void run_and_check_layer(Backend& b, ops::MoeLayer& layer, const Routing& w, int64_t max_tokens,
                                ops::MoeLayerMethod m, dev::DType t, int64_t F, const std::string& what, const Mem& mem,
                                bool rounded, float tol) {
  const int r = b.rank();
  const int64_t L = w.E / w.world, H = w.H, k = w.k;
  const int64_t T = w.tokens(r, max_tokens);
  const size_t eb = dev::dtype_size(t);
  CallInputs in = inputs_of(w, r, T, t);
  Rows wu(L * 2 * F, H, t), wd(L * H, F, t);
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t j = 0; j < 2 * F; ++j)
      for (int64_t h = 0; h < H; ++h) put(wu.p(), (l * 2 * F + j) * H + h, w_up(r * L + l, j, h), t);
    for (int64_t i = 0; i < H; ++i)
      for (int64_t j = 0; j < F; ++j) put(wd.p(), (l * H + i) * F + j, w_down(r * L + l, i, j), t);
  }
  const size_t xb = static_cast<size_t>(T * H) * eb, pb = static_cast<size_t>(T * k);
  const size_t ub = static_cast<size_t>(L * 2 * F * H) * eb, db = static_cast<size_t>(L * H * F) * eb;
  void* x_op = mem.alloc(std::max<size_t>(xb, 16));
  auto* ids_op = static_cast<int32_t*>(mem.alloc(std::max<size_t>(pb * 4, 16)));
  auto* wt_op = static_cast<float*>(mem.alloc(std::max<size_t>(pb * 4, 16)));
  void* wu_op = mem.alloc(ub);
  void* wd_op = mem.alloc(db);
  void* y_op = mem.alloc(std::max<size_t>(xb, 16));
  mem.to(x_op, in.x.p(), xb);
  mem.to(ids_op, in.ids.data(), pb * 4);
  mem.to(wt_op, in.wt.data(), pb * 4);
  mem.to(wu_op, wu.p(), ub);
  mem.to(wd_op, wd.p(), db);
  layer.forward(x_op, ids_op, wt_op, wu_op, wd_op, y_op, {.method = m, .tokens = T, .stream = mem.stream});
  Rows y(T, H, t);
  mem.from(y.p(), y_op, xb);
  auto rnd = [&](float v) {
    if (!rounded || t == dev::DType::kF32) return v;
    return t == dev::DType::kF16 ? dev::to_float(dev::from_float<dev::f16_t>(v))
                                 : dev::to_float(dev::from_float<dev::bf16_t>(v));
  };
  std::vector<float> hv(static_cast<size_t>(2 * F)), a(static_cast<size_t>(F));
  std::vector<float> want(static_cast<size_t>(std::max<int64_t>(T * H, 1)), 0.f);
  float scale = 0;
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = w.id(r, i, j);
      auto xin = [&](int64_t h) { return rnd(w.x(r, i, h)); };
      for (int64_t q = 0; q < 2 * F; ++q) {
        float acc = 0;
        for (int64_t h = 0; h < H; ++h) acc += xin(h) * rnd(w_up(e, q, h));
        hv[static_cast<size_t>(q)] = rnd(acc);
      }
      for (int64_t q = 0; q < F; ++q) {
        const float g = hv[static_cast<size_t>(q)], u = hv[static_cast<size_t>(F + q)];
        a[static_cast<size_t>(q)] = rnd(g / (1.f + std::exp(-g)) * u);
      }
      for (int64_t h = 0; h < H; ++h) {
        float acc = 0;
        for (int64_t q = 0; q < F; ++q) acc += a[static_cast<size_t>(q)] * rnd(w_down(e, h, q));
        want[static_cast<size_t>(i * H + h)] += w.w(r, i, j) * rnd(acc);
      }
    }
  for (int64_t i = 0; i < T * H; ++i) {
    want[static_cast<size_t>(i)] = rnd(want[static_cast<size_t>(i)]);
    scale = std::max(scale, std::fabs(want[static_cast<size_t>(i)]));
  }
  for (int64_t i = 0; i < T * H; ++i) {
    const float got = get(y.p(), i, t), ref = want[static_cast<size_t>(i)];
    WEFT_CHECK(std::fabs(got - ref) <= tol * std::max(scale, 1e-2f),
               fmt::format("{}: y[{}][{}] = {}, expected {} (scale {})", what, i / H, i % H, got, ref, scale));
  }
}

}  // namespace weft::testing::moe
