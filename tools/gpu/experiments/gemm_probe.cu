// Probe for the GEMM+communication ops' GEMMs (issue 6), one process on 1-2 GPUs:
//  1. cublasGemmEx against each of cublasLt's top algorithms, for the pieces the decomposed
//     methods run (ag_gemm halves, gemm_rs blocks) — does timing the candidates beat the default?
//  2. the same with beta = 1 (D = A·B + C; C != D and C == D): can the gemm_rs reduction ride in
//     cuBLAS's epilogue at no cost?
//  3. interference: the full GEMM alone, beside a copy-engine push from GPU 1 into GPU 0's
//     memory, and beside a local copy — how much of ag_gemm's overhead is the traffic itself.
// Build here: nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a tools/gpu/experiments/gemm_probe.cu \
//               -o .gpu/gemm_probe -lcublasLt -lcublas
// Run there: source tools/gpu/env.sh; .gpu/gemm_probe   (tools/gpu/experiments/probe.sh)
// Row-major A[M,K], W[N,K] (torch linear), C[M,N], bf16, fp32 accumulation, as the bench.
#include "probe_common.cuh"

using namespace probe;

namespace {

struct Shape {
  const char* what;
  int m, n, k;
};

}  // namespace

int main() {
  int ngpu = 0;
  CK(cudaGetDeviceCount(&ngpu));
  const size_t kA = 16384ull * 8192, kW = 14336ull * 8192, kC = 16384ull * 14336;
  const Setup st = setup(kA, kW, kC);
  __nv_bfloat16 *a = st.a, *w = st.w, *c = st.c, *d = st.d;
  cublasHandle_t bh = st.bh;
  cublasLtHandle_t lh = st.lh;
  auto gemmex = [&](int m, int n, int k, const void* aa, void* cc, float beta) {
    const float alpha = 1.f;
    CB(cublasGemmEx(bh, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF, k, aa, CUDA_R_16BF, k, &beta, cc,
                    CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  // anchor shapes (docs/anchors.md) M×K×N: ag_gemm full and its halves (2 ranks); gemm_rs local (K/2), own
  // block (M/2) and its halves (pieces).
  const Shape shapes[] = {
      {"ag full 8192x8192x14336", 8192, 14336, 8192}, {"ag half", 4096, 14336, 8192},
      {"ag full 4096x8192x8192", 4096, 8192, 8192},   {"ag half", 2048, 8192, 8192},
      {"ag full 16384x8192x3584", 16384, 3584, 8192}, {"ag half", 8192, 3584, 8192},
      {"ag full 2048x4096x4096", 2048, 4096, 4096},   {"ag half", 1024, 4096, 4096},
      {"rs full 8192x8192x14336", 8192, 14336, 4096}, {"rs block", 4096, 14336, 4096},
      {"rs full 4096x8192x8192", 4096, 8192, 4096},   {"rs block", 2048, 8192, 4096},
      {"rs full 16384x8192x3584", 16384, 3584, 4096}, {"rs block", 8192, 3584, 4096},
      {"rs full 2048x4096x4096", 2048, 4096, 2048},   {"rs block", 1024, 4096, 2048},
  };
  std::printf("%-26s %6s %6s %6s | %9s | %9s %9s(idx) | %9s %9s | %9s %9s\n", "shape", "M", "N", "K", "GemmEx", "Lt#0",
              "Lt best", "Ex b=1 C=D", "Lt b1 C=D", "Lt b1 C!=D", "best b1");
  for (const Shape& s : shapes) {
    Lt l = make_lt(lh, s.m, s.n, s.k, 8);
    const double ex = time_us([&] { gemmex(s.m, s.n, s.k, a, d, 0.f); });
    std::vector<double> lt0(l.algos.size()), lt1(l.algos.size()), lt1n(l.algos.size());
    for (size_t i = 0; i < l.algos.size(); ++i) {
      lt0[i] = time_us([&] { run_lt(l, int(i), w, a, d, d, 0.f); });
      lt1[i] = time_us([&] { run_lt(l, int(i), w, a, d, d, 1.f); });
      lt1n[i] = time_us([&] { run_lt(l, int(i), w, a, c, d, 1.f); });
    }
    const double ex1 = time_us([&] { gemmex(s.m, s.n, s.k, a, d, 1.f); });
    const size_t b0 = std::min_element(lt0.begin(), lt0.end()) - lt0.begin();
    const double best1 =
        std::min(*std::min_element(lt1.begin(), lt1.end()), *std::min_element(lt1n.begin(), lt1n.end()));
    std::printf("%-26s %6d %6d %6d | %9.1f | %9.1f %9.1f(%zu) | %9.1f %9.1f | %9.1f %9.1f\n", s.what, s.m, s.n, s.k, ex,
                lt0[0], lt0[b0], b0, ex1, lt1[0], lt1n[0], best1);
    std::printf("   all Lt b=0:");
    for (double x : lt0) std::printf(" %.1f", x);
    std::printf("\n   all Lt b=1 C!=D:");
    for (double x : lt1n) std::printf(" %.1f", x);
    std::printf("\n");
    std::fflush(stdout);
  }

  // Interference: GEMM alone vs beside copies. A push from GPU 1 into GPU 0 (the ag_gemm
  // pattern: the peer writes the gathered rows) and a local device-to-device copy.
  std::printf("\ninterference (GEMM on GPU 0, us per call, median):\n");
  const size_t kCopy = 64ull << 20;
  void *dst0, *src1 = nullptr, *src0;
  CK(cudaMalloc(&dst0, kCopy));
  CK(cudaMalloc(&src0, kCopy));
  cudaStream_t s1 = nullptr, s0c;
  CK(cudaStreamCreateWithFlags(&s0c, cudaStreamNonBlocking));
  if (ngpu > 1) {
    CK(cudaDeviceEnablePeerAccess(1, 0));
    CK(cudaSetDevice(1));
    CK(cudaDeviceEnablePeerAccess(0, 0));
    CK(cudaMalloc(&src1, kCopy));
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaSetDevice(0));
  }
  const Shape ishapes[] = {{"ag full 4096x8192x8192", 4096, 8192, 8192},
                           {"ag full 16384x8192x3584", 16384, 3584, 8192},
                           {"ag full 8192x8192x14336", 8192, 14336, 8192}};
  for (const Shape& s : ishapes) {
    const double alone = time_us([&] { gemmex(s.m, s.n, s.k, a, d, 0.f); }, 4, 9);
    double push = 0, local = 0;
    // Enough copies to outlast the timed GEMMs (2 warm-up + 9 x 4 calls): a 64 MiB push
    // takes ~170 us, a local copy ~40 us.
    const int push_copies = int(40 * alone / 150) + 4, local_copies = int(40 * alone / 35) + 4;
    if (ngpu > 1) {
      CK(cudaSetDevice(1));
      for (int i = 0; i < push_copies; ++i) CK(cudaMemcpyPeerAsync(dst0, 0, src1, 1, kCopy, s1));
      CK(cudaSetDevice(0));
      push = time_us([&] { gemmex(s.m, s.n, s.k, a, d, 0.f); }, 4, 9);
      CK(cudaSetDevice(1));
      cudaEvent_t t0, t1;
      CK(cudaStreamSynchronize(s1));
      CK(cudaEventCreate(&t0));
      CK(cudaEventCreate(&t1));
      CK(cudaEventRecord(t0, s1));
      for (int i = 0; i < 8; ++i) CK(cudaMemcpyPeerAsync(dst0, 0, src1, 1, kCopy, s1));
      CK(cudaEventRecord(t1, s1));
      CK(cudaEventSynchronize(t1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, t0, t1));
      std::printf("   (push alone: %.0f GB/s)\n", 8.0 * kCopy / (ms * 1e-3) / 1e9);
      CK(cudaSetDevice(0));
    }
    for (int i = 0; i < local_copies; ++i) CK(cudaMemcpyAsync(dst0, src0, kCopy, cudaMemcpyDeviceToDevice, s0c));
    local = time_us([&] { gemmex(s.m, s.n, s.k, a, d, 0.f); }, 4, 9);
    CK(cudaStreamSynchronize(s0c));
    std::printf("%-26s alone %8.1f | beside a peer push %8.1f (%.3fx) | beside a local copy %8.1f (%.3fx)\n", s.what,
                alone, push, push / alone, local, local / alone);
    std::fflush(stdout);
  }
  return 0;
}
