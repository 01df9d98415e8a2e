// The GEMV + AllReduce op (gemv_ar_impl.hpp): configuration and call checks, agreement across
// ranks, the method choice (`auto`: model.cpp), the method objects, dispatch; and the context's
// shared pieces (the local GEMV, the unfused epilogue).
#include "weft/ops/gemv_ar.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <set>
#include <utility>

#include "../common/tuning_cache.hpp"
#include "gemv_ar_impl.hpp"
#include "weft/core/error.hpp"
#include "weft/device/dtype.hpp"

#ifdef WEFT_HAVE_CUDA
#include "weft/core/cuda_check.hpp"
#endif

namespace weft::ops {

namespace detail {

GemvContext::GemvContext(Backend& backend, const GemvArConfig& c)
    : b(backend), cfg(c), share(backend, "gemv_ar"), op(backend, "gemv_ar"), coll(backend) {
  op.set_share(&share);
  world = backend.size();
  rank = backend.rank();
  eb = dev::dtype_size(c.dtype);
  k_local = c.k / world;
}

GemvContext::~GemvContext() {
#ifdef WEFT_HAVE_CUDA
  if (blas) cublasDestroy(blas);
  if (blas_workspace) cudaFree(blas_workspace);
  if (gpu_sum) cudaFree(gpu_sum);
#endif
}

namespace {

template <class T>
void host_gemv_t(const T* x, const T* w, T* y, int64_t m, int64_t n, int64_t k) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.f;
      const T* xr = x + i * k;
      const T* wr = w + j * k;
      for (int64_t q = 0; q < k; ++q) acc += dev::to_float(xr[q]) * dev::to_float(wr[q]);
      y[i * n + j] = dev::from_float<T>(acc);
    }
}

// residual_out and out are written row by row after the row's reads, so residual ==
// residual_out (in place) is fine.
template <class T>
void host_add_rmsnorm_t(const T* y, const T* residual, const T* gamma, T* residual_out, T* out, int64_t m, int64_t n,
                        float eps) {
  std::vector<float> r(static_cast<size_t>(n));
  for (int64_t i = 0; i < m; ++i) {
    float ss = 0.f;
    for (int64_t j = 0; j < n; ++j) {
      const T v = dev::from_float<T>(dev::to_float(y[i * n + j]) + dev::to_float(residual[i * n + j]));
      r[static_cast<size_t>(j)] = dev::to_float(v);
      residual_out[i * n + j] = v;
      ss += r[static_cast<size_t>(j)] * r[static_cast<size_t>(j)];
    }
    const float inv = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
    for (int64_t j = 0; j < n; ++j)
      out[i * n + j] = dev::from_float<T>(r[static_cast<size_t>(j)] * inv * dev::to_float(gamma[j]));
  }
}

}  // namespace

void GemvContext::gemv(const void* x, const void* w, void* y, int64_t m, void* stream, bool weft) {
#ifdef WEFT_HAVE_CUDA
  if (!host()) {
    const auto s = static_cast<cudaStream_t>(stream);
    if (weft) {
      kernels::GemvArgs a;
      a.x = x;
      a.w = w;
      a.y = y;
      a.m = static_cast<int>(m);
      a.n = static_cast<int>(cfg.n);
      a.k = static_cast<int>(k_local);
      a.m_max = static_cast<int>(cfg.m_max);
      a.op_tag = dev::op_tag("gemv_ar");
      WEFT_CUDA_CHECK(kernels::gemv_local(a, cfg.dtype, s));
      return;
    }
    // Row-major y = x w^T through cuBLAS's column-major view: y^T [n x m] = w [n x k] x^T.
    const cudaDataType_t t = cfg.dtype == dev::DType::kF16 ? CUDA_R_16F : CUDA_R_16BF;
    const float alpha = 1.f, beta = 0.f;
    const int n = static_cast<int>(cfg.n), k = static_cast<int>(k_local), rows = static_cast<int>(m);
    WEFT_CUBLAS_CHECK(cublasSetStream(blas, s));
    WEFT_CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, &alpha, w, t, k, x, t, k, &beta, y, t, n,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return;
  }
#endif
  (void)stream, (void)weft;
  if (cfg.dtype == dev::DType::kF16)
    host_gemv_t(static_cast<const dev::f16_t*>(x), static_cast<const dev::f16_t*>(w), static_cast<dev::f16_t*>(y), m,
                cfg.n, k_local);
  else
    host_gemv_t(static_cast<const dev::bf16_t*>(x), static_cast<const dev::bf16_t*>(w), static_cast<dev::bf16_t*>(y), m,
                cfg.n, k_local);
}

void GemvContext::copy_rows(void* dst, const void* src, int64_t m, void* stream) {
  const size_t bytes = static_cast<size_t>(m * cfg.n) * eb;
#ifdef WEFT_HAVE_CUDA
  if (!host()) {
    WEFT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)));
    return;
  }
#endif
  (void)stream;
  std::memcpy(dst, src, bytes);
}

void GemvContext::add_rmsnorm(const void* y, const void* residual, const void* gamma, void* residual_out, void* out,
                              int64_t m, void* stream) {
#ifdef WEFT_HAVE_CUDA
  if (!host()) {
    WEFT_CUDA_CHECK(kernels::add_rmsnorm(y, residual, gamma, residual_out, out, static_cast<int>(m),
                                         static_cast<int>(cfg.n), cfg.eps, cfg.dtype,
                                         static_cast<cudaStream_t>(stream)));
    return;
  }
#endif
  (void)stream;
  if (cfg.dtype == dev::DType::kF16)
    host_add_rmsnorm_t(static_cast<const dev::f16_t*>(y), static_cast<const dev::f16_t*>(residual),
                       static_cast<const dev::f16_t*>(gamma), static_cast<dev::f16_t*>(residual_out),
                       static_cast<dev::f16_t*>(out), m, cfg.n, cfg.eps);
  else
    host_add_rmsnorm_t(static_cast<const dev::bf16_t*>(y), static_cast<const dev::bf16_t*>(residual),
                       static_cast<const dev::bf16_t*>(gamma), static_cast<dev::bf16_t*>(residual_out),
                       static_cast<dev::bf16_t*>(out), m, cfg.n, cfg.eps);
}

#ifdef WEFT_HAVE_CUDA
void GemvContext::init_gpu() {
  WEFT_CUBLAS_CHECK(cublasCreate(&blas));
  const size_t ws = 4ull << 20;  // skinny GEMMs need little; set so that graph capture never allocates
  WEFT_CUDA_CHECK(cudaMalloc(&blas_workspace, ws));
  WEFT_CUBLAS_CHECK(cublasSetWorkspace(blas, blas_workspace, ws));
  WEFT_CUBLAS_CHECK(cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH));
  const size_t bytes = static_cast<size_t>(cfg.m_max * cfg.n) * eb;
  WEFT_CUDA_CHECK(cudaMalloc(&gpu_sum, bytes));
  WEFT_CUDA_CHECK(cudaMemset(gpu_sum, 0, bytes));
}
#endif

}  // namespace detail

namespace {
// The token tiles `auto`'s tuned choices are kept by: the kernels' (M rounded up to these).
constexpr int64_t kGemvTileMs[] = {8, 16, 32, 64, 128};
constexpr size_t kGemvTiles = std::size(kGemvTileMs);
size_t tile_of(int64_t m) {
  size_t t = 0;
  while (kGemvTileMs[t] < m) ++t;
  return t;
}

}  // namespace

// ---- the op ----------------------------------------------------------------------------------

struct GemvAllReduce::Impl : detail::GemvContext {
  Impl(Backend& backend, const GemvArConfig& c) : GemvContext(backend, c) {}

  std::unique_ptr<detail::GemvBaseline> baseline;
  std::unique_ptr<detail::GemvDecomposed> decomposed;
  std::unique_ptr<detail::GemvFused> fused;  // null where the GPU has no fused kernel
  std::vector<GemvAutoChoice> autoc;         // [m - 1], every M of 1 .. m_max
  std::string cache;                         // the tuning cache's path ("": none)
  std::set<std::pair<int64_t, int>> agreed;  // (M, method) whose first call the ranks agreed on

  std::vector<GemvMethod> available() const {
    std::vector<GemvMethod> v{GemvMethod::kBaseline};
    if (decomposed->ready()) v.push_back(GemvMethod::kDecomposed);
    if (fused) v.push_back(GemvMethod::kFused);
    return v;
  }

  void check_m(int64_t m, const char* what) const {
    WEFT_REQUIRE(m >= 1 && m <= cfg.m_max,
                 fmt::format("gemv_ar: {} M = {} is outside 1 .. {} (config.m_max: the most tokens a call may have)",
                             what, m, cfg.m_max));
  }

  // The tuning-cache key of this shape's token tile t (kGemvTileMs[t]):
  // gemv_ar|device|world|NxK|dtype|epilogue|m<=tile.
  std::string tuning_key(size_t t) const {
    return fmt::format("gemv_ar|{}|w{}|{}x{}|{}|{}|m<={}", b.device_name(), world, cfg.n, cfg.k,
                       dev::dtype_name(cfg.dtype), cfg.epilogue ? "norm" : "plain", kGemvTileMs[t]);
  }

  detail::GemvMethodImpl* method_of(GemvMethod m) const {
    switch (m) {
      case GemvMethod::kBaseline:
        return baseline.get();
      case GemvMethod::kDecomposed:
        if (!decomposed->ready()) throw Error("gemv_ar: the decomposed method is not available: " + decomposed->why());
        return decomposed.get();
      case GemvMethod::kFused:
        if (!fused) throw Error("gemv_ar: the fused method is not available on this GPU (no fused kernel for it)");
        return fused.get();
      case GemvMethod::kAuto:
        break;
    }
    throw_error(__FILE__, __LINE__, "gemv_ar: auto was not resolved");
  }
};

namespace {

// Checked before anything collective, so every rank refuses the same bad configuration alike.
void validate(const GemvArConfig& c, int world) {
  WEFT_REQUIRE(c.n >= 1, fmt::format("gemv_ar: n = {} (need at least 1)", c.n));
  WEFT_REQUIRE(c.k >= 1, fmt::format("gemv_ar: k = {} (need at least 1)", c.k));
  WEFT_REQUIRE(c.dtype == dev::DType::kBF16 || c.dtype == dev::DType::kF16,
               fmt::format("gemv_ar: dtype {} (gemv_ar takes bf16 or f16)", dev::dtype_name(c.dtype)));
  WEFT_REQUIRE(c.k % world == 0, fmt::format("gemv_ar: k = {} does not divide among {} ranks (x and w are split "
                                             "along K; pad K to a multiple of {})",
                                             c.k, world, world));
  WEFT_REQUIRE((c.k / world) % 8 == 0,
               fmt::format("gemv_ar: k = {} on {} ranks: K per rank = {} is not a multiple of 8 (rows of x and w must "
                           "be 16-byte aligned)",
                           c.k, world, c.k / world));
  WEFT_REQUIRE(c.n % 8 == 0, fmt::format("gemv_ar: n = {} is not a multiple of 8 (y's rows and the fused method's "
                                         "16-byte lines)",
                                         c.n));
  WEFT_REQUIRE(c.m_max >= 1 && c.m_max <= kGemvMaxM,
               fmt::format("gemv_ar: m_max = {} is outside 1 .. {}", c.m_max, kGemvMaxM));
  WEFT_REQUIRE(std::isfinite(c.eps) && c.eps >= 0.f,
               fmt::format("gemv_ar: eps = {} (need a finite value >= 0)", c.eps));
}

std::string describe(const GemvArConfig& c) {
  return fmt::format("N x K = {} x {}, m_max {}, {}, epilogue {}, eps {}", c.n, c.k, c.m_max, dev::dtype_name(c.dtype),
                     c.epilogue ? "on" : "off", c.eps);
}

}  // namespace

GemvAllReduce::GemvAllReduce(Backend& backend, const GemvArConfig& config) {
  validate(config, backend.size());
  impl_ = std::make_unique<Impl>(backend, config);
  Impl& I = *impl_;
  I.op.agree("the configuration", describe(config));
  const SymmetricHeap::Scope mine = I.share.scope();  // every allocation of the set-up is the op's
  int ctas = 0, small_ctas = 0;
  if (I.host()) {
    I.host_sum.resize(static_cast<size_t>(config.m_max * config.n) * I.eb);
    // Two grids unlike each other, as on GPUs (the two state sets are tested apart).
    ctas = static_cast<int>(std::min<int64_t>(4, config.n / 8));
    small_ctas = static_cast<int>(std::min<int64_t>(3, config.n / 8));
  } else {
#ifdef WEFT_HAVE_CUDA
    I.init_gpu();
    int device = 0;
    WEFT_CUDA_CHECK(cudaGetDevice(&device));
    const int m_small = static_cast<int>(std::min<int64_t>(config.m_max, kernels::kGemvSmallM));
    small_ctas = kernels::gemv_ar_fused_small_ctas(static_cast<int>(config.n), m_small, device);
    ctas = config.m_max > kernels::kGemvSmallM ? kernels::gemv_ar_fused_ctas(static_cast<int>(config.n), device)
                                               : small_ctas;
    if (small_ctas == 0) ctas = 0;
    // The fused call's grids must be the same on every rank (their per-CTA epochs and parts).
    I.op.agree("the fused grid", fmt::format("{} / {} CTAs", small_ctas, ctas));
#else
    throw_error(__FILE__, __LINE__, "gemv_ar: the nccl backend needs a CUDA build");
#endif
  }
  // In this order on every rank (symmetric allocations are matched by name, size and order).
  I.baseline = std::make_unique<detail::GemvBaseline>(I);
  I.decomposed = std::make_unique<detail::GemvDecomposed>(I);
  if (ctas > 0) I.fused = std::make_unique<detail::GemvFused>(I, ctas, small_ctas);
  if (!I.decomposed->ready() && I.rank == 0)
    std::fprintf(stderr, "weft: gemv_ar: the decomposed method is not available: %s\n", I.decomposed->why().c_str());
  // Tuning cache: rank 0 reads each token tile's entry and tells everyone, so every rank
  // decides alike; an entry naming a method this op does not have is ignored.
  I.cache = detail::tuning_cache_path(config.tune_cache, "gemv_ar.json");
  int32_t tuned[kGemvTiles];
  const auto avail = I.available();
  for (size_t t = 0; t < kGemvTiles; ++t) {
    tuned[t] = -1;
    if (I.rank != 0) continue;
    if (auto c = detail::read_tuned_choice(I.cache, I.tuning_key(t))) {
      try {
        const GemvMethod meth = parse_gemv_method(c->method);
        if (meth != GemvMethod::kAuto && std::find(avail.begin(), avail.end(), meth) != avail.end())
          tuned[t] = static_cast<int32_t>(meth);
      } catch (const InvalidArgument&) {  // an unknown method: the entry is ignored
      }
    }
  }
  I.b.bootstrap().broadcast(tuned, sizeof tuned, 0);
  const plan::DeviceConstants d = detail::gemv_device_constants();
  for (int64_t m = 1; m <= config.m_max; ++m) {
    detail::GemvModelInput in{
        I.world, m, config.n, I.k_local, I.eb, config.epilogue, I.fused != nullptr, I.decomposed->ready()};
    GemvAutoChoice a;
    if (I.host()) {
      a.method = I.fused ? GemvMethod::kFused : GemvMethod::kBaseline;
      a.source = "host backend default";
    } else {
      a = detail::predict_gemv(in, d);
    }
    if (const int32_t t = tuned[tile_of(m)]; t >= 0) {
      a.method = static_cast<GemvMethod>(t);
      a.source = "tuning cache " + I.cache;
    }
    I.autoc.push_back(a);
  }
}

GemvAllReduce::~GemvAllReduce() = default;

void GemvAllReduce::run(const void* x, const void* w, void* y, const GemvRunOptions& opt) {
  Impl& I = *impl_;
  const int64_t m = opt.m ? opt.m : I.cfg.m_max;
  I.check_m(m, "this call's");
  I.b.record_call("gemv_ar", to_string(opt.method), static_cast<uint64_t>(m), static_cast<int32_t>(I.cfg.dtype), true);
  I.op.guarded([&] {
    // The first call of each (M, method) is agreed across ranks; later calls check nothing
    // collective, so they can be captured into CUDA graphs (a later mismatch makes the waits
    // time out, and the failure report names both calls from the records).
    const std::pair<int64_t, int> key{m, static_cast<int>(opt.method)};
    if (I.world > 1 && !I.agreed.count(key))
      I.op.agree("the call", fmt::format("M = {}, method {}", m, to_string(opt.method)));
    I.agreed.insert(key);
    const uint64_t x_bytes = static_cast<uint64_t>(m * I.k_local) * I.eb;
    const uint64_t w_bytes = static_cast<uint64_t>(I.cfg.n * I.k_local) * I.eb;
    const uint64_t y_bytes = static_cast<uint64_t>(m * I.cfg.n) * I.eb;
    I.op.check_ptr(x, 16, "x");
    I.op.check_ptr(w, 16, "w");
    I.op.check_ptr(y, 16, "y");
    WEFT_REQUIRE(!detail::ranges_overlap(y, y_bytes, x, x_bytes) && !detail::ranges_overlap(y, y_bytes, w, w_bytes),
                 "gemv_ar: y overlaps x or w (y is written while they are read)");
    detail::GemvEpilogue ep{opt.residual, opt.gamma, opt.residual_out};
    if (I.cfg.epilogue) {
      I.op.check_ptr(opt.residual, 16, "residual (the epilogue's operand)");
      I.op.check_ptr(opt.gamma, 16, "gamma (the epilogue's operand)");
      I.op.check_ptr(opt.residual_out, 16, "residual_out (the epilogue's operand)");
      const uint64_t g_bytes = static_cast<uint64_t>(I.cfg.n) * I.eb;
      WEFT_REQUIRE(!detail::ranges_overlap(y, y_bytes, opt.residual, y_bytes) &&
                       !detail::ranges_overlap(y, y_bytes, opt.gamma, g_bytes) &&
                       !detail::ranges_overlap(y, y_bytes, opt.residual_out, y_bytes),
                   "gemv_ar: y overlaps residual, gamma or residual_out");
      WEFT_REQUIRE(!detail::ranges_overlap(opt.residual_out, y_bytes, x, x_bytes) &&
                       !detail::ranges_overlap(opt.residual_out, y_bytes, w, w_bytes) &&
                       !detail::ranges_overlap(opt.residual_out, y_bytes, opt.gamma, g_bytes),
                   "gemv_ar: residual_out overlaps x, w or gamma");
      WEFT_REQUIRE(
          opt.residual == opt.residual_out || !detail::ranges_overlap(opt.residual, y_bytes, opt.residual_out, y_bytes),
          "gemv_ar: residual and residual_out overlap without being the same buffer (in place)");
    } else {
      WEFT_REQUIRE(!opt.residual && !opt.gamma && !opt.residual_out,
                   "gemv_ar: epilogue operands (residual, gamma, residual_out) given, but the op was made without "
                   "the epilogue (GemvArConfig::epilogue)");
    }
    const GemvMethod method = opt.method == GemvMethod::kAuto ? I.autoc[static_cast<size_t>(m - 1)].method : opt.method;
    I.method_of(method)->run(m, x, w, y, ep, opt.stream);
  });
}

void GemvAllReduce::run_gemv_only(const void* x, const void* w, void* y, int64_t m, bool weft, void* stream) {
  Impl& I = *impl_;
  I.check_m(m, "run_gemv_only:");
  I.op.check_ptr(x, 16, "x");
  I.op.check_ptr(w, 16, "w");
  I.op.check_ptr(y, 16, "y");
  I.gemv(x, w, y, m, stream, weft);
}

void GemvAllReduce::run_all_reduce_only(void* y, int64_t m, GemvMethod method, void* stream) {
  Impl& I = *impl_;
  I.check_m(m, "run_all_reduce_only:");
  I.op.check_ptr(y, 16, "y");
  I.b.record_call("gemv_ar.all_reduce", to_string(method), static_cast<uint64_t>(m), static_cast<int32_t>(I.cfg.dtype),
                  true);
  I.op.guarded([&] {
    if (method == GemvMethod::kBaseline) return I.baseline->all_reduce(y, m, stream);
    if (method == GemvMethod::kDecomposed) {
      if (!I.decomposed->ready())
        throw Error("gemv_ar: the decomposed method is not available: " + I.decomposed->why());
      return I.decomposed->all_reduce(y, m, stream);
    }
    throw InvalidArgument(
        fmt::format("gemv_ar: run_all_reduce_only takes baseline or decomposed, not {}", to_string(method)));
  });
}

void GemvAllReduce::run_add_rmsnorm(const void* y, const void* residual, const void* gamma, void* residual_out,
                                    void* out, int64_t m, void* stream) {
  Impl& I = *impl_;
  I.check_m(m, "run_add_rmsnorm:");
  I.op.check_ptr(y, 16, "y");
  I.op.check_ptr(residual, 16, "residual");
  I.op.check_ptr(gamma, 16, "gamma");
  I.op.check_ptr(residual_out, 16, "residual_out");
  I.op.check_ptr(out, 16, "out");
  I.add_rmsnorm(y, residual, gamma, residual_out, out, m, stream);
}

std::vector<GemvMethod> GemvAllReduce::available_methods() const { return impl_->available(); }

GemvAutoChoice GemvAllReduce::auto_choice(int64_t m) const {
  impl_->check_m(m, "auto_choice:");
  return impl_->autoc[static_cast<size_t>(m - 1)];
}

void GemvAllReduce::record_tuned(int64_t m, GemvMethod method, double us) const {
  const Impl& I = *impl_;
  I.check_m(m, "record_tuned:");
  WEFT_REQUIRE(method != GemvMethod::kAuto, "gemv_ar: record_tuned takes a method, not auto");
  if (I.rank != 0 || I.cache.empty()) return;
  detail::store_tuned_choice(I.cache, I.tuning_key(tile_of(m)), {to_string(method), 0}, us);
}

const GemvArConfig& GemvAllReduce::config() const { return impl_->cfg; }
int64_t GemvAllReduce::k_local() const { return impl_->k_local; }

}  // namespace weft::ops
