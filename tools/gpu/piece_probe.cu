// Piece-size profile of cuBLAS for gemm_rs decomposed's pieces (issue 6), one GPU: for each
// family (N, K) of the ANCHORS shapes' local GEMMs and each row count M, the time of
// cublasGemmEx (the peer pieces: D = A·B) and of the fastest of cublasLt's first 8 candidates
// with C added (the own pieces of the cuBLASLt fold: D = A·B + C, C != D), per call and per
// row — which piece sizes does cuBLAS run efficiently? Interleaved rounds, sustained load.
// Build here: nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a tools/gpu/piece_probe.cu \
//               -o .gpu/piece_probe -lcublasLt -lcublas
// Run there: source tools/gpu/env.sh; .gpu/piece_probe [family ...]   (families: 3584 8192 14336)
// Row-major A[M,K], W[N,K] (torch linear), C[M,N], bf16, fp32 accumulation, as the bench.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)
#define CB(x)                                                                           \
  do {                                                                                  \
    int s_ = static_cast<int>(x);                                                       \
    if (s_ != 0) {                                                                      \
      std::fprintf(stderr, "%s:%d %s: cublas status %d\n", __FILE__, __LINE__, #x, s_); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

namespace {

cudaStream_t g_stream;
cudaEvent_t g_e0, g_e1;
void* g_ws = nullptr;
const size_t kWs = 64ull << 20;

// Median over batches of `per` back-to-back calls, us per call.
template <class F>
double time_us(F&& f, int per = 4, int batches = 7) {
  for (int i = 0; i < 2; ++i) f();
  std::vector<double> v;
  for (int b = 0; b < batches; ++b) {
    CK(cudaEventRecord(g_e0, g_stream));
    for (int i = 0; i < per; ++i) f();
    CK(cudaEventRecord(g_e1, g_stream));
    CK(cudaEventSynchronize(g_e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, g_e0, g_e1));
    v.push_back(ms * 1e3 / per);
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Lt {
  cublasLtHandle_t h;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc;
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
};

// Column-major view: C'[N,M] = W'[K,N]^T · A'[K,M].
Lt make_lt(cublasLtHandle_t h, int m, int n, int k, int want) {
  Lt l{};
  l.h = h;
  CB(cublasLtMatmulDescCreate(&l.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CB(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CB(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  CB(cublasLtMatrixLayoutCreate(&l.la, CUDA_R_16BF, k, n, k));
  CB(cublasLtMatrixLayoutCreate(&l.lb, CUDA_R_16BF, k, m, k));
  CB(cublasLtMatrixLayoutCreate(&l.lc, CUDA_R_16BF, n, m, n));
  cublasLtMatmulPreference_t pref;
  CB(cublasLtMatmulPreferenceCreate(&pref));
  CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWs, sizeof kWs));
  l.algos.resize(want);
  int got = 0;
  CB(cublasLtMatmulAlgoGetHeuristic(h, l.op, l.la, l.lb, l.lc, l.lc, pref, want, l.algos.data(), &got));
  l.algos.resize(got);
  cublasLtMatmulPreferenceDestroy(pref);
  return l;
}

void run_lt(const Lt& l, int i, const void* w, const void* a, const void* c, void* d, float beta) {
  const float alpha = 1.f;
  CB(cublasLtMatmul(l.h, l.op, &alpha, w, l.la, a, l.lb, &beta, c, l.lc, d, l.lc, &l.algos[i].algo, g_ws, kWs,
                    g_stream));
}

__global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned x = unsigned(i) * 2654435761u + seed;
    p[i] = __float2bfloat16(float(int(x >> 24) - 128) / 256.f);
  }
}


struct Family {
  int n, k, m_max;
};

}  // namespace

int main(int argc, char** argv) {
  CK(cudaSetDevice(0));
  CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  CK(cudaEventCreate(&g_e0));
  CK(cudaEventCreate(&g_e1));
  CK(cudaMalloc(&g_ws, kWs));
  const size_t kA = 16384ull * 4096, kW = 14336ull * 4096, kC = 8192ull * 14336;
  __nv_bfloat16 *a, *w, *c, *d;
  CK(cudaMalloc(&a, kA * 2));
  CK(cudaMalloc(&w, kW * 2));
  CK(cudaMalloc(&c, kC * 2));
  CK(cudaMalloc(&d, kC * 2));
  fill<<<1024, 256>>>(a, kA, 1);
  fill<<<1024, 256>>>(w, kW, 2);
  fill<<<1024, 256>>>(c, kC, 3);
  CK(cudaDeviceSynchronize());
  cublasHandle_t bh;
  CB(cublasCreate(&bh));
  CB(cublasSetStream(bh, g_stream));
  CB(cublasSetWorkspace(bh, g_ws, kWs));
  cublasLtHandle_t lh;
  CB(cublasLtCreate(&lh));
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
    if (size_t(full) * f.k <= kA) std::printf("full %d rows: GemmEx %.1f us\n", full, time_us([&] { gemmex(full, f.n, f.k); }, 3, 5));
  }
  return 0;
}
