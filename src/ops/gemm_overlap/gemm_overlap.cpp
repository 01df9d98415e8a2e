// The GEMM + communication op (gemm_overlap_impl.hpp): argument checks, the method choice
// (`auto`: the cost model, model.cpp, and the tuning cache), the method objects, dispatch.
#include "weft/ops/gemm_overlap.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <set>

#include "../common/tuning_cache.hpp"
#include "fused.hpp"
#include "gemm_overlap_impl.hpp"
#include "plan.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/gemm.hpp"
#include "weft/ops/gemm_overlap_model.hpp"
#include "weft/plan/cost.hpp"
#include "weft/plan/plan.hpp"

#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime.h>

#include "stream_memops.hpp"
#include "weft/core/cuda_check.hpp"
#include "weft/kernels/gemm.hpp"
#include "weft/kernels/runtime_kernels.hpp"
#endif

namespace weft::ops {

namespace {

using detail::ceil_div;

plan::DeviceConstants device_constants() {
  if (const std::string p = tunable_text(tunables::kDeviceConstants); !p.empty()) return plan::load_device_constants(p);
  return plan::h200_constants();
}

}  // namespace

// The op: the shapes, decisions and helpers its methods share are its base (GemmOpContext,
// gemm_overlap_impl.hpp).
struct GemmOverlap::Impl : detail::GemmOpContext {
  AutoChoice autoc;
  bool auto_pads = false;  // K per rank unaligned: `auto` runs the padded op (its own auto; make_padded)
  std::string cache;

  // The method objects, made at construction (setup: never inside a CUDA graph capture). GPU:
  // fused only where fused_gpu.
  std::unique_ptr<detail::GemmMethodImpl> baseline_method, decomposed_method, fused_method;

  Impl(Backend& backend, const GemmOverlapConfig& c, std::shared_ptr<detail::GemmShared> sh)
      : GemmOpContext(backend, c, std::move(sh)) {}

  void validate();
  // The tuning-cache key of this shape: op|device|world|MxKxN|dtype|layout.
  std::string tuning_key() const {
    return fmt::format("{}|{}|w{}|{}x{}x{}|{}|{}", to_string(cfg.op), b.device_name(), world, cfg.m, cfg.k, cfg.n,
                       dev::dtype_name(cfg.dtype), to_string(cfg.b_layout));
  }
  RsFold choose_rs_fold(const OverlapModelInput& in, const plan::DeviceConstants& d) const;
  void decide(const std::vector<GemmMethod>& avail);
  void setup_host();
  std::vector<GemmMethod> available() const;
  GemmMethod resolve(GemmMethod m) const;
#ifdef WEFT_HAVE_CUDA
  void setup_gpu();
#endif
  // One call of method m (resolved) on the method's object; stream: a cudaStream_t on GPUs.
  void dispatch(GemmMethod method, int64_t m, const void* a, const void* bp, void* c, void* stream, bool tracing,
                void* gathered_a = nullptr);
};

// Every M the op prepared, the largest (config.m) first: one context and its method objects
// each, sharing GemmShared. A call of another M runs the first one's baseline.
struct GemmOverlap::State {
  explicit State(Backend& b) : share(b, "gemm_overlap") {}
  detail::HeapShare share;  // first: destroyed last, after every context and method object
  std::vector<std::unique_ptr<Impl>> shapes;
  Impl* traced = nullptr;               // the context of the last traced call
  std::set<std::pair<int64_t, int>> told;  // (M, method) whose fall-back to the baseline was reported

  // K per rank not a multiple of 8: the op on K padded to one (decomposed and fused run there,
  // A and B copied into its zero-padded operands each call; the baseline runs the operands as
  // they are), its operands (device memory on GPUs, else host), whether the last traced call
  // ran there.
  std::unique_ptr<GemmOverlap> padded;
  int64_t pad_k = 0;
  void* pad_a = nullptr;
  void* pad_b = nullptr;
  std::vector<unsigned char> host_pad_a, host_pad_b;
  bool traced_padded = false;
  ~State();

  Impl& root() const { return *shapes.front(); }
  Impl* prepared(int64_t m) const {
    for (const auto& p : shapes)
      if (p->cfg.m == m) return p.get();
    return nullptr;
  }
};

void GemmOverlap::Impl::validate() {
  const auto& c = cfg;
  const char* op = to_string(c.op);
  WEFT_REQUIRE(
      c.m >= 1 && c.n >= 1 && c.k >= 1,
      fmt::format("{}: shape M x K x N = {} x {} x {} (every dimension must be at least 1)", op, c.m, c.k, c.n));
  WEFT_REQUIRE(c.dtype == dev::DType::kBF16 || c.dtype == dev::DType::kF16,
               fmt::format("{}: dtype {} (GEMM ops take bf16 or f16 inputs)", op, dev::dtype_name(c.dtype)));
  WEFT_REQUIRE(c.chunks >= 0 && c.chunks <= 256, fmt::format("{}: {} chunks (need 0 (auto) .. 256)", op, c.chunks));
  WEFT_REQUIRE(c.tile_rows >= 0 && c.tile_cols >= 0,
               fmt::format("{}: tile {} x {} (need >= 0; 0: default)", op, c.tile_rows, c.tile_cols));
  WEFT_REQUIRE(c.host_transfer_workers >= 1 && c.host_tile_workers >= 1,
               fmt::format("{}: {} transfer and {} tile workers (need >= 1 each)", op, c.host_transfer_workers,
                           c.host_tile_workers));
  detail::check_algo(c.op, c.algo);
  world = b.size();
  rank = b.rank();
  eb = dev::dtype_size(c.dtype);
  const std::string shape = fmt::format("M x K x N = {} x {} x {}", c.m, c.k, c.n);
  if (c.op == GemmOp::kAgGemm || c.op == GemmOp::kGemmRs)
    WEFT_REQUIRE(
        c.m % world == 0,
        fmt::format(
            "{}: {}: M = {} does not divide among {} ranks ({}; pad M to a multiple of {})", op, shape, c.m, world,
            c.op == GemmOp::kAgGemm ? "each rank holds M/world rows of A" : "each rank receives M/world rows of C",
            world));
  if (c.op != GemmOp::kAgGemm)
    WEFT_REQUIRE(c.k % world == 0,
                 fmt::format("{}: {}: K = {} does not divide among {} ranks (A and B are sharded along K; pad K to a "
                             "multiple of {})",
                             op, shape, c.k, world, world));
  k_local = c.op == GemmOp::kAgGemm ? c.k : c.k / world;
  // Rows of A not 16-byte aligned: this context runs the baseline (cuBLAS and NCCL) only; the
  // op runs the other methods on K padded to a multiple of 8 (make_padded).
  if (k_local % 8 != 0)
    unaligned_why = fmt::format("{}: {} on {} ranks: K per rank = {} is not a multiple of 8 (rows of A must be "
                                "16-byte aligned for the decomposed and fused methods)",
                                op, shape, world, k_local);
  m_shard = c.op == GemmOp::kGemmAr ? ceil_div(c.m, world) : c.m / world;
  a_rows = c.op == GemmOp::kAgGemm ? c.m / world : c.m;
  a_cols = k_local;
  b_rows = c.b_layout == BLayout::kNK ? c.n : k_local;
  b_cols = c.b_layout == BLayout::kNK ? k_local : c.n;
  c_rows = c.op == GemmOp::kGemmRs ? c.m / world : c.m;
  c_cols = c.n;
}

// How gemm_rs decomposed meets the peers' partial products: WEFT_RS_FOLD=0|gather|lt|weft
// forces one (1 = weft); auto, the model's rule (default_rs_fold, model.cpp, with the
// measurements behind its thresholds). weft's fold needs its sm_90a GEMM and copy-engine
// transfers (its GEMM holds every SM while it waits for the peers' pieces).
RsFold GemmOverlap::Impl::choose_rs_fold(const OverlapModelInput& in, const plan::DeviceConstants& d) const {
#ifdef WEFT_HAVE_CUDA
  if (cfg.op != GemmOp::kGemmRs || world < 2 || b.kind() != BackendKind::kNccl) return RsFold::kNone;
  const std::string force = tunable_text(tunables::kRsFold);
  if (force == "0") return RsFold::kNone;
  const bool weft_ok = !sm_copies && kernels::gemm_sm90_available();
  const bool gather_ok = world == 2 && !sm_copies && detail::stream_memops_available();
  if (force == "lt") return world == 2 ? RsFold::kLt : RsFold::kNone;
  if (force == "gather") return gather_ok ? RsFold::kGather : RsFold::kNone;
  if (force == "1" || force == "weft") return weft_ok ? RsFold::kWeft : RsFold::kNone;
  return default_rs_fold(in, d, weft_ok, gather_ok);
#else
  (void)in, (void)d;
  return RsFold::kNone;
#endif
}

std::vector<GemmMethod> GemmOverlap::Impl::available() const {
  if (!unaligned_why.empty()) return {GemmMethod::kBaseline};
  std::vector<GemmMethod> v{GemmMethod::kBaseline, GemmMethod::kDecomposed};
  if (b.kind() == BackendKind::kHost || fused_gpu) v.push_back(GemmMethod::kFused);
  return v;
}

void GemmOverlap::Impl::decide(const std::vector<GemmMethod>& avail) {
  const bool gpu = b.kind() == BackendKind::kNccl;
  // Cost model (GPU; include/weft/ops/gemm_overlap_model.hpp): the best chunk count for
  // decomposed, and each method's prediction.
  int model_chunks = 2;
  GemmMethod model_choice = GemmMethod::kBaseline;
  if (gpu) {
    const plan::DeviceConstants d = device_constants();
    const OverlapModelInput in{cfg.op, world, cfg.m, cfg.n, cfg.k, static_cast<int>(eb)};
    rs_fold = choose_rs_fold(in, d);
    const OverlapPrediction p = predict_overlap(in, d, rs_fold, cfg.chunks, fused_gpu);
    model_chunks = p.chunks;
    model_choice = p.choice;
    autoc.predicted_baseline_us = p.baseline_us;
    autoc.predicted_decomposed_us = p.decomposed_us;
    autoc.predicted_fused_us = p.fused_us;
  }
  // Tuning cache: rank 0 reads it and tells everyone, so every rank decides alike.
  cache = detail::tuning_cache_path(cfg.tune_cache, "gemm_overlap.json");
  struct {
    int32_t method;
    int32_t chunks;
  } wire{-1, 0};
  if (rank == 0) {
    if (auto t = detail::read_tuned_choice(cache, tuning_key())) {
      try {
        wire.method = static_cast<int32_t>(parse_gemm_method(t->method));
        wire.chunks = t->chunks;
      } catch (const InvalidArgument&) {  // an unknown method: the entry is ignored
      }
    }
  }
  b.bootstrap().broadcast(&wire, sizeof wire, 0);
  const bool cached =
      wire.method >= 0 && std::find(avail.begin(), avail.end(), static_cast<GemmMethod>(wire.method)) != avail.end();
  chunks = cfg.chunks > 0 ? cfg.chunks : cached && wire.chunks > 0 ? wire.chunks : gpu ? model_chunks : 2;
  chunks = static_cast<int>(std::clamp<int64_t>(chunks, 1, std::max<int64_t>(1, m_shard)));
  autoc.chunks = chunks;
  if (!unaligned_why.empty()) {
    autoc.method = GemmMethod::kBaseline;
    autoc.source = fmt::format("K per rank = {} is not a multiple of 8: only the baseline runs it", k_local);
  } else if (cached) {
    autoc.method = static_cast<GemmMethod>(wire.method);
    autoc.source = "tuning cache " + cache;
  } else if (!gpu) {
    autoc.method = GemmMethod::kDecomposed;
    autoc.source = "host backend default (the plan executor)";
  } else {
    autoc.method = model_choice;
    autoc.source = "cost model";
  }
}

void GemmOverlap::Impl::setup_host() {
  baseline_method = std::make_unique<detail::BaselineHost>(*this);
  if (!unaligned_why.empty()) return;
  decomposed_method = std::make_unique<detail::HostPlanMethod>(*this, true);
  fused_method = std::make_unique<detail::HostPlanMethod>(*this, false);
}

GemmMethod GemmOverlap::Impl::resolve(GemmMethod m) const { return m == GemmMethod::kAuto ? autoc.method : m; }

void GemmOverlap::Impl::dispatch(GemmMethod which, int64_t m, const void* a, const void* bp, void* c, void* stream,
                                 bool tracing, void* gathered_a) {
  detail::GemmMethodImpl* method = nullptr;
  switch (which) {
    case GemmMethod::kBaseline:
      method = baseline_method.get();
      break;
    case GemmMethod::kDecomposed:
      method = decomposed_method.get();
      break;
    case GemmMethod::kFused:
      method = fused_method.get();
      break;
    case GemmMethod::kAuto:
      throw_error(__FILE__, __LINE__, "auto was not resolved");
  }
  if (!method && !unaligned_why.empty()) throw InvalidArgument(unaligned_why);
  if (!method)  // fused on GPUs where it cannot run (fused_gpu false)
    throw Error(fmt::format("{}: the fused method on GPUs {}", to_string(cfg.op),
                            fused::fused_available() ? "runs ag_gemm and gemm_rs only (docs/gemm_overlap.md)"
                                                     : "needs an sm_90 GPU (weft's GEMM)"));
  method->gather_into = gathered_a;
  method->run(m, a, bp, c, stream, tracing);
  method->gather_into = nullptr;
  if (gathered_a) method->keep_gathered(m, a, gathered_a, stream);
}

#ifdef WEFT_HAVE_CUDA
// In this order (the heap's allocations are matched across ranks by name, size and order): the
// shared part (init_gpu: kernels, cuBLAS, scratch, the epoch word and barrier), decomposed,
// fused.
void GemmOverlap::Impl::setup_gpu() {
  init_gpu();
  baseline_method = std::make_unique<detail::BaselineGpu>(*this);
  if (!unaligned_why.empty()) return;
  auto decomposed = std::make_unique<detail::DecomposedGpu>(*this);
  const uint64_t rs_stage = decomposed->staging();
  decomposed_method = std::move(decomposed);
  if (fused_gpu) fused_method = std::make_unique<detail::FusedGpu>(*this, rs_stage);
}
#endif

// ---- GemmOverlap -------------------------------------------------------------------------

namespace {
// What every rank of one op must agree on: the ranks would otherwise allocate, plan and move
// different things (caught later, if at all, as a symmetric allocation mismatch or a hang).
std::string describe(const GemmOverlapConfig& c) {
  return fmt::format("{} M x K x N = {} x {} x {} {} {}{}{}{}{}", to_string(c.op), c.m, c.k, c.n,
                     dev::dtype_name(c.dtype), to_string(c.b_layout),
                     c.m_buckets.empty() ? std::string() : fmt::format(" M buckets {}", fmt::join(c.m_buckets, ",")),
                     c.chunks ? fmt::format(" chunks {}", c.chunks) : std::string(),
                     c.algo.empty() ? std::string() : fmt::format(" algo {}", c.algo),
                     c.tile_rows || c.tile_cols ? fmt::format(" host tile {} x {}", c.tile_rows, c.tile_cols)
                                                : std::string());
}

void make_padded(GemmOverlap::State& S, Backend& backend, const GemmOverlapConfig& config);

// Rows a call of M may have: 1..max, and (ag_gemm, gemm_rs) a multiple of the world size.
void check_m(const GemmOverlapConfig& c, int world, int64_t m, const char* what) {
  WEFT_REQUIRE(m >= 1 && m <= c.m, fmt::format("{}: {} M = {} is outside 1 .. {} (the M the op was made for)",
                                               to_string(c.op), what, m, c.m));
  if (c.op != GemmOp::kGemmAr)
    WEFT_REQUIRE(m % world == 0, fmt::format("{}: {} M = {} does not divide among {} ranks ({}; pad M to a multiple "
                                             "of {})",
                                             to_string(c.op), what, m, world,
                                             c.op == GemmOp::kAgGemm ? "each rank holds M/world rows of A"
                                                                     : "each rank receives M/world rows of C",
                                             world));
}
}  // namespace

GemmOverlap::GemmOverlap(Backend& backend, const GemmOverlapConfig& config)
    : state_(std::make_unique<State>(backend)) {
  State& S = *state_;
  const SymmetricHeap::Scope mine = S.share.scope();  // every allocation of the set-up is the op's
  auto shared = std::make_shared<detail::GemmShared>();
  // One context per prepared M, the largest (config.m) first: it makes what the others share.
  auto prepare = [&](int64_t m) {
    GemmOverlapConfig c = config;
    c.m = m;
    c.m_buckets.clear();
    S.shapes.push_back(std::make_unique<Impl>(backend, c, shared));
    Impl& I = *S.shapes.back();
    if (S.shapes.size() == 1) I.op.agree("the configuration", describe(config));
    I.validate();
#ifdef WEFT_HAVE_CUDA
    if (backend.kind() == BackendKind::kNccl) {
      I.fused_gpu = fused::fused_available() && fused::fused_supports(static_cast<fused::Op>(static_cast<int32_t>(c.op)));
      I.sm_copies = tunable_text(tunables::kOverlapEngine) == "sm";
    }
#endif
    I.decide(I.available());
    if (backend.kind() == BackendKind::kHost) {
      I.setup_host();
    } else {
#ifdef WEFT_HAVE_CUDA
      I.setup_gpu();
#else
      throw_error(__FILE__, __LINE__, "the nccl backend needs a CUDA build");
#endif
    }
  };
  prepare(config.m);
  std::vector<int64_t> ms;
  for (int64_t m : config.m_buckets) {
    check_m(config, backend.size(), m, "m_buckets:");
    if (m != config.m && std::find(ms.begin(), ms.end(), m) == ms.end()) ms.push_back(m);
  }
  std::sort(ms.begin(), ms.end(), std::greater<>());
  for (const int64_t m : ms) prepare(m);
  if (!S.root().unaligned_why.empty()) make_padded(S, backend, config);
}

GemmOverlap::State::~State() {
#ifdef WEFT_HAVE_CUDA
  if (pad_a) cudaFree(pad_a);
  if (pad_b) cudaFree(pad_b);
#endif
}

GemmOverlap::~GemmOverlap() = default;

namespace {

// The twin op on K padded to a multiple of 8 per rank, its zero-padded operands, and what each
// prepared M's `auto` picks: the twin's own choice where the model predicts it, with the
// padding copies, faster than the baseline on the unaligned operands (on the host backend:
// always).
void make_padded(GemmOverlap::State& S, Backend& backend, const GemmOverlapConfig& config) {
  GemmOverlap::Impl& R = S.root();
  S.pad_k = padded_k_local(R.k_local);
  GemmOverlapConfig c = config;
  c.k = config.op == GemmOp::kAgGemm ? S.pad_k : S.pad_k * R.world;
  S.padded = std::make_unique<GemmOverlap>(backend, c);
  const size_t a_bytes = static_cast<size_t>(R.a_rows * S.pad_k) * R.eb;
  const size_t b_bytes = static_cast<size_t>(config.n * S.pad_k) * R.eb;
  const bool gpu = backend.kind() == BackendKind::kNccl;
  if (!gpu) {
    S.host_pad_a.assign(a_bytes, 0);
    S.host_pad_b.assign(b_bytes, 0);
  } else {
#ifdef WEFT_HAVE_CUDA
    WEFT_CUDA_CHECK(cudaMalloc(&S.pad_a, a_bytes));
    WEFT_CUDA_CHECK(cudaMalloc(&S.pad_b, b_bytes));
    WEFT_CUDA_CHECK(cudaMemset(S.pad_a, 0, a_bytes));  // the pad columns stay zero: calls copy the rest
    WEFT_CUDA_CHECK(cudaMemset(S.pad_b, 0, b_bytes));
    WEFT_CUDA_CHECK(cudaDeviceSynchronize());
#endif
  }
  for (const auto& p : S.shapes) {
    const AutoChoice t = S.padded->auto_choice(p->cfg.m);
    const double best = t.method == GemmMethod::kDecomposed ? t.predicted_decomposed_us
                        : t.method == GemmMethod::kFused    ? t.predicted_fused_us
                                                            : t.predicted_baseline_us;
    const OverlapModelInput in{config.op, R.world, p->cfg.m, config.n, config.k, static_cast<int>(R.eb)};
    if (!gpu || pad_unaligned_k(in, device_constants(), t.predicted_baseline_us, best)) {
      p->autoc = t;  // the padded op's choice (its baseline too runs on the padded operands)
      p->autoc.source = fmt::format("K per rank = {} padded to {}: {}", R.k_local, S.pad_k, t.source);
      p->auto_pads = true;
    } else {
      p->autoc.source =
          fmt::format("K per rank = {} is not a multiple of 8: the baseline (padding it predicted slower)", R.k_local);
    }
  }
}

// This call's A (its rows) and B into the twin's zero-padded operands: each row of K per rank
// elements into a row of pad_k (B stored [K x N]: its K rows, the pad rows after them).
void pad_operands(GemmOverlap::State& S, const GemmOverlap::Impl& I, int64_t a_rows, const void* a, const void* b,
                  void* stream) {
  const size_t kl = static_cast<size_t>(I.k_local) * I.eb, kp = static_cast<size_t>(S.pad_k) * I.eb;
  const bool b_by_k = I.cfg.b_layout != BLayout::kNK;  // B [K x N]
  const size_t b_rows = static_cast<size_t>(I.cfg.n);
  if (I.b.kind() == BackendKind::kHost) {
    for (int64_t r = 0; r < a_rows; ++r)
      std::memcpy(S.host_pad_a.data() + static_cast<size_t>(r) * kp, static_cast<const unsigned char*>(a) + r * kl, kl);
    if (b_by_k) {
      std::memcpy(S.host_pad_b.data(), b, kl * b_rows);
    } else {
      for (size_t r = 0; r < b_rows; ++r)
        std::memcpy(S.host_pad_b.data() + r * kp, static_cast<const unsigned char*>(b) + r * kl, kl);
    }
    return;
  }
#ifdef WEFT_HAVE_CUDA
  auto s = static_cast<cudaStream_t>(stream);
  // By SMs, the whole GPU (the copy engines move these narrow rows slowly).
  const int ctas = 8 * kernels::sm_count();
  WEFT_CUDA_CHECK(kernels::overlap_copy(S.pad_a, kp, a, kl, kl, static_cast<size_t>(a_rows), ctas, s));
  if (b_by_k)
    WEFT_CUDA_CHECK(kernels::overlap_copy(S.pad_b, kl * b_rows, b, kl * b_rows, kl * b_rows, 1, ctas, s));
  else
    WEFT_CUDA_CHECK(kernels::overlap_copy(S.pad_b, kp, b, kl, kl, b_rows, ctas, s));
#else
  (void)stream;
#endif
}

}  // namespace

void GemmOverlap::run(const void* a, const void* b, void* c, const GemmRunOptions& opt) {
  State& S = *state_;
  Impl& R = S.root();
  const int64_t m = opt.m ? opt.m : R.cfg.m;
  check_m(R.cfg, R.world, m, "this call's");
  // Every call: recorded for the failure report (a few stores), then, where the backend
  // agrees on every call (host), the ranks agree on M and the method, so a mismatch is
  // reported as one, naming both, on every rank. On GPUs the configuration is agreed at
  // construction (a per-call exchange would cost a host round trip and break graph capture);
  // a later call that differs makes the waits time out, and the failure report names both
  // calls from the records.
  R.b.record_call(to_string(R.cfg.op), to_string(opt.method), static_cast<uint64_t>(m),
                  static_cast<int32_t>(R.cfg.dtype), true);
  R.op.guarded([&] {
    if (R.b.agrees_every_call() && R.world > 1)
      R.op.agree("the call", fmt::format("M = {}, method {}", m, to_string(opt.method)));
  });
  Impl* prepared = S.prepared(m);
  Impl& I = prepared ? *prepared : R;
  const uint64_t a_bytes = static_cast<uint64_t>(a_rows(m) * I.a_cols) * I.eb;
  const uint64_t b_bytes = static_cast<uint64_t>(I.b_rows * I.b_cols) * I.eb;
  const uint64_t c_bytes = static_cast<uint64_t>(c_rows(m) * I.c_cols) * I.eb;
  I.op.check_ptr(a, 16, "A");
  I.op.check_ptr(b, 16, "B");
  I.op.check_ptr(c, 16, "C");
  const auto overlaps = detail::ranges_overlap;
  WEFT_REQUIRE(!overlaps(c, c_bytes, a, a_bytes) && !overlaps(c, c_bytes, b, b_bytes),
               fmt::format("{}: C overlaps A or B (C is written while they are read)", to_string(I.cfg.op)));
  if (opt.gathered_a) {
    WEFT_REQUIRE(I.cfg.op == GemmOp::kAgGemm,
                 fmt::format("{}: gathered_a is for ag_gemm only (the op that gathers A)", to_string(I.cfg.op)));
    I.op.check_ptr(opt.gathered_a, 16, "gathered_a");
    const uint64_t g_bytes = static_cast<uint64_t>(m * I.a_cols) * I.eb;
    WEFT_REQUIRE(!overlaps(opt.gathered_a, g_bytes, a, a_bytes) && !overlaps(opt.gathered_a, g_bytes, b, b_bytes) &&
                     !overlaps(opt.gathered_a, g_bytes, c, c_bytes),
                 "ag_gemm: gathered_a overlaps A, B or C");
  }
  GemmMethod method = GemmMethod::kBaseline;
  if (prepared) {
    method = I.resolve(opt.method);
  } else if (opt.method != GemmMethod::kAuto && opt.method != GemmMethod::kBaseline &&
             S.told.insert({m, static_cast<int>(opt.method)}).second && I.rank == 0) {
    std::fprintf(stderr, "weft: %s: M = %lld was not prepared (prepared: %s): the baseline runs it, not %s\n",
                 to_string(I.cfg.op), static_cast<long long>(m), fmt::format("{}", fmt::join(prepared_m(), ", ")).c_str(),
                 to_string(opt.method));
  }
  if (prepared && prepared->auto_pads && opt.method == GemmMethod::kAuto)
    method = GemmMethod::kAuto;  // the padded op's own auto
  if (S.padded && method != GemmMethod::kBaseline && opt.gathered_a) {
    WEFT_REQUIRE(opt.method == GemmMethod::kAuto,
                 fmt::format("{}: gathered_a with K per rank = {} (not a multiple of 8): only the baseline keeps the "
                             "gathered A (the other methods run on K padded to {})",
                             to_string(I.cfg.op), I.k_local, S.pad_k));
    method = GemmMethod::kBaseline;
  }
  if (S.padded && method != GemmMethod::kBaseline) {  // on K padded to a multiple of 8
    I.op.guarded([&] { pad_operands(S, I, a_rows(m), a, b, opt.stream); });
    GemmRunOptions o = opt;
    o.method = method;
    const void* pa = S.pad_a ? S.pad_a : S.host_pad_a.data();
    const void* pb = S.pad_b ? S.pad_b : S.host_pad_b.data();
    S.padded->run(pa, pb, c, o);
    if (opt.trace) S.traced_padded = true;
    return;
  }
  if (opt.trace) {
    I.trace.clear();
    S.traced = &I;
    S.traced_padded = false;
  }
  I.op.guarded([&] { I.dispatch(method, m, a, b, c, opt.stream, opt.trace, opt.gathered_a); });
}

void GemmOverlap::run_gemm_only(const void* a, const void* b, void* c, void* stream, GemmAlone which) {
  Impl& I = state_->root();
  I.op.check_ptr(a, 16, "A");
  I.op.check_ptr(b, 16, "B");
  I.op.check_ptr(c, 16, "C");
  if (I.b.kind() == BackendKind::kHost) {
    const int64_t rows = I.cfg.m;
    if (I.cfg.op == GemmOp::kAgGemm) {
      I.host_scratch.resize(static_cast<size_t>(rows * I.k_local) * I.eb);
      detail::host_gemm(I.cfg.dtype, I.cfg.b_layout, I.host_scratch.data(), b, c, I.k_local, I.cfg.n, 0, rows, 0,
                        I.cfg.n);
    } else {
      void* out = c;
      if (I.cfg.op == GemmOp::kGemmRs) {
        I.host_scratch.resize(static_cast<size_t>(rows * I.cfg.n) * I.eb);
        out = I.host_scratch.data();
      }
      detail::host_gemm(I.cfg.dtype, I.cfg.b_layout, a, b, out, I.k_local, I.cfg.n, 0, rows, 0, I.cfg.n);
    }
    return;
  }
#ifdef WEFT_HAVE_CUDA
  auto s = static_cast<cudaStream_t>(stream);
  const void* ga = I.cfg.op == GemmOp::kAgGemm ? I.scratch : a;
  void* gc = I.cfg.op == GemmOp::kGemmRs ? I.scratch : c;
  if (which == GemmAlone::kCublas) return I.gemm(s, ga, b, gc, I.cfg.m, I.k_local, 0, I.cfg.n);
  if (which == GemmAlone::kCublasTuned) return I.gemm(s, ga, b, gc, I.cfg.m, I.k_local, 0, I.cfg.n, Impl::Blas::kLt);
  if (!kernels::gemm_sm90_available()) throw Error("weft's GEMM alone: needs an sm_90 GPU");
  ops::gemm_gpu(I.weft_gemm_args(ga, b, gc, I.cfg.m), {}, s);
#else
  (void)stream;
  if (which == GemmAlone::kWeft) throw Error("weft's GEMM alone: not built (CUDA)");
#endif
}

bool GemmOverlap::times_every_gemm() const {
#ifdef WEFT_HAVE_CUDA
  const Impl& I = state_->root();
  return I.lt && I.lt->tuning() == detail::LtGemm::Tune::kAll;
#else
  return false;
#endif
}

std::vector<std::string> GemmOverlap::gemm_choices() const {
#ifdef WEFT_HAVE_CUDA
  if (state_->root().lt) return state_->root().lt->report();
#endif
  return {};
}

std::vector<GemmMethod> GemmOverlap::available_methods() const {
  return state_->padded ? state_->padded->available_methods() : state_->root().available();
}
const AutoChoice& GemmOverlap::auto_choice() const { return state_->root().autoc; }

AutoChoice GemmOverlap::auto_choice(int64_t m) const {
  const Impl& R = state_->root();
  check_m(R.cfg, R.world, m, "auto_choice:");
  if (const Impl* p = state_->prepared(m)) return p->autoc;
  AutoChoice a;
  a.method = GemmMethod::kBaseline;
  a.chunks = 1;
  a.source = "not a prepared M (m_buckets): the baseline";
  return a;
}

std::vector<int64_t> GemmOverlap::prepared_m() const {
  std::vector<int64_t> ms;
  for (const auto& p : state_->shapes) ms.push_back(p->cfg.m);
  std::sort(ms.begin(), ms.end());
  return ms;
}

const GemmOverlapConfig& GemmOverlap::config() const { return state_->root().cfg; }
int GemmOverlap::chunks() const { return state_->root().chunks; }
int64_t GemmOverlap::a_rows(int64_t m) const {
  const Impl& R = state_->root();
  return m == 0 ? R.a_rows : R.cfg.op == GemmOp::kAgGemm ? m / R.world : m;
}
int64_t GemmOverlap::a_cols() const { return state_->root().a_cols; }
int64_t GemmOverlap::b_rows() const { return state_->root().b_rows; }
int64_t GemmOverlap::b_cols() const { return state_->root().b_cols; }
int64_t GemmOverlap::c_rows(int64_t m) const {
  const Impl& R = state_->root();
  return m == 0 ? R.c_rows : R.cfg.op == GemmOp::kGemmRs ? m / R.world : m;
}
int64_t GemmOverlap::c_cols() const { return state_->root().c_cols; }
const std::vector<TraceEvent>& GemmOverlap::trace() const {
  if (state_->traced_padded) return state_->padded->trace();
  return state_->traced ? state_->traced->trace : state_->root().trace;
}

std::string GemmOverlap::tuning_key() const { return state_->root().tuning_key(); }

void GemmOverlap::store_tuning(GemmMethod method, int chunks, double us) const {
  const Impl& I = state_->root();
  if (I.rank != 0 || I.cache.empty()) return;
  WEFT_REQUIRE(method != GemmMethod::kAuto, "store_tuning: store a concrete method, not auto");
  detail::store_tuned_choice(I.cache, tuning_key(), {to_string(method), chunks}, us);
}

}  // namespace weft::ops
