#include "weft/bench/embedding_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>

#include "weft/bench/bench_buffer.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/embedding_a2a.hpp"

#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include "weft/bench/graph_timing.hpp"
#include "weft/core/cuda_check.hpp"
#endif

namespace weft::bench {
namespace {

// MLPerf DLRM-DCNv2's 26 tables' pooling factors (multi-hot sizes).
constexpr int64_t kDlrmPooling[] = {3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1};
constexpr int kTables = 26;

struct Case {
  std::string shape;
  int64_t batch, dim;
  std::vector<int64_t> pooling;  // [kTables]
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Table g's bags for the global batch of `bags`: exactly p indices each, uniform in [0, rows).
std::vector<int64_t> bag_indices(int64_t g, int64_t bags, int64_t p, int64_t rows) {
  uint64_t s = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(g + 1);
  std::vector<int64_t> v(static_cast<size_t>(bags * p));
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<int64_t>((s >> 33) % static_cast<uint64_t>(rows));
  }
  return v;
}

}  // namespace

EmbeddingBenchResult bench_embedding(Backend& b, const EmbeddingBenchOptions& opt) {
  const bool gpu = b.kind() == BackendKind::kNccl;
  const int world = b.size(), rank = b.rank();
  const int64_t rows = opt.rows > 0 ? opt.rows : gpu ? 1000000 : 1000;
  std::vector<std::string> shapes = opt.shapes.empty() ? std::vector<std::string>{"dlrm", "sweep"} : opt.shapes;
  std::vector<Case> cases;
  for (const auto& sh : shapes) {
    WEFT_REQUIRE(sh == "dlrm" || sh == "sweep",
                 fmt::format("weft bench embedding_a2a: unknown shape '{}' (dlrm, sweep)", sh));
    if (sh == "dlrm") {
      std::vector<int64_t> batches = opt.batches;
      if (batches.empty())
        batches = !gpu        ? std::vector<int64_t>{64}
                  : opt.quick ? std::vector<int64_t>{4096}
                              : std::vector<int64_t>{2048, 4096, 16384, 65536};
      for (int64_t B : batches)
        cases.push_back({"dlrm", B, 128, std::vector<int64_t>(std::begin(kDlrmPooling), std::end(kDlrmPooling))});
    } else {
      const std::vector<int64_t> batches = opt.batches.empty() ? std::vector<int64_t>{gpu ? 4096 : 16} : opt.batches;
      for (int64_t B : batches)
        for (int64_t d : {64, 128, 256})
          for (int64_t p : {1, 10, 100}) {
            if (opt.quick && (d != 128 || p == 1)) continue;
            cases.push_back({"sweep", B, d, std::vector<int64_t>(kTables, p)});
          }
    }
  }
  EmbeddingBenchResult res;
  res.device = b.device_name();
  res.backend = to_string(b.kind());
  res.world = world;
  res.timing = gpu ? "CUDA graphs of 3 calls, every column's replays interleaved, GPUs lined up by a device barrier "
                     "before each; median of the replays, slowest rank"
                   : "host backend: eager calls, wall clock, median of 3, slowest rank (CPU numbers)";
  [[maybe_unused]] const auto bar = b.heap().alloc_barrier("bench.embedding.bar");
  auto slowest = [&](double x) {
    std::vector<double> all(static_cast<size_t>(world));
    b.bootstrap().allgather(&x, sizeof x, all.data());
    return *std::max_element(all.begin(), all.end());
  };
  void* s = nullptr;
#ifdef WEFT_HAVE_CUDA
  const TimingStream ts(gpu);
  cudaStream_t stream = ts.stream;
  s = stream;
  if (gpu) {  // the HBM reference: a 1 GiB device-to-device copy
    const size_t n = 1ull << 30;
    BenchBuffer x(true, n), y(true, n);
    auto copy = [&] { WEFT_CUDA_CHECK(cudaMemcpyAsync(y.get(), x.get(), n, cudaMemcpyDeviceToDevice, stream)); };
    copy();
    std::vector<double> us;
    for (int i = 0; i < 5; ++i) us.push_back(timed_run(b, bar, stream, ts.e0, ts.e1, 200000, 1, copy));
    res.copy_gbps = 2.0 * static_cast<double>(n) / (slowest(median(us)) * 1e3);
  }
#endif
  for (const Case& c : cases) {
    ops::EmbeddingA2AConfig cfg;
    cfg.batch = c.batch;
    cfg.check_indices = false;  // no read-back in the timed calls
    std::vector<int64_t> mine;  // global numbers of this rank's tables
    for (int64_t g = 0; g < kTables; ++g)
      if (g % world == rank) {
        mine.push_back(g);
        cfg.tables.push_back({rows, c.dim});
      }
    const int64_t bags = world * c.batch;
    double pool_sum = 0, row_bytes = 0;
    for (int64_t p : c.pooling) pool_sum += static_cast<double>(p);
    const std::string label = fmt::format("{} B={} D={} pooling {:.1f}", c.shape, c.batch, c.dim, pool_sum / kTables);
    if (opt.progress) opt.progress(label + ": tables and bags");
    std::vector<std::unique_ptr<BenchBuffer>> bufs;
    std::vector<ops::EmbeddingBagInput> in;
    for (int64_t g : mine) {
      const int64_t p = c.pooling[static_cast<size_t>(g)];
      BenchBuffer* w =
          bufs.emplace_back(std::make_unique<BenchBuffer>(gpu, static_cast<size_t>(rows * c.dim) * 4)).get();
#ifdef WEFT_HAVE_CUDA
      if (gpu) WEFT_CUDA_CHECK(cudaMemset(w->get(), 0x3c, static_cast<size_t>(rows * c.dim) * 4));  // 0.0115 each
#endif
      std::vector<int64_t> offs(static_cast<size_t>(bags + 1));
      for (int64_t i = 0; i <= bags; ++i) offs[static_cast<size_t>(i)] = i * p;
      const std::vector<int64_t> idx = bag_indices(g, bags, p, rows);
      BenchBuffer* o = bufs.emplace_back(std::make_unique<BenchBuffer>(gpu, offs.size() * 8)).get();
      o->load(offs.data(), offs.size() * 8);
      BenchBuffer* x = bufs.emplace_back(std::make_unique<BenchBuffer>(gpu, idx.size() * 8)).get();
      x->load(idx.data(), idx.size() * 8);
      in.push_back({w->get(), static_cast<const int64_t*>(o->get()), static_cast<const int64_t*>(x->get()), nullptr});
      in.back().num_indices = bags * p;
      row_bytes += static_cast<double>(bags * p * c.dim) * 4;
    }
    ops::EmbeddingA2A op(b, cfg);
    const int64_t T = op.total_dim(), Dm = op.local_dim();
    BenchBuffer out(gpu, static_cast<size_t>(c.batch * T) * 4), ref(gpu, static_cast<size_t>(c.batch * T) * 4),
        pooled(gpu, static_cast<size_t>(bags * Dm) * 4);
    auto forward = [&](ops::EmbeddingA2AMethod m, void* dst) {
      ops::EmbeddingA2ARunOptions o;
      o.method = m;
      o.stream = s;
      op.forward(in.data(), dst, o);
    };
    std::vector<std::pair<std::string, std::function<void()>>> cols;
    for (ops::EmbeddingA2AMethod m : {ops::EmbeddingA2AMethod::kBaseline, ops::EmbeddingA2AMethod::kDecomposed,
                                      ops::EmbeddingA2AMethod::kFused, ops::EmbeddingA2AMethod::kAuto})
      cols.emplace_back(ops::to_string(m), [&, m] { forward(m, out.get()); });
    // The backward with SGD's update (the fused optimizer: no dense gradient), grad_out = out.
    std::vector<ops::EmbeddingTableGrad> sgd(in.size());
    for (size_t t = 0; t < in.size(); ++t) sgd[t].weight = const_cast<void*>(in[t].weight);
    auto backward = [&](ops::EmbeddingA2AMethod m, ops::EmbeddingGradKind k, const ops::EmbeddingTableGrad* g) {
      ops::EmbeddingBackwardOptions o;
      o.method = m;
      o.stream = s;
      o.kind = k;
      o.lr = 1e-6f;
      op.backward(in.data(), out.get(), g, o);
    };
    for (ops::EmbeddingA2AMethod m :
         {ops::EmbeddingA2AMethod::kBaseline, ops::EmbeddingA2AMethod::kDecomposed, ops::EmbeddingA2AMethod::kFused})
      cols.emplace_back(std::string("bwd_") + ops::to_string(m),
                        [&, m] { backward(m, ops::EmbeddingGradKind::kSgd, sgd.data()); });
    cols.emplace_back("lookup", [&] {
      ops::EmbeddingA2ARunOptions o;
      o.stream = s;
      op.pool(in.data(), pooled.get(), o);
    });
    // The all-to-all alone: NCCL's sends and receives of the pooled rows' bytes (plain memory).
    double sent = 0;
    for (int q = 0; q < world; ++q)
      if (q != rank) sent += static_cast<double>(c.batch * Dm) * 4;
#ifdef WEFT_HAVE_CUDA
    std::unique_ptr<BenchBuffer> a2a_in, a2a_out;
    std::vector<int64_t> dims_of(static_cast<size_t>(world), 0);
    for (int64_t g = 0; g < kTables; ++g) dims_of[static_cast<size_t>(g % world)] += c.dim;
    if (gpu && world > 1) {
      a2a_in = std::make_unique<BenchBuffer>(true, static_cast<size_t>(bags * Dm) * 4);
      a2a_out = std::make_unique<BenchBuffer>(true, static_cast<size_t>(c.batch * T) * 4);
      cols.emplace_back("all_to_all", [&] {
        auto comm = static_cast<ncclComm_t>(b.nccl_comm());
        const size_t mine_bytes = static_cast<size_t>(c.batch * Dm) * 4;
        size_t at = 0;
        WEFT_NCCL_CHECK(ncclGroupStart());
        for (int q = 0; q < world; ++q) {
          const size_t theirs = static_cast<size_t>(c.batch * dims_of[static_cast<size_t>(q)]) * 4;
          if (mine_bytes)
            WEFT_NCCL_CHECK(ncclSend(static_cast<char*>(a2a_in->get()) + mine_bytes * static_cast<size_t>(q),
                                     mine_bytes, ncclChar, q, comm, stream));
          if (theirs)
            WEFT_NCCL_CHECK(ncclRecv(static_cast<char*>(a2a_out->get()) + at, theirs, ncclChar, q, comm, stream));
          at += theirs;
        }
        WEFT_NCCL_CHECK(ncclGroupEnd());
      });
    }
#endif
    if (opt.progress) opt.progress(label + ": first calls, baseline against fused");
    forward(ops::EmbeddingA2AMethod::kBaseline, ref.get());
    forward(ops::EmbeddingA2AMethod::kFused, out.get());
#ifdef WEFT_HAVE_CUDA
    if (gpu) WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
#endif
    const size_t n_out = static_cast<size_t>(c.batch * T);
    WEFT_REQUIRE(out.read<uint32_t>(n_out) == ref.read<uint32_t>(n_out),
                 fmt::format("weft bench embedding_a2a: {}: fused's output differs from the baseline's", label));
    // The backward's sparse gradients by baseline and fused, compared bitwise (where they fit).
    size_t sparse_bytes = 0;
    for (size_t t = 0; t < in.size(); ++t) sparse_bytes += static_cast<size_t>(in[t].num_indices * (c.dim + 1)) * 8;
    if (slowest(static_cast<double>(sparse_bytes)) <= static_cast<double>(1ull << 30)) {  // alike on every rank
      if (opt.progress) opt.progress(label + ": backward, baseline against fused");
      std::vector<std::vector<uint32_t>> first;
      for (ops::EmbeddingA2AMethod m : {ops::EmbeddingA2AMethod::kBaseline, ops::EmbeddingA2AMethod::kFused}) {
        std::vector<std::unique_ptr<BenchBuffer>> sb;
        std::vector<ops::EmbeddingTableGrad> sparse(in.size());
        for (size_t t = 0; t < in.size(); ++t) {
          const size_t n = static_cast<size_t>(std::max<int64_t>(in[t].num_indices, 1));
          sparse[t].rows = static_cast<int64_t*>(sb.emplace_back(std::make_unique<BenchBuffer>(gpu, n * 8))->get());
          sparse[t].values = static_cast<float*>(
              sb.emplace_back(std::make_unique<BenchBuffer>(gpu, n * static_cast<size_t>(c.dim) * 4))->get());
          sparse[t].count = static_cast<int64_t*>(sb.emplace_back(std::make_unique<BenchBuffer>(gpu, 8))->get());
        }
        backward(m, ops::EmbeddingGradKind::kSparse, sparse.data());
#ifdef WEFT_HAVE_CUDA
        if (gpu) WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
#endif
        std::vector<std::vector<uint32_t>> got;
        for (size_t t = 0; t < in.size(); ++t) {
          const int64_t n = sb[3 * t + 2]->read<int64_t>(1)[0];
          WEFT_REQUIRE(n >= 0 && n <= in[t].num_indices,
                       fmt::format("weft bench embedding_a2a: {}: backward's count {} for table {}", label, n, t));
          got.push_back(sb[3 * t]->read<uint32_t>(static_cast<size_t>(2 * n)));
          got.push_back(sb[3 * t + 1]->read<uint32_t>(static_cast<size_t>(n * c.dim)));
        }
        if (first.empty()) first = std::move(got);
        WEFT_REQUIRE(got.empty() || got == first,
                     fmt::format("weft bench embedding_a2a: {}: fused's backward differs from the baseline's", label));
      }
    }
    for (auto& col : cols) col.second();  // every column's set-up outside the capture (SGD moves the weights)
#ifdef WEFT_HAVE_CUDA
    if (gpu) WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
#endif
    std::map<std::string, std::vector<double>> us;
    [[maybe_unused]] const int reps = opt.quick ? 3 : 10;
#ifdef WEFT_HAVE_CUDA
    if (gpu) {
      std::vector<std::unique_ptr<ReplayGraph>> graphs;
      b.barrier();
      for (auto& col : cols) {
        graphs.push_back(std::make_unique<ReplayGraph>(stream, 3, col.second));
        graphs.back()->launch();
      }
      if (opt.progress) opt.progress(label + ": timing");
      for (int i = 0; i < reps; ++i)
        for (size_t k = 0; k < cols.size(); ++k)
          us[cols[k].first].push_back(graphs[k]->timed_replay(b, bar, ts.e0, ts.e1, 200000));
    }
#endif
    if (!gpu)
      for (int i = 0; i < 3; ++i)
        for (auto& col : cols) {
          b.barrier();
          const auto t0 = std::chrono::steady_clock::now();
          col.second();
          us[col.first].push_back(
              std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        }
    for (auto& col : cols) {
      EmbeddingPoint pt;
      pt.shape = c.shape;
      pt.method = col.first;
      pt.batch = c.batch;
      pt.dim = c.dim;
      pt.tables = kTables;
      pt.pooling = pool_sum / kTables;
      pt.median_us = slowest(median(us[col.first]));
      if (col.first == "lookup") pt.bytes = row_bytes;
      if (col.first == "all_to_all") pt.bytes = sent;
      pt.bytes = slowest(pt.bytes);  // the busiest rank's
      pt.gbps = pt.median_us > 0 ? pt.bytes / (pt.median_us * 1e3) : 0;
      res.points.push_back(pt);
    }
  }
  return res;
}

nlohmann::json to_json(const EmbeddingBenchResult& r) {
  nlohmann::json j;
  j["bench"] = "embedding_a2a";
  j["device"] = r.device;
  j["backend"] = r.backend;
  j["world"] = r.world;
  j["timing"] = r.timing;
  j["copy_gbps"] = r.copy_gbps;
  j["points"] = nlohmann::json::array();
  for (const EmbeddingPoint& p : r.points)
    j["points"].push_back({{"shape", p.shape},
                           {"method", p.method},
                           {"batch", p.batch},
                           {"dim", p.dim},
                           {"tables", p.tables},
                           {"pooling", p.pooling},
                           {"median_us", p.median_us},
                           {"bytes", p.bytes},
                           {"gbps", p.gbps}});
  return j;
}

std::string to_table(const EmbeddingBenchResult& r) {
  std::string s = fmt::format(
      "weft bench embedding_a2a on {} x{} ({}), 26 tables, fp32, sum; us; lookup GB/s of rows read (a device copy: "
      "{:.0f} GB/s)\n",
      r.device, r.world, r.backend, r.copy_gbps);
  s += fmt::format(
      "{:6} {:>6} {:>4} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7} {:>7} {:>9} {:>9} {:>9} {:>7}\n", "shape",
      "B", "D", "pool", "baseline", "decomposed", "fused", "auto", "lookup", "a2a", "GB/s", "fused/b", "bwd base",
      "bwd dec", "bwd fused", "bwd f/b");
  std::map<std::string, std::map<std::string, const EmbeddingPoint*>> rows;
  std::vector<std::string> order;
  for (const EmbeddingPoint& p : r.points) {
    const std::string key = fmt::format("{:6} {:>6} {:>4} {:>6.1f}", p.shape, p.batch, p.dim, p.pooling);
    if (!rows.count(key)) order.push_back(key);
    rows[key][p.method] = &p;
  }
  for (const auto& key : order) {
    auto& m = rows[key];
    auto us = [&](const char* k) { return m.count(k) ? fmt::format("{:.1f}", m[k]->median_us) : std::string("-"); };
    const double gb = m.count("lookup") ? m["lookup"]->gbps : 0;
    const double ratio = m.count("fused") && m.count("baseline") && m["baseline"]->median_us > 0
                             ? m["fused"]->median_us / m["baseline"]->median_us
                             : 0;
    const double bwd = m.count("bwd_fused") && m.count("bwd_baseline") && m["bwd_baseline"]->median_us > 0
                           ? m["bwd_fused"]->median_us / m["bwd_baseline"]->median_us
                           : 0;
    s += fmt::format("{} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7.0f} {:>7.2f} {:>9} {:>9} {:>9} {:>7.2f}\n", key,
                     us("baseline"), us("decomposed"), us("fused"), us("auto"), us("lookup"), us("all_to_all"), gb,
                     ratio, us("bwd_baseline"), us("bwd_decomposed"), us("bwd_fused"), bwd);
  }
  return s;
}

}  // namespace weft::bench
