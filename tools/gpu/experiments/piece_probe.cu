// Piece-size profile of cuBLAS for gemm_rs decomposed's pieces (issue 6), one GPU: for each
// family (N, K) of the anchor shapes (docs/anchors.md)' local GEMMs and each row count M, the time of
// cublasGemmEx (the peer pieces: D = A·B) and of the fastest of cublasLt's first 8 candidates
// with C added (the own pieces of the cuBLASLt fold: D = A·B + C, C != D), per call and per
// row — which piece sizes does cuBLAS run efficiently? Interleaved rounds, sustained load.
// Build here: nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a tools/gpu/experiments/piece_probe.cu \
//               -o .gpu/piece_probe -lcublasLt -lcublas
// Run there: source tools/gpu/env.sh; .gpu/piece_probe [family ...]   (families: 3584 8192 14336)
// Row-major A[M,K], W[N,K] (torch linear), C[M,N], bf16, fp32 accumulation, as the bench.
#include "probe_common.cuh"

using namespace probe;

namespace {

struct Family {
  int n, k, m_max;
};

}  // namespace

int main(int argc, char** argv) {
  const size_t kA = 16384ull * 4096, kW = 14336ull * 4096, kC = 8192ull * 14336;
  const Setup st = setup(kA, kW, kC);
  __nv_bfloat16 *a = st.a, *w = st.w, *c = st.c, *d = st.d;
  cublasHandle_t bh = st.bh;
  cublasLtHandle_t lh = st.lh;
  auto gemmex = [&](int m, int n, int k) {
    const float alpha = 1.f, beta = 0.f;
    CB(cublasGemmEx(bh, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF, k, a, CUDA_R_16BF, k, &beta, d,
                    CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  std::vector<Family> fams = {{3584, 4096, 8192}, {8192, 4096, 4096}, {14336, 4096, 4096}};
  if (argc > 1) {
    std::vector<Family> pick;
    for (int i = 1; i < argc; ++i)
      for (const Family& f : fams)
        if (f.n == std::atoi(argv[i])) pick.push_back(f);
    fams = pick;
  }
  // Heat: 300 ms of the largest GEMM back to back (the power cap's clock, as the benches).
  for (int i = 0; i < 200; ++i) gemmex(8192, 3584, 4096);
  CK(cudaStreamSynchronize(g_stream));
  std::printf("%6s %6s %6s | %9s %8s | %9s %8s %4s | %s\n", "M", "N", "K", "GemmEx", "ns/row", "+C best", "ns/row",
              "idx", "+C / GemmEx");
  for (const Family& f : fams) {
    for (int m = 512; m <= f.m_max; m += 128) {
      Lt l = make_lt(lh, m, f.n, f.k, 8);
      const double ex = time_us([&] { gemmex(m, f.n, f.k); }, 3, 5);
      double best = 1e30;
      size_t bi = 0;
      for (size_t i = 0; i < l.algos.size(); ++i) {
        const double t = time_us([&] { run_lt(l, int(i), w, a, c, d, 1.f); }, 3, 5);
        if (t < best) best = t, bi = i;
      }
      std::printf("%6d %6d %6d | %9.1f %8.2f | %9.1f %8.2f %4zu | %.3f\n", m, f.n, f.k, ex, ex * 1e3 / m, best,
                  best * 1e3 / m, bi, best / ex);
      std::fflush(stdout);
      cublasLtMatmulDescDestroy(l.op);
      cublasLtMatrixLayoutDestroy(l.la);
      cublasLtMatrixLayoutDestroy(l.lb);
      cublasLtMatrixLayoutDestroy(l.lc);
    }
    // The whole local GEMM of the family's shape, for the ratio.
    const int full = f.m_max * 2;
    if (size_t(full) * f.k <= kA)
      std::printf("full %d rows: GemmEx %.1f us\n", full, time_us([&] { gemmex(full, f.n, f.k); }, 3, 5));
  }
  return 0;
}
