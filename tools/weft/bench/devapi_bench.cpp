#include "weft/bench/devapi_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <string_view>

#include "weft/core/error.hpp"
#include "weft/device/api.hpp"
#include "weft/runtime/host_exec.hpp"

namespace weft::bench {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

namespace {

uint32_t pattern(int rank, uint64_t i) {
  return static_cast<uint32_t>(rank + 1) * 0x01000193u ^ static_cast<uint32_t>(i);
}

// Host backend: "CTAs" are worker threads, each copying its slice through dev::put/get.
DevapiBenchResult bench_host(Backend& b, const DevapiBenchOptions& opt) {
  DevapiBenchResult res;
  res.device = b.device_name();
  res.backend = to_string(b.kind());
  res.world = b.size();
  res.reps = opt.quick ? 3 : 10;
  const uint64_t bytes = opt.quick ? (4ull << 20) : (32ull << 20);
  const uint64_t words = bytes / 4;
  auto src = b.heap().alloc<uint32_t>(words, "bench.src");
  auto dst = b.heap().alloc<uint32_t>(words, "bench.dst");
  auto sig = b.heap().alloc_signals(1, "bench.pingpong");
  const dev::DeviceCtx c = b.ctx();
  const int peer = (b.rank() + 1) % b.size();
  const int from = (b.rank() + b.size() - 1) % b.size();
  {
    uint32_t* s = c.local<uint32_t>(src.offset);
    for (uint64_t i = 0; i < words; ++i) s[i] = pattern(b.rank(), i);
  }
  for (const char* mode : {"push", "pull"}) {
    const bool push = std::string_view(mode) == "push";
    for (int workers : {1, 2}) {
      std::vector<double> us;
      for (int rep = 0; rep < res.reps; ++rep) {
        b.zero(dst.offset, bytes);
        b.barrier();
        auto t0 = std::chrono::steady_clock::now();
        host_launch(workers, 1, [&](CoopHostTeam, int w) {
          const uint64_t lo = bytes * w / workers, hi = bytes * (w + 1) / workers;
          if (push)  // my src into the peer's dst
            dev::put(dev::CoopThread{}, c, peer, dst.offset + lo, c.local<char>(src.offset) + lo, hi - lo);
          else  // pull: peer's src into my dst
            dev::get(dev::CoopThread{}, c, c.local<char>(dst.offset) + lo, peer, src.offset + lo, hi - lo);
        });
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        b.barrier();
      }
      // Push: my dst holds what `from` pushed; pull: my dst holds `peer`'s src.
      const int owner = push ? from : peer;
      const uint32_t* d = c.local<uint32_t>(dst.offset);
      bool ok = true;
      for (uint64_t i = 0; i < words && ok; ++i) ok = d[i] == pattern(owner, i);
      WEFT_CHECK(ok, fmt::format("rank {}: {} benchmark moved wrong data", b.rank(), mode));
      BandwidthPoint p{mode, workers, 1, bytes, median(us), 0, ok};
      p.gbps = bytes / (p.median_us * 1e-6) / 1e9;
      res.bandwidth.push_back(p);
      if (opt.progress) opt.progress(fmt::format("{} {} worker(s): {:.2f} GB/s", mode, workers, p.gbps));
    }
  }
  if (b.size() >= 2) {
    res.latency_iters = opt.quick ? 200 : 2000;
    // The signal is never reset and this is its first use: it counts from 0. (Reading it
    // here instead would race with the peer's first ping.)
    const uint64_t base = 0;
    b.barrier();
    auto t0 = std::chrono::steady_clock::now();
    if (b.rank() <= 1) {
      const int other = 1 - b.rank();
      for (int i = 1; i <= res.latency_iters; ++i) {
        if (b.rank() == 0) {
          dev::signal_add(c, other, sig.at(0), 1);
          dev::wait_ge(c, sig.at(0), base + i, other);
        } else {
          dev::wait_ge(c, sig.at(0), base + i, other);
          dev::signal_add(c, other, sig.at(0), 1);
        }
      }
    }
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    res.one_way_latency_us = us / res.latency_iters / 2;
    b.barrier();
  }
  return res;
}

}  // namespace

DevapiBenchResult bench_devapi(Backend& b, const DevapiBenchOptions& opt) {
#ifdef WEFT_HAVE_CUDA
  if (b.kind() == BackendKind::kNccl) return bench_devapi_gpu(b, opt);
#endif
  return bench_host(b, opt);
}

nlohmann::json to_json(const DevapiBenchResult& r) {
  nlohmann::json j;
  j["device"] = r.device;
  j["backend"] = r.backend;
  j["world"] = r.world;
  j["reps"] = r.reps;
  for (const auto& p : r.bandwidth)
    j["bandwidth"].push_back({{"mode", p.mode},
                              {"ctas", p.ctas},
                              {"threads", p.threads},
                              {"bytes", p.bytes},
                              {"median_us", p.median_us},
                              {"GBps", p.gbps},
                              {"verified", p.verified}});
  if (r.one_way_latency_us >= 0) {
    j["one_way_latency_us"] = r.one_way_latency_us;
    j["latency_iters"] = r.latency_iters;
  }
  return j;
}

std::string to_table(const DevapiBenchResult& r) {
  std::string out =
      fmt::format("device API on {} ({} backend, {} ranks, median of {} reps)\n", r.device, r.backend, r.world, r.reps);
  out += fmt::format("{:<6} {:>6} {:>8} {:>10} {:>12} {:>10}\n", "mode", "ctas", "threads", "MiB", "median us", "GB/s");
  for (const auto& p : r.bandwidth)
    out += fmt::format("{:<6} {:>6} {:>8} {:>10.1f} {:>12.1f} {:>10.1f}\n", p.mode, p.ctas, p.threads,
                       p.bytes / 1048576.0, p.median_us, p.gbps);
  if (r.one_way_latency_us >= 0)
    out += fmt::format("one-way signal latency: {:.2f} us (ping-pong of {} round trips, ranks 0 and 1)\n",
                       r.one_way_latency_us, r.latency_iters);
  else
    out += "one-way signal latency: not measured (one rank)\n";
  return out;
}

}  // namespace weft::bench
