// Per-tile timeline of weft's sm_90a GEMM (issue 6: why it trails cuBLAS at the short-K local
// GEMMs of gemm_rs), one GPU: the kernel's trace hook stamps, per schedule position, when the
// consumers began the tile's main loop (its first stage arrived) and when its stores were
// issued, and the SM. Printed: the kernel's span (CUDA events), per CTA the first tile's start
// after the earliest start, each tile's span, the gaps between one tile's stores and the next
// tile's start, and the last store to the kernel's end -- medians over CTAs.
// Build here (after tools/gpu/build.sh):
//   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude tools/gpu/experiments/gemm_trace_probe.cu \
//     build-gpu/libweft.a -o .gpu/gemm_trace_probe -lcuda -lcublasLt -lcublas
// Run there: source tools/gpu/env.sh; .gpu/gemm_trace_probe [MxKxN ...]
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "probe_common.cuh"
#include "weft/kernels/gemm.hpp"

namespace {
__global__ void stamp(uint64_t* t) {
  uint64_t v;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
  *t = v;
}
}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> shapes =
      probe::shapes_from(argc, argv, {"2048x2048x4096", "4096x4096x8192", "2048x4096x4096", "8192x8192x8192"});
  cublasHandle_t bh = probe::init_stream();
  cudaStream_t s = probe::g_stream;
  cudaEvent_t e0 = probe::g_e0, e1 = probe::g_e1;
  {
    // Two stamp kernels back to back: the launch gap the lines above include twice.
    uint64_t* st = nullptr;
    CK(cudaMalloc(&st, 16));
    std::vector<double> g;  // (this st is the stamp-only one)
    for (int i = 0; i < 20; ++i) {
      stamp<<<1, 1, 0, s>>>(st);
      stamp<<<1, 1, 0, s>>>(st + 1);
      uint64_t hs[2];
      CK(cudaStreamSynchronize(s));
      CK(cudaMemcpy(hs, st, 16, cudaMemcpyDeviceToHost));
      g.push_back((double(hs[1]) - double(hs[0])) / 1e3);
    }
    std::printf("stamp-only: stamp -> next stamp %.2f us (median of 20)\n", probe::median(g));
    CK(cudaFree(st));
  }
  for (const std::string& sh : shapes) {
    int m = 0, k = 0, n = 0;
    if (std::sscanf(sh.c_str(), "%dx%dx%d", &m, &k, &n) != 3) return 2;
    __nv_bfloat16 *a, *b, *c;
    CK(cudaMalloc(&a, size_t(m) * k * 2));
    CK(cudaMalloc(&b, size_t(n) * k * 2));
    CK(cudaMalloc(&c, size_t(m) * n * 2));
    probe::fill<<<1024, 256>>>(a, size_t(m) * k, 1);
    probe::fill<<<1024, 256>>>(b, size_t(n) * k, 2);
    weft::kernels::GemmArgs ga;
    ga.m = m, ga.n = n, ga.k = k;
    ga.a = a, ga.lda = k, ga.b = b, ga.ldb = k, ga.c[0] = c, ga.ldc = n;
    const int positions = weft::kernels::gemm_positions(m, n, 2);
    uint64_t* tr = nullptr;
    CK(cudaMalloc(&tr, size_t(3) * positions * 8));
    // globaltimer of a 1-thread kernel just before and just after: [0, 1] cuBLAS, [2, 3] the traced GEMM
    uint64_t* st = nullptr;
    CK(cudaMalloc(&st, 32));
    uint64_t* tc = nullptr;
    CK(cudaMalloc(&tc, 4 * 1024 * 8));
    CK(cudaMemset(tc, 0, 4 * 1024 * 8));
    weft::kernels::GemmHooks plain, traced;
    traced.trace = tr;
    traced.trace_cta = tc;
    const char* why = nullptr;
    // Heat: 300 ms of back-to-back calls (the power cap's clock, as the benches), then timed.
    for (int i = 0; i < 2; ++i) CK(weft::kernels::gemm(ga, plain, s, &why));
    CK(cudaEventRecord(e0, s));
    CK(weft::kernels::gemm(ga, plain, s, &why));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    const int heat = std::max(10, int(300 / std::max(ms, 0.01f)));
    for (int i = 0; i < heat; ++i) CK(weft::kernels::gemm(ga, plain, s, &why));
    std::vector<double> plain_us, traced_us, cublas_stamps;
    auto cublas = [&] {
      const float alpha = 1.f, beta = 0.f;
      if (cublasGemmEx(bh, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, b, CUDA_R_16BF, k, a, CUDA_R_16BF, k, &beta, c,
                       CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
        std::exit(4);
    };
    for (int i = 0; i < 3; ++i) cublas();
    std::vector<uint64_t> h(size_t(3) * positions);
    std::vector<double> first, spans, gaps, tail, ntiles;
    for (int r = 0; r < 9; ++r) {
      for (int t = 0; t < 2; ++t) {
        CK(cudaEventRecord(e0, s));
        if (t) stamp<<<1, 1, 0, s>>>(st + 2);
        CK(weft::kernels::gemm(ga, t ? traced : plain, s, &why));
        if (t) stamp<<<1, 1, 0, s>>>(st + 3);
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
        (t ? traced_us : plain_us).push_back(ms * 1e3);
      }
      {  // cuBLAS between the same two stamps
        stamp<<<1, 1, 0, s>>>(st);
        cublas();
        stamp<<<1, 1, 0, s>>>(st + 1);
        uint64_t hs[2];
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(hs, st, 16, cudaMemcpyDeviceToHost));
        cublas_stamps.push_back((double(hs[1]) - double(hs[0])) / 1e3);
      }
      if (r != 4) continue;
      CK(cudaMemcpy(h.data(), tr, h.size() * 8, cudaMemcpyDeviceToHost));
      uint64_t t0 = ~0ull, t1 = 0;
      std::map<uint64_t, std::vector<std::pair<uint64_t, uint64_t>>> per_sm;
      for (int p = 0; p < positions; ++p) {
        if (h[3 * p + 1] == 0) continue;  // phantom
        t0 = std::min(t0, h[3 * p]);
        t1 = std::max(t1, h[3 * p + 1]);
        per_sm[h[3 * p + 2]].push_back({h[3 * p], h[3 * p + 1]});
      }
      for (auto& [sm, v] : per_sm) {
        std::sort(v.begin(), v.end());
        first.push_back((v[0].first - t0) / 1e3);
        for (size_t i = 0; i < v.size(); ++i) {
          spans.push_back((v[i].second - v[i].first) / 1e3);
          if (i > 0) gaps.push_back((double(v[i].first) - double(v[i - 1].second)) / 1e3);
        }
        tail.push_back((t1 - v.back().second) / 1e3);
        ntiles.push_back(double(v.size()));
      }
      uint64_t hs[2];
      CK(cudaStreamSynchronize(s));
      CK(cudaMemcpy(hs, st + 2, 16, cudaMemcpyDeviceToHost));
      {
        std::vector<uint64_t> c4(4 * 1024);
        CK(cudaMemcpy(c4.data(), tc, c4.size() * 8, cudaMemcpyDeviceToHost));
        std::vector<double> entry, sync, issue, arrive;
        for (int i = 0; i < 1024 && c4[4 * i]; ++i) {
          entry.push_back((double(c4[4 * i]) - double(hs[0])) / 1e3);
          sync.push_back((double(c4[4 * i + 1]) - double(c4[4 * i])) / 1e3);
          issue.push_back((double(c4[4 * i + 2]) - double(c4[4 * i + 1])) / 1e3);
          arrive.push_back((double(c4[4 * i + 3]) - double(c4[4 * i + 2])) / 1e3);
        }
        std::printf(
            "%s: per CTA (median; %zu CTAs): stamp -> entry %.2f us (min %.2f, max %.2f), entry -> barrier "
            "set-up done %.2f, -> first TMA issued %.2f, -> first stage arrived %.2f\n",
            sh.c_str(), entry.size(), probe::median(entry), *std::min_element(entry.begin(), entry.end()),
            *std::max_element(entry.begin(), entry.end()), probe::median(sync), probe::median(issue),
            probe::median(arrive));
      }
      std::printf(
          "%s: stamp before -> first tile start %.2f us, first tile start -> last store %.1f us, last store -> "
          "stamp after %.2f us (two kernels on an idle stream, nothing between: %s)\n",
          sh.c_str(), (double(t0) - double(hs[0])) / 1e3, (t1 - t0) / 1e3, (double(hs[1]) - double(t1)) / 1e3,
          "see the stamp-only line");
    }
    std::printf("%s: stamp -> stamp around cuBLAS (median of 9): %.1f us\n", sh.c_str(), probe::median(cublas_stamps));
    {  // back to back: 10 calls between two events, weft and cuBLAS in turn, 9 rounds
      std::vector<double> bw, bc;
      for (int r = 0; r < 9; ++r)
        for (int t = 0; t < 2; ++t) {
          CK(cudaEventRecord(e0, s));
          for (int i = 0; i < 10; ++i) {
            if (t)
              cublas();
            else
              CK(weft::kernels::gemm(ga, plain, s, &why));
          }
          CK(cudaEventRecord(e1, s));
          CK(cudaEventSynchronize(e1));
          CK(cudaEventElapsedTime(&ms, e0, e1));
          (t ? bc : bw).push_back(ms * 1e3 / 10);
        }
      std::printf("%s: back to back (10 calls, median of 9 rounds): weft %.1f us, cuBLAS %.1f us per call\n",
                  sh.c_str(), probe::median(bw), probe::median(bc));
    }
    std::printf(
        "%s bf16 nk: kernel %.1f us (traced %.1f); per CTA (median over %zu SMs): %.0f tiles, first start +%.2f us "
        "(max %.2f), tile span %.2f us (min %.2f, max %.2f), gap store->next start %.2f us (max %.2f), last store -> "
        "end of all %.2f us\n",
        sh.c_str(), probe::median(plain_us), probe::median(traced_us), first.size(), probe::median(ntiles),
        probe::median(first), first.empty() ? 0 : *std::max_element(first.begin(), first.end()), probe::median(spans),
        spans.empty() ? 0 : *std::min_element(spans.begin(), spans.end()),
        spans.empty() ? 0 : *std::max_element(spans.begin(), spans.end()), probe::median(gaps),
        gaps.empty() ? 0 : *std::max_element(gaps.begin(), gaps.end()), probe::median(tail));
    std::fflush(stdout);
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFree(c));
    CK(cudaFree(tr));
    CK(cudaFree(tc));
  }
  return 0;
}
