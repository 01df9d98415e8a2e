// The exact checks of the GEMM + communication ops, shared by the host and GPU tests: the
// small-integer inputs, this rank's A_r and B for a call, the reference C, the test config.
//
// |A| <= 1 and |B| <= 2. Dense B (host tests, K <= 128): every product sum stays within
// +-256, where bf16 holds every integer, so each rounding (a partial product, every add of a
// reduction) is exact and any order of the adds gives the same bits. Sparse B (GPU tests, K up
// to 512): B is nonzero only where (k + j) % 4 == 0, so |C| <= 2 * ceil(K/4) <= 256 again
// (cuBLAS, NCCL and weft's reductions all give the same bits). A depends on the global row and
// column and the call; B on its global row, column, call and, for ag_gemm (where every rank
// has its own B), the rank.
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <utility>

#include "weft/core/error.hpp"
#include "weft/device/dtype.hpp"
#include "weft/ops/gemm_overlap.hpp"

namespace weft::testing {

inline float overlap_a(int64_t g, int64_t k, int64_t e) { return static_cast<float>((g * 7 + k * 3 + e * 5) % 3 - 1); }
inline float overlap_b(int64_t k, int64_t j, int64_t e, int owner, bool sparse) {
  if (sparse && (k + j) % 4 != 0) return 0.f;
  return static_cast<float>((k * 5 + j * 3 + e + owner * 2) % 5 - 2);
}

// This rank's A_r (a_rows x a_cols) and B (b_rows x b_cols, in the op's layout) for call e
// of m rows (0: the op's M).
inline void fill_overlap_inputs(const ops::GemmOverlap& op, int rank, int64_t e, bool sparse, uint16_t* a,
                                uint16_t* b, int64_t m = 0) {
  const auto& c = op.config();
  const int64_t kl = op.a_cols();
  for (int64_t i = 0; i < op.a_rows(m); ++i)
    for (int64_t k = 0; k < kl; ++k) {
      const int64_t g = c.op == ops::GemmOp::kAgGemm ? rank * op.a_rows(m) + i : i;
      const int64_t kg = c.op == ops::GemmOp::kAgGemm ? k : rank * kl + k;
      a[i * kl + k] = dev::to_bits16(overlap_a(g, kg, e), c.dtype);
    }
  const int owner = c.op == ops::GemmOp::kAgGemm ? rank : 0;
  for (int64_t k = 0; k < kl; ++k)
    for (int64_t j = 0; j < c.n; ++j) {
      const int64_t kg = c.op == ops::GemmOp::kAgGemm ? k : rank * kl + k;
      const uint16_t v = dev::to_bits16(overlap_b(kg, j, e, owner, sparse), c.dtype);
      if (c.b_layout == ops::BLayout::kNK)
        b[j * kl + k] = v;
      else
        b[k * c.n + j] = v;
    }
}

// C against the plain reference C = A * B over the global K (gemm_rs: this rank's rows of
// it), bit for bit, for a call of m rows (0: the op's M); the first mismatches in the message.
inline void check_overlap_output(const ops::GemmOverlap& op, const uint16_t* got, int rank, int world, int64_t e,
                                 bool sparse, const std::string& what, int64_t m = 0) {
  const auto& c = op.config();
  const int64_t row0 = c.op == ops::GemmOp::kGemmRs ? rank * ((m ? m : c.m) / world) : 0;
  const int owner = c.op == ops::GemmOp::kAgGemm ? rank : 0;
  int bad = 0;
  std::string first;
  for (int64_t i = 0; i < op.c_rows(m); ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      float want = 0;
      const int64_t k0 = sparse ? (4 - j % 4) % 4 : 0, step = sparse ? 4 : 1;  // sparse: B's nonzeros only
      for (int64_t k = k0; k < c.k; k += step) want += overlap_a(row0 + i, k, e) * overlap_b(k, j, e, owner, sparse);
      const float have = dev::from_bits16(got[i * c.n + j], c.dtype);
      if (have != want && bad++ < 5) first += fmt::format(" C[{}][{}] = {} (expected {})", i, j, have, want);
    }
  WEFT_CHECK(bad == 0, fmt::format("{} rank {} call {}: {} mismatches:{}", what, rank, e, bad, first));
}

struct OverlapShape {
  ops::GemmOp op;
  int64_t m, k, n;
};

inline ops::GemmOverlapConfig overlap_config(const OverlapShape& s, dev::DType t = dev::DType::kBF16,
                                             ops::BLayout l = ops::BLayout::kNK, int chunks = 2,
                                             std::string algo = "") {
  ops::GemmOverlapConfig c;
  c.op = s.op;
  c.m = s.m;
  c.k = s.k;
  c.n = s.n;
  c.dtype = t;
  c.b_layout = l;
  c.chunks = chunks;
  c.algo = std::move(algo);
  c.tune_cache.assign(1, '-');  // no cache (assign: GCC 12 flags operator= of a literal with -Wrestrict)
  return c;
}

}  // namespace weft::testing
