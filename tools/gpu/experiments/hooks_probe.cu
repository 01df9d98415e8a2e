// What the fused gemm_rs's GEMM pays for its hooks, one GPU (issue 6): the GEMM the 2-rank
// copy-engine fold runs (src/ops/gemm_overlap/fused.cpp, build_rs_ce / run_rs_ce, as rank 0),
// built up one hook at a time, without the communication -- the peer's slot is a local buffer
// and the signals its tiles wait for are already set -- against weft's plain GEMM and cuBLAS:
//   plain   : weft's GEMM (CTA pairs, all SMs, raster groups of 16)
//   ctas    : the fold's grid: SMs - 1 CTAs (even), raster groups of 8
//   order   : + the fold's order table (the peer's block first, in pieces of 8 M-blocks, then the
//             own block) and two destinations (peer rows to an outbox, own rows to C)
//   notify  : + a count per tile of the peer's block (local counters)
//   fold    : + the own tiles' waits at the epilogue (met) and the peer's slot added as a source
//             = the fused gemm_rs's GEMM
//   notify_d, fold_d: notify and fold with the counts deferred to k-block 4 of the next tile
//             (GemmHooks::notify_deferred + notify_flush_kb = 4), as the fold runs since 2026-11-25
//   waits_d : notify_d + the own tiles' waits at the epilogue (met), no source (plain stores)
//   fold_r  : fold_d with the own tiles reduce-adding (TMA reduce-add, bf16) into C instead of
//             adding a source in the epilogue (C would hold the peer's piece, copied there first)
// Each variant: 10 back-to-back calls between two events, all variants in turn over 9 rounds
// after 300 ms of heat; median µs per call.
// Build here (after tools/gpu/build.sh):
//   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude tools/gpu/experiments/hooks_probe.cu \
//     build-gpu/libweft.a -o .gpu/hooks_probe -lcuda -lcublasLt -lcublas -lnccl
// Run there: source tools/gpu/env.sh; .gpu/hooks_probe [MxKxN ...]   (the op's M x K_local x N)
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "probe_common.cuh"
#include "weft/kernels/gemm.hpp"

namespace {
template <class T>
T* upload(const std::vector<T>& h) {
  T* d = nullptr;
  CK(cudaMalloc(&d, std::max<size_t>(h.size(), 1) * sizeof(T)));
  CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> shapes =
      probe::shapes_from(argc, argv, {"4096x4096x8192", "2048x2048x4096", "8192x4096x14336", "16384x4096x3584"});
  cublasHandle_t bh = probe::init_stream();
  cudaStream_t s = probe::g_stream;
  cudaEvent_t e0 = probe::g_e0, e1 = probe::g_e1;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("%-16s | %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s | %s\n", "M x K x N", "cuBLAS", "plain", "ctas", "order",
              "notify", "fold", "notify_d", "fold_d", "fold_r", "waits_d", "each / plain");
  for (const std::string& sh : shapes) {
    int m = 0, k = 0, n = 0;
    if (std::sscanf(sh.c_str(), "%dx%dx%d", &m, &k, &n) != 3) return 2;
    const int ms = m / 2, tm = 128, tiles_n = (n + 255) / 256, blocks = ms / tm;
    __nv_bfloat16 *a, *b, *c, *outbox, *slot;
    CK(cudaMalloc(&a, size_t(m) * k * 2));
    CK(cudaMalloc(&b, size_t(n) * k * 2));
    CK(cudaMalloc(&c, size_t(ms) * n * 2));
    CK(cudaMalloc(&outbox, size_t(m) * n * 2));
    CK(cudaMalloc(&slot, size_t(ms) * n * 2));
    probe::fill<<<1024, 256>>>(a, size_t(m) * k, 1);
    probe::fill<<<1024, 256>>>(b, size_t(n) * k, 2);
    probe::fill<<<1024, 256>>>(slot, size_t(ms) * n, 3);
    // The fold's tables for rank 0 of 2 (build_rs_ce): pieces of >= 8 M-blocks, <= 8 pieces.
    int pieces = std::clamp(blocks / 8, 1, 8);
    if (blocks * tiles_n <= sms - 1) pieces = 1;
    while (pieces > 1 && blocks % pieces != 0) --pieces;
    const int bpp = blocks / pieces;
    std::vector<int32_t> order, nidx, nrank, wbegin{0}, widx, wpeer;
    std::vector<int8_t> dest;
    std::vector<uint64_t> wval;
    for (int d = 1; d <= 2; ++d) {
      const int p = d % 2;  // the peer (1) first, then the own block (0)
      for (int j = 0; j < pieces; ++j) {
        std::vector<int> bl;
        for (int x = j * bpp; x < (j + 1) * bpp; ++x) bl.push_back(p * blocks + x);
        const size_t group = std::min<size_t>(bl.size(), 16);
        for (size_t g = 0; g < bl.size(); g += group)
          for (int nb = 0; nb < tiles_n; ++nb)
            for (size_t i = g; i < std::min(bl.size(), g + group); ++i) {
              order.push_back(bl[i] * tiles_n + nb);
              dest.push_back(p == 0 ? 0 : 1);
              nidx.push_back(p == 0 ? -1 : j);
              nrank.push_back(0);
            }
      }
    }
    for (int mb = 0; mb < 2 * blocks; ++mb) {
      if (mb < blocks) {  // own block: wait for the peer's piece of its rows (signal 8 + piece)
        widx.push_back(8 + mb / bpp);
        wval.push_back(1);
        wpeer.push_back(1);
      }
      wbegin.push_back(static_cast<int32_t>(widx.size()));
    }
    int32_t *d_order = upload(order), *d_nidx = upload(nidx), *d_nrank = upload(nrank), *d_wbegin = upload(wbegin),
            *d_widx = upload(widx), *d_wpeer = upload(wpeer);
    int8_t* d_dest = upload(dest);
    std::vector<int8_t> dest_r = dest;  // own tiles (dest 0) reduce-add
    for (auto& x : dest_r)
      if (x == 0) x = weft::kernels::kGemmDestReduce;
    int8_t* d_dest_r = upload(dest_r);
    uint64_t* d_wval = upload(wval);
    uint64_t* heap = nullptr;  // [0, 8): the piece counters; [8, 16): the peer's pieces, set to 2^40 (met)
    CK(cudaMalloc(&heap, 64 * 8));
    {
      std::vector<uint64_t> h(64, 0);
      for (int i = 8; i < 16; ++i) h[i] = 1ull << 40;
      h[32] = 1;  // the wait scale (the call counter)
      CK(cudaMemcpy(heap, h.data(), 64 * 8, cudaMemcpyHostToDevice));
    }
    weft::dev::DeviceCtx ctx{};
    ctx.rank = 0;
    ctx.world = 1;
    ctx.heap_bytes = 64 * 8;
    ctx.timeout_ns = 10'000'000'000ull;
    ctx.peer_base[0] = reinterpret_cast<char*>(heap);

    auto base = [&] {
      weft::kernels::GemmArgs g;
      g.m = m, g.n = n, g.k = k;
      g.a = a, g.lda = k, g.b = b, g.ldb = k, g.ldc = n;
      return g;
    };
    const char* why = nullptr;
    std::vector<std::function<void()>> variants;
    variants.push_back([&] {  // cuBLAS
      const float alpha = 1.f, beta = 0.f;
      if (cublasGemmEx(bh, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, b, CUDA_R_16BF, k, a, CUDA_R_16BF, k, &beta,
                       outbox, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
        std::exit(4);
    });
    variants.push_back([&] {  // plain
      auto g = base();
      g.c[0] = outbox;
      CK(weft::kernels::gemm(g, {}, s, &why));
    });
    variants.push_back([&] {  // ctas
      auto g = base();
      g.c[0] = outbox;
      g.ctas = sms - 1;
      g.group_m = 8;
      g.cluster_m = 2;
      CK(weft::kernels::gemm(g, {}, s, &why));
    });
    auto fold_args = [&](int level, bool deferred, bool reduce = false, bool no_src = false) {
      auto g = base();
      g.ctas = sms - 1;
      g.cluster_m = 2;
      g.num_dests = 2;
      g.c[0] = c, g.c_row0[0] = 0, g.c_rows[0] = ms;
      g.c[1] = outbox, g.c_row0[1] = 0, g.c_rows[1] = m;
      weft::kernels::GemmHooks h;
      h.ctx = ctx;
      h.order = d_order;
      h.dest = reduce ? d_dest_r : d_dest;
      if (level >= 1) {
        h.notify_idx = d_nidx;
        h.notify_rank = d_nrank;
        h.notify_off = 0;
        h.notify_deferred = deferred;
        h.notify_flush_kb = deferred ? 4 : 0;
      }
      if (level >= 2) {
        if (!reduce && !no_src) g.src[0] = slot, g.num_src = 1, g.ld_src = n, g.src_row0 = 0, g.src_rows = ms;
        h.wait_begin = d_wbegin, h.wait_idx = d_widx, h.wait_val = d_wval, h.wait_peer = d_wpeer;
        h.wait_off = 0;
        h.wait_per_mblock = true;
        h.wait_at_epilogue = true;
        h.wait_scale_dev = heap + 32;
      }
      CK(weft::kernels::gemm(g, h, s, &why));
    };
    variants.push_back([&] { fold_args(0, false); });
    variants.push_back([&] { fold_args(1, false); });
    variants.push_back([&] { fold_args(2, false); });
    variants.push_back([&] { fold_args(1, true); });
    variants.push_back([&] { fold_args(2, true); });
    variants.push_back([&] { fold_args(2, true, true); });
    variants.push_back([&] { fold_args(2, true, false, true); });
    if (order.size() != static_cast<size_t>(weft::kernels::gemm_positions(m, n, 2))) {
      std::printf("%s: order table %zu positions, the kernel runs %d: skipped\n", sh.c_str(), order.size(),
                  weft::kernels::gemm_positions(m, n, 2));
      continue;
    }
    // Heat, then the rounds.
    for (size_t v = 0; v < variants.size(); ++v) {  // each once, checked on its own
      variants[v]();
      CK(cudaStreamSynchronize(s));
      if (std::getenv("PROBE_VERBOSE")) std::fprintf(stderr, "%s: variant %zu ran\n", sh.c_str(), v);
    }
    CK(cudaEventRecord(e0, s));
    variants[1]();
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms_one = 0;
    CK(cudaEventElapsedTime(&ms_one, e0, e1));
    for (int i = 0, heat = std::max(10, int(300 / std::max(ms_one, 0.01f))); i < heat; ++i) variants[1]();
    std::vector<std::vector<double>> t(variants.size());
    for (int r = 0; r < 9; ++r)
      for (size_t v = 0; v < variants.size(); ++v) {
        CK(cudaEventRecord(e0, s));
        for (int i = 0; i < 10; ++i) variants[v]();
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms_v = 0;
        CK(cudaEventElapsedTime(&ms_v, e0, e1));
        t[v].push_back(ms_v * 1e3 / 10);
        if (std::getenv("PROBE_VERBOSE")) std::fprintf(stderr, "round %d variant %zu: %.1f us\n", r, v, ms_v * 1e2);
      }
    std::vector<double> med;
    for (auto& x : t) med.push_back(probe::median(x));
    std::printf(
        "%-16s | %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f | cuBLAS %.3f, ctas %.3f, order "
        "%.3f, notify %.3f, fold %.3f, notify_d %.3f, fold_d %.3f, fold_r %.3f, waits_d %.3f (pieces %d)\n",
        sh.c_str(), med[0], med[1], med[2], med[3], med[4], med[5], med[6], med[7], med[8], med[9], med[0] / med[1],
        med[2] / med[1], med[3] / med[1], med[4] / med[1], med[5] / med[1], med[6] / med[1], med[7] / med[1],
        med[8] / med[1], med[9] / med[1], pieces);
    std::fflush(stdout);
    for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(c), static_cast<void*>(outbox),
                    static_cast<void*>(slot), static_cast<void*>(heap), static_cast<void*>(d_order),
                    static_cast<void*>(d_nidx), static_cast<void*>(d_nrank), static_cast<void*>(d_wbegin),
                    static_cast<void*>(d_widx), static_cast<void*>(d_wpeer), static_cast<void*>(d_dest),
                    static_cast<void*>(d_dest_r), static_cast<void*>(d_wval)})
      CK(cudaFree(p));
  }
  return 0;
}
