#include "weft/bench/moe_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>

#include "weft/core/error.hpp"
#include "weft/ops/moe.hpp"

#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime.h>

#include "weft/bench/graph_timing.hpp"
#include "weft/core/cuda_check.hpp"
#endif

namespace weft::bench {
namespace {

struct MoeShape {
  const char* name;
  int64_t hidden, experts, top_k;
};
// The shapes (the expert ffn does not enter dispatch and combine).
constexpr MoeShape kShapes[] = {
    {"mixtral", 4096, 8, 2}, {"qwen3-30b-a3b", 2048, 128, 8}, {"deepseek-v3-like", 7168, 64, 8}};

// Bytes in the backend's memory (device on GPUs), zeroed.
class Mem {
 public:
  Mem(bool gpu, size_t n) : gpu_(gpu) {
#ifdef WEFT_HAVE_CUDA
    if (gpu) {
      WEFT_CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(n, 16)));
      WEFT_CUDA_CHECK(cudaMemset(p_, 0, std::max<size_t>(n, 16)));
      return;
    }
#endif
    host_.assign(n + 16, 0);
    p_ = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(host_.data()) + 15) & ~uintptr_t{15});
  }
  ~Mem() {
#ifdef WEFT_HAVE_CUDA
    if (gpu_) cudaFree(p_);
#endif
  }
  Mem(const Mem&) = delete;
  void load(const void* src, size_t n) {
#ifdef WEFT_HAVE_CUDA
    if (gpu_) {
      WEFT_CUDA_CHECK(cudaMemcpy(p_, src, n, cudaMemcpyHostToDevice));
      return;
    }
#endif
    std::memcpy(p_, src, n);
  }
  void* get() const { return p_; }

 private:
  bool gpu_;
  void* p_ = nullptr;
  std::vector<unsigned char> host_;
};

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
      shapes = {{"small", 64, 4 * world, 2}};
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
      const std::vector<int32_t> mine = routing(rank, T, sh.experts, sh.top_k);
      ids.load(mine.data(), mine.size() * 4);
      const std::vector<float> w(mine.size(), 1.f / static_cast<float>(sh.top_k));
      wt.load(w.data(), w.size() * 4);
      double link = 0;  // rows every rank sends to other ranks, bytes, mean over the ranks
      for (int p = 0; p < world; ++p)
        for (int32_t e : routing(p, T, sh.experts, sh.top_k)) link += e / L != p ? static_cast<double>(row) : 0.0;
      link /= world;
      for (ops::MoeMethod m : {ops::MoeMethod::kBaseline, ops::MoeMethod::kDecomposed, ops::MoeMethod::kDirect}) {
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
        const int reps = gpu ? (opt.quick ? 5 : 15) : 3;
        for (auto [part, call] : std::vector<std::pair<const char*, std::function<void()>>>{
                 {"dispatch", dispatch}, {"combine", combine}, {"both", both}}) {
          std::vector<double> us;
          if (opt.progress) opt.progress(fmt::format("{} T {} {}: {}", sh.name, T, ops::to_string(m), part));
#ifdef WEFT_HAVE_CUDA
          if (gpu) {
            WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
            b.barrier();
            if (m != ops::MoeMethod::kBaseline) {
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
          med = *std::max_element(all.begin(), all.end());
          MoePoint pt;
          pt.shape = sh.name;
          pt.method = ops::to_string(m);
          pt.part = part;
          pt.hidden = sh.hidden;
          pt.experts = sh.experts;
          pt.top_k = sh.top_k;
          pt.tokens = T;
          pt.median_us = med;
          pt.link_bytes = std::string(part) == "both" ? 2 * link : link;
          pt.gbps = med > 0 ? pt.link_bytes / (med * 1e3) : 0;
          res.points.push_back(pt);
        }
      }
#ifdef WEFT_HAVE_CUDA
      if (gpu) WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
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
                           {"gbps", p.gbps}});
  return j;
}

std::string to_table(const MoeBenchResult& r) {
  std::string s = fmt::format("weft bench moe on {} x{} ({}), bf16; us (GB/s of rows crossing the link)\n", r.device,
                              r.world, r.backend);
  s += fmt::format("{:18} {:>5} {:>11} {:>18} {:>18} {:>10}\n", "shape", "T", "method", "dispatch", "combine", "both");
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
    s += fmt::format("{} {:>18} {:>18} {:>10}\n", key, cell("dispatch", true), cell("combine", true),
                     cell("both", false));
  }
  return s;
}

}  // namespace weft::bench
