// The fused GEMV + all-reduce's shared algorithm (gemv_ar_algos.hpp) on the host backend,
// through kernels::gemv_ar_host_fused: worlds 1-4, every M of 1 ... m_max from one set of
// receive lines, consecutive calls (epochs, both parities, stale lines of other M), with and
// without the residual + RMSNorm epilogue, bf16 and f16, LL and LL128 lines, exact on integer
// data; parts pushed by other teams than their readers; a silent peer times out with its rank
// and the op named (both protocols).
#include "weft/kernels/gemv_ar_algos.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "rank_harness.hpp"
#include "weft/core/error.hpp"
#include "weft/kernels/gemv_ar_kernels.hpp"
#include "weft/runtime/backend.hpp"
#include "weft/runtime/host_exec.hpp"

using namespace weft;
using namespace weft::testing;

namespace {

struct Shape {
  int n, k, m_max, ctas;
  int ll128 = 0;  // GemvArgs::ll128: LL128 receive lines (the op's set of M > 16)
};

uint16_t bits(float f, dev::DType t) { return dev::to_bits16(f, t); }
float val(uint16_t b, dev::DType t) { return dev::from_bits16(b, t); }

// Small integers: every product, partial and sum is exact in fp32 and the partials and sums
// fit the dtypes exactly, so the result does not depend on the order of the GEMV's terms.
float x_at(int rank, int t, int kk, int call) { return static_cast<float>((rank * 7 + t * 3 + kk + call) % 3 - 1); }
float w_at(int rank, int j, int kk) { return static_cast<float>((rank * 5 + j * 11 + kk * 2) % 5 - 2); }
float res_at(int t, int j, int call) { return static_cast<float>((t * 13 + j * 7 + call) % 9 - 4); }
float gamma_at(int j) { return static_cast<float>(j % 4 + 1) * 0.5f; }

// One rank's state and buffers for a series of fused calls of one shape: the symmetric state,
// W and gamma (fixed), x, the residual and the outputs (per call).
struct Case {
  Shape s;
  dev::DType dt;
  int world, rank;
  kernels::GemvArgs a;
  std::vector<uint16_t> x, w, y, res, ro, gamma;

  Case(Backend& b, const Shape& shape, dev::DType t)
      : s(shape),
        dt(t),
        world(b.size()),
        rank(b.rank()),
        x(static_cast<size_t>(s.m_max) * s.k),
        w(static_cast<size_t>(s.n) * s.k),
        y(static_cast<size_t>(s.m_max) * s.n),
        res(y.size()),
        ro(y.size()),
        gamma(static_cast<size_t>(s.n)) {
    a.n = s.n;
    a.k = s.k;
    a.m_max = s.m_max;
    a.ctas = s.ctas;
    a.op_tag = dev::op_tag("gemv_ar");
    a.ll128 = s.ll128;
    a.lines_off = b.heap().alloc_bytes(
        s.ll128 ? kernels::gemv_ll128_lines_bytes(world, s.m_max, s.n) : kernels::gemv_lines_bytes(world, s.m_max, s.n),
        "gemv.lines");
    a.epoch_off = b.heap().alloc_bytes(kernels::gemv_epochs_bytes(s.ctas), "gemv.epochs");
    a.norm_off = b.heap().alloc_bytes(kernels::gemv_norm_bytes(s.m_max, s.ctas), "gemv.norm");
    for (int j = 0; j < s.n; ++j)
      for (int kk = 0; kk < s.k; ++kk) w[static_cast<size_t>(j) * s.k + kk] = bits(w_at(rank, j, kk), dt);
    for (int j = 0; j < s.n; ++j) gamma[static_cast<size_t>(j)] = bits(gamma_at(j), dt);
  }

  // Call `call`'s inputs for m tokens (y poisoned), and the args that point at them.
  void set_call(int m, int call, bool epilogue) {
    for (int t = 0; t < m; ++t)
      for (int kk = 0; kk < s.k; ++kk) x[static_cast<size_t>(t) * s.k + kk] = bits(x_at(rank, t, kk, call), dt);
    for (int t = 0; t < m; ++t)
      for (int j = 0; j < s.n; ++j) res[static_cast<size_t>(t) * s.n + j] = bits(res_at(t, j, call), dt);
    std::fill(y.begin(), y.end(), bits(-99.f, dt));
    a.m = m;
    a.x = x.data();
    a.w = w.data();
    a.y = y.data();
    a.residual = epilogue ? res.data() : nullptr;
    a.residual_out = epilogue ? ro.data() : nullptr;
    a.gamma = epilogue ? gamma.data() : nullptr;
  }

  // This rank's fp32 partial of columns j .. j+3 of token t (the GEMV a team runs).
  void partial(int t, int j, float* v) const {
    for (int q = 0; q < 4; ++q) {
      float sum = 0.f;
      for (int kk = 0; kk < s.k; ++kk)
        sum += val(x[static_cast<size_t>(t) * s.k + kk], dt) * val(w[static_cast<size_t>(j + q) * s.k + kk], dt);
      v[q] = sum;
    }
  }

  // Checks call `call` exactly against the reference (every rank's rounded partials summed in
  // rank order, then the epilogue), and that nothing past its m rows was written.
  void check(int call, bool epilogue, const std::string& what) const {
    const int m = a.m;
    for (int t = 0; t < m; ++t) {
      std::vector<float> ref_ro(static_cast<size_t>(s.n));
      float sq = 0.f;
      for (int j = 0; j < s.n; ++j) {
        float sum = 0.f;
        for (int r = 0; r < world; ++r) {
          float p = 0.f;
          for (int kk = 0; kk < s.k; ++kk) p += x_at(r, t, kk, call) * w_at(r, j, kk);
          sum += val(bits(p, dt), dt);
        }
        const float yv = val(bits(sum, dt), dt);
        if (!epilogue) {
          const uint16_t got = y[static_cast<size_t>(t) * s.n + j];
          WEFT_CHECK(got == bits(yv, dt), what + ": world " + std::to_string(world) + " m " + std::to_string(m) +
                                              " token " + std::to_string(t) + " column " + std::to_string(j) +
                                              ": y = " + std::to_string(val(got, dt)) + ", want " + std::to_string(yv));
          continue;
        }
        ref_ro[static_cast<size_t>(j)] = val(bits(yv + res_at(t, j, call), dt), dt);
        sq += ref_ro[static_cast<size_t>(j)] * ref_ro[static_cast<size_t>(j)];
      }
      if (!epilogue) continue;
      const float inv = 1.0f / std::sqrt(sq / static_cast<float>(s.n) + a.eps);
      for (int j = 0; j < s.n; ++j) {
        const size_t at = static_cast<size_t>(t) * s.n + j;
        const float want_ro = ref_ro[static_cast<size_t>(j)];
        WEFT_CHECK(ro[at] == bits(want_ro, dt),
                   what + ": m " + std::to_string(m) + " token " + std::to_string(t) + " column " + std::to_string(j) +
                       ": residual_out " + std::to_string(val(ro[at], dt)) + ", want " + std::to_string(want_ro));
        const float want = want_ro * inv * gamma_at(j);
        WEFT_CHECK(y[at] == bits(want, dt), what + ": m " + std::to_string(m) + " token " + std::to_string(t) +
                                                " column " + std::to_string(j) + ": out " +
                                                std::to_string(val(y[at], dt)) + ", want " + std::to_string(want));
      }
    }
    // Rows past m are not written.
    for (size_t i = static_cast<size_t>(m) * s.n; i < y.size(); ++i)
      WEFT_CHECK(y[i] == bits(-99.f, dt), what + ": y written past token m = " + std::to_string(m));
  }
};

void run_case(const Shape& s, dev::DType dt, bool epilogue) {
  auto b = make_backend();
  Case c(*b, s, dt);
  int call = 0;
  // Every M up, then back down: each call of a parity sees lines the other M left there.
  std::vector<int> ms;
  for (int m = 1; m <= s.m_max; ++m) ms.push_back(m);
  for (int m = s.m_max; m >= 1; m -= 3) ms.push_back(m);
  for (int m : ms) {
    ++call;
    c.set_call(m, call, epilogue);
    kernels::gemv_ar_host_fused(b->ctx(), c.a, dt);
    c.check(call, epilogue, "host fused");
  }
}

}  // namespace

class GemvArAlgosHost : public ::testing::TestWithParam<int> {};

TEST_P(GemvArAlgosHost, ExactForEveryMWithAndWithoutEpilogue) {
  expect_all_ok(run_host_ranks(GetParam(), [] {
    // n = 200: parts of 64 columns, the last one 8 wide; 3 teams own 2, 1 and 1 parts.
    run_case({200, 24, 9, 3}, dev::DType::kBF16, false);
    run_case({200, 24, 9, 3}, dev::DType::kBF16, true);
    run_case({64, 16, 5, 2}, dev::DType::kF16, true);
    run_case({136, 8, 4, 1}, dev::DType::kF16, false);
    run_case({200, 24, 9, 3, 1}, dev::DType::kBF16, false);
    run_case({200, 24, 9, 3, 1}, dev::DType::kBF16, true);
    run_case({136, 8, 4, 1, 1}, dev::DType::kF16, true);
  }));
}

// Any team may push a part (docs/gemv_ar.md, "Next: overlap at m > 16"): the receive lines'
// invariant rests on the order of whole calls, not on the pusher being the part's reader. Here
// the pusher of part P in call c is team (P + c) mod ctas -- another team than its reader in
// most calls, a different one call to call -- over consecutive calls of both parities, LL and
// LL128 lines, with and without the epilogue; every result exact.
TEST_P(GemvArAlgosHost, AnyTeamMayPushAPart) {
  expect_all_ok(run_host_ranks(GetParam(), [] {
    auto b = make_backend();
    constexpr int n = 200, k = 16, m_max = 6, ctas = 3, pw = 64, threads = 2;
    const int parts = gemv::parts_of(n, pw);
    for (int ll128 : {0, 1}) {
      Case cs(*b, {n, k, m_max, ctas, ll128}, dev::DType::kBF16);
      std::vector<std::vector<float>> scratch(ctas, std::vector<float>(static_cast<size_t>(gemv::scratch_floats(
                                                        m_max, gemv::max_parts_per_cta(n, pw, ctas), pw, threads))));
      for (int call = 1; call <= 8; ++call) {
        const bool epilogue = call % 3 == 0;
        cs.set_call(1 + (call * 5) % m_max, call, epilogue);
        const dev::DeviceCtx& c = b->ctx();
        const kernels::GemvArgs& a = cs.a;
        host_launch(ctas, threads, [&](CoopHostTeam g, int team) {
          const uint64_t e = gemv::epoch_begin(c, a, team);
          for (int P = 0; P < parts; ++P) {
            if ((P + call) % ctas != team) continue;
            const int j0 = P * pw, j1 = std::min(n, j0 + pw);
            gemv::push_part<dev::bf16_t>(g, c, a, e, pw, j0, j1, [&](int t, int j, float* v) { cs.partial(t, j, v); });
          }
          gemv::finish<dev::bf16_t>(g, c, a, team, pw, e, scratch[static_cast<size_t>(team)].data());
          gemv::epoch_end(g, c, a, team, e);
        });
        cs.check(call, epilogue, "ll128 " + std::to_string(ll128) + " call " + std::to_string(call));
      }
    }
  }));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GemvArAlgosHost, ::testing::Values(1, 2, 3, 4, 8));

class GemvArAlgosHostFaults : public ::testing::TestWithParam<int> {};

TEST_P(GemvArAlgosHostFaults, SilentPeerTimesOutNamingIt) {
  const int ll128 = GetParam();
  auto res = run_host_ranks(
      2,
      [ll128] {
        auto b = make_backend();
        kernels::GemvArgs a;
        a.ll128 = ll128;
        a.n = 64;
        a.k = 8;
        a.m = a.m_max = 2;
        a.ctas = 1;
        a.op_tag = dev::op_tag("gemv_ar");
        a.lines_off = b->heap().alloc_bytes(
            ll128 ? kernels::gemv_ll128_lines_bytes(2, a.m_max, a.n) : kernels::gemv_lines_bytes(2, a.m_max, a.n),
            "gemv.lines");
        a.epoch_off = b->heap().alloc_bytes(kernels::gemv_epochs_bytes(a.ctas), "gemv.epochs");
        if (b->rank() == 1) return;  // never calls
        std::vector<uint16_t> x(static_cast<size_t>(a.m) * a.k), w(static_cast<size_t>(a.n) * a.k),
            y(static_cast<size_t>(a.m) * a.n);
        a.x = x.data();
        a.w = w.data();
        a.y = y.data();
        kernels::gemv_ar_host_fused(b->ctx(), a, dev::DType::kBF16);
      },
      {}, 800);
  EXPECT_EQ(res[1].exit_code, 0) << res[1].message;
  EXPECT_EQ(res[0].exit_code, 1);
  EXPECT_NE(res[0].message.find("signal wait timed out"), std::string::npos) << res[0].message;
  EXPECT_NE(res[0].message.find("rank 1 did not arrive (gemv_ar: signal at heap offset"), std::string::npos)
      << res[0].message;
}

INSTANTIATE_TEST_SUITE_P(LLAndLL128, GemvArAlgosHostFaults, ::testing::Values(0, 1));
