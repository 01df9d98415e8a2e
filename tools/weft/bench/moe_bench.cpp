#include "weft/bench/moe_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>

#include "weft/bench/bench_buffer.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/moe.hpp"

#ifdef WEFT_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <random>

#include "weft/bench/graph_timing.hpp"
#include "weft/core/cuda_check.hpp"
#include "weft/device/dtype.hpp"
#include "weft/kernels/gemm.hpp"
#include "weft/ops/gemm.hpp"
#endif

namespace weft::bench {
namespace {

struct MoeShape {
  const char* name;
  int64_t hidden, experts, top_k;
  int64_t ffn = 0;  // the expert's intermediate size (the experts' GEMMs only)
};
// The shapes.
constexpr MoeShape kShapes[] = {
    {"mixtral", 4096, 8, 2, 14336}, {"qwen3-30b-a3b", 2048, 128, 8, 768}, {"deepseek-v3-like", 7168, 64, 8, 2048}};

using Mem = BenchBuffer;  // bytes in the backend's memory

// Rank r's routing: top_k distinct uniform experts per token (a seeded LCG).
std::vector<int32_t> routing(int r, int64_t tokens, int64_t experts, int64_t k) {
  uint64_t s = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(r + 1);
  std::vector<int32_t> ids(static_cast<size_t>(tokens * k));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < k; ++j) {
      int32_t e;
      bool again;
      do {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        e = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(experts));
        again = false;
        for (int64_t q = 0; q < j; ++q) again |= ids[static_cast<size_t>(t * k + q)] == e;
      } while (again);
      ids[static_cast<size_t>(t * k + j)] = e;
    }
  return ids;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

#ifdef WEFT_HAVE_CUDA
// Rows local expert g of `local` receives in the experts' benchmark: the mean of uniform
// routing, T * top_k * world / E, spread over 0.75 ... 1.24 of it by a fixed pattern (the same
// formula as bench/torch_grouped_mm_peer.py).
int64_t expert_rows(const MoeShape& sh, int64_t T, int world, int64_t g) {
  return T * sh.top_k * world * (96 + (g * 37) % 64) / (sh.experts * 128);
}

// The experts' two GEMMs on this rank (gate/up: [rows, H] x [2F, H]^T per expert; down: [rows, F]
// x [H, F]^T), weft's grouped GEMM (each expert's rows in whole 128-row blocks, one launch)
// against a cuBLAS call per expert (counts known on the host), both in CUDA graphs, interleaved.
void bench_experts(Backend& b, dev::BarrierHandle bar, cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1,
                   const MoeShape& sh, int64_t T, int reps, MoeBenchResult& res,
                   const std::function<void(const std::string&)>& progress) {
  const int world = b.size();
  const int64_t L = sh.experts / world, BM = kernels::kGemmTileM;
  std::vector<int64_t> rows(L), start(L);
  std::vector<int32_t> group_of;
  int64_t real = 0;
  for (int64_t g = 0; g < L; ++g) {
    rows[g] = expert_rows(sh, T, world, g);
    start[g] = static_cast<int64_t>(group_of.size()) * BM;
    for (int64_t q = 0; q < (rows[g] + BM - 1) / BM; ++q) group_of.push_back(static_cast<int32_t>(g));
    real += rows[g];
  }
  const int64_t M = std::max<int64_t>(1, static_cast<int64_t>(group_of.size())) * BM;
  if (group_of.empty()) group_of.push_back(-1);
  cublasHandle_t h = nullptr;
  WEFT_CUBLAS_CHECK(cublasCreate(&h));
  WEFT_CUBLAS_CHECK(cublasSetStream(h, stream));
  struct Part {
    const char* name;
    int64_t k, n;
  };
  for (const Part part : {Part{"up", sh.hidden, 2 * sh.ffn}, Part{"down", sh.ffn, sh.hidden}}) {
    if (progress)
      progress(
          fmt::format("{} T {} experts {}: {} x {} x {} ({} experts)", sh.name, T, part.name, real, part.k, part.n, L));
    const size_t na = static_cast<size_t>(M * part.k), nb = static_cast<size_t>(L * part.n * part.k),
                 nc = static_cast<size_t>(M * part.n);
    std::vector<uint16_t> ha(na), hb(nb);
    std::mt19937 rng(7 + b.rank());
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (auto& x : ha) x = dev::to_bits16(u(rng), dev::DType::kBF16);
    for (auto& x : hb) x = dev::to_bits16(u(rng) / std::sqrt(static_cast<float>(part.k)), dev::DType::kBF16);
    Mem a(true, na * 2), w(true, nb * 2), c(true, nc * 2), ref(true, nc * 2), grp(true, group_of.size() * 4);
    a.load(ha.data(), na * 2);
    w.load(hb.data(), nb * 2);
    grp.load(group_of.data(), group_of.size() * 4);
    kernels::GemmArgs ga;
    ga.m = static_cast<int>(M);
    ga.n = static_cast<int>(part.n);
    ga.k = static_cast<int>(part.k);
    ga.a = a.get();
    ga.lda = part.k;
    ga.b = w.get();
    ga.ldb = part.k;
    ga.c[0] = c.get();
    ga.ldc = part.n;
    ga.group_of = static_cast<const int32_t*>(grp.get());
    ga.groups = static_cast<int>(L);
    auto run_weft = [&] { ops::gemm_gpu(ga, {}, stream); };
    const float alpha = 1.f, beta = 0.f;
    auto run_cublas = [&] {
      for (int64_t g = 0; g < L; ++g) {
        if (rows[g] == 0) continue;
        const auto* ag = static_cast<const uint16_t*>(a.get()) + start[g] * part.k;
        const auto* wg = static_cast<const uint16_t*>(w.get()) + g * part.n * part.k;
        auto* cg = static_cast<uint16_t*>(ref.get()) + start[g] * part.n;
        WEFT_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(part.n), static_cast<int>(rows[g]),
                                       static_cast<int>(part.k), &alpha, wg, CUDA_R_16BF, static_cast<int>(part.k), ag,
                                       CUDA_R_16BF, static_cast<int>(part.k), &beta, cg, CUDA_R_16BF,
                                       static_cast<int>(part.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }
    };
    run_weft();
    run_cublas();
    WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
    // weft against cuBLAS on every expert's rows.
    std::vector<uint16_t> hc(nc), hr(nc);
    WEFT_CUDA_CHECK(cudaMemcpy(hc.data(), c.get(), nc * 2, cudaMemcpyDeviceToHost));
    WEFT_CUDA_CHECK(cudaMemcpy(hr.data(), ref.get(), nc * 2, cudaMemcpyDeviceToHost));
    double err = 0, scale = 0;
    for (int64_t g = 0; g < L; ++g)
      for (int64_t i = start[g] * part.n; i < (start[g] + rows[g]) * part.n; ++i) {
        const double x = dev::from_bits16(hc[i], dev::DType::kBF16), y = dev::from_bits16(hr[i], dev::DType::kBF16);
        err = std::max(err, std::fabs(x - y));
        scale = std::max(scale, std::fabs(y));
      }
    WEFT_REQUIRE(
        err <= 2e-2 * std::max(scale, 1e-3),
        fmt::format("weft bench moe: {} experts {}: the grouped GEMM differs from cuBLAS by {:.3g} (scale {:.3g})",
                    sh.name, part.name, err, scale));
    b.barrier();
    ReplayGraph gw(stream, 5, run_weft), gc(stream, 5, run_cublas);
    gw.launch();
    gc.launch();
    std::vector<double> tw, tc;
    for (int i = 0; i < reps; ++i) {  // interleaved: the same clock and power history for both
      tw.push_back(gw.timed_replay(b, bar, e0, e1, 200000));
      tc.push_back(gc.timed_replay(b, bar, e0, e1, 200000));
    }
    for (auto [method, us] : {std::pair<const char*, std::vector<double>*>{"weft", &tw}, {"cublas", &tc}}) {
      double med = median(*us);
      std::vector<double> all(static_cast<size_t>(world));
      b.bootstrap().allgather(&med, sizeof med, all.data());
      med = *std::max_element(all.begin(), all.end());
      MoePoint pt;
      pt.shape = sh.name;
      pt.method = method;
      pt.part = std::string("experts-") + part.name;
      pt.hidden = sh.hidden;
      pt.experts = sh.experts;
      pt.top_k = sh.top_k;
      pt.tokens = T;
      pt.median_us = med;
      pt.rows = real;
      pt.tflops = med > 0 ? 2.0 * static_cast<double>(real) * part.k * part.n / (med * 1e6) : 0;
      res.points.push_back(pt);
    }
  }
  WEFT_CUBLAS_CHECK(cublasDestroy(h));
}
#endif
}  // namespace

MoeBenchResult bench_moe(Backend& b, const MoeBenchOptions& opt) {
  const bool gpu = b.kind() == BackendKind::kNccl;
  const int world = b.size(), rank = b.rank();
  std::vector<MoeShape> shapes;
  for (const auto& name : opt.shapes) {
    const auto* it =
        std::find_if(std::begin(kShapes), std::end(kShapes), [&](const MoeShape& s) { return name == s.name; });
    WEFT_REQUIRE(it != std::end(kShapes),
                 fmt::format("weft bench moe: unknown shape '{}' (mixtral, qwen3-30b-a3b, deepseek-v3-like)", name));
    shapes.push_back(*it);
  }
  if (shapes.empty()) {
    if (gpu)
      shapes.assign(std::begin(kShapes), std::end(kShapes));
    else
      shapes = {{"small", 64, 4 * world, 2, 32}};
  }
  std::vector<int64_t> tokens = opt.tokens;
  if (tokens.empty())
    tokens = gpu ? (opt.quick ? std::vector<int64_t>{128} : std::vector<int64_t>{128, 4096}) : std::vector<int64_t>{5};
  MoeBenchResult res;
  res.device = b.device_name();
  res.backend = to_string(b.kind());
  res.world = world;
  res.timing =
      gpu ? "decomposed, direct: CUDA graphs of several calls, GPUs lined up by a device barrier before each timed "
            "replay; baseline: eager calls (its counts go through the host) between the same barriers; "
            "median of the replays, slowest rank"
          : "host backend: eager calls, wall clock, median of 3, slowest rank (CPU numbers)";
  [[maybe_unused]] const auto bar = b.heap().alloc_barrier("bench.moe.bar");
#ifdef WEFT_HAVE_CUDA
  const TimingStream ts(gpu);
  cudaStream_t stream = ts.stream;
  cudaEvent_t e0 = ts.e0, e1 = ts.e1;
#endif
  void* s = nullptr;
#ifdef WEFT_HAVE_CUDA
  s = stream;
#endif
  for (const MoeShape& sh : shapes)
    for (const int64_t T : tokens) {
      WEFT_REQUIRE(sh.experts % world == 0,
                   fmt::format("weft bench moe: {} experts do not divide among {} ranks", sh.experts, world));
      if (opt.progress) opt.progress(fmt::format("{} T {}", sh.name, T));
      const std::vector<int32_t> mine = routing(rank, T, sh.experts, sh.top_k);
      const std::vector<float> w(mine.size(), 1.f / static_cast<float>(sh.top_k));
      // Times `call` on this rank: graphs of 5 calls (eager where `eager`), the slowest rank's median.
      auto timed = [&](const std::function<void()>& call, [[maybe_unused]] bool eager) {
        const int reps = gpu ? (opt.quick ? 5 : 15) : 3;
        std::vector<double> us;
#ifdef WEFT_HAVE_CUDA
        if (gpu) {
          WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
          b.barrier();
          if (!eager) {
            ReplayGraph g(stream, 5, call);
            g.launch();
            for (int i = 0; i < reps; ++i) us.push_back(g.timed_replay(b, bar, e0, e1, 200000));
          } else {
            for (int i = 0; i < reps; ++i) us.push_back(timed_run(b, bar, stream, e0, e1, 200000, 1, call));
          }
        }
#endif
        if (!gpu)
          for (int i = 0; i < reps; ++i) {
            b.barrier();
            const auto t0 = std::chrono::steady_clock::now();
            call();
            us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
          }
        double med = median(us);
        std::vector<double> all(static_cast<size_t>(world));
        b.bootstrap().allgather(&med, sizeof med, all.data());
        return *std::max_element(all.begin(), all.end());
      };
      auto point = [&](const char* method, const std::string& part, double us) {
        MoePoint pt;
        pt.shape = sh.name;
        pt.method = method;
        pt.part = part;
        pt.hidden = sh.hidden;
        pt.experts = sh.experts;
        pt.top_k = sh.top_k;
        pt.tokens = T;
        pt.median_us = us;
        return pt;
      };
      {  // the exchange alone
        ops::MoeConfig cfg;
        cfg.hidden = sh.hidden;
        cfg.experts = sh.experts;
        cfg.top_k = sh.top_k;
        cfg.max_tokens = T;
        // Uniform routing gives a rank about T * top_k rows; room for twice that.
        cfg.recv_capacity = std::max<int64_t>(2 * T * sh.top_k, 64);
        cfg.check_ids = false;  // no read-back in the timed calls
        ops::MoeDispatchCombine op(b, cfg);
        const int64_t L = sh.experts / world;
        const size_t row = static_cast<size_t>(sh.hidden) * 2;
        Mem x(gpu, static_cast<size_t>(T) * row), ids(gpu, static_cast<size_t>(T * sh.top_k) * 4),
            wt(gpu, static_cast<size_t>(T * sh.top_k) * 4), y(gpu, static_cast<size_t>(T) * row);
        ids.load(mine.data(), mine.size() * 4);
        wt.load(w.data(), w.size() * 4);
        // Bytes of rows every rank sends to other ranks, mean over the ranks: a row a pair (combine,
        // and dispatch but direct's with rows once a peer), a row a (token, peer rank) (that one).
        double link = 0, link_once = 0;
        for (int p = 0; p < world; ++p) {
          const std::vector<int32_t> ids_p = routing(p, T, sh.experts, sh.top_k);
          for (int64_t t = 0; t < T; ++t) {
            std::vector<bool> reached(static_cast<size_t>(world), false);
            for (int64_t j = 0; j < sh.top_k; ++j) {
              const int d = static_cast<int>(ids_p[static_cast<size_t>(t * sh.top_k + j)] / L);
              if (d == p) continue;
              link += static_cast<double>(row);
              if (!reached[static_cast<size_t>(d)]) link_once += static_cast<double>(row);
              reached[static_cast<size_t>(d)] = true;
            }
          }
        }
        link /= world;
        link_once /= world;
        for (ops::MoeMethod m : {ops::MoeMethod::kBaseline, ops::MoeMethod::kDecomposed, ops::MoeMethod::kDirect}) {
          if (!opt.exchange) break;
          const ops::MoeRunOptions o{.method = m, .tokens = T, .stream = s};
          auto dispatch = [&] { op.dispatch(x.get(), static_cast<const int32_t*>(ids.get()), o); };
          auto combine = [&] { op.combine(op.recv(), static_cast<const float*>(wt.get()), y.get(), o); };
          auto both = [&] {
            dispatch();
            combine();
          };
          if (opt.progress) opt.progress(fmt::format("{} T {} {}: first calls", sh.name, T, ops::to_string(m)));
          dispatch();  // the first calls (the collectives' set-up), outside any capture
          combine();
          for (auto [part, call] : std::vector<std::pair<const char*, std::function<void()>>>{
                   {"dispatch", dispatch}, {"combine", combine}, {"both", both}}) {
            if (opt.progress) opt.progress(fmt::format("{} T {} {}: {}", sh.name, T, ops::to_string(m), part));
            MoePoint pt = point(ops::to_string(m), part, timed(call, m == ops::MoeMethod::kBaseline));
            const double sent = m == ops::MoeMethod::kDirect && op.rows_once() ? link_once : link;
            pt.link_bytes = std::string(part) == "dispatch" ? sent : std::string(part) == "both" ? sent + link : link;
            pt.gbps = pt.median_us > 0 ? pt.link_bytes / (pt.median_us * 1e3) : 0;
            res.points.push_back(pt);
          }
        }
      }
      if (opt.layer) {  // the layer: dispatch, the experts' FFNs, combine
        ops::MoeLayerConfig lc;
        lc.moe.hidden = sh.hidden;
        lc.moe.experts = sh.experts;
        lc.moe.top_k = sh.top_k;
        lc.moe.max_tokens = T;
        lc.moe.recv_capacity = std::max<int64_t>(2 * T * sh.top_k, 64);
        lc.moe.check_ids = false;
        lc.ffn = sh.ffn;
        ops::MoeLayer layer(b, lc);
        const int64_t L = sh.experts / world;
        const size_t row = static_cast<size_t>(sh.hidden) * 2;
        const size_t nu = static_cast<size_t>(L * 2 * sh.ffn * sh.hidden),
                     nd = static_cast<size_t>(L * sh.hidden * sh.ffn);
        Mem x(gpu, static_cast<size_t>(T) * row), ids(gpu, static_cast<size_t>(T * sh.top_k) * 4),
            wt(gpu, static_cast<size_t>(T * sh.top_k) * 4), y(gpu, static_cast<size_t>(T) * row), wu(gpu, nu * 2),
            wd(gpu, nd * 2);
        ids.load(mine.data(), mine.size() * 4);
        wt.load(w.data(), w.size() * 4);
        {  // x and the weights: small values (the layer's arithmetic, not its data, is timed)
          std::vector<uint16_t> v(std::max({nu, nd, static_cast<size_t>(T * sh.hidden)}));
          for (size_t i = 0; i < v.size(); ++i)
            v[i] =
                dev::to_bits16(static_cast<float>(static_cast<int>((i * 7 + rank) % 9) - 4) / 64.f, dev::DType::kBF16);
          x.load(v.data(), static_cast<size_t>(T) * row);
          wu.load(v.data(), nu * 2);
          wd.load(v.data(), nd * 2);
        }
        for (ops::MoeLayerMethod m :
             {ops::MoeLayerMethod::kBaseline, ops::MoeLayerMethod::kDecomposed, ops::MoeLayerMethod::kFused}) {
          const ops::MoeLayerRunOptions o{.method = m, .tokens = T, .stream = s};
          auto call = [&] {
            layer.forward(x.get(), static_cast<const int32_t*>(ids.get()), static_cast<const float*>(wt.get()),
                          wu.get(), wd.get(), y.get(), o);
          };
          if (opt.progress) opt.progress(fmt::format("{} T {} layer {}", sh.name, T, ops::to_string(m)));
          call();  // first calls outside any capture
          res.points.push_back(point(ops::to_string(m), "layer", timed(call, m == ops::MoeLayerMethod::kBaseline)));
        }
      }
#ifdef WEFT_HAVE_CUDA
      if (gpu) {
        WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
        if (opt.experts) bench_experts(b, bar, stream, e0, e1, sh, T, opt.quick ? 5 : 15, res, opt.progress);
      }
#endif
      b.barrier();
    }
  return res;
}

nlohmann::json to_json(const MoeBenchResult& r) {
  nlohmann::json j;
  j["bench"] = "moe";
  j["device"] = r.device;
  j["backend"] = r.backend;
  j["world"] = r.world;
  j["timing"] = r.timing;
  j["points"] = nlohmann::json::array();
  for (const MoePoint& p : r.points)
    j["points"].push_back({{"shape", p.shape},
                           {"method", p.method},
                           {"part", p.part},
                           {"hidden", p.hidden},
                           {"experts", p.experts},
                           {"top_k", p.top_k},
                           {"tokens", p.tokens},
                           {"median_us", p.median_us},
                           {"link_bytes", p.link_bytes},
                           {"gbps", p.gbps},
                           {"rows", p.rows},
                           {"tflops", p.tflops}});
  return j;
}

std::string to_table(const MoeBenchResult& r) {
  std::string s = fmt::format("weft bench moe on {} x{} ({}), bf16; us (GB/s of rows crossing the link)\n", r.device,
                              r.world, r.backend);
  s += fmt::format("{:18} {:>5} {:>11} {:>18} {:>18} {:>10} {:>10}\n", "shape", "T", "method", "dispatch", "combine",
                   "both", "layer");
  std::map<std::string, std::map<std::string, const MoePoint*>> rows;
  std::vector<std::string> order;
  for (const MoePoint& p : r.points) {
    const std::string key = fmt::format("{:18} {:>5} {:>11}", p.shape, p.tokens, p.method);
    if (!rows.count(key)) order.push_back(key);
    rows[key][p.part] = &p;
  }
  for (const auto& key : order) {
    auto cell = [&](const char* part, bool bw) {
      const MoePoint* p = rows[key].count(part) ? rows[key][part] : nullptr;
      if (!p) return std::string("-");
      return bw ? fmt::format("{:.1f} ({:.0f})", p->median_us, p->gbps) : fmt::format("{:.1f}", p->median_us);
    };
    if (!rows[key].count("dispatch") && !rows[key].count("layer")) continue;
    s += fmt::format("{} {:>18} {:>18} {:>10} {:>10}\n", key, cell("dispatch", true), cell("combine", true),
                     cell("both", false), cell("layer", false));
  }
  bool head = false;
  for (const MoePoint& p : r.points) {
    if (p.part.rfind("experts-", 0) != 0) continue;
    if (!head)
      s += fmt::format(
          "experts' GEMMs on each rank (weft grouped vs a cuBLAS call per expert): us (TFLOP/s)\n"
          "{:18} {:>5} {:>6} {:>13} {:>8} {:>16}\n",
          "shape", "T", "rows", "part", "method", "us (TFLOP/s)");
    head = true;
    s += fmt::format("{:18} {:>5} {:>6} {:>13} {:>8} {:>9.1f} ({:4.0f})\n", p.shape, p.tokens, p.rows, p.part, p.method,
                     p.median_us, p.tflops);
  }
  return s;
}

}  // namespace weft::bench
