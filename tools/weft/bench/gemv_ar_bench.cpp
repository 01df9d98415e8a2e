#include "weft/bench/gemv_ar_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include "weft/bench/bench_buffer.hpp"
#include "weft/bench/devapi_bench.hpp"
#include "weft/bench/gemm_overlap_bench.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/gemv_ar.hpp"

#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime.h>

#include "weft/bench/graph_timing.hpp"
#include "weft/core/cuda_check.hpp"
#endif

namespace weft::bench {
namespace {

using ops::GemvMethod;



// One operand of `n` bf16 values in the backend's memory.
struct Buf : BenchBuffer {
  Buf(bool gpu, size_t n) : BenchBuffer(gpu, n * 2) {}
  void upload(const std::vector<uint16_t>& v) { load(v.data(), v.size() * 2); }
  std::vector<uint16_t> download(size_t n) const { return read<uint16_t>(n); }
};

// This rank's memory bandwidth in GB/s: a large copy (GPU: device to device, cudaMemcpyAsync
// between events; host: memcpy, wall clock), bytes read + written / time, the median of 7
// after a warm-up. Returns the method's description in `how`.
double measure_bandwidth(bool gpu, bool quick, std::string& how) {
  const size_t bytes = gpu ? (quick ? size_t{256} << 20 : size_t{1} << 30) : (quick ? size_t{16} << 20 : size_t{64} << 20);
  std::vector<double> gbps;
#ifdef WEFT_HAVE_CUDA
  if (gpu) {
    void *src = nullptr, *dst = nullptr;
    const TimingStream ts(true);
    cudaStream_t s = ts.stream;
    WEFT_CUDA_CHECK(cudaMalloc(&src, bytes));
    WEFT_CUDA_CHECK(cudaMalloc(&dst, bytes));
    WEFT_CUDA_CHECK(cudaMemset(src, 1, bytes));
    for (int r = -1; r < 7; ++r) {
      const double us = event_us(
          s, ts.e0, ts.e1, [&] { WEFT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s)); });
      if (r >= 0) gbps.push_back(2.0 * static_cast<double>(bytes) / (us * 1e3));
    }
    WEFT_CUDA_CHECK(cudaFree(src));
    WEFT_CUDA_CHECK(cudaFree(dst));
    how = fmt::format(
        "a {} MiB device-to-device cudaMemcpyAsync timed by events, (bytes read + bytes written) / time, median of 7 "
        "after a warm-up, the slowest rank's",
        bytes >> 20);
    return median(gbps);
  }
#endif
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  for (int r = -1; r < 7; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    src[static_cast<size_t>(r + 1) % bytes] = dst[bytes / 2];  // the copy is used
    if (r >= 0) gbps.push_back(2.0 * static_cast<double>(bytes) / (us * 1e3));
  }
  how = fmt::format(
      "a {} MiB host memcpy timed by the wall clock, (bytes read + bytes written) / time, median of 7 after a warm-up, "
      "the slowest rank's (CPU figure)",
      bytes >> 20);
  return median(gbps);
}

}  // namespace

GemvShape parse_gemv_shape(const std::string& s) {
  const size_t colon = s.find(':');
  auto num = [&](const std::string& t) -> int64_t {
    if (t.empty() || t.size() > 12 || t.find_first_not_of("0123456789") != std::string::npos) return 0;
    return std::stoll(t);
  };
  GemvShape d;
  if (colon != std::string::npos) {
    d.k = num(s.substr(0, colon));
    d.n = num(s.substr(colon + 1));
  }
  if (d.k <= 0 || d.n <= 0)
    throw InvalidArgument(fmt::format("gemv_ar shape '{}': expected K:N, two positive integers (K the full depth, "
                                      "before the split over the ranks), e.g. 8192:8192",
                                      s));
  return d;
}

GemvBenchResult bench_gemv_ar(Backend& b, const GemvBenchOptions& opt) {
  const bool gpu = b.kind() == BackendKind::kNccl;
  const int world = b.size();
  std::vector<GemvShape> shapes;
  for (const auto& s : opt.shapes) shapes.push_back(parse_gemv_shape(s));
  if (shapes.empty()) {
    if (gpu)
      shapes = opt.quick ? std::vector<GemvShape>{{4096, 4096}, {8192, 8192}}
                         : std::vector<GemvShape>{{4096, 4096}, {14336, 4096}, {8192, 8192}, {28672, 8192}};
    else
      shapes = opt.quick ? std::vector<GemvShape>{{16 * world, 32}}
                         : std::vector<GemvShape>{{32 * world, 64}, {64 * world, 128}};
  }
  std::vector<int64_t> ms = opt.ms;
  if (ms.empty())
    ms = gpu ? (opt.quick ? std::vector<int64_t>{1, 16, 128} : std::vector<int64_t>{1, 8, 16, 64, 128})
             : (opt.quick ? std::vector<int64_t>{1, 3} : std::vector<int64_t>{1, 8, 16});
  for (int64_t m : ms)
    WEFT_REQUIRE(m >= 1 && m <= ops::kGemvMaxM,
                 fmt::format("weft bench gemv_ar: M = {} outside 1 ... {}", m, ops::kGemvMaxM));
  const int64_t m_max = *std::max_element(ms.begin(), ms.end());

  GemvBenchResult res;
  res.device = b.device_name();
  res.backend = to_string(b.kind());
  res.world = world;
  res.timing =
      gpu ? std::string("CUDA graphs of several calls, GPUs lined up by a device barrier before each timed replay, "
                        "interleaved rounds (a warm-up round, then one replay of every column per round, odd rounds "
                        "reversed), median of replays, slowest rank; W rotated over copies totalling >= 160 MiB "
                        "per rank (not served from L2); checks against the baseline after the timing")
          : std::string("host backend: eager calls, wall clock, median of 3 interleaved rounds, slowest rank (CPU "
                        "numbers); checks against the baseline after the timing");
  // Every rank measures its own memory's bandwidth at once (each GPU its HBM); the slowest's
  // sets the roofline, as the slowest rank's median sets every column.
  const double gbps = measure_bandwidth(gpu, opt.quick, res.bandwidth_method);
  std::vector<double> all(static_cast<size_t>(world));
  b.bootstrap().allgather(&gbps, sizeof gbps, all.data());
  res.hbm_gbps = *std::min_element(all.begin(), all.end());
  if (opt.progress) opt.progress(fmt::format("memory bandwidth {:.0f} GB/s ({})", res.hbm_gbps, res.bandwidth_method));
  [[maybe_unused]] const auto bar = b.heap().alloc_barrier("bench.gemv_ar.bar");
  const double tol = gemv_bench_tolerance(world);

  for (const GemvShape& d : shapes) {
    ops::GemvArConfig cfg;
    cfg.n = d.n;
    cfg.k = d.k;
    cfg.m_max = m_max;
    cfg.dtype = dev::DType::kBF16;
    ops::GemvAllReduce op(b, cfg);
    cfg.epilogue = true;
    ops::GemvAllReduce epi(b, cfg);
    const int64_t kl = op.k_local();
    const size_t nx = static_cast<size_t>(m_max * kl), nw = static_cast<size_t>(d.n * kl),
                 ny = static_cast<size_t>(m_max * d.n);
    const double w_bytes = static_cast<double>(nw) * 2;
    // W's copies, identical, rotated call by call (GPU): the calls of one graph read W from
    // HBM as a decode step does (one weight read once per step), not from L2.
    const int copies = gpu ? static_cast<int>(std::clamp<double>(std::ceil(160.0 * (1 << 20) / w_bytes), 1, 10)) : 1;
    Buf x(gpu, nx), y(gpu, ny), yar(gpu, ny), resid(gpu, ny), gamma(gpu, static_cast<size_t>(d.n)), ro(gpu, ny),
        out(gpu, ny);
    std::vector<std::unique_ptr<Buf>> ws;
    const auto hw = random_bf16(nw, 2 * b.rank() + 1);
    for (int c = 0; c < copies; ++c) {
      ws.push_back(std::make_unique<Buf>(gpu, nw));
      ws.back()->upload(hw);
    }
    x.upload(random_bf16(nx, 2 * b.rank()));
    resid.upload(random_bf16(ny, 1000));  // the residual stream: the same on every rank
    gamma.upload(random_bf16(static_cast<size_t>(d.n), 1001));
#ifdef WEFT_HAVE_CUDA
    const TimingStream ts(gpu);
    cudaStream_t stream = ts.stream;
    cudaEvent_t e0 = ts.e0, e1 = ts.e1;
#endif
    void* s = nullptr;
#ifdef WEFT_HAVE_CUDA
    s = stream;
#endif
    const double roofline_us = w_bytes / (res.hbm_gbps * 1e3);

    for (const int64_t m : ms) {
      const std::string tag = fmt::format("K {} N {} M {}", d.k, d.n, m);
      const size_t my = static_cast<size_t>(m * d.n);
      // One column: its call (W rotated), what it writes, what it is checked against.
      struct Column {
        std::string method;
        std::function<void()> call;
        std::string ref;           // the column whose output this one's is checked against ("": none)
        std::vector<Buf*> outs;    // what it writes (compared with ref's)
        bool ran = false;
        std::string note;
        std::vector<double> us;
#ifdef WEFT_HAVE_CUDA
        std::unique_ptr<ReplayGraph> graph;
#endif
      };
      auto next_w = [&, i = std::make_shared<int>(0)]() -> const void* {
        const void* p = ws[static_cast<size_t>(*i)]->get();
        *i = (*i + 1) % copies;
        return p;
      };
      std::vector<Column> cols;
      auto method_col = [&](const char* name, GemvMethod meth, const char* ref) {
        Column c;
        c.method = name;
        c.call = [&, meth] { op.run(x.get(), next_w(), y.get(), {.method = meth, .m = m, .stream = s}); };
        c.ref = ref;
        c.outs = {&y};
        return c;
      };
      auto epi_col = [&](const char* name, GemvMethod meth, const char* ref) {
        Column c;
        c.method = name;
        c.call = [&, meth] {
          epi.run(x.get(), next_w(), out.get(),
                  {.method = meth, .m = m, .residual = resid.get(), .gamma = gamma.get(), .residual_out = ro.get(),
                   .stream = s});
        };
        c.ref = ref;
        c.outs = {&out, &ro};
        return c;
      };
      cols.push_back(method_col("baseline", GemvMethod::kBaseline, ""));
      for (bool weft : {false, true}) {
        Column c;
        c.method = weft ? "gemv_weft" : "gemv_cublas";
        c.call = [&, weft] { op.run_gemv_only(x.get(), next_w(), y.get(), m, weft, s); };
        c.ref = weft ? "gemv_cublas" : "";
        c.outs = {&y};
        cols.push_back(std::move(c));
      }
      // The all-reduce alone, in place on a zeroed y (its sum stays zero over the replays).
      for (GemvMethod meth : {GemvMethod::kBaseline, GemvMethod::kDecomposed}) {
        Column c;
        c.method = meth == GemvMethod::kBaseline ? "ar_nccl" : "ar_weft";
        c.call = [&, meth] { op.run_all_reduce_only(yar.get(), m, meth, s); };
        cols.push_back(std::move(c));
      }
      cols.push_back(method_col("decomposed", GemvMethod::kDecomposed, "baseline"));
      cols.push_back(method_col("fused", GemvMethod::kFused, "baseline"));
      cols.push_back(method_col("auto", GemvMethod::kAuto, "baseline"));
      cols.push_back(epi_col("unfused_rmsnorm", GemvMethod::kBaseline, ""));
      cols.push_back(epi_col("fused_rmsnorm", GemvMethod::kFused, "unfused_rmsnorm"));

      // 1. Each column's first call (the op's first call of an (M, method) checks the ranks
      //    agree: not capturable), then its graph. A column that cannot run keeps its reason.
      [[maybe_unused]] const int per_graph = bench_calls_per_run(10);
      for (Column& col : cols) {
        try {
          col.call();
          col.ran = true;
        } catch (const TimeoutError&) {
          throw;
        } catch (const Error& e) {
          col.note = e.what();
        }
        if (!col.ran) continue;
        if (col.method == "auto") {
          const ops::GemvAutoChoice ac = op.auto_choice(m);
          col.note = fmt::format("chose {} from {}", ops::to_string(ac.method), ac.source);
        }
#ifdef WEFT_HAVE_CUDA
        if (gpu) {
          WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
          b.synchronize();
          b.barrier();
          col.graph = std::make_unique<ReplayGraph>(stream, per_graph, col.call);
        }
#endif
      }
      [[maybe_unused]] const uint64_t sleep_ns = bench_sleep_ns();
      auto run_once = [&](Column& col) -> double {
#ifdef WEFT_HAVE_CUDA
        if (gpu) return col.graph->timed_replay(b, bar, e0, e1, sleep_ns);
#endif
        b.barrier();
        const auto t0 = std::chrono::steady_clock::now();
        col.call();
        return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      };
      // 2. Interleaved rounds: a warm-up round, then rounds of one run of every column (odd
      //    rounds reversed), so clock and power drift reach every column alike.
      interleaved_rounds(cols, gpu ? (opt.quick ? 3 : 15) : 3, run_once);
      // 3. Checks: each column run once more (what was timed), its outputs fetched; references
      //    come first in the column order. Every rank takes part (the calls are collective).
      std::map<std::string, std::vector<std::vector<uint16_t>>> outputs;
      std::map<std::string, double> errs;
      for (Column& col : cols) {
        if (!col.ran || col.outs.empty()) continue;
        run_once(col);
#ifdef WEFT_HAVE_CUDA
        if (gpu) WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
#endif
        std::vector<std::vector<uint16_t>> got;
        for (const Buf* o : col.outs) got.push_back(o->download(my));
        // Each output against the reference's same output (the epilogue's normalised result and
        // its residual have different scales); a reference that did not run leaves the column
        // unchecked, alike on every rank.
        if (!col.ref.empty() && outputs.count(col.ref)) {
          double e = 0;
          for (size_t i = 0; i < got.size(); ++i) e = std::max(e, relative_error_bf16(got[i], outputs[col.ref][i]));
          errs[col.method] = max_over_ranks(b, e);
        }
        outputs[col.method] = std::move(got);
      }
      // 4. The points: the slowest rank's median per column, then the roofline.
      for (Column& col : cols) {
        const double us = col.ran ? max_over_ranks(b, median(col.us)) : 0;
        GemvPoint p{d.k, d.n, m, col.method, us, col.note};
        if (errs.count(col.method)) {
          p.rel_err = errs[col.method];
          p.tolerance = tol;
          if (p.rel_err > tol)
            p.note += fmt::format("{}WRONG: relative error {:.3g} against {}", p.note.empty() ? "" : "; ", p.rel_err,
                                  col.ref);
        }
        if (opt.progress)
          opt.progress(fmt::format("gemv_ar {} {}: {}", tag, col.method,
                                   us > 0 ? fmt::format("{:.1f} us", us) : "did not run (" + p.note + ")"));
        res.points.push_back(std::move(p));
      }
      if (opt.tune) {
        // The fastest checked method of each op (every rank has the same slowest-rank medians).
        auto fastest = [&](std::initializer_list<std::pair<const char*, GemvMethod>> cands,
                           const ops::GemvAllReduce& o) {
          const GemvPoint* best = nullptr;
          GemvMethod meth = GemvMethod::kBaseline;
          for (const auto& [name, mm] : cands)
            for (const GemvPoint& p : res.points)
              if (p.k == d.k && p.n == d.n && p.m == m && p.method == name && p.median_us > 0 &&
                  p.rel_err <= p.tolerance && (!best || p.median_us < best->median_us)) {
                best = &p;
                meth = mm;
              }
          if (!best) return;
          o.record_tuned(m, meth, best->median_us);
          if (opt.progress)
            opt.progress(fmt::format("gemv_ar {}{}: tuned {} ({:.1f} us)", tag, o.config().epilogue ? " + norm" : "",
                                     ops::to_string(meth), best->median_us));
        };
        fastest({{"baseline", GemvMethod::kBaseline},
                 {"decomposed", GemvMethod::kDecomposed},
                 {"fused", GemvMethod::kFused}},
                op);
        fastest({{"unfused_rmsnorm", GemvMethod::kBaseline}, {"fused_rmsnorm", GemvMethod::kFused}}, epi);
      }
      res.points.push_back({d.k, d.n, m, "roofline", roofline_us,
                            fmt::format("W's {:.1f} MiB per rank / {:.0f} GB/s (not timed)", w_bytes / (1 << 20),
                                        res.hbm_gbps)});
#ifdef WEFT_HAVE_CUDA
      cols.clear();  // the graphs, before the buffers they name
      if (gpu) b.synchronize();
#endif
    }
#ifdef WEFT_HAVE_CUDA
    if (gpu) WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
#endif
    b.barrier();
  }
  return res;
}

nlohmann::json to_json(const GemvBenchResult& r) {
  nlohmann::json pts = nlohmann::json::array();
  for (const auto& p : r.points)
    pts.push_back({{"k", p.k},
                   {"n", p.n},
                   {"m", p.m},
                   {"method", p.method},
                   {"median_us", p.median_us},
                   {"note", p.note},
                   {"rel_err_vs_reference", p.rel_err}});
  return {{"bench", "gemv_ar"},
          {"device", r.device},
          {"backend", r.backend},
          {"world", r.world},
          {"dtype", "bf16"},
          {"data", "random"},
          {"w_layout", "nk"},
          {"timing", r.timing},
          {"hbm_gbps", r.hbm_gbps},
          {"bandwidth_method", r.bandwidth_method},
          {"points", pts},
          {"tolerance_vs_reference", gemv_bench_tolerance(r.world)}};
}

std::string to_table(const GemvBenchResult& r) {
  std::string out = fmt::format(
      "gemv_ar on {} ({} backend, {} ranks), bf16 random data, W[N, K/world]; times in us per call (median); memory "
      "bandwidth {:.0f} GB/s\n",
      r.device, r.backend, r.world, r.hbm_gbps);
  out += fmt::format("{:<17} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9} "
                     "{:>8}\n",
                     "KxNxM", "baseline", "gemv cb", "gemv wf", "ar nccl", "ar weft", "decomp", "fused", "auto",
                     "chose", "fus/base", "roofln", "gemv bw", "f+norm", "unfused", "fn/unf", "max err");
  for (size_t i = 0; i < r.points.size();) {
    size_t j = i;
    std::map<std::string, const GemvPoint*> t;
    for (; j < r.points.size() && r.points[j].k == r.points[i].k && r.points[j].n == r.points[i].n &&
           r.points[j].m == r.points[i].m;
         ++j)
      t[r.points[j].method] = &r.points[j];
    auto us = [&](const char* k) { return t.count(k) ? t[k]->median_us : 0.0; };
    auto cell = [&](const char* k) { return us(k) > 0 ? fmt::format("{:.1f}", us(k)) : std::string("-"); };
    auto ratio = [](double a, double b) { return a > 0 && b > 0 ? fmt::format("{:.2f}", a / b) : std::string("-"); };
    std::string chose = "-";
    if (t.count("auto")) {
      const std::string& n = t["auto"]->note;
      chose = n.rfind("chose ", 0) == 0 ? n.substr(6, n.find(" from") - 6) : n.substr(0, 10);
    }
    // The GEMV alone's share of the bandwidth: W's bytes / its time, over the measured bandwidth.
    const double gemv = us("gemv_weft") > 0 ? us("gemv_weft") : us("gemv_cublas");
    double err = -1;
    for (const auto& [name, p] : t) err = std::max(err, p->rel_err);
    out += fmt::format(
        "{:<17} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8}\n",
        fmt::format("{}x{}x{}", r.points[i].k, r.points[i].n, r.points[i].m), cell("baseline"), cell("gemv_cublas"),
        cell("gemv_weft"), cell("ar_nccl"), cell("ar_weft"), cell("decomposed"), cell("fused"), cell("auto"), chose,
        ratio(us("fused"), us("baseline")), cell("roofline"),
        us("roofline") > 0 && gemv > 0 ? fmt::format("{:.0f}%", 100 * us("roofline") / gemv) : std::string("-"),
        cell("fused_rmsnorm"), cell("unfused_rmsnorm"), ratio(us("fused_rmsnorm"), us("unfused_rmsnorm")),
        err >= 0 ? fmt::format("{:.1e}", err) : std::string("-"));
    i = j;
  }
  out += "gemv cb / gemv wf: the local GEMV alone, cuBLAS / weft's kernel; ar nccl / ar weft: the all-reduce of y "
         "alone, NCCL / weft's latency all-reduce; fus/base: fused / baseline (< 1: fused is faster); roofln: W's bytes "
         "per rank / the measured memory bandwidth (" +
         r.bandwidth_method +
         "); gemv bw: roofline / GEMV alone (weft's; cuBLAS's where weft's did not run), the share of the measured "
         "bandwidth it reaches; f+norm: fused with the residual + RMSNorm epilogue; unfused: GEMM, all-reduce, add + "
         "RMSNorm (the epilogue op's baseline); fn/unf: f+norm / unfused; max err: of every checked column against its "
         "reference (decomposed, fused, auto: the baseline; gemv wf: gemv cb; f+norm: unfused, both outputs), max |d| "
         "/ max |ref| over all ranks (tolerance " +
         fmt::format("{:g}", gemv_bench_tolerance(r.world)) + ")\n";
  for (const auto& p : r.points)
    if (p.median_us == 0 && !p.note.empty())
      out += fmt::format("note: {} {}x{}x{}: {}\n", p.method, p.k, p.n, p.m, p.note);
  return out;
}

}  // namespace weft::bench
