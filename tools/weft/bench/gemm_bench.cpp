#include "weft/bench/gemm_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "weft/bench/devapi_bench.hpp"  // median
#include "weft/bench/shape.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/gemm.hpp"
#ifdef WEFT_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "weft/bench/graph_timing.hpp"  // event_us
#include "weft/core/cuda_check.hpp"
#include "weft/kernels/gemm.hpp"
#include "weft/runtime/backend.hpp"
#endif

namespace weft::bench {
namespace {

using Shape = GemmShape;

std::vector<Shape> parse_shapes(const std::vector<std::string>& in, const std::vector<Shape>& defaults) {
  if (in.empty()) return defaults;
  std::vector<Shape> out;
  for (const auto& s : in) out.push_back(parse_gemm_shape(s));
  return out;
}

double tflops(const Shape& s, double us) { return 2.0 * s.m * s.n * s.k / (us * 1e-6) / 1e12; }

// CPU tile reference (host backend): small shapes, wall clock.
GemmBenchResult bench_cpu(const GemmBenchOptions& opt) {
  GemmBenchResult r;
  r.device = "CPU (host backend: the CPU tile reference)";
  r.timing = "wall clock, median of 3 runs";
  const auto shapes = parse_shapes(
      opt.shapes, opt.quick ? std::vector<Shape>{{64, 64, 64}} : std::vector<Shape>{{128, 256, 256}, {256, 512, 256}});
  for (const auto& s : shapes) {
    std::vector<uint16_t> a(s.m * s.k), b(s.n * s.k), c(s.m * s.n);
    std::mt19937 rng(1);
    for (auto& x : a) x = dev::from_float<dev::bf16_t>(static_cast<float>(static_cast<int>(rng() % 5) - 2)).bits;
    for (auto& x : b) x = dev::from_float<dev::bf16_t>(static_cast<float>(static_cast<int>(rng() % 5) - 2)).bits;
    ops::CpuGemm g{dev::DType::kBF16, dev::DType::kBF16, false, a.data(), s.k, b.data(), s.k, c.data(), s.n, s.k};
    std::vector<double> us;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      ops::gemm_cpu(g, s.m, s.n);
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    GemmPoint p{s.m, s.n, s.k, "bf16", "nk", "cpu", median(us), 0, 0, 0};
    p.tflops = tflops(s, p.median_us);
    if (opt.progress) opt.progress(fmt::format("cpu {}x{}x{}: {:.0f} us", s.m, s.k, s.n, p.median_us));
    r.points.push_back(p);
  }
  return r;
}

#ifdef WEFT_HAVE_CUDA

struct Variant {
  dev::DType dtype;
  bool b_kn;
};

GemmBenchResult bench_gpu(const GemmBenchOptions& opt) {
  GemmBenchResult r;
  cudaDeviceProp prop{};
  WEFT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  r.device = prop.name;
  // WEFT_BENCH_SUSTAIN_MS=t: before each timing, t ms of back-to-back calls (steady power/clock).
  const int64_t sustain_ms = tunable_value(tunables::kBenchSustainMs);
  // WEFT_BENCH_WEFT_FIRST=1: weft runs first in round 0 (right after each shape's set-up,
  // when the GPU has been idle), cuBLAS first in round 1 -- the mirror of the default.
  const int cublas_first_parity = tunable_value(tunables::kBenchWeftFirst) != 0 ? 1 : 0;  // rounds where cuBLAS runs first
  r.timing = fmt::format(
      "CUDA events around batches of calls (10 for < 1 ms, else 3), median of 9 batches, after warm-up{}; 4 (sustained: 2) "
      "interleaved rounds (cuBLAS, weft, weft single CTAs, weft K-32 stages; odd rounds cuBLAS last), each one's "
      "best round; cuBLAS: "
      "cublasGemmEx, CUBLAS_COMPUTE_32F, default algorithm; same buffers for all",
      sustain_ms > 0 ? fmt::format(" and {} ms of back-to-back calls (sustained clock)", sustain_ms) : "");
  const std::vector<Shape> defaults = {
      {8192, 8192, 14336}, {4096, 8192, 8192}, {16384, 8192, 3584}, {2048, 4096, 4096}, {8192, 8192, 8192}};
  const auto shapes = parse_shapes(opt.shapes, opt.quick ? std::vector<Shape>{{2048, 4096, 4096}} : defaults);
  const std::vector<Variant> variants = {
      {dev::DType::kBF16, false}, {dev::DType::kBF16, true}, {dev::DType::kF16, false}};
  cublasHandle_t h = nullptr;
  WEFT_CUBLAS_CHECK(cublasCreate(&h));
  cudaStream_t stream = nullptr;
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  WEFT_CUBLAS_CHECK(cublasSetStream(h, stream));
  void* ws = nullptr;
  const size_t ws_bytes = 64ull << 20;
  WEFT_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  WEFT_CUBLAS_CHECK(cublasSetWorkspace(h, ws, ws_bytes));
  cudaEvent_t e0, e1;
  WEFT_CUDA_CHECK(cudaEventCreate(&e0));
  WEFT_CUDA_CHECK(cudaEventCreate(&e1));

  for (const auto& s : shapes) {
    for (const auto& v : variants) {
      if (opt.quick && (v.b_kn || v.dtype != dev::DType::kBF16)) continue;
      const size_t na = s.m * s.k, nb = s.n * s.k, nc = s.m * s.n;
      std::vector<uint16_t> ha(na), hb(nb);
      std::mt19937 rng(42);
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      auto enc = [&](float x) { return dev::to_bits16(x, v.dtype); };
      for (auto& x : ha) x = enc(u(rng));
      for (auto& x : hb) x = enc(u(rng));
      void *da = nullptr, *db = nullptr, *dc = nullptr, *dref = nullptr;
      WEFT_CUDA_CHECK(cudaMalloc(&da, na * 2));
      WEFT_CUDA_CHECK(cudaMalloc(&db, nb * 2));
      WEFT_CUDA_CHECK(cudaMalloc(&dc, nc * 2));
      WEFT_CUDA_CHECK(cudaMalloc(&dref, nc * 2));
      WEFT_CUDA_CHECK(cudaMemcpy(da, ha.data(), na * 2, cudaMemcpyHostToDevice));
      WEFT_CUDA_CHECK(cudaMemcpy(db, hb.data(), nb * 2, cudaMemcpyHostToDevice));
      const cudaDataType_t ct = v.dtype == dev::DType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
      const float alpha = 1.f, beta = 0.f;
      // Row-major C[M,N] = A[M,K] * op(B) is column-major C^T[N,M] = op(B)^T-ish * A^T.
      auto run_cublas = [&] {
        if (v.b_kn)
          WEFT_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, s.n, s.m, s.k, &alpha, db, ct, s.n, da, ct, s.k,
                                         &beta, dref, ct, s.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        else
          WEFT_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, s.n, s.m, s.k, &alpha, db, ct, s.k, da, ct, s.k,
                                         &beta, dref, ct, s.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      };
      kernels::GemmArgs ga;
      ga.m = static_cast<int>(s.m);
      ga.n = static_cast<int>(s.n);
      ga.k = static_cast<int>(s.k);
      ga.type = v.dtype == dev::DType::kBF16 ? kernels::GemmType::kBF16 : kernels::GemmType::kF16;
      ga.b_layout = v.b_kn ? kernels::GemmBLayout::kKN : kernels::GemmBLayout::kNK;
      ga.a = da;
      ga.lda = s.k;
      ga.b = db;
      ga.ldb = v.b_kn ? s.n : s.k;
      ga.c[0] = dc;
      ga.ldc = s.n;
      auto run_weft = [&] { ops::gemm_gpu(ga, {}, stream); };
      kernels::GemmArgs ga1 = ga;  // the other grid: single CTAs (weft runs CTA pairs sharing B)
      ga1.cluster_m = 1;
      auto run_weft1 = [&] { ops::gemm_gpu(ga1, {}, stream); };
      kernels::GemmArgs ga2 = ga;  // 8 stages of K 32 instead of 4 of K 64
      ga2.k_block = 32;
      auto run_weft2 = [&] { ops::gemm_gpu(ga2, {}, stream); };
      auto time = [&](const std::function<void()>& f) {
        for (int i = 0; i < 3; ++i) f();
        if (sustain_ms > 0) {
          // Sustained: run back to back for sustain_ms first, so the GPU reaches the power and
          // clock it holds under this kernel (these GEMMs are power-capped at 700 W on H200).
          WEFT_CUDA_CHECK(cudaEventRecord(e0, stream));
          for (float ms = 0; ms < static_cast<float>(sustain_ms);) {
            for (int i = 0; i < 10; ++i) f();
            WEFT_CUDA_CHECK(cudaEventRecord(e1, stream));
            WEFT_CUDA_CHECK(cudaEventSynchronize(e1));
            WEFT_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
          }
        }
        const int batch = event_us(stream, e0, e1, f) < 1000.0 ? 10 : 3;
        std::vector<double> us;
        for (int rep = 0; rep < (opt.quick ? 5 : 9); ++rep)
          us.push_back(event_us(stream, e0, e1, [&] {
                         for (int i = 0; i < batch; ++i) f();
                       }) / batch);
        return median(us);
      };
      // Interleaved rounds (cuBLAS, weft, single-CTA weft, ...): clocks drift between runs on
      // the shared machine, so each round compares the same conditions; report each one's
      // best round median.
      const bool ladder = !v.b_kn && v.dtype == dev::DType::kBF16;
      double t_cublas = 1e30, t_weft = 1e30, t_weft1 = ladder ? 1e30 : 0, t_weft2 = ladder ? 1e30 : 0;
      int ctas = 0, cluster = 0;
      // Odd rounds run cuBLAS last, so neither side always runs first after a pause (where
      // the GPU has boost headroom). Measured: the order did not explain the short-timing gap
      // to cuBLAS (docs/gemm.md, "Why the bench times a sustained load").
      for (int round = 0; round < (opt.quick || sustain_ms > 0 ? 2 : 4); ++round) {
        if (round % 2 == cublas_first_parity) t_cublas = std::min(t_cublas, time(run_cublas));
        t_weft = std::min(t_weft, time(run_weft));
        if (round == 0) kernels::gemm_last_launch(&ctas, &cluster);
        if (ladder) t_weft1 = std::min(t_weft1, time(run_weft1));
        if (ladder) t_weft2 = std::min(t_weft2, time(run_weft2));
        if (round % 2 != cublas_first_parity) t_cublas = std::min(t_cublas, time(run_cublas));
      }
      // Correctness: weft vs cuBLAS on the same inputs.
      std::vector<uint16_t> hc(nc), hr(nc);
      WEFT_CUDA_CHECK(cudaMemcpy(hc.data(), dc, nc * 2, cudaMemcpyDeviceToHost));
      WEFT_CUDA_CHECK(cudaMemcpy(hr.data(), dref, nc * 2, cudaMemcpyDeviceToHost));
      auto dec = [&](uint16_t x) { return dev::from_bits16(x, v.dtype); };
      double max_rel = 0, ref_scale = 0;
      int64_t nans = 0;
      for (size_t i = 0; i < nc; ++i) ref_scale = std::max(ref_scale, std::fabs(static_cast<double>(dec(hr[i]))));
      for (size_t i = 0; i < nc; ++i) {
        const double a = dec(hc[i]), b = dec(hr[i]);
        if (std::isnan(a)) ++nans;
        // Relative to the output's scale: elements near zero have no meaningful relative error.
        max_rel = std::max(max_rel, std::fabs(a - b) / std::max(std::fabs(b), 0.05 * ref_scale));
      }
      const std::string dt = dev::dtype_name(v.dtype), bl = v.b_kn ? "kn" : "nk";
      r.points.push_back({s.m, s.n, s.k, dt, bl, "cublas", t_cublas, tflops(s, t_cublas), 0, 0});
      r.points.push_back({s.m, s.n, s.k, dt, bl, "weft", t_weft, tflops(s, t_weft), max_rel, nans});
      if (ladder) r.points.push_back({s.m, s.n, s.k, dt, bl, "weft-single-cta", t_weft1, tflops(s, t_weft1), 0, 0});
      if (ladder) r.points.push_back({s.m, s.n, s.k, dt, bl, "weft-k32", t_weft2, tflops(s, t_weft2), 0, 0});
      if (opt.progress)
        opt.progress(
            fmt::format("{}x{}x{} {} {}: cuBLAS {:.1f} us, weft {:.1f} us ({:.3f}x; {} CTAs, clusters of {}), "
                        "single-CTA weft {:.1f} us, max rel err {:.2e}",
                        s.m, s.k, s.n, dt, bl, t_cublas, t_weft, t_weft / t_cublas, ctas, cluster, t_weft1, max_rel));
      cudaFree(da);
      cudaFree(db);
      cudaFree(dc);
      cudaFree(dref);
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(ws);
  cublasDestroy(h);
  cudaStreamDestroy(stream);
  return r;
}
#endif

}  // namespace

GemmBenchResult bench_gemm(const GemmBenchOptions& opt) {
#ifdef WEFT_HAVE_CUDA
  if (count_gpus() > 0) return bench_gpu(opt);
#endif
  return bench_cpu(opt);
}

nlohmann::json to_json(const GemmBenchResult& r) {
  nlohmann::json j;
  j["bench"] = "gemm";
  j["device"] = r.device;
  j["timing"] = r.timing;
  j["shape_order"] = "M x K x N; C[M,N] = A[M,K] * B; nk: B = W[N,K] (torch linear), kn: B[K,N]";
  for (const auto& p : r.points)
    j["points"].push_back({{"m", p.m},
                           {"n", p.n},
                           {"k", p.k},
                           {"dtype", p.dtype},
                           {"b_layout", p.b_layout},
                           {"impl", p.impl},
                           {"median_us", p.median_us},
                           {"tflops", p.tflops},
                           {"max_rel_err", p.max_rel_err},
                           {"nan_count", p.nan_count}});
  return j;
}

std::string to_table(const GemmBenchResult& r) {
  std::string out = fmt::format("{} ({})\n", r.device, r.timing);
  out += fmt::format("{:>22} {:>5} {:>3} {:>10} {:>10} {:>9} {:>9} {:>7} {:>9}\n", "MxKxN", "dtype", "B", "cublas us",
                     "weft us", "cublas TF", "weft TF", "weft/cb", "rel err");
  for (size_t i = 0; i < r.points.size(); ++i) {
    const auto& p = r.points[i];
    if (p.impl == "cpu") {
      out += fmt::format("{:>22} {:>5} {:>3} {:>10} {:>10.1f} {:>9} {:>9.4f}\n", fmt::format("{}x{}x{}", p.m, p.k, p.n),
                         p.dtype, p.b_layout, "-", p.median_us, "-", p.tflops);
      continue;
    }
    if (p.impl == "weft-single-cta" || p.impl == "weft-k32") {
      const size_t back = p.impl == "weft-single-cta" ? 2 : 3;  // the cuBLAS row of this shape
      const double ratio = r.points[i - back].tflops > 0 ? p.tflops / r.points[i - back].tflops : 0.0;
      out += fmt::format("{:>22} {:>5} {:>3} {:>10} {:>10.1f} {:>9} {:>9.1f} {:>7.3f}   ({})\n", "", "", "", "",
                         p.median_us, "", p.tflops, ratio,
                         p.impl == "weft-k32" ? "8 stages of K 32" : "single CTAs");
      continue;
    }
    if (p.impl != "cublas" || i + 1 >= r.points.size()) continue;
    const auto& w = r.points[i + 1];
    out += fmt::format("{:>22} {:>5} {:>3} {:>10.1f} {:>10.1f} {:>9.1f} {:>9.1f} {:>7.3f} {:>9.2e}{}\n",
                       fmt::format("{}x{}x{}", p.m, p.k, p.n), p.dtype, p.b_layout, p.median_us, w.median_us, p.tflops,
                       w.tflops, p.tflops > 0 ? w.tflops / p.tflops : 0.0, w.max_rel_err,
                       w.nan_count ? fmt::format(" NaN x{}", w.nan_count) : "");
  }
  out += "weft/cb: weft's throughput over cuBLAS's (>= 0.95 is the issue's bar)\n";
  return out;
}

}  // namespace weft::bench
