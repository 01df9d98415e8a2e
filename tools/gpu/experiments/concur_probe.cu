// Concurrency probe for gemm_rs decomposed's cuBLAS pieces (issue 6), one GPU: how much do
// the pieces cost against one GEMM, and how much of it comes back when the own (folded)
// pieces run on a second, lower-priority stream beside the peer pieces instead of after them
// on one stream?
//
// For each local GEMM of the anchor shapes (docs/anchors.md) (M rows, N, K = the rank's K half) and c chunks:
//   full : one GEMM of M rows (cublasGemmEx: "GEMM alone")
//   seq  : the decomposed cuBLASLt fold as weft runs it: peer pieces P_j (M/2c rows, GemmEx),
//          each copied (device-to-device, on a copy stream: the stand-in of the NVLink copy),
//          then own pieces O_j = A_j B + (copy j) (cuBLASLt, C != D), all on one stream
//   conc : the same, O_j on a low-priority stream (each after copy j), P_j on a high-priority one
//   conc2: as conc, each O_j on its own low-priority stream (no order among them)
//   seq_w, conc_w: seq and conc with weft's synchronisation: after copy j the copy stream
//          writes flag j (an 8-byte copy-engine copy, as put_count), and O_j waits for a
//          1-thread kernel that spins on the flag (and clears it) -- on the copy stream
//          (seq_w, as weft's one-stream fold) or on a high-priority stream (conc_w, variant a
//          of bench/results/gemm_rs-prio-20261122/ at commit 57cb476). The kernel needs an SM: does it find one?
// One GPU only: on 2xH200 the multi-stream design measured no gain in the bench's sustained
// timing (2026-11-22); this probe's gain (docs/gemm_overlap.md) does not carry.
// Every variant is one CUDA graph; rounds replay every graph in turn (interleaved: all see the
// same power-capped clock) after 300 ms of heat; median µs per replay.
// Build here: nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a tools/gpu/experiments/concur_probe.cu \
//               -o .gpu/concur_probe -lcublasLt -lcublas
// Run there: source tools/gpu/env.sh; .gpu/concur_probe [rounds]
#include <string>

#include "probe_common.cuh"

using namespace probe;

namespace {

__global__ void spin_clear(unsigned long long* flag) {
  volatile unsigned long long* f = flag;
  while (*f == 0) {
  }
  *f = 0;
}

struct Fam {
  int m, n, k;
};

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 15;
  const size_t kA = 16384ull * 4096, kW = 14336ull * 4096, kC = 8192ull * 14336;
  const Setup st = setup(kA, kW, kC);
  __nv_bfloat16 *a = st.a, *w = st.w, *c = st.c, *d = st.d;
  __nv_bfloat16* scratch = nullptr;  // peer pieces' output (the outbox)
  __nv_bfloat16* slot = nullptr;     // where the "peer's" pieces land (the staging slot)
  CK(cudaMalloc(&scratch, kC * 2));
  CK(cudaMalloc(&slot, kC * 2));
  CK(cudaMemset(slot, 0, kC * 2));
  cublasHandle_t bh = st.bh;
  cublasLtHandle_t lh = st.lh;
  int lo = 0, hi = 0;
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t s_hi, s_lo[4], cs;
  CK(cudaStreamCreateWithPriority(&s_hi, cudaStreamNonBlocking, hi));
  for (auto& x : s_lo) CK(cudaStreamCreateWithPriority(&x, cudaStreamNonBlocking, lo));
  CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  cudaStream_t s_wait;
  CK(cudaStreamCreateWithPriority(&s_wait, cudaStreamNonBlocking, hi));
  unsigned long long *flags = nullptr, *one = nullptr;
  CK(cudaMalloc(&flags, 8 * 8));
  CK(cudaMemset(flags, 0, 8 * 8));
  CK(cudaMalloc(&one, 8));
  const unsigned long long kOne = 1;
  CK(cudaMemcpy(one, &kOne, 8, cudaMemcpyHostToDevice));
  std::vector<cudaEvent_t> ev(64);
  for (auto& e : ev) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));

  auto gemmex = [&](cudaStream_t s, const __nv_bfloat16* ap, __nv_bfloat16* dp, int m, int n, int k) {
    const float alpha = 1.f, beta = 0.f;
    CB(cublasSetStream(bh, s));
    CB(cublasGemmEx(bh, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF, k, ap, CUDA_R_16BF, k, &beta, dp,
                    CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  // The fastest of cuBLASLt's first 8 candidates for D = A B + C (C != D) at m rows, timed once.
  auto pick_lt = [&](int m, int n, int k) {
    Lt l = make_lt(lh, m, n, k, 8);
    double best = 1e30;
    int bi = 0;
    for (size_t i = 0; i < l.algos.size(); ++i) {
      const double t = time_us([&] { run_lt(l, int(i), w, a, c, d, 1.f); }, 3, 5);
      if (t < best) best = t, bi = int(i);
    }
    return std::pair<Lt, int>(l, bi);
  };
  auto lt_on = [&](cudaStream_t s, const Lt& l, int i, const void* ap, const void* cp, void* dp) {
    const float alpha = 1.f, beta = 1.f;
    CB(cublasLtMatmul(l.h, l.op, &alpha, w, l.la, ap, l.lb, &beta, cp, l.lc, dp, l.lc, &l.algos[i].algo, g_ws, kWs, s));
  };

  // Heat: 300 ms of a large GEMM back to back.
  for (int i = 0; i < 200; ++i) gemmex(g_stream, a, d, 8192, 3584, 4096);
  CK(cudaStreamSynchronize(g_stream));

  const std::vector<Fam> fams = {{4096, 8192, 4096}, {2048, 4096, 2048}, {8192, 14336, 4096}, {16384, 3584, 4096}};
  constexpr int kV = 6;
  std::printf("%-16s %2s | %8s %8s %8s %8s %8s %8s | %6s %6s %6s %6s %6s\n", "M x N x K", "c", "full", "seq", "conc",
              "conc2", "seq_w", "conc_w", "seq/f", "conc/f", "conc2/f", "seq_w/f", "conc_w/f");
  for (const Fam& f : fams) {
    for (int chunks : {1, 2, 4}) {
      const int rows = f.m / 2 / chunks;  // rows of a piece
      if (rows % 128) continue;
      auto [lt, li] = pick_lt(rows, f.n, f.k);
      const size_t piece = size_t(rows) * f.n;  // elements
      // variant 0 full, 1 seq, 2 conc, 3 conc2, 4 seq_w, 5 conc_w
      cudaGraphExec_t g[kV];
      for (int v = 0; v < kV; ++v) {
        const bool waits = v >= 4;
        const bool one_stream = v == 1 || v == 4;
        cudaStream_t s = g_stream;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        if (v == 0) {
          gemmex(s, a, d, f.m, f.n, f.k);
        } else {
          int e = 0;
          cudaStream_t sp = one_stream ? s : s_hi;
          CK(cudaEventRecord(ev[e], s));
          CK(cudaStreamWaitEvent(cs, ev[e], 0));
          if (sp != s) CK(cudaStreamWaitEvent(sp, ev[e], 0));
          ++e;
          std::vector<int> copied(chunks);
          for (int j = 0; j < chunks; ++j) {
            gemmex(sp, a + size_t(j) * rows * f.k, scratch + j * piece, rows, f.n, f.k);
            CK(cudaEventRecord(ev[e], sp));
            CK(cudaStreamWaitEvent(cs, ev[e++], 0));
            CK(cudaMemcpyAsync(slot + j * piece, scratch + j * piece, piece * 2, cudaMemcpyDeviceToDevice, cs));
            if (waits) {
              CK(cudaMemcpyAsync(flags + j, one, 8, cudaMemcpyDeviceToDevice, cs));
              cudaStream_t sw = one_stream ? cs : s_wait;
              if (sw != cs) {
                CK(cudaEventRecord(ev[e], cs));
                CK(cudaStreamWaitEvent(sw, ev[e++], 0));
              }
              spin_clear<<<1, 1, 0, sw>>>(flags + j);
              CK(cudaGetLastError());
              CK(cudaEventRecord(ev[e], sw));
            } else {
              CK(cudaEventRecord(ev[e], cs));
            }
            copied[j] = e++;
          }
          std::vector<cudaStream_t> used;
          for (int j = 0; j < chunks; ++j) {
            cudaStream_t so = one_stream ? s : v == 3 ? s_lo[j] : s_lo[0];
            CK(cudaStreamWaitEvent(so, ev[copied[j]], 0));
            const size_t r0 = size_t(f.m / 2) + size_t(j) * rows;  // own rows
            lt_on(so, lt, li, a + r0 * f.k, slot + j * piece, d + r0 * f.n);
            if (so != s && std::find(used.begin(), used.end(), so) == used.end()) used.push_back(so);
          }
          if (sp != s) used.push_back(sp);
          used.push_back(cs);
          if (waits && !one_stream) used.push_back(s_wait);
          for (cudaStream_t x : used) {
            CK(cudaEventRecord(ev[e], x));
            CK(cudaStreamWaitEvent(s, ev[e++], 0));
          }
        }
        cudaGraph_t graph;
        CK(cudaStreamEndCapture(s, &graph));
        CK(cudaGraphInstantiate(&g[v], graph, 0));
        CK(cudaGraphDestroy(graph));
      }
      std::vector<std::vector<double>> t(kV);
      for (int r = -1; r < rounds; ++r)
        for (int v = 0; v < kV; ++v) {
          CK(cudaEventRecord(g_e0, g_stream));
          for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(g[v], g_stream));
          CK(cudaEventRecord(g_e1, g_stream));
          CK(cudaEventSynchronize(g_e1));
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, g_e0, g_e1));
          if (r >= 0) t[v].push_back(ms * 1e3 / 3);
        }
      double med[kV];
      for (int v = 0; v < kV; ++v) {
        std::sort(t[v].begin(), t[v].end());
        med[v] = t[v][t[v].size() / 2];
        CK(cudaGraphExecDestroy(g[v]));
      }
      const std::string name = std::to_string(f.m) + "x" + std::to_string(f.n) + "x" + std::to_string(f.k);
      std::printf("%-16s %2d | %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f | %6.3f %6.3f %6.3f %6.3f %6.3f\n", name.c_str(),
                  chunks, med[0], med[1], med[2], med[3], med[4], med[5], med[1] / med[0], med[2] / med[0],
                  med[3] / med[0], med[4] / med[0], med[5] / med[0]);
      std::fflush(stdout);
      cublasLtMatmulDescDestroy(lt.op);
      cublasLtMatrixLayoutDestroy(lt.la);
      cublasLtMatrixLayoutDestroy(lt.lb);
      cublasLtMatrixLayoutDestroy(lt.lc);
    }
  }
  return 0;
}
