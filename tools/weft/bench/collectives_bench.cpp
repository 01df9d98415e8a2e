#include "weft/bench/collectives_bench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <vector>

#include "weft/bench/devapi_bench.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/collectives.hpp"

#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include "weft/bench/graph_timing.hpp"
#include "weft/core/cuda_check.hpp"
#endif

namespace weft::bench {
namespace {

using ops::Method;

const std::vector<std::string> kColls = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"};

std::vector<Method> methods_for(const std::string& coll, uint64_t bytes) {
  if (coll == "all_reduce") {
    std::vector<Method> m{Method::kBaseline};
    if (bytes <= (4ull << 20)) m.push_back(Method::kOneShot);     // its staging grows as world x size
    if (bytes <= (1ull << 20)) m.push_back(Method::kLowLatency);     // twice the bytes: small calls only
    if (bytes <= (4ull << 20)) m.push_back(Method::kLowLatency128);  // one-shot: staging grows as world x size
    m.push_back(Method::kTwoShot);
    m.push_back(Method::kAuto);
    return m;
  }
  std::vector<Method> m{Method::kBaseline, Method::kDirect};
  // LL: twice the bytes, small calls only -- up to 2 MiB per rank, past auto's switch to
  // direct (1.5 MiB sent) on 2 and 4 ranks, so the crossover stays visible.
  if (bytes <= (2ull << 20)) m.push_back(Method::kLowLatency);
  m.push_back(Method::kAuto);
  return m;
}

// Bytes each rank sends to its peers (nccl-tests' bus bandwidth numerator).
double bus_bytes(const std::string& coll, uint64_t bytes, int world) {
  const double n = world, s = static_cast<double>(bytes);
  if (coll == "all_reduce") return 2.0 * (n - 1) / n * s;
  if (coll == "all_gather") return (n - 1) * s;
  return (n - 1) / n * s;  // reduce-scatter, all-to-all: input split in n blocks
}

// Element count the op takes for `bytes` of bf16 input per rank.
uint64_t count_for(const std::string& coll, uint64_t bytes, int world) {
  const uint64_t elems = bytes / 2;
  return coll == "all_reduce" || coll == "all_gather" ? elems : elems / world;
}

// NCCL buffers registered as symmetric windows (collective: every rank makes them in the same
// order); in and out stay null where the backend is not NCCL or NCCL refuses (a message once).
struct SymmBuffers {
  void* in = nullptr;
  void* out = nullptr;
#ifdef WEFT_HAVE_CUDA
  ncclComm_t comm = nullptr;
  ncclWindow_t win[2] = {nullptr, nullptr};
#endif
  SymmBuffers(Backend& b, size_t in_bytes, size_t out_bytes) {
#ifdef WEFT_HAVE_CUDA
    comm = static_cast<ncclComm_t>(b.nccl_comm());
    if (!comm || in_bytes == 0) return;
    ncclResult_t r = ncclMemAlloc(&in, in_bytes);
    if (r == ncclSuccess) r = ncclMemAlloc(&out, out_bytes);
    if (r == ncclSuccess) r = ncclCommWindowRegister(comm, in, in_bytes, &win[0], NCCL_WIN_COLL_SYMMETRIC);
    if (r == ncclSuccess) r = ncclCommWindowRegister(comm, out, out_bytes, &win[1], NCCL_WIN_COLL_SYMMETRIC);
    if (r != ncclSuccess) {
      std::fprintf(stderr, "weft bench collectives: rank %d: no nccl_symm column (NCCL: %s)\n", b.rank(),
                   ncclGetErrorString(r));
      release();
    }
    // Every rank times the column or none does.
    const int ok = in != nullptr ? 1 : 0;
    std::vector<int> all(static_cast<size_t>(b.size()));
    b.bootstrap().allgather(&ok, sizeof ok, all.data());
    if (std::find(all.begin(), all.end(), 0) != all.end()) release();
#else
    (void)b, (void)in_bytes, (void)out_bytes;
#endif
  }
  ~SymmBuffers() { release(); }
  SymmBuffers(const SymmBuffers&) = delete;
  SymmBuffers& operator=(const SymmBuffers&) = delete;
  void release() {
#ifdef WEFT_HAVE_CUDA
    for (ncclWindow_t& w : win)
      if (w) ncclCommWindowDeregister(comm, w), w = nullptr;
    if (in) ncclMemFree(in);
    if (out) ncclMemFree(out);
#endif
    in = out = nullptr;
  }
};

}  // namespace

std::vector<CollPoint> bench_collectives(Backend& b, const CollBenchOptions& opt) {
  const int world = b.size();
  const bool gpu = b.kind() == BackendKind::kNccl;
  std::vector<uint64_t> sizes;
  if (gpu && !opt.quick)
    for (uint64_t s = 8ull << 10; s <= (256ull << 20); s *= 2) sizes.push_back(s);
  else if (gpu)
    sizes = {8ull << 10, 256ull << 10, 4ull << 20, 64ull << 20};
  else
    sizes = {8ull << 10, 256ull << 10, opt.quick ? (1ull << 20) : (8ull << 20)};
  const uint64_t max_in = sizes.back();
  std::vector<std::string> colls = opt.colls.empty() ? kColls : opt.colls;
  for (const auto& c : colls)
    WEFT_REQUIRE(
        std::find(kColls.begin(), kColls.end(), c) != kColls.end(),
        fmt::format("unknown collective '{}': expected all_reduce, all_gather, reduce_scatter, all_to_all", c));

  ops::Collectives coll(b);
  const uint64_t sym_out = b.heap().alloc_bytes(max_in * world, "bench.coll.out");
  // NCCL's symmetric mode, the second baseline: its collectives on buffers of its own
  // (ncclMemAlloc) registered as NCCL_WIN_COLL_SYMMETRIC windows, so that NCCL runs its
  // symmetric kernels. Where NCCL cannot, the column is left out (said once).
  SymmBuffers symm(b, gpu ? max_in : 0, gpu ? max_in * world : 0);
  // Lines the GPUs up before each timed replay (GPU builds only; allocated on every rank alike).
  [[maybe_unused]] const auto bar = b.heap().alloc_barrier("bench.coll.bar");
  std::vector<char> host_in(max_in);
  for (uint64_t i = 0; i < max_in / 2; ++i)  // small bf16 integers: never zeros, never overflow
    reinterpret_cast<dev::bf16_t*>(host_in.data())[i] =
        dev::from_float<dev::bf16_t>(static_cast<float>(static_cast<int>((i * 7 + b.rank()) % 13) - 6));

  void* in = nullptr;
  void* out = nullptr;
  std::vector<char> host_out;
#ifdef WEFT_HAVE_CUDA
  cudaStream_t stream = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
#endif
  if (gpu) {
#ifdef WEFT_HAVE_CUDA
    WEFT_CUDA_CHECK(cudaMalloc(&in, max_in));
    WEFT_CUDA_CHECK(cudaMalloc(&out, max_in * world));
    WEFT_CUDA_CHECK(cudaMemcpy(in, host_in.data(), max_in, cudaMemcpyHostToDevice));
    if (symm.in) WEFT_CUDA_CHECK(cudaMemcpy(symm.in, host_in.data(), max_in, cudaMemcpyHostToDevice));
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    WEFT_CUDA_CHECK(cudaEventCreate(&e0));
    WEFT_CUDA_CHECK(cudaEventCreate(&e1));
#endif
  } else {
    in = host_in.data();
    host_out.resize(max_in * world);
    out = host_out.data();
  }

  std::vector<CollPoint> pts;
  for (const auto& name : colls) {
    for (uint64_t bytes : sizes) {
      const uint64_t count = count_for(name, bytes, world);
      void* s = nullptr;
#ifdef WEFT_HAVE_CUDA
      s = stream;
#endif
      // Times `call` (GPU: CUDA-graph replays; host: eager calls) and records it as `method`.
      auto measure = [&](const std::string& method, const std::function<void()>& call) {
        std::vector<double> us;
        if (gpu) {
#ifdef WEFT_HAVE_CUDA
          call();  // first call of the shape: allocates its state, outside the capture
          WEFT_CUDA_CHECK(cudaStreamSynchronize(stream));
          b.barrier();
          const int per_graph = bytes <= (1ull << 20) ? 20 : bytes <= (16ull << 20) ? 5 : 2;
          const int reps = opt.quick ? 3 : (bytes <= (16ull << 20) ? 15 : 7);
          us = time_graph_replays(b, bar, stream, e0, e1, per_graph, reps, 100000, call);
#endif
        } else {
          call();
          for (int r = 0; r < 3; ++r) {
            b.barrier();
            auto t0 = std::chrono::steady_clock::now();
            call();
            us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
          }
        }
        CollPoint p{name, method, bytes, median(us), 0};
        p.busbw_gbps = bus_bytes(name, bytes, world) / (p.median_us * 1e-6) / 1e9;
        pts.push_back(p);
        if (opt.progress)
          opt.progress(fmt::format("{} {} {} KiB: {:.1f} us", name, p.method, bytes >> 10, p.median_us));
      };
      for (Method m : methods_for(name, bytes)) {
        auto call = [&] {
          if (name == "all_reduce") coll.all_reduce(in, out, count, dev::DType::kBF16, m, s);
          // NCCL writes into plain device memory, as its users do; weft into its symmetric output.
          const bool nccl = m == Method::kBaseline && gpu;
          if (name == "all_gather") {
            if (nccl)
              coll.baseline_all_gather(in, out, count, dev::DType::kBF16, s);
            else
              coll.all_gather(in, sym_out, count, dev::DType::kBF16, m, s);
          }
          if (name == "reduce_scatter") coll.reduce_scatter(in, out, count, dev::DType::kBF16, m, s);
          if (name == "all_to_all") {
            if (nccl)
              coll.baseline_all_to_all(in, out, count, dev::DType::kBF16, s);
            else
              coll.all_to_all(in, sym_out, count, dev::DType::kBF16, m, s);
          }
        };
        measure(m == Method::kBaseline ? (gpu ? "nccl" : "reference") : ops::to_string(m), call);
      }
      // Not all_to_all: NCCL has no symmetric kernel for it, and its all-to-all into a symmetric
      // window gave wrong data and hung at 2 MiB a peer (docs/collectives.md).
      if (symm.in && name != "all_to_all") {
        const void* sin = symm.in;
        void* sout = symm.out;
        measure("nccl_symm", [&] {
          if (name == "all_reduce") coll.all_reduce(sin, sout, count, dev::DType::kBF16, Method::kBaseline, s);
          if (name == "all_gather") coll.baseline_all_gather(sin, sout, count, dev::DType::kBF16, s);
          if (name == "reduce_scatter") coll.reduce_scatter(sin, sout, count, dev::DType::kBF16, Method::kBaseline, s);
        });
      }
    }
  }
#ifdef WEFT_HAVE_CUDA
  if (gpu) {
    WEFT_CUDA_CHECK(cudaEventDestroy(e0));
    WEFT_CUDA_CHECK(cudaEventDestroy(e1));
    WEFT_CUDA_CHECK(cudaStreamDestroy(stream));
    WEFT_CUDA_CHECK(cudaFree(in));
    WEFT_CUDA_CHECK(cudaFree(out));
  }
#endif
  return pts;
}

nlohmann::json to_json(const std::vector<CollPoint>& pts) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& p : pts)
    j.push_back({{"coll", p.coll},
                 {"method", p.method},
                 {"bytes", p.bytes},
                 {"median_us", p.median_us},
                 {"busbw_GBps", p.busbw_gbps}});
  return j;
}

std::string to_table(const std::vector<CollPoint>& pts) {
  // One row per (collective, size): every method's time and its ratio to the baseline.
  // The baseline is the better NCCL mode where both ran (nccl, nccl_symm: its symmetric windows).
  std::string out =
      fmt::format("{:<15} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>10} {:>8} {:>10}\n", "collective", "size",
                  "baseline", "nccl_symm", "one-shot", "two-shot", "ll", "ll128", "direct", "auto", "best/base");
  for (size_t i = 0; i < pts.size();) {
    size_t j = i;
    double base = 0, best = 1e30;
    std::map<std::string, double> t;
    for (; j < pts.size() && pts[j].coll == pts[i].coll && pts[j].bytes == pts[i].bytes; ++j) {
      t[pts[j].method] = pts[j].median_us;
      if (pts[j].method == "nccl" || pts[j].method == "reference" || pts[j].method == "nccl_symm")
        base = base > 0 ? std::min(base, pts[j].median_us) : pts[j].median_us;
      else
        best = std::min(best, pts[j].median_us);
    }
    auto cell = [&](const char* k) { return t.count(k) ? fmt::format("{:.1f}", t[k]) : std::string("-"); };
    const uint64_t kib = pts[i].bytes >> 10;
    const std::string plain = t.count("nccl") ? cell("nccl") : cell("reference");
    out += fmt::format("{:<15} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>10} {:>8} {:>10.2f}\n", pts[i].coll,
                       kib >= 1024 ? fmt::format("{} MiB", kib >> 10) : fmt::format("{} KiB", kib), plain,
                       cell("nccl_symm"), cell("one-shot"), cell("two-shot"), cell("ll"), cell("ll128"), cell("direct"),
                       cell("auto"), base > 0 ? best / base : 0.0);
    i = j;
  }
  return out + "times in us per call (median); baseline: NCCL (host: the reference), nccl_symm: NCCL on its "
               "symmetric windows; best/base: weft's best / the better NCCL mode, < 1: weft is faster\n";
}

}  // namespace weft::bench
