// Embedding-bag lookups + all-to-all's checks, shared by the host and GPU tests
// (tests/unit/embedding_a2a_host_test.cpp, tests/gpu/embedding_a2a_gpu_test.cpp): tables and bags
// every rank can compute for every rank, and one forward checked exactly against a per-sample
// reference (integer tables: every sum is exact whatever its order).
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "op_mem.hpp"
#include "weft/core/error.hpp"
#include "weft/device/dtype.hpp"
#include "weft/ops/embedding_a2a.hpp"
#include "weft/runtime/backend.hpp"

namespace weft::testing::embedding {

using namespace weft::ops;

inline float round_to(float f, dev::DType t) {
  return t == dev::DType::kF32 ? f : dev::from_bits16(dev::to_bits16(f, t), t);
}
inline void put(std::vector<unsigned char>& v, int64_t i, float f, dev::DType t) {
  if (t == dev::DType::kF32) {
    std::memcpy(v.data() + 4 * i, &f, 4);
  } else {
    const uint16_t b = dev::to_bits16(f, t);
    std::memcpy(v.data() + 2 * i, &b, 2);
  }
}
inline float get(const std::vector<unsigned char>& v, int64_t i, dev::DType t) {
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
// (rank 2 none), of dims dim_base times 1, 2 or 3; table g (global) has 5 + 3g rows of small
// integers, or with `fraction` of values whose sums round (the reference then sums in the op's
// order, a rounding per product and per sum, as x86-64's host code does without FMA).
struct Model {
  int world = 1;
  int64_t batch = 3;
  bool fraction = false;
  std::vector<int> owner;                   // global table -> rank
  std::vector<EmbeddingTableShape> shapes;  // global order
  explicit Model(int w, int64_t b, int64_t dim_base = 8, bool frac = false) : world(w), batch(b), fraction(frac) {
    for (int r = 0; r < w; ++r)
      for (int t = 0; t < (r + 1) % 3; ++t) {
        owner.push_back(r);
        shapes.push_back({5 + 3 * static_cast<int64_t>(shapes.size()), dim_base * (1 + (r + t) % 3)});
      }
  }
  std::vector<EmbeddingTableShape> tables_of(int r) const {
    std::vector<EmbeddingTableShape> v;
    for (size_t g = 0; g < shapes.size(); ++g)
      if (owner[g] == r) v.push_back(shapes[g]);
    return v;
  }
  float w(size_t g, int64_t row, int64_t j) const {
    const int64_t k = static_cast<int64_t>(g) * 7 + row * 3 + j;
    if (fraction) return static_cast<float>(static_cast<double>(k % 997) * 0.6180339887 - 300.0) / 97.f;
    return static_cast<float>(k % 5 - 2);
  }
  // Bag `bag` of table g: its size (0 ... 3, and 100 for bag 1 of every even table) and indices.
  int64_t bag_size(size_t g, int64_t bag) const {
    return g % 2 == 0 && bag == 1 ? 100 : (static_cast<int64_t>(g) + bag) % 4;
  }
  int64_t index(size_t g, int64_t bag, int64_t i) const {
    return (static_cast<int64_t>(g) + bag * 5 + i * 3) % shapes[g].rows;  // duplicates in long bags
  }
  static float psw(size_t g, int64_t i) { return g % 2 == 1 ? static_cast<float>(i % 3 - 1 + (i % 3 == 1)) : 1.f; }
  EmbeddingA2AConfig config(int r, dev::DType wt, dev::DType ot, EmbeddingPooling pool) const {
    EmbeddingA2AConfig c;
    c.tables = tables_of(r);
    c.batch = batch;
    c.weight_dtype = wt;
    c.out_dtype = ot;
    c.pooling = pool;
    return c;
  }
  // Rank r's tables' inputs in host memory: their global numbers, weights in wt, and the bags
  // of the global batch (offsets, indices, per-sample weights).
  struct Inputs {
    std::vector<size_t> global;
    std::vector<std::vector<unsigned char>> weights;
    std::vector<std::vector<int64_t>> offsets, indices;
    std::vector<std::vector<float>> psws;
  };
  Inputs inputs(int r, dev::DType wt) const {
    Inputs in;
    for (size_t g = 0; g < shapes.size(); ++g) {
      if (owner[g] != r) continue;
      in.global.push_back(g);
      const EmbeddingTableShape& s = shapes[g];
      in.weights.emplace_back(static_cast<size_t>(s.rows * s.dim) * dev::dtype_size(wt));
      for (int64_t row = 0; row < s.rows; ++row)
        for (int64_t j = 0; j < s.dim; ++j) put(in.weights.back(), row * s.dim + j, w(g, row, j), wt);
      in.offsets.emplace_back(1, 0);
      in.indices.emplace_back();
      in.psws.emplace_back();
      for (int64_t bag = 0; bag < world * batch; ++bag) {
        for (int64_t i = 0; i < bag_size(g, bag); ++i) {
          in.indices.back().push_back(index(g, bag, i));
          in.psws.back().push_back(psw(g, static_cast<int64_t>(in.indices.back().size()) - 1));
        }
        in.offsets.back().push_back(static_cast<int64_t>(in.indices.back().size()));
      }
    }
    return in;
  }
};

// One forward of `m` on this rank, checked exactly against the per-sample reference.
// Returns this rank's output bytes (the GPU test compares methods bitwise).
inline std::vector<unsigned char> run_and_check(Backend& b, const Model& m, dev::DType wt, dev::DType ot,
                                                EmbeddingPooling pool, bool weighted, const std::string& what, Mem& mem,
                                                EmbeddingA2AMethod method = EmbeddingA2AMethod::kAuto) {
  const int r = b.rank();
  EmbeddingA2A op(b, m.config(r, wt, ot, pool));
  WEFT_CHECK(static_cast<size_t>(op.dims().size()) == m.shapes.size(), what + ": every rank's tables");
  const Model::Inputs h = m.inputs(r, wt);
  const auto& weights = h.weights;
  const auto& offsets = h.offsets;
  const auto& indices = h.indices;
  const auto& psws = h.psws;
  std::vector<EmbeddingBagInput> in;
  auto put_in = [&mem](const void* h, size_t n) {
    void* d = mem.alloc(std::max<size_t>(n, 16));
    mem.to(d, h, n);
    return d;
  };
  for (size_t t = 0; t < weights.size(); ++t)
    in.push_back({put_in(weights[t].data(), weights[t].size()),
                  static_cast<const int64_t*>(put_in(offsets[t].data(), offsets[t].size() * 8)),
                  static_cast<const int64_t*>(put_in(indices[t].data(), indices[t].size() * 8)),
                  weighted ? static_cast<const float*>(put_in(psws[t].data(), psws[t].size() * 4)) : nullptr});
  std::vector<unsigned char> out(static_cast<size_t>(std::max<int64_t>(1, m.batch * op.total_dim())) *
                                 dev::dtype_size(ot));
  void* d_out = mem.alloc(out.size());
  EmbeddingA2ARunOptions opt;
  opt.method = method;
  opt.stream = mem.stream;
  op.forward(in.data(), d_out, opt);
  mem.from(out.data(), d_out, out.size());
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
          acc += (weighted ? Model::psw(g, first + i) : 1.f) * round_to(m.w(g, m.index(g, bag, i), j), wt);
        if (pool == EmbeddingPooling::kMean && n > 0) acc *= 1.f / static_cast<float>(n);
        const float want = round_to(acc, ot), got = get(out, b * op.total_dim() + col + j, ot);
        WEFT_CHECK(got == want, fmt::format("{}: rank {} sample {} table {} column {}: {}, expected {}", what, r, b, g,
                                            j, got, want));
      }
    }
    col += s.dim;
  }
  return out;
}

// One backward of `m` on this rank into `kind`'s sinks, checked exactly against the transpose
// computed here in the op's order (grad_out of rank q, sample b, column c is a small integer),
// and, for the updates, against SGD's and Adagrad's steps computed here the same way.
inline void run_and_check_backward(Backend& b, const Model& m, dev::DType wt, dev::DType ot, EmbeddingPooling pool,
                                   bool weighted, const std::string& what, Mem& mem,
                                   EmbeddingA2AMethod method = EmbeddingA2AMethod::kAuto,
                                   EmbeddingGradKind kind = EmbeddingGradKind::kDense) {
  const int r = b.rank();
  EmbeddingA2A op(b, m.config(r, wt, ot, pool));
  const int64_t bags = m.world * m.batch, T = op.total_dim();
  auto grad = [](int q, int64_t s, int64_t c) { return static_cast<float>((q * 7 + s * 3 + c) % 5 - 2); };
  std::vector<unsigned char> go(static_cast<size_t>(std::max<int64_t>(1, m.batch * T)) * dev::dtype_size(ot));
  for (int64_t s = 0; s < m.batch; ++s)
    for (int64_t c = 0; c < T; ++c) put(go, s * T + c, grad(r, s, c), ot);
  Model::Inputs h = m.inputs(r, wt);
  const std::vector<size_t>& mine = h.global;
  auto put_in = [&mem](const void* p, size_t n) {
    void* d = mem.alloc(std::max<size_t>(n, 16));
    mem.to(d, p, n);
    return d;
  };
  const float lr = 0.375f, eps = 1e-3f;
  auto state0 = [](size_t e) { return static_cast<float>(e % 3) * 0.5f; };
  std::vector<EmbeddingBagInput> in;
  std::vector<EmbeddingTableGrad> sinks(mine.size());
  std::vector<int64_t> zero(1, 0);
  for (size_t t = 0; t < mine.size(); ++t) {
    const EmbeddingTableShape& sh = m.shapes[mine[t]];
    const size_t elems = static_cast<size_t>(sh.rows * sh.dim), nnz = h.indices[t].size();
    EmbeddingBagInput x{put_in(h.weights[t].data(), h.weights[t].size()),
                        static_cast<const int64_t*>(put_in(h.offsets[t].data(), h.offsets[t].size() * 8)),
                        static_cast<const int64_t*>(put_in(h.indices[t].data(), nnz * 8)),
                        weighted ? static_cast<const float*>(put_in(h.psws[t].data(), nnz * 4)) : nullptr};
    x.num_indices = static_cast<int64_t>(nnz);
    in.push_back(x);
    EmbeddingTableGrad& g = sinks[t];
    const std::vector<float> poison(elems, -7.f);  // backward sets every element it owns
    g.dense = static_cast<float*>(put_in(poison.data(), elems * 4));
    g.rows = static_cast<int64_t*>(mem.alloc(std::max<size_t>(nnz, 2) * 8));
    g.values = static_cast<float*>(mem.alloc(std::max<size_t>(nnz * static_cast<size_t>(sh.dim), 4) * 4));
    g.count = static_cast<int64_t*>(put_in(zero.data(), 8));
    g.weight = const_cast<void*>(x.weight);
    std::vector<float> st(elems);
    for (size_t e = 0; e < elems; ++e) st[e] = state0(e);
    g.state = static_cast<float*>(put_in(st.data(), elems * 4));
  }
  EmbeddingBackwardOptions opt;
  opt.method = method;
  opt.stream = mem.stream;
  opt.kind = kind;
  opt.lr = lr;
  opt.eps = eps;
  op.backward(in.data(), put_in(go.data(), go.size()), sinks.data(), opt);
  // The reference: global column of table g's column j.
  std::vector<int64_t> col_of(m.shapes.size());
  int64_t col = 0;
  for (size_t g = 0; g < m.shapes.size(); ++g) {
    col_of[g] = col;
    col += m.shapes[g].dim;
  }
  for (size_t t = 0; t < mine.size(); ++t) {
    const size_t g = mine[t];
    const EmbeddingTableShape& sh = m.shapes[g];
    const size_t elems = static_cast<size_t>(sh.rows * sh.dim), D = static_cast<size_t>(sh.dim);
    std::vector<float> want(elems, 0.f);
    int64_t first = 0;
    for (int64_t bag = 0; bag < bags; ++bag) {
      const int64_t n = m.bag_size(g, bag);
      const float s = pool == EmbeddingPooling::kMean && n > 0 ? 1.f / static_cast<float>(n) : 1.f;
      const int q = static_cast<int>(bag / m.batch);
      for (int64_t i = 0; i < n; ++i) {
        const float f = (weighted ? Model::psw(g, first + i) : 1.f) * s;
        const int64_t row = m.index(g, bag, i);
        for (int64_t j = 0; j < sh.dim; ++j)
          want[static_cast<size_t>(row * sh.dim + j)] += f * round_to(grad(q, bag % m.batch, col_of[g] + j), ot);
      }
      first += n;
    }
    std::vector<int64_t> rows = h.indices[t];  // the distinct rows indexed, ascending
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    auto fail = [&](const std::string& where, float got, float expected) {
      return fmt::format("{} ({}): rank {} table {} {}: {}, expected {}", what, to_string(kind), r, g, where, got,
                         expected);
    };
    const EmbeddingTableGrad& x = sinks[t];
    if (kind == EmbeddingGradKind::kDense) {
      std::vector<float> got(elems);
      mem.from(got.data(), x.dense, elems * 4);
      for (size_t e = 0; e < elems; ++e)
        WEFT_CHECK(got[e] == want[e], fail(fmt::format("grad[{}][{}]", e / D, e % D), got[e], want[e]));
    } else if (kind == EmbeddingGradKind::kSparse) {
      int64_t count = -1;
      mem.from(&count, x.count, 8);
      WEFT_CHECK(count == static_cast<int64_t>(rows.size()),
                 fmt::format("{}: rank {} table {}: {} sparse rows, expected {}", what, r, g, count, rows.size()));
      std::vector<int64_t> got_rows(rows.size());
      std::vector<float> got(rows.size() * D);
      mem.from(got_rows.data(), x.rows, rows.size() * 8);
      mem.from(got.data(), x.values, got.size() * 4);
      for (size_t k = 0; k < rows.size(); ++k) {
        WEFT_CHECK(got_rows[k] == rows[k], fmt::format("{}: rank {} table {}: sparse row {} is {}, expected {}", what,
                                                       r, g, k, got_rows[k], rows[k]));
        for (size_t j = 0; j < D; ++j)
          WEFT_CHECK(
              got[k * D + j] == want[static_cast<size_t>(rows[k]) * D + j],
              fail(fmt::format("values[{}][{}]", k, j), got[k * D + j], want[static_cast<size_t>(rows[k]) * D + j]));
      }
    } else {
      std::vector<unsigned char> w(h.weights[t].size());
      std::vector<float> st(elems);
      mem.from(w.data(), x.weight, w.size());
      mem.from(st.data(), x.state, elems * 4);
      std::vector<bool> touched(static_cast<size_t>(sh.rows), false);
      for (int64_t row : rows) touched[static_cast<size_t>(row)] = true;
      for (size_t e = 0; e < elems; ++e) {
        const float w0 = get(h.weights[t], static_cast<int64_t>(e), wt), gr = want[e];
        float w1 = w0, s1 = state0(e);
        if (touched[e / D] && kind == EmbeddingGradKind::kSgd) {
          const float step = lr * gr;
          w1 = round_to(w0 - step, wt);
        } else if (touched[e / D]) {
          const float sq = gr * gr;
          s1 = s1 + sq;
          const float den = std::sqrt(s1) + eps;
          const float d = gr / den;
          const float step = -lr * d;
          w1 = round_to(w0 + step, wt);
        }
        const float got = get(w, static_cast<int64_t>(e), wt);
        WEFT_CHECK(got == w1, fail(fmt::format("weight[{}][{}]", e / D, e % D), got, w1));
        if (kind == EmbeddingGradKind::kAdagrad)
          WEFT_CHECK(st[e] == s1, fail(fmt::format("state[{}][{}]", e / D, e % D), st[e], s1));
      }
    }
  }
}

}  // namespace weft::testing::embedding
