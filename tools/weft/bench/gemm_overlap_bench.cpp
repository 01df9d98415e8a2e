#include "weft/bench/gemm_overlap_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>

#include "weft/bench/devapi_bench.hpp"
#include "weft/bench/shape.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/gemm_overlap.hpp"
#include "weft/ops/trace.hpp"

#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime.h>

#include "weft/bench/graph_timing.hpp"
#include "weft/core/cuda_check.hpp"
#endif

namespace weft::bench {
namespace {

using ops::GemmMethod;


// Small integers: exact in bf16, never all zero.
std::vector<uint16_t> pattern(size_t n, int salt) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] =
        dev::from_float<dev::bf16_t>(static_cast<float>(static_cast<int>((i * 7 + static_cast<size_t>(salt)) % 5) - 2))
            .bits;
  return v;
}


}  // namespace

OverlapBenchResult bench_gemm_overlap(Backend& b, const OverlapBenchOptions& opt) {
  const ops::GemmOp kind = ops::parse_gemm_op(opt.op);
  const bool gpu = b.kind() == BackendKind::kNccl;
  const int world = b.size();
  std::vector<std::string> shapes = opt.shapes, made;  // made: the defaults or the random ones
  if (shapes.empty() && opt.random == 0) {
    if (gpu)
      made = {"8192x8192x14336", "4096x8192x8192", "16384x8192x3584", "2048x4096x4096"};
    else
      made = opt.quick ? std::vector<std::string>{"64x64x48"} : std::vector<std::string>{"64x64x48", "96x128x64"};
  }
  for (const GemmShape& d : random_gemm_shapes(opt.random, opt.seed, gpu ? 256 : 16, gpu ? 8192 : 128))
    made.push_back(fmt::format("{}x{}x{}", d.m, d.k, d.n));
  // The host shapes must divide the world: round M and K up to multiples of 8 x world.
  for (auto& s : made) {
    if (gpu) break;
    GemmShape d = parse_gemm_shape(s);
    const int64_t q = 8 * world;
    d.m = (d.m + q - 1) / q * q;
    d.k = (d.k + q - 1) / q * q;
    s = fmt::format("{}x{}x{}", d.m, d.k, d.n);
  }
  shapes.insert(shapes.end(), made.begin(), made.end());
  OverlapBenchResult res;
  res.op = opt.op;
  res.device = b.device_name();
  res.backend = to_string(b.kind());
  res.world = world;
  res.data = opt.data;
  res.random = opt.random;
  res.seed = opt.random > 0 ? opt.seed : 0;
  res.timing =
      (gpu ? std::string(
                 std::string(opt.eager ? "eager calls (no graphs), several back to back"
                                       : "CUDA graphs of several calls") +
                 ", GPUs lined up by a device barrier before each timed run, median of runs, slowest rank; inputs "
                 "not rotated (they stay in L2 only for the smallest shapes); ")
           : std::string("host backend: eager calls, wall clock, median of 3, slowest rank (CPU numbers); ")) +
      (opt.sequential ? "sequential: each column's replays back to back, then its check against the baseline"
                      : "interleaved: a warm-up round, then rounds of one replay of every column (odd rounds "
                        "reversed); checks against the baseline after the timing");
  [[maybe_unused]] const auto bar = b.heap().alloc_barrier("bench.gemm_overlap.bar");

  for (const std::string& shape : shapes) {
    const GemmShape d = parse_gemm_shape(shape);
    ops::GemmOverlapConfig cfg;
    cfg.op = kind;
    cfg.m = d.m;
    cfg.k = d.k;
    cfg.n = d.n;
    cfg.dtype = dev::DType::kBF16;
    cfg.b_layout = ops::BLayout::kNK;
    cfg.chunks = opt.chunks;
    ops::GemmOverlap op(b, cfg);
    const size_t na = static_cast<size_t>(op.a_rows() * op.a_cols()),
                 nb = static_cast<size_t>(op.b_rows() * op.b_cols()),
                 nc = static_cast<size_t>(op.c_rows() * op.c_cols());
    WEFT_REQUIRE(opt.data == "random" || opt.data == "ints",
                 fmt::format("weft bench {}: --data must be random or ints, not '{}'", opt.op, opt.data));
    const bool rnd = opt.data == "random";
    const auto ha = rnd ? random_bf16(na, 2 * b.rank()) : pattern(na, b.rank()),
               hb = rnd ? random_bf16(nb, 2 * b.rank() + 1) : pattern(nb, 3 + b.rank());
    void *a = nullptr, *w = nullptr, *c = nullptr;
    std::vector<uint16_t> host_a, host_b, host_c;
#ifdef WEFT_HAVE_CUDA
    cudaStream_t stream = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
#endif
    if (gpu) {
#ifdef WEFT_HAVE_CUDA
      WEFT_CUDA_CHECK(cudaMalloc(&a, na * 2));
      WEFT_CUDA_CHECK(cudaMalloc(&w, nb * 2));
      WEFT_CUDA_CHECK(cudaMalloc(&c, nc * 2));
      WEFT_CUDA_CHECK(cudaMemcpy(a, ha.data(), na * 2, cudaMemcpyHostToDevice));
      WEFT_CUDA_CHECK(cudaMemcpy(w, hb.data(), nb * 2, cudaMemcpyHostToDevice));
      WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      WEFT_CUDA_CHECK(cudaEventCreate(&e0));
      WEFT_CUDA_CHECK(cudaEventCreate(&e1));
#endif
    } else {
      host_a.resize(na + 8);
      host_b.resize(nb + 8);
      host_c.resize(nc + 8);
      auto align = [](std::vector<uint16_t>& v) {
        return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(v.data()) + 15) & ~uintptr_t{15});
      };
      a = align(host_a);
      w = align(host_b);
      c = align(host_c);
      std::memcpy(a, ha.data(), na * 2);
      std::memcpy(w, hb.data(), nb * 2);
    }
    void* s = nullptr;
#ifdef WEFT_HAVE_CUDA
    s = stream;
#endif
    const double flops = 2.0 * static_cast<double>(op.config().m) * static_cast<double>(op.config().n) *
                         static_cast<double>(op.a_cols());
    const ops::AutoChoice& ac = op.auto_choice();
    [[maybe_unused]] const double predicted = std::max(ac.predicted_baseline_us, 1.0);
    // One column of the table: its call; after the first call, its graph (GPU) and its times.
    struct Column {
      std::string method;  // baseline, gemm_only, gemm_only_tuned, gemm_only_weft, decomposed, fused, auto
      std::function<void()> call;
      bool checked = false;  // output compared with the baseline's
      bool ran = false;
      int chunks = 0;
      const ops::GemmOverlap* owner = nullptr;  // --tune's decomposed_cN: its own op (else `op`)
      std::string note;
      std::vector<double> us;
#ifdef WEFT_HAVE_CUDA
      std::unique_ptr<ReplayGraph> graph;
#endif
    };
    std::vector<Column> cols;
    auto method_col = [&](GemmMethod m) {
      Column col;
      col.method = ops::to_string(m);
      col.call = [&, m] { op.run(a, w, c, {.method = m, .stream = s}); };
      col.checked = m != GemmMethod::kBaseline;
      return col;
    };
    auto gemm_col = [&](const char* name, ops::GemmOverlap::GemmAlone kind) {
      Column col;
      col.method = name;
      col.call = [&, kind] { op.run_gemm_only(a, w, c, s, kind); };
      return col;
    };
    cols.push_back(method_col(GemmMethod::kBaseline));
    cols.push_back(gemm_col("gemm_only", ops::GemmOverlap::GemmAlone::kCublas));
    if (gpu) {
      // With WEFT_GEMM_TUNE=1 (decomposed's GEMMs on the fastest of cuBLAS's candidates,
      // timed): the GEMM alone so chosen, the ceiling for a method whose GEMMs are tuned.
      if (op.times_every_gemm()) cols.push_back(gemm_col("gemm_only_tuned", ops::GemmOverlap::GemmAlone::kCublasTuned));
      // weft's GEMM alone, timed the same way: what the fused methods' GEMM costs without
      // communication (sm_90 GPUs only).
      cols.push_back(gemm_col("gemm_only_weft", ops::GemmOverlap::GemmAlone::kWeft));
    }
    for (GemmMethod m : {GemmMethod::kDecomposed, GemmMethod::kFused, GemmMethod::kAuto}) cols.push_back(method_col(m));
    // --tune: decomposed at other chunk counts too, one op each, timed and checked beside the
    // rest ("decomposed_cN" points): which count is fastest depends on how cuBLAS's kernels
    // quantize the pieces, which the model does not know (measured: docs/gemm_overlap.md,
    // "auto: cost model and tuning cache").
    std::vector<std::unique_ptr<ops::GemmOverlap>> tune_ops;
    if (opt.tune && world > 1 && opt.chunks == 0)
      for (int ch : {1, 2, 3, 4, 6}) {
        if (ch == op.chunks() || ch > op.c_rows()) continue;
        ops::GemmOverlapConfig tc = cfg;
        tc.chunks = ch;
        tune_ops.push_back(std::make_unique<ops::GemmOverlap>(b, tc));
        ops::GemmOverlap* t = tune_ops.back().get();
        Column col;
        col.method = fmt::format("decomposed_c{}", ch);
        col.call = [&, t] { t->run(a, w, c, {.method = GemmMethod::kDecomposed, .stream = s}); };
        col.checked = true;
        col.chunks = ch;
        col.owner = t;
        cols.push_back(std::move(col));
      }

    // 1. Each column's first call (allocations, cuBLAS's timed choices; outside any capture),
    //    then its graph. A column that cannot run keeps its reason; every rank fails alike
    //    (shape or build), or none does.
    // Calls per timed run (WEFT_BENCH_PER_GRAPH: experiments).
    [[maybe_unused]] const int per_graph = bench_calls_per_run(predicted < 300 ? 10 : predicted < 3000 ? 3 : 2);
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
      if (col.method == "auto")
        col.note = fmt::format("chose {} (chunks {}) from {}", ops::to_string(op.auto_choice().method), op.chunks(),
                               op.auto_choice().source);
      if (col.method.rfind("decomposed", 0) == 0)
        for (const std::string& g : (col.owner ? *col.owner : op).gemm_choices())
          col.note += (col.note.empty() ? "cuBLASLt " : "; ") + g;
      if (col.method == "decomposed" || col.method == "auto") col.chunks = op.chunks();
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
    // One timed run of a column: a barrier-lined graph replay (GPU), an eager call (host).
    auto run_once = [&](Column& col) -> double {
#ifdef WEFT_HAVE_CUDA
      if (gpu && opt.eager)  // the stream is idle here: every run and check ends synchronised
        return timed_run(b, bar, stream, e0, e1, sleep_ns, per_graph, [&] {
          for (int i = 0; i < per_graph; ++i) col.call();
        });
      if (gpu) return col.graph->timed_replay(b, bar, e0, e1, sleep_ns);
#endif
      b.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      col.call();
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    };
    // This rank's C after the column's last call or replay.
    auto fetch_c = [&]() {
      std::vector<uint16_t> out(nc);
#ifdef WEFT_HAVE_CUDA
      if (gpu) {
        WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
        WEFT_CUDA_CHECK(cudaMemcpy(out.data(), c, nc * 2, cudaMemcpyDeviceToHost));
        return out;
      }
#endif
      std::memcpy(out.data(), c, nc * 2);
      return out;
    };
    // The baseline's output, then each checked column's against it (every rank, collectively):
    // its graph replayed once more (the same inputs), so what is checked is what was timed.
    std::vector<uint16_t> c_base;
    std::map<std::string, double> errs;
    auto check = [&](Column& col) {
      if (!col.ran || (!col.checked && col.method != "baseline")) return;
      run_once(col);
      if (col.method == "baseline") {
        c_base = fetch_c();
      } else if (!c_base.empty()) {
        errs[col.method] = max_over_ranks(b, relative_error_bf16(fetch_c(), c_base));
      }
    };

    // 2. The timed runs. Interleaved (default): one warm-up round, then rounds of one run of
    //    each column (odd rounds in reverse order), so a clock or power drift reaches every
    //    column alike. Sequential (--sequential, the earlier protocol; docs/gemm_overlap.md,
    //    "Timing protocol"): each column's runs back to back, then its check.
    const int reps = gpu ? (opt.quick ? 3 : 15) : 3;
    if (opt.sequential) {
      // (Each column's start and end in the progress output: with many calls per run
      // (WEFT_BENCH_PER_GRAPH) a column runs for seconds, long enough to sample the GPU's
      // clock and power beside it: tools/gpu/experiments/power_probe.sh.)
      for (Column& col : cols) {
        if (!col.ran) continue;
        if (opt.progress) opt.progress(fmt::format("{} {} {}: timing", opt.op, shape, col.method));
        run_once(col);  // warm-up
        for (int r = 0; r < reps; ++r) col.us.push_back(run_once(col));
        if (opt.progress) opt.progress(fmt::format("{} {} {}: timed", opt.op, shape, col.method));
        check(col);
      }
    } else {
      interleaved_rounds(cols, reps, run_once);
      for (Column& col : cols) check(col);
    }

    // 3. The table's points: the slowest rank's median per column.
    std::map<std::string, double> measured;
    const double tol = overlap_bench_tolerance(opt.op, world);
    const size_t first_point = res.points.size();  // this shape's points (--tune chooses from them)
    for (Column& col : cols) {
      const double us = col.ran ? max_over_ranks(b, median(col.us)) : 0;
      OverlapPoint p{opt.op, d.m, d.k, d.n, col.method, us, us > 0 ? flops / (us * 1e6) : 0, col.chunks, col.note};
      if (errs.count(col.method)) {
        p.rel_err = errs[col.method];
        p.tolerance = tol;
        if (p.rel_err > tol)
          p.note +=
              fmt::format("{}WRONG: relative error {:.3g} against the baseline", p.note.empty() ? "" : "; ", p.rel_err);
      }
      if (us > 0) measured[col.method] = us;
      if (opt.progress)
        opt.progress(fmt::format("{} {} {}: {}", opt.op, shape, col.method,
                                 us > 0 ? fmt::format("{:.1f} us", us) : "did not run (" + p.note + ")"));
      res.points.push_back(std::move(p));
    }
#ifdef WEFT_HAVE_CUDA
    cols.clear();  // the graphs, before the buffers they name
    if (gpu) b.synchronize();
#endif

    if (opt.tune && b.rank() == 0) {
      // The fastest method (decomposed at its fastest chunk count), of those that ran exact.
      const OverlapPoint* best = nullptr;
      for (size_t i = first_point; i < res.points.size(); ++i) {
        const OverlapPoint& p = res.points[i];
        const bool candidate = p.method == "baseline" || p.method == "fused" || p.method.rfind("decomposed", 0) == 0;
        if (candidate && p.median_us > 0 && p.rel_err <= tol && (!best || p.median_us < best->median_us)) best = &p;
      }
      if (best) {
        const bool dec = best->method.rfind("decomposed", 0) == 0;
        op.store_tuning(ops::parse_gemm_method(dec ? "decomposed" : best->method), dec ? best->chunks : op.chunks(),
                        best->median_us);
      }
    }
    if (!opt.trace_dir.empty()) {
      for (GemmMethod m : {GemmMethod::kBaseline, GemmMethod::kDecomposed, GemmMethod::kFused}) {
        if (!measured.count(ops::to_string(m))) continue;
        // The traced call is the last of four enqueued back to back: the untraced three absorb
        // the ranks' start skew (a lone eager call shows one rank waiting for the other's
        // launch), so the trace shows the steady state the timed replays ran in.
        // Eager calls timed by events after the GPUs are lined up (slowest rank): set against the
        // graph replays and the traced call's span, what capture changes and what a call costs
        // outside its kernels.
        constexpr int kEager = 10;
        double eager_us = 0;
#ifdef WEFT_HAVE_CUDA
        if (gpu) {
          WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
          b.barrier();
          eager_us = max_over_ranks(b, timed_run(b, bar, stream, e0, e1, sleep_ns, kEager, [&] {
                                      for (int i = 0; i < kEager; ++i) op.run(a, w, c, {.method = m, .stream = s});
                                    }));
        }
#endif
        for (int i = 0; i < 3; ++i) op.run(a, w, c, {.method = m, .stream = s});
        op.run(a, w, c, {.method = m, .trace = true, .stream = s});
        const auto all = ops::gather_trace(b, op.trace());
        if (b.rank() == 0) {
          std::filesystem::create_directories(opt.trace_dir);
          const std::string path = fmt::format("{}/{}-{}-{}-{}-{}r.json", opt.trace_dir, opt.op, shape,
                                               ops::to_string(m), res.backend, world);
          nlohmann::json meta{{"op", opt.op},
                              {"shape", shape},
                              {"method", ops::to_string(m)},
                              {"chunks", op.chunks()},
                              {"device", res.device},
                              {"world", world},
                              {"call", "4th of 4 enqueued back to back"}};
          if (eager_us > 0) meta["eager_us_per_call"] = eager_us;  // GPU only
          ops::write_chrome_trace(path, all, meta.dump());
          res.traces.push_back(path);
          if (opt.progress)
            opt.progress(fmt::format("trace {}{}:\n{}", path,
                                     eager_us > 0 ? fmt::format(" (eager: {:.1f} us a call, {} calls after a barrier, "
                                                                "slowest rank)",
                                                                eager_us, kEager)
                                                  : std::string(),
                                     ops::format_trace_summary(ops::summarize_trace(ops::to_chrome_trace(all, meta.dump())))));
        }
      }
    }
#ifdef WEFT_HAVE_CUDA
    if (gpu) {
      WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
      WEFT_CUDA_CHECK(cudaEventDestroy(e0));
      WEFT_CUDA_CHECK(cudaEventDestroy(e1));
      WEFT_CUDA_CHECK(cudaStreamDestroy(stream));
      WEFT_CUDA_CHECK(cudaFree(a));
      WEFT_CUDA_CHECK(cudaFree(w));
      WEFT_CUDA_CHECK(cudaFree(c));
    }
#endif
    b.barrier();
  }
  return res;
}

std::vector<uint16_t> random_bf16(size_t n, int salt) {
  std::vector<uint16_t> v(n);
  uint64_t x = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(salt + 1);
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const float u = static_cast<float>(x >> 40) / static_cast<float>(1ull << 24);  // [0, 1)
    v[i] = dev::from_float<dev::bf16_t>(2.f * u - 1.f).bits;
  }
  return v;
}

int bench_calls_per_run(int dflt) {
  const int64_t v = tunable_value(tunables::kBenchPerRun);
  return v > 0 ? static_cast<int>(std::min<int64_t>(v, 1000)) : dflt;
}

uint64_t bench_sleep_ns() {
  return static_cast<uint64_t>(std::clamp<int64_t>(tunable_value(tunables::kBenchSleepUs), 0, 100000)) * 1000;
}

double max_over_ranks(Backend& b, double v) {
  std::vector<double> all(static_cast<size_t>(b.size()));
  b.bootstrap().allgather(&v, sizeof v, all.data());
  return *std::max_element(all.begin(), all.end());
}

double relative_error_bf16(const std::vector<uint16_t>& got, const std::vector<uint16_t>& ref) {
  WEFT_REQUIRE(got.size() == ref.size(), "relative_error_bf16: sizes differ");
  double diff = 0, mag = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double r = dev::to_float(dev::bf16_t{ref[i]}), g = dev::to_float(dev::bf16_t{got[i]});
    mag = std::max(mag, std::abs(r));
    diff = std::max(diff, std::isnan(g) ? std::numeric_limits<double>::infinity() : std::abs(g - r));
  }
  return mag > 0 ? diff / mag : diff;
}

nlohmann::json to_json(const OverlapBenchResult& r) {
  nlohmann::json pts = nlohmann::json::array();
  for (const auto& p : r.points)
    pts.push_back({{"op", p.op},
                   {"m", p.m},
                   {"k", p.k},
                   {"n", p.n},
                   {"method", p.method},
                   {"median_us", p.median_us},
                   {"tflops_per_rank", p.tflops},
                   {"chunks", p.chunks},
                   {"note", p.note},
                   {"rel_err_vs_baseline", p.rel_err}});
  nlohmann::json j = {{"bench", r.op},
                      {"device", r.device},
                      {"backend", r.backend},
                      {"world", r.world},
                      {"dtype", "bf16"},
                      {"data", r.data},
                      {"b_layout", "nk"},
                      {"timing", r.timing},
                      {"points", pts},
                      {"traces", r.traces},
                      {"tolerance_vs_baseline", overlap_bench_tolerance(r.op, r.world)}};
  if (r.random > 0) {
    j["random"] = r.random;
    j["seed"] = r.seed;
  }
  const AutoSummary a = auto_summary(r);
  if (a.shapes > 0)
    j["auto_vs_baseline"] = {
        {"shapes", a.shapes}, {"geomean", a.geomean}, {"worst", a.worst}, {"worst_shape", a.worst_shape}};
  return j;
}

std::string to_table(const OverlapBenchResult& r) {
  std::string out =
      fmt::format("{} on {} ({} backend, {} ranks), bf16 {} data, W[N,K]; times in us per call (median)\n", r.op,
                  r.device, r.backend, r.world, r.data);
  out += fmt::format("{:<18} {:>10} {:>10} {:>10} {:>10} {:>12} {:>10} {:>10} {:>16} {:>10} {:>10} {:>9}\n", "MxKxN",
                     "baseline", "gemm only", "gemm tuned", "weft gemm", "decomposed", "fused", "auto", "auto chose",
                     "best/base", "best/gemm", "max err");
  for (size_t i = 0; i < r.points.size();) {
    size_t j = i;
    std::map<std::string, const OverlapPoint*> t;
    for (; j < r.points.size() && r.points[j].m == r.points[i].m && r.points[j].k == r.points[i].k &&
           r.points[j].n == r.points[i].n;
         ++j)
      t[r.points[j].method] = &r.points[j];
    auto us = [&](const char* k) { return t.count(k) ? t[k]->median_us : 0.0; };
    auto cell = [&](const char* k) { return us(k) > 0 ? fmt::format("{:.1f}", us(k)) : std::string("-"); };
    double best = 0;
    for (const char* m : {"decomposed", "fused"})
      if (us(m) > 0 && (best == 0 || us(m) < best)) best = us(m);
    std::string chose = "-";
    if (t.count("auto")) {
      const std::string& n = t["auto"]->note;
      chose = n.rfind("chose ", 0) == 0 ? n.substr(6, n.find(" (") - 6) : n;
    }
    const std::string dec = us("decomposed") > 0 && t.count("decomposed")
                                ? fmt::format("{} ({})", cell("decomposed"), t["decomposed"]->chunks)
                                : "-";
    // The ceiling: the faster of cuBLAS's default and its tuned GEMM alone.
    double gemm = us("gemm_only");
    if (us("gemm_only_tuned") > 0 && (gemm == 0 || us("gemm_only_tuned") < gemm)) gemm = us("gemm_only_tuned");
    double err = -1;
    for (const char* m : {"decomposed", "fused", "auto"})
      if (t.count(m)) err = std::max(err, t[m]->rel_err);
    out += fmt::format("{:<18} {:>10} {:>10} {:>10} {:>10} {:>12} {:>10} {:>10} {:>16} {:>10} {:>10} {:>9}\n",
                       fmt::format("{}x{}x{}", r.points[i].m, r.points[i].k, r.points[i].n), cell("baseline"),
                       cell("gemm_only"), cell("gemm_only_tuned"), cell("gemm_only_weft"), dec, cell("fused"),
                       cell("auto"), chose,
                       best > 0 && us("baseline") > 0 ? fmt::format("{:.2f}", best / us("baseline")) : "-",
                       best > 0 && gemm > 0 ? fmt::format("{:.2f}", best / gemm) : "-",
                       err >= 0 ? fmt::format("{:.1e}", err) : std::string("-"));
    i = j;
  }
  out +=
      "gemm only: cublasGemmEx; gemm tuned (WEFT_GEMM_TUNE=1): the fastest of GemmEx and cuBLASLt's candidates; weft "
      "gemm: "
      "weft's GEMM (the fused methods' kernel); decomposed: time (chunks per shard); best/base < 1: weft beats the "
      "baseline; best/gemm: best weft method / the faster GEMM alone (1 = communication fully hidden); max err: of "
      "decomposed, fused and auto against the baseline's output, max |C - C_base| / max |C_base| over all ranks "
      "(tolerance " +
      fmt::format("{:g}", overlap_bench_tolerance(r.op, r.world)) + ")\n";
  for (const auto& p : r.points)
    if (p.median_us == 0 && !p.note.empty())
      out += fmt::format("note: {} {}x{}x{}: {}\n", p.method, p.m, p.k, p.n, p.note);
  const AutoSummary a = auto_summary(r);
  if (a.shapes > 1)
    out += fmt::format("auto / baseline over {} shapes{}: geometric mean {:.3f}, worst {:.3f} at {}\n", a.shapes,
                       r.random > 0 ? fmt::format(" ({} random, seed {})", r.random, r.seed) : std::string(),
                       a.geomean, a.worst, a.worst_shape);
  return out;
}

AutoSummary auto_summary(const OverlapBenchResult& r) {
  std::map<std::string, std::pair<double, double>> t;  // shape -> (baseline, auto)
  std::vector<std::string> order;
  for (const auto& p : r.points) {
    if (p.median_us <= 0 || (p.method != "baseline" && p.method != "auto")) continue;
    const std::string key = fmt::format("{}x{}x{}", p.m, p.k, p.n);
    if (!t.count(key)) order.push_back(key);
    (p.method == "baseline" ? t[key].first : t[key].second) = p.median_us;
  }
  AutoSummary a;
  double log_sum = 0;
  for (const auto& key : order) {
    const auto [base, aut] = t[key];
    if (base <= 0 || aut <= 0) continue;
    const double x = aut / base;
    ++a.shapes;
    log_sum += std::log(x);
    if (x > a.worst) {
      a.worst = x;
      a.worst_shape = key;
    }
  }
  a.geomean = a.shapes > 0 ? std::exp(log_sum / a.shapes) : 0;
  return a;
}

}  // namespace weft::bench
