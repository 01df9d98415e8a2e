// GEMV + AllReduce on the nccl backend (issue 23): every method (baseline, decomposed, fused
// where the GPU has it, auto), bf16 and f16, M in {1, 7, 16, 64, 128, 3, 17} from one object, the
// epilogue on and off; exact on small-integer data, within the dtype's rounding of an fp32
// reference on random data; CUDA-graph capture of every method, each graph replayed twice with
// different inputs. On 1 GPU and on every GPU; skipped without GPUs.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "gpu_harness.hpp"
#include "rank_harness.hpp"
#include "weft/core/cuda_check.hpp"
#include "weft/core/error.hpp"
#include "weft/device/dtype.hpp"
#include "weft/ops/gemv_ar.hpp"

using namespace weft;
using namespace weft::ops;
using namespace weft::testing;

namespace {

std::vector<RankResult> run_gpu(int n, const std::function<void()>& fn) {
  return run_gpu_ranks(n, fn, /*heap_mib=*/1024, /*deadline_ms=*/600000);
}

struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t n) : bytes(n) { WEFT_CUDA_CHECK(cudaMalloc(&p, n + 16)); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void load(const std::vector<uint16_t>& h) {
    WEFT_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  }
  std::vector<uint16_t> read(size_t n) const {
    std::vector<uint16_t> h(n);
    WEFT_CUDA_CHECK(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost));
    return h;
  }
};

uint16_t bits(float f, dev::DType t) {
  return t == dev::DType::kF16 ? dev::from_float<dev::f16_t>(f).bits : dev::from_float<dev::bf16_t>(f).bits;
}
float value(uint16_t b, dev::DType t) {
  return t == dev::DType::kF16 ? dev::to_float(dev::f16_t{b}) : dev::to_float(dev::bf16_t{b});
}
float unit_roundoff(dev::DType t) { return t == dev::DType::kF16 ? 1.f / 2048 : 1.f / 256; }

// Deterministic data, the same on every rank for a given (rank, call): `integer`: -1, 0, 1
// (K <= 128: every sum exact); else uniform in [-1, 1), rounded to the dtype.
float datum(bool integer, uint64_t seed) {
  seed = (seed ^ (seed >> 31)) * 0x9E3779B97F4A7C15ull;
  seed ^= seed >> 29;
  if (integer) return static_cast<float>(seed % 3) - 1.f;
  return static_cast<float>(seed % 65536) / 32768.f - 1.f;
}

// One call's data on this rank, and the fp32 reference (sums over every rank's partials, which
// the test makes itself) with each element's rounding bound.
struct Case {
  int64_t m = 0, n = 0, k_local = 0;
  dev::DType t{};
  bool integer = true, epilogue = false;
  std::vector<uint16_t> x, w, residual, gamma;
  std::vector<double> y;      // the exact sum of the dtype-rounded inputs' products
  std::vector<double> bound;  // |error| allowed for y: each partial's and the sum's rounding
  std::vector<double> r, out;
};

Case make_case(int rank, int world, int64_t m, int64_t n, int64_t k_local, dev::DType t, bool integer, bool epilogue,
               int64_t e) {
  Case c;
  c.m = m, c.n = n, c.k_local = k_local, c.t = t, c.integer = integer, c.epilogue = epilogue;
  auto X = [&](int r, int64_t i, int64_t q) {
    return value(bits(datum(integer, (e * 131 + r) * 1000003 + static_cast<uint64_t>(i * k_local + q)), t), t);
  };
  auto W = [&](int r, int64_t j, int64_t q) {
    return value(bits(datum(integer, (e * 137 + r) * 999983 + 77 + static_cast<uint64_t>(j * k_local + q)), t), t);
  };
  c.x.resize(static_cast<size_t>(m * k_local));
  c.w.resize(static_cast<size_t>(n * k_local));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t q = 0; q < k_local; ++q) c.x[static_cast<size_t>(i * k_local + q)] = bits(X(rank, i, q), t);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t q = 0; q < k_local; ++q) c.w[static_cast<size_t>(j * k_local + q)] = bits(W(rank, j, q), t);
  const double u = unit_roundoff(t);
  c.y.assign(static_cast<size_t>(m * n), 0.0);
  c.bound.assign(static_cast<size_t>(m * n), 0.0);
  std::vector<float> wr(static_cast<size_t>(n * k_local)), xr(static_cast<size_t>(m * k_local));
  std::vector<double> big(static_cast<size_t>(m * n), 0.0);  // the largest |partial| of each element
  for (int r = 0; r < world; ++r) {
    for (int64_t j = 0; j < n; ++j)
      for (int64_t q = 0; q < k_local; ++q) wr[static_cast<size_t>(j * k_local + q)] = W(r, j, q);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t q = 0; q < k_local; ++q) xr[static_cast<size_t>(i * k_local + q)] = X(r, i, q);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double p = 0, abs_sum = 0;
        for (int64_t q = 0; q < k_local; ++q) {
          const double t_ = static_cast<double>(xr[static_cast<size_t>(i * k_local + q)]) * wr[static_cast<size_t>(j * k_local + q)];
          p += t_;
          abs_sum += std::fabs(t_);
        }
        c.y[static_cast<size_t>(i * n + j)] += p;
        // The partial's rounding; its fp32 sum over K and a library's split-K partial sums kept
        // in the dtype (up to 4 roundings) err by the sum of |terms|, not by |p|, where the
        // terms cancel.
        c.bound[static_cast<size_t>(i * n + j)] +=
            2 * u * std::fabs(p) + (4 * u + static_cast<double>(k_local) * 0x1p-24) * abs_sum;
        big[static_cast<size_t>(i * n + j)] = std::max(big[static_cast<size_t>(i * n + j)], std::fabs(p));
      }
  }
  // Integer partials and sums up to 2 / u (256 in bf16, 2048 in f16) are exact: bound 0.
  for (size_t i = 0; i < c.y.size(); ++i)
    c.bound[i] =
        integer && std::max(big[i], std::fabs(c.y[i])) <= 2 / u ? 0.0 : c.bound[i] + 2 * u * std::fabs(c.y[i]) + 1e-6;
  if (!epilogue) return c;
  c.residual.resize(static_cast<size_t>(m * n));
  c.gamma.resize(static_cast<size_t>(n));
  c.r.resize(static_cast<size_t>(m * n));
  c.out.resize(static_cast<size_t>(m * n));
  for (int64_t j = 0; j < n; ++j)
    c.gamma[static_cast<size_t>(j)] =
        bits(integer ? static_cast<float>(j % 5) - 2.f : 1.f + datum(false, 5000 + j) / 2, t);
  for (int64_t i = 0; i < m; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < n; ++j) {
      const size_t a = static_cast<size_t>(i * n + j);
      c.residual[a] = bits(datum(integer, 9000 + e * 7 + a), t);
      c.r[a] = c.y[a] + value(c.residual[a], t);
      ss += c.r[a] * c.r[a];
    }
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + 1e-6);
    for (int64_t j = 0; j < n; ++j) {
      const size_t a = static_cast<size_t>(i * n + j);
      c.out[a] = c.r[a] * inv * value(c.gamma[static_cast<size_t>(j)], t);
    }
  }
  return c;
}

void expect_near(float got, double want, double bound, const std::string& what, size_t at) {
  WEFT_CHECK(std::fabs(static_cast<double>(got) - want) <= bound,
             fmt::format("{}: element {} is {}, expected {} (bound {})", what, at, got, want, bound));
}

// y (or, with the epilogue, residual_out and the normalised y) against the reference.
void check(const Case& c, const std::vector<uint16_t>& y, const std::vector<uint16_t>& r_out, const std::string& what) {
  const double u = unit_roundoff(c.t);
  for (size_t a = 0; a < static_cast<size_t>(c.m * c.n); ++a) {
    const float got = value(y[a], c.t);
    if (!c.epilogue) {
      // Exact where every partial and the sum are representable integers (bound 0), else
      // within the partials' and the sum's rounding.
      expect_near(got, c.y[a], c.bound[a], what + " y", a);
      continue;
    }
    const double rb =
        c.integer && c.bound[a] == 0 && std::fabs(c.r[a]) <= 2 / u ? 0.0 : c.bound[a] + 2 * u * std::fabs(c.r[a]);
    expect_near(value(r_out[a], c.t), c.r[a], rb, what + " residual_out", a);
    // The norm of a rounded residual_out: a few roundings of |out|, and y's error carried.
    expect_near(got, c.out[a], 8 * u * (std::fabs(c.out[a]) + 1) + 4 * rb, what + " out", a);
  }
}

std::vector<GemvMethod> methods_of(const GemvAllReduce& op) {
  std::vector<GemvMethod> v = op.available_methods();
  v.push_back(GemvMethod::kAuto);
  return v;
}

// One op per (dtype, epilogue): every method (or only `only`) at every M of ms, integer then
// random data.
int run_every_method(Backend& b, int64_t n, int64_t k, cudaStream_t s,
                     const std::vector<int64_t>& ms = {1, 7, 16, 64, 128, 3, 17},  // small set, large, back
                     const std::vector<dev::DType>& dtypes = {dev::DType::kBF16, dev::DType::kF16},
                     std::optional<GemvMethod> only = std::nullopt) {
  const int rank = b.rank(), world = b.size();
  int checks = 0;
  int64_t e = 0;
  for (dev::DType t : dtypes)
    for (bool epilogue : {false, true}) {
      GemvArConfig cfg;
      cfg.n = n;
      cfg.k = k;
      cfg.m_max = kGemvMaxM;
      cfg.dtype = t;
      cfg.epilogue = epilogue;
      GemvAllReduce op(b, cfg);
      const int64_t kl = op.k_local();
      DevBuf x(static_cast<size_t>(kGemvMaxM * kl) * 2), w(static_cast<size_t>(n * kl) * 2),
          y(static_cast<size_t>(kGemvMaxM * n) * 2), res(static_cast<size_t>(kGemvMaxM * n) * 2),
          gamma(static_cast<size_t>(n) * 2), r_out(static_cast<size_t>(kGemvMaxM * n) * 2);
      const std::vector<GemvMethod> methods = only ? std::vector<GemvMethod>{*only} : methods_of(op);
      for (int64_t m : ms)
        for (GemvMethod method : methods)
          for (bool integer : {true, false}) {
            ++e;
            const Case c = make_case(rank, world, m, n, kl, t, integer, epilogue, e);
            x.load(c.x);
            w.load(c.w);
            WEFT_CUDA_CHECK(cudaMemset(y.p, 0xFF, y.bytes));
            GemvRunOptions o;
            o.method = method;
            o.m = m;
            o.stream = s;
            if (epilogue) {
              res.load(c.residual);
              gamma.load(c.gamma);
              WEFT_CUDA_CHECK(cudaMemset(r_out.p, 0xFF, r_out.bytes));
              o.residual = res.p;
              o.gamma = gamma.p;
              o.residual_out = r_out.p;
            }
            WEFT_CUDA_CHECK(cudaDeviceSynchronize());
            op.run(x.p, w.p, y.p, o);
            WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
            b.synchronize();
            check(c, y.read(static_cast<size_t>(m * n)),
                  epilogue ? r_out.read(static_cast<size_t>(m * n)) : std::vector<uint16_t>{},
                  fmt::format("world {} N x K = {} x {} M = {} {} {} epilogue {} {} data", world, n, k, m,
                              to_string(method), dev::dtype_name(t), epilogue ? "on" : "off",
                              integer ? "integer" : "random"));
            ++checks;
            b.barrier();  // nobody reloads inputs a peer's call may still read
          }
    }
  return checks;
}

}  // namespace

class GemvArGpu : public ::testing::TestWithParam<int> {};

TEST_P(GemvArGpu, EveryMethodEveryMIsRight) {
  const int n = GetParam() == 0 ? gpus() : GetParam();
  if (gpus() < 1 || n > gpus()) GTEST_SKIP() << "needs " << n << " GPU(s)";
  expect_all_ok(run_gpu(n, [] {
    auto b = make_backend();
    const int w = b->size();
    cudaStream_t s;
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    // K = 16 per rank: integer sums stay within 128 (exact); then a larger depth per rank.
    int checks = run_every_method(*b, 256, 16 * w, s);
    checks += run_every_method(*b, 1024, 512 * w, s);
    if (b->rank() == 0) std::printf("[gpu] gemv_ar: %d ranks, %d checks passed\n", w, checks);
    WEFT_CUDA_CHECK(cudaStreamDestroy(s));
  }));
}

// The fused call on a decode-sized weight: N = 8192 is 64 tiles of 128 rows (every CTA of the
// grid busy, several parts each in finish), K = 1024 per rank, M from both token-tile ends.
TEST_P(GemvArGpu, FusedCallOnALargeWeight) {
  const int n = GetParam() == 0 ? gpus() : GetParam();
  if (gpus() < 1 || n > gpus()) GTEST_SKIP() << "needs " << n << " GPU(s)";
  expect_all_ok(run_gpu(n, [] {
    auto b = make_backend();
    cudaStream_t s;
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int checks =
        run_every_method(*b, 8192, 1024 * b->size(), s, {17, 128, 40}, {dev::DType::kBF16}, GemvMethod::kFused);
    if (b->rank() == 0) std::printf("[gpu] gemv_ar large weight: %d ranks, %d checks passed\n", b->size(), checks);
    WEFT_CUDA_CHECK(cudaStreamDestroy(s));
  }));
}

INSTANTIATE_TEST_SUITE_P(Gpus, GemvArGpu, ::testing::Values(1, 0));

// Every method captured into a CUDA graph without a call before it (the op prepared every M at
// construction), then replayed twice with different inputs: each replay right.
TEST(GemvArGpuGraph, CapturedCallsReplayWithNewInputs) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  expect_all_ok(run_gpu(gpus(), [] {
    auto b = make_backend();
    const int w = b->size(), rank = b->rank();
    cudaStream_t s;
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int64_t n = 512, k = 256 * w;
    for (bool epilogue : {false, true}) {
      GemvArConfig cfg;
      cfg.n = n;
      cfg.k = k;
      cfg.m_max = 64;
      cfg.epilogue = epilogue;
      GemvAllReduce op(*b, cfg);
      const int64_t kl = op.k_local();
      DevBuf x(static_cast<size_t>(64 * kl) * 2), wt(static_cast<size_t>(n * kl) * 2),
          y(static_cast<size_t>(64 * n) * 2), res(static_cast<size_t>(64 * n) * 2), gamma(static_cast<size_t>(n) * 2),
          r_out(static_cast<size_t>(64 * n) * 2);
      int64_t e = 100;
      for (GemvMethod method : op.available_methods())
        for (int64_t m : {16, 3}) {
          GemvRunOptions o;
          o.method = method;
          o.m = m;
          o.stream = s;
          if (epilogue) {
            o.residual = res.p;
            o.gamma = gamma.p;
            o.residual_out = r_out.p;
          }
          cudaGraph_t graph;
          cudaGraphExec_t exec;
          WEFT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
          op.run(x.p, wt.p, y.p, o);
          WEFT_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
          WEFT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
          for (int replay = 0; replay < 2; ++replay) {
            ++e;
            const Case c = make_case(rank, w, m, n, kl, dev::DType::kBF16, replay == 0, epilogue, e);
            x.load(c.x);
            wt.load(c.w);
            if (epilogue) {
              res.load(c.residual);
              gamma.load(c.gamma);
              WEFT_CUDA_CHECK(cudaMemset(r_out.p, 0xFF, r_out.bytes));
            }
            WEFT_CUDA_CHECK(cudaMemset(y.p, 0xFF, y.bytes));
            WEFT_CUDA_CHECK(cudaDeviceSynchronize());
            b->barrier();  // every rank's inputs are in place before anyone replays
            WEFT_CUDA_CHECK(cudaGraphLaunch(exec, s));
            WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
            b->synchronize();
            check(c, y.read(static_cast<size_t>(m * n)),
                  epilogue ? r_out.read(static_cast<size_t>(m * n)) : std::vector<uint16_t>{},
                  fmt::format("graph {} M = {} epilogue {} replay {}", to_string(method), m, epilogue ? "on" : "off",
                              replay));
            b->barrier();
          }
          WEFT_CUDA_CHECK(cudaGraphExecDestroy(exec));
          WEFT_CUDA_CHECK(cudaGraphDestroy(graph));
        }
    }
    WEFT_CUDA_CHECK(cudaStreamDestroy(s));
  }));
}
