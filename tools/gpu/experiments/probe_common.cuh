// Helpers shared by the probes of tools/gpu/experiments/ (gemm_probe.cu, piece_probe.cu, concur_probe.cu,
// gemm_trace_probe.cu, hooks_probe.cu; store_probe.cu and gather_probe.cu its CK): error
// macros, event timing (median over batches of back-to-back calls), cublasLt descriptors and
// heuristics for row-major A[M,K] · W[N,K]^T, a bf16 fill. Single-file nvcc programs include it.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
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

namespace probe {

inline cudaStream_t g_stream;
inline cudaEvent_t g_e0, g_e1;
inline void* g_ws = nullptr;
inline const size_t kWs = 64ull << 20;

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

// The middle element (upper median) of v.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
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
inline Lt make_lt(cublasLtHandle_t h, int m, int n, int k, int want) {
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

inline void run_lt(const Lt& l, int i, const void* w, const void* a, const void* c, void* d, float beta) {
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

// The stream and the two timing events above, created on GPU 0; a cuBLAS handle on the stream.
inline cublasHandle_t init_stream() {
  CK(cudaSetDevice(0));
  CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  CK(cudaEventCreate(&g_e0));
  CK(cudaEventCreate(&g_e1));
  cublasHandle_t bh = nullptr;
  CB(cublasCreate(&bh));
  CB(cublasSetStream(bh, g_stream));
  return bh;
}

// The shapes named on the command line (argv[1..]), or `defaults`.
inline std::vector<std::string> shapes_from(int argc, char** argv, std::vector<std::string> defaults) {
  std::vector<std::string> shapes(argv + 1, argv + argc);
  return shapes.empty() ? defaults : shapes;
}

// One GPU's probe state: the stream, events and workspace above, A / W / C / D of the given
// element counts filled with bf16 values, a cuBLAS handle on the stream with the workspace,
// a cuBLASLt handle.
struct Setup {
  __nv_bfloat16 *a = nullptr, *w = nullptr, *c = nullptr, *d = nullptr;
  cublasHandle_t bh = nullptr;
  cublasLtHandle_t lh = nullptr;
};
inline Setup setup(size_t a_elems, size_t w_elems, size_t c_elems) {
  Setup s;
  s.bh = init_stream();
  CK(cudaMalloc(&g_ws, kWs));
  CK(cudaMalloc(&s.a, a_elems * 2));
  CK(cudaMalloc(&s.w, w_elems * 2));
  CK(cudaMalloc(&s.c, c_elems * 2));
  CK(cudaMalloc(&s.d, c_elems * 2));
  fill<<<1024, 256>>>(s.a, a_elems, 1);
  fill<<<1024, 256>>>(s.w, w_elems, 2);
  fill<<<1024, 256>>>(s.c, c_elems, 3);
  CK(cudaDeviceSynchronize());
  CB(cublasSetWorkspace(s.bh, g_ws, kWs));
  CB(cublasLtCreate(&s.lh));
  return s;
}

}  // namespace probe
