#include "lt_gemm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "weft/core/cuda_check.hpp"
#include "weft/core/env.hpp"

#define WEFT_LT_CHECK(call)                                                                              \
  do {                                                                                                   \
    cublasStatus_t weft_s_ = (call);                                                                     \
    if (weft_s_ != CUBLAS_STATUS_SUCCESS)                                                                \
      ::weft::throw_error(__FILE__, __LINE__,                                                            \
                          fmt::format("{} failed: cuBLAS status {}", #call, static_cast<int>(weft_s_))); \
  } while (0)

namespace weft::ops::detail {
namespace {

constexpr int kCandidates = 8;

// The largest power of two (<= 256) that divides every address: cuBLASLt assumes 256-byte
// aligned operands unless told otherwise.
uint32_t alignment(std::initializer_list<const void*> ps) {
  uint32_t a = 256;
  for (const void* p : ps)
    if (p) {
      const auto v = reinterpret_cast<uintptr_t>(p);
      while (a > 1 && (v % a) != 0) a /= 2;
    }
  return a;
}

}  // namespace

LtGemm::LtGemm(void* workspace, size_t bytes, cublasHandle_t gemmex)
    : gemmex_(gemmex), ws_(workspace), ws_bytes_(bytes) {
  WEFT_LT_CHECK(cublasLtCreate(&h_));
  WEFT_CUDA_CHECK(cudaEventCreate(&e0_));
  WEFT_CUDA_CHECK(cudaEventCreate(&e1_));
  const std::string t = tunable_text(tunables::kGemmTune);
  tune_ = t == "0" ? Tune::kOff : t == "1" ? Tune::kAll : Tune::kAddOnly;
}

LtGemm::~LtGemm() {
  for (auto& [k, e] : cache_) {
    cublasLtMatrixLayoutDestroy(e.la);
    cublasLtMatrixLayoutDestroy(e.lb);
    cublasLtMatrixLayoutDestroy(e.ld);
    cublasLtMatmulDescDestroy(e.desc);
  }
  if (e0_) cudaEventDestroy(e0_);
  if (e1_) cudaEventDestroy(e1_);
  if (h_) cublasLtDestroy(h_);
}

// Column-major view of the row-major product: D^T[cols x rows] = op(B)^T · A^T, i.e. cuBLAS's
// "A" is B (transposed when B is W[N,K]) and its "B" is A.
LtGemm::Entry& LtGemm::entry(const LtProblem& p, const void* a, const void* b, const void* c, const void* d) {
  const uint32_t al = alignment({a, b, c, d});
  const bool in_place = p.add_c && c == d;
  const auto key = std::tuple_cat(p.key(), std::tuple(in_place, static_cast<int>(al)));
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  Entry e;
  const cudaDataType_t t = p.dtype == dev::DType::kF16 ? CUDA_R_16F : CUDA_R_16BF;
  WEFT_LT_CHECK(cublasLtMatmulDescCreate(&e.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = p.b_nk ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
  WEFT_LT_CHECK(cublasLtMatmulDescSetAttribute(e.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  WEFT_LT_CHECK(cublasLtMatmulDescSetAttribute(e.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (p.b_nk)
    WEFT_LT_CHECK(
        cublasLtMatrixLayoutCreate(&e.la, t, static_cast<uint64_t>(p.k), static_cast<uint64_t>(p.cols), p.ldb));
  else
    WEFT_LT_CHECK(
        cublasLtMatrixLayoutCreate(&e.la, t, static_cast<uint64_t>(p.cols), static_cast<uint64_t>(p.k), p.ldb));
  WEFT_LT_CHECK(cublasLtMatrixLayoutCreate(&e.lb, t, static_cast<uint64_t>(p.k), static_cast<uint64_t>(p.rows), p.lda));
  WEFT_LT_CHECK(
      cublasLtMatrixLayoutCreate(&e.ld, t, static_cast<uint64_t>(p.cols), static_cast<uint64_t>(p.rows), p.ldd));
  cublasLtMatmulPreference_t pref;
  WEFT_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = ws_bytes_;
  WEFT_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    WEFT_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof al));
  e.algos.resize(kCandidates);
  int got = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(h_, e.desc, e.la, e.lb, e.ld, e.ld, pref, kCandidates, e.algos.data(), &got);
  cublasLtMatmulPreferenceDestroy(pref);
  // cublasGemmEx adds C only in place (its C is D).
  e.gemmex = gemmex_ != nullptr && (!p.add_c || in_place);
  if (st != CUBLAS_STATUS_SUCCESS) got = 0;  // cublasGemmEx may still take it
  if (got == 0 && !e.gemmex)
    throw Error(fmt::format("cuBLASLt has no algorithm for a {}x{}x{} GEMM (lda {}, ldb {}, ldd {}, {}-byte aligned)",
                            p.rows, p.cols, p.k, p.lda, p.ldb, p.ldd, al));
  e.algos.resize(static_cast<size_t>(got));
  return cache_.emplace(key, std::move(e)).first->second;
}

void LtGemm::launch(const LtProblem& p, const Entry& e, int i, const void* a, const void* b, const void* c, void* d,
                    cudaStream_t s) const {
  const float alpha = 1.f, beta = p.add_c ? 1.f : 0.f;
  if (e.gemmex && i == 0) {
    const cudaDataType_t t = p.dtype == dev::DType::kF16 ? CUDA_R_16F : CUDA_R_16BF;
    WEFT_LT_CHECK(cublasSetStream(gemmex_, s));
    WEFT_LT_CHECK(cublasGemmEx(gemmex_, p.b_nk ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(p.cols),
                               static_cast<int>(p.rows), static_cast<int>(p.k), &alpha, b, t, static_cast<int>(p.ldb),
                               a, t, static_cast<int>(p.lda), &beta, d, t, static_cast<int>(p.ldd), CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
    return;
  }
  const size_t j = static_cast<size_t>(i - (e.gemmex ? 1 : 0));
  WEFT_LT_CHECK(cublasLtMatmul(h_, e.desc, &alpha, b, e.la, a, e.lb, &beta, p.add_c ? c : d, e.ld, d, e.ld,
                               &e.algos[j].algo, ws_, ws_bytes_, s));
}

void LtGemm::run(const LtProblem& p, const void* a, const void* b, const void* c, void* d, cudaStream_t s,
                 bool may_time) {
  if (p.rows <= 0 || p.cols <= 0) return;
  Entry& e = entry(p, a, b, c, d);
  if (!may_time) return launch(p, e, 0, a, b, c, d, s);
  e.tunable = true;
  const int n = candidates(e);
  // In place (C == D) a candidate's repeated runs would add C more than once: not timed.
  const bool in_place = p.add_c && c == d;
  const bool timed = tune_ == Tune::kAll || (tune_ == Tune::kAddOnly && p.add_c);
  if (e.chosen < 0 && timed && n > 1 && !in_place) {
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    WEFT_CUDA_CHECK(cudaStreamIsCapturing(s, &cap));
    if (cap == cudaStreamCaptureStatusNone) {
      constexpr int kRounds = 4, kBurst = 3;
      std::vector<std::vector<double>> t(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) launch(p, e, i, a, b, c, d, s);  // warm-up (and first-use costs)
      for (int r = 0; r < kRounds; ++r)
        for (int i = 0; i < n; ++i) {
          WEFT_CUDA_CHECK(cudaEventRecord(e0_, s));
          for (int k = 0; k < kBurst; ++k) launch(p, e, i, a, b, c, d, s);
          WEFT_CUDA_CHECK(cudaEventRecord(e1_, s));
          WEFT_CUDA_CHECK(cudaEventSynchronize(e1_));
          float ms = 0;
          WEFT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0_, e1_));
          t[static_cast<size_t>(i)].push_back(ms * 1e3 / kBurst);
        }
      e.us.clear();
      for (auto& v : t) {
        std::sort(v.begin(), v.end());
        e.us.push_back((v[v.size() / 2 - 1] + v[v.size() / 2]) / 2);
      }
      const int best = static_cast<int>(std::min_element(e.us.begin(), e.us.end()) - e.us.begin());
      e.chosen = e.us[static_cast<size_t>(best)] < 0.97 * e.us[0] ? best : 0;
    }
  } else if (e.chosen < 0 && (!timed || n == 1 || in_place)) {
    e.chosen = 0;
  }
  launch(p, e, std::max(e.chosen, 0), a, b, c, d, s);
}

std::vector<std::string> LtGemm::report() const {
  std::vector<std::string> out;
  for (const auto& [k, e] : cache_) {
    if (!e.tunable) continue;
    const auto& [rows, cols, kk, lda, ldb, ldd, nk, dt, add, in_place, al] = k;
    (void)lda, (void)ldb, (void)ldd, (void)nk, (void)dt;
    std::string s = fmt::format("{}x{}x{}{}: ", rows, cols, kk, add ? (in_place ? " +C in place" : " +C") : "");
    if (e.us.empty())
      s += fmt::format("{} (untimed)", e.gemmex ? "cublasGemmEx" : "cublasLt heuristic #0");
    else {
      auto name = [&](int i) {
        return e.gemmex && i == 0 ? std::string("cublasGemmEx") : fmt::format("cublasLt #{}", i - (e.gemmex ? 1 : 0));
      };
      s += fmt::format("{} of {} candidates, {:.1f} us ({} {:.1f} us)", name(e.chosen), candidates(e),
                       e.us[static_cast<size_t>(e.chosen)], name(0), e.us[0]);
    }
    (void)al;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace weft::ops::detail
