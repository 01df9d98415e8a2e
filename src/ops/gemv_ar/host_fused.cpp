// The fused GEMV + all-reduce on the host backend: a.ctas teams, each a scalar fp32 GEMV of
// its parts followed by the kernel's own exchange, sum and epilogue (gemv_ar_algos.hpp).
#include <algorithm>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/kernels/gemv_ar_algos.hpp"
#include "weft/kernels/gemv_ar_kernels.hpp"
#include "weft/runtime/host_exec.hpp"

namespace weft::kernels {
namespace {

// Columns of a part: a multiple of 8 (any works; every rank uses the same).
constexpr int kHostPartWidth = 64;
// Workers per team (CI machines have two cores; ranks and teams share them).
constexpr int kHostTeamThreads = 2;

template <class T>
void run_team(CoopHostTeam g, const dev::DeviceCtx& c, const GemvArgs& a, int k, float* part, float* scratch) {
  constexpr int pw = kHostPartWidth;
  const uint64_t e = gemv::epoch_begin(c, a, k);
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.w);
  const int np = gemv::parts_of(a.n, pw);
  for (int p = k; p < np; p += a.ctas) {
    const int j0 = p * pw, j1 = std::min(a.n, j0 + pw);
    const int cols = j1 - j0;
    for (int i = g.rank(); i < a.m * cols; i += g.size()) {
      const int t = i / cols, j = j0 + i % cols;
      const T* xr = x + static_cast<size_t>(t) * a.k;
      const T* wr = w + static_cast<size_t>(j) * a.k;
      float s = 0.f;
      for (int kk = 0; kk < a.k; ++kk) s += dev::to_float(xr[kk]) * dev::to_float(wr[kk]);
      part[t * pw + (j - j0)] = s;
    }
    g.sync();
    gemv::push_part<T>(g, c, a, e, pw, j0, j1, [&](int t, int j, float* v) {
      for (int q = 0; q < 4; ++q) v[q] = part[t * pw + (j - j0) + q];
    });
    g.sync();  // the part buffer is reused by the next part
  }
  gemv::finish<T>(g, c, a, k, pw, e, scratch);
  gemv::epoch_end(g, c, a, k, e);
}

}  // namespace

void gemv_ar_host_fused(const dev::DeviceCtx& c, const GemvArgs& a, dev::DType t) {
  WEFT_REQUIRE(t == dev::DType::kBF16 || t == dev::DType::kF16, "gemv_ar: the host fused call takes bf16 or f16");
  WEFT_REQUIRE(a.ctas >= 1 && a.m >= 1 && a.m <= a.m_max && a.n % 8 == 0 && a.k >= 1,
               "gemv_ar: bad host fused call shape");
  const int pw = kHostPartWidth;
  const int per_cta = gemv::max_parts_per_cta(a.n, pw, a.ctas);
  std::vector<std::vector<float>> part(static_cast<size_t>(a.ctas), std::vector<float>(static_cast<size_t>(a.m) * pw));
  std::vector<std::vector<float>> scratch(
      static_cast<size_t>(a.ctas),
      std::vector<float>(static_cast<size_t>(gemv::scratch_floats(a.m_max, per_cta, pw, kHostTeamThreads))));
  host_launch(a.ctas, kHostTeamThreads, [&](CoopHostTeam g, int k) {
    float* pb = part[static_cast<size_t>(k)].data();
    float* sb = scratch[static_cast<size_t>(k)].data();
    if (t == dev::DType::kBF16)
      run_team<dev::bf16_t>(g, c, a, k, pb, sb);
    else
      run_team<dev::f16_t>(g, c, a, k, pb, sb);
  });
}

}  // namespace weft::kernels
