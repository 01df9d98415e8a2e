// cuBLASLt GEMMs with the algorithm chosen by timing (CUDA builds; internal to the ops).
//
// The decomposed GEMM+communication methods run cuBLAS on pieces of the op's GEMM (halves,
// chunks of rows). cublasGemmEx takes cuBLAS's first heuristic; on 2xH200 the fastest of
// cublasLt's first 8 candidates was 4-12% faster for most of those pieces
// (tools/gpu/experiments/gemm_probe.cu; docs/gemm_overlap.md). LtGemm times the candidates
// the first time it meets a problem (outside stream capture) and keeps the fastest.
//
// Row-major: D[rows x cols] (ld ldd) = A[rows x k] (ld lda) · op(B) (+ C, same layout as D,
// when `c` is given: the gemm_rs fold adds the peer's partial product in cuBLAS's epilogue).
// B is W[N,K] (nk: op = transpose, ld ldb = K) or B[K,N] (kn, ld = N), offset by the caller to
// the first column.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "weft/device/dtype.hpp"

namespace weft::ops::detail {

struct LtProblem {
  int64_t rows = 0, cols = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;
  bool b_nk = true;
  dev::DType dtype = dev::DType::kBF16;
  bool add_c = false;  // D = A·op(B) + C (in place where C is D: then cublasGemmEx, beta = 1, is candidate 0)
  auto key() const { return std::tuple(rows, cols, k, lda, ldb, ldd, b_nk, static_cast<int>(dtype), add_c); }
};

class LtGemm {
 public:
  // `workspace` (bytes) is shared with the caller's other cuBLAS calls on the same stream.
  // `gemmex`: a cuBLAS handle (with that workspace) whose cublasGemmEx is a candidate too
  // (problems without C): its kernel is not always among cublasLt's first 8 (2xH200:
  // 16384x3584x8192 ran 1105 us by GemmEx, 1196 us by the fastest of those).
  LtGemm(void* workspace, size_t bytes, cublasHandle_t gemmex = nullptr);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Which problems are timed (WEFT_GEMM_TUNE): 0 none, 1 all, default (unset or other) only
  // those that add C -- they have no cublasGemmEx to fall back on, and cublasLt's first
  // heuristic ran them 15-30% slower than GemmEx's kernel on 2xH200. Untimed problems run
  // candidate 0: cublasGemmEx, or cublasLt's first heuristic where C is added. Timing every
  // problem measured no gain in the GEMM+communication benches (2xH200, 2026-11-22 10:2x: the
  // chosen kernels, fastest in the tuning's back-to-back bursts, were up to 12% slower than
  // GemmEx's in the bench's graph replays; docs/gemm_overlap.md).
  enum class Tune { kOff, kAddOnly, kAll };
  Tune tuning() const { return tune_; }

  // Runs the problem. The first time a problem is met outside stream capture (and tuning is
  // on), each candidate runs on `s` with these pointers (it must be safe to compute this
  // product more than once: D is written, never read, unless it is C: then nothing is timed)
  // and the fastest is kept: 4 rounds, each timing every candidate in turn (so a clock that
  // drifts over the rounds favours none) as a burst of 3 back-to-back calls, median per
  // candidate; candidate 0 stays unless another is >= 3% faster (timing noise must not switch
  // kernels). This synchronises `s`. In a capture an untuned problem takes candidate 0.
  // may_time = false: candidate 0, untimed and nothing recorded (the baselines' plain cuBLAS).
  void run(const LtProblem& p, const void* a, const void* b, const void* c, void* d, cudaStream_t s,
           bool may_time = true);

  // What was chosen, for reports, one line per problem run with may_time (the others always
  // run candidate 0).
  std::vector<std::string> report() const;

 private:
  struct Entry {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
    std::vector<cublasLtMatmulHeuristicResult_t> algos;
    int chosen = -1;       // index into the candidates; -1: untuned (candidate 0 is run)
    bool gemmex = false;   // candidate 0 is cublasGemmEx, then algos[i - 1]
    bool tunable = false;  // run with may_time at least once (report() lists it)
    std::vector<double> us;
  };
  Entry& entry(const LtProblem& p, const void* a, const void* b, const void* c, const void* d);
  void launch(const LtProblem& p, const Entry& e, int i, const void* a, const void* b, const void* c, void* d,
              cudaStream_t s) const;
  int candidates(const Entry& e) const { return static_cast<int>(e.algos.size()) + (e.gemmex ? 1 : 0); }

  cublasLtHandle_t h_ = nullptr;
  cublasHandle_t gemmex_ = nullptr;
  void* ws_ = nullptr;
  size_t ws_bytes_ = 0;
  Tune tune_ = Tune::kAddOnly;
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, int, bool, bool, int>, Entry> cache_;
};

}  // namespace weft::ops::detail
