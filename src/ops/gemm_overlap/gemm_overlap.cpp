#include "weft/ops/gemm_overlap.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "../common/tuning_cache.hpp"
#include "gemm_overlap_impl.hpp"
#include "plan.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/collectives.hpp"
#include "weft/ops/gemm.hpp"
#include "fused.hpp"
#include "weft/ops/gemm_overlap_model.hpp"
#include "weft/plan/cost.hpp"
#include "weft/plan/plan.hpp"

#ifdef WEFT_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "lt_gemm.hpp"
#include "stream_memops.hpp"
#include "weft/core/cuda_check.hpp"
#include "weft/kernels/gemm.hpp"
#include "weft/kernels/gemm_overlap_kernels.hpp"
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

// ---- state -----------------------------------------------------------------------------

// The op: the shapes, decisions and helpers its methods share are its base (GemmOpContext,
// gemm_overlap_impl.hpp).
struct GemmOverlap::Impl : detail::GemmOpContext {
  AutoChoice autoc;
  std::string cache;

  // The method objects, made at construction (setup: never inside a CUDA graph capture). GPU:
  // fused only where fused_gpu.
  std::unique_ptr<detail::GemmMethodImpl> baseline_method, decomposed_method, fused_method;

#ifdef WEFT_HAVE_CUDA
  cudaStream_t cs = nullptr;  // copy / communication stream of `decomposed`
  cudaEvent_t ev_fork = nullptr, ev_join = nullptr;
  std::vector<cudaEvent_t> ev_piece;
  // gemm_rs, RsFold::kLt (2 ranks): the peer's piece j has landed here (recorded on cs after
  // its wait).
  std::vector<cudaEvent_t> ev_recv;
  // ... RsFold::kGather (2 ranks; gather_rs): the peer's rows of A for this rank's block and
  // the peer's B land in g_a / g_b (symmetric; B's layout), in `chunks` column pieces of B
  // (g_cols). Flag j (symmetric word): the peer's A and B up to piece j are here (a copy of the
  // peer's call counter; a wait kernel on cw). Its epoch guard: rs_guard (memop_guard).
  uint64_t g_a = 0, g_b = 0;
  dev::SignalSlab g_flags{};
  std::vector<std::pair<int64_t, int64_t>> g_cols;
  uint64_t* one = nullptr;
  cudaStream_t cw = nullptr, cb = nullptr;  // the data waits; the deadline-bearing second wait
  cudaEvent_t ev_backup = nullptr;
  std::vector<cudaEvent_t> ev_out;  // this rank's push of piece j (and its flag) is done
  // decomposed ag_gemm: the plan's tables and tensors
  detail::OpPlan ag;
  std::vector<uint64_t> ag_tensor_off;
  dev::SignalSlab ag_signals{};
  bool ag_own_in_place = false;  // own rows read in place, their local copy left out (setup_gpu)
  // decomposed gemm_rs: staging [world][m_shard x N] and one signal per (source, chunk)
  uint64_t rs_stage = 0;
  dev::SignalSlab rs_signals{};
  // ... the epoch guard without an SM (rs_memop_guard: the gathered inputs always, the reduce
  // pass unless with SM copies or without stream memory operations): slot q = "rank q
  // began this call", a copy of `one` from q, waited for by a stream memory operation and reset
  // by the waiter (memop_guard). (A device-barrier kernel on the copy stream waited in graph
  // replays for an SM until the first GEMM's last wave, delaying the first copy.)
  bool rs_memop_guard = false;
  dev::SignalSlab rs_guard{};
  // ... with the own block on weft's GEMM (RsFold::kWeft): one launch that waits per M-block
  // for the peers' pieces and adds them in its epilogue -- no reduce pass. Its wait tables.
  void* rs_fold_tables = nullptr;
  kernels::GemmHooks rs_fold_hooks{};
  cudaEvent_t ev_guard = nullptr;                   // after the epoch guard's barrier on the copy stream
  std::vector<std::pair<int64_t, int64_t>> pieces;  // chunk row ranges
#endif

  Impl(Backend& backend, const GemmOverlapConfig& c) : GemmOpContext(backend, c) {}
  ~Impl();

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
  void check_ptr(const void* p, const char* what, uint64_t bytes) const;
  void run_host(GemmMethod m, const void* a, const void* bp, void* c, bool tracing);
#ifdef WEFT_HAVE_CUDA
  void setup_gpu();
  void run_gpu(GemmMethod m, const void* a, const void* bp, void* c, cudaStream_t s, bool tracing);
  void gpu_decomposed(const void* a, const void* bp, void* c, cudaStream_t s, bool tracing);
  void gather_rs(const void* a, const void* bp, void* c, cudaStream_t s, bool tracing);  // RsFold::kGather
  // gemm_rs's epoch guard on `s` without an SM (rs_memop_guard): tell every peer this rank
  // began this call, wait until every peer did, reset those words. No deadline: the waits for
  // the peers' data must not sit behind it (they name a missing peer).
  void memop_guard(cudaStream_t s);
#endif
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
  WEFT_REQUIRE(k_local % 8 == 0,
               fmt::format("{}: {} on {} ranks: K per rank = {} is not a multiple of 8 (rows of A must be 16-byte "
                           "aligned)",
                           op, shape, world, k_local));
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
  if (cached) {
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
  decomposed_method = std::make_unique<detail::HostPlanMethod>(*this, true);
  fused_method = std::make_unique<detail::HostPlanMethod>(*this, false);
}

GemmMethod GemmOverlap::Impl::resolve(GemmMethod m) const { return m == GemmMethod::kAuto ? autoc.method : m; }

void GemmOverlap::Impl::check_ptr(const void* p, const char* what, uint64_t bytes) const {
  WEFT_REQUIRE(p != nullptr, fmt::format("{}: {} is a null pointer", to_string(cfg.op), what));
  WEFT_REQUIRE(reinterpret_cast<uintptr_t>(p) % 16 == 0,
               fmt::format("{}: {} pointer {} is not 16-byte aligned ({} bytes)", to_string(cfg.op), what, p, bytes));
}

// ---- host backend ------------------------------------------------------------------------

void GemmOverlap::Impl::run_host(GemmMethod m, const void* a, const void* bp, void* c, bool tracing) {
  switch (m) {
    case GemmMethod::kBaseline:
      return baseline_method->run(a, bp, c, nullptr, tracing);
    case GemmMethod::kDecomposed:
      return decomposed_method->run(a, bp, c, nullptr, tracing);
    case GemmMethod::kFused:
      return fused_method->run(a, bp, c, nullptr, tracing);
    case GemmMethod::kAuto:
      break;
  }
  throw_error(__FILE__, __LINE__, "auto was not resolved");
}

// ---- GPU backend -------------------------------------------------------------------------

#ifdef WEFT_HAVE_CUDA
namespace {
using detail::at;
using detail::TableBlob;
}  // namespace

void GemmOverlap::Impl::setup_gpu() {
  init_gpu();
  baseline_method = std::make_unique<detail::BaselineGpu>(*this);
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&ev_fork, cudaEventDisableTiming));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&ev_join, cudaEventDisableTiming));
  SymmetricHeap& heap = b.heap();
  const std::string tag = fmt::format("{}.{}x{}x{}", to_string(cfg.op), cfg.m, cfg.k, cfg.n);
  const int64_t rows = cfg.op == GemmOp::kGemmAr ? cfg.m : m_shard;
  pieces = plan::split_range(0, rows, chunks);
  if (cfg.op == GemmOp::kAgGemm) {
    // decomposed: the all-gather plan's tables, one GEMM per chunk of rows (all of N).
    detail::OpPlanParams p;
    p.op = cfg.op;
    p.world = world;
    p.m = cfg.m;
    p.n = cfg.n;
    p.k_local = k_local;
    p.chunks = chunks;
    p.algo = cfg.algo;
    p.engine = plan::Engine::kCopyEngine;
    p.elem_bytes = static_cast<int>(eb);
    p.tile_rows = ceil_div(m_shard, chunks);
    p.tile_cols = cfg.n;
    ag = detail::build_op_plan(p);
    for (const auto& d : ag.lowered.ranks[static_cast<size_t>(rank)].transfers)
      WEFT_REQUIRE(static_cast<plan::Kind>(d.kind) != plan::Kind::kReduce,
                   fmt::format("ag_gemm decomposed: plan {} has a reduce transfer", ag.plan.name));
    for (size_t t = 0; t < ag.plan.tensors.size(); ++t) {
      const plan::Tensor& x = ag.plan.tensors[t];
      // The input tensor is the user's A_r (read in place): nothing to allocate.
      ag_tensor_off.push_back(
          static_cast<int>(t) == ag.input
              ? 0
              : heap.alloc_bytes(static_cast<size_t>(x.rows * x.cols * x.elem_bytes), tag + ".decomposed." + x.name));
    }
    ag_signals = heap.alloc_signals(static_cast<uint32_t>(ag.lowered.max_signals()), tag + ".decomposed.signals");
    // This rank's own rows are read in place by the GEMM and the plan's copy of them into
    // the gathered buffer is left out (its signal is still given), where no transfer
    // forwards from the gathered buffer (the direct templates push from the input) and no
    // tile straddles the edge of the own rows (it would read gathered rows never copied).
    // That device-local copy is an SM kernel the first GEMM waits behind (docs/gemm_overlap.md).
    const plan::LoweredRank& lr = ag.lowered.ranks[static_cast<size_t>(rank)];
    const int64_t own0 = rank * m_shard, own1 = own0 + m_shard;
    bool forwards = false, straddles = false;
    for (const plan::TransferDesc& d : lr.transfers) forwards |= d.src_tensor == ag.gemm;
    for (const plan::TileEntry& t : lr.tiles) {
      const int64_t r0 = int64_t{t.m} * ag.schedule.tile_rows, r1 = std::min(cfg.m, r0 + ag.schedule.tile_rows);
      straddles |= r0 < own1 && r1 > own0 && (r0 < own0 || r1 > own1);
    }
    ag_own_in_place = !forwards && !straddles;
  } else if (cfg.op == GemmOp::kGemmRs) {
    rs_stage = heap.alloc_bytes(static_cast<size_t>(world) * m_shard * cfg.n * eb, tag + ".decomposed.staging");
    rs_signals = heap.alloc_signals(static_cast<uint32_t>(world * chunks), tag + ".decomposed.signals");
    ev_piece.resize(static_cast<size_t>(std::max(1, world - 1) * chunks));
    if (rs_fold == RsFold::kLt || rs_fold == RsFold::kGather) {
      ev_recv.resize(static_cast<size_t>(chunks));
      for (auto& e : ev_recv) WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    rs_memop_guard = rs_fold == RsFold::kGather ||
                     (rs_fold == RsFold::kNone && world > 1 && !sm_copies && detail::stream_memops_available());
    if (rs_memop_guard) {
      rs_guard = heap.alloc_signals(static_cast<uint32_t>(world), tag + ".decomposed.guard");
      WEFT_CUDA_CHECK(cudaMalloc(&one, sizeof(uint64_t)));
      const uint64_t v = 1;
      WEFT_CUDA_CHECK(cudaMemcpy(one, &v, sizeof v, cudaMemcpyHostToDevice));
    }
    if (rs_fold == RsFold::kGather) {
      g_a = heap.alloc_bytes(static_cast<size_t>(m_shard * k_local) * eb, tag + ".gather.a");
      g_b = heap.alloc_bytes(static_cast<size_t>(b_rows * b_cols) * eb, tag + ".gather.b");
      g_flags = heap.alloc_signals(static_cast<uint32_t>(chunks), tag + ".gather.flags");
      // Column pieces on 128-column boundaries where N allows (whole tiles of cuBLAS's).
      for (const auto& [c0, c1] : plan::split_range(0, cfg.n, chunks)) {
        const auto round = [&](int64_t x) { return x == cfg.n ? x : std::min<int64_t>(cfg.n, (x + 64) / 128 * 128); };
        g_cols.emplace_back(round(c0), round(c1));
      }
      WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&cw, cudaStreamNonBlocking));
      WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&cb, cudaStreamNonBlocking));
      WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&ev_backup, cudaEventDisableTiming));
      ev_out.resize(static_cast<size_t>(chunks));
      for (auto& e : ev_out) WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    if (rs_fold == RsFold::kWeft) {  // (never with SM copies: choose_rs_fold)
      // Per M-block of the own block: wait for piece j of every peer q (signal q * chunks + j
      // >= the call count) for each piece j its rows overlap.
      std::vector<int32_t> begin{0}, idx, from;
      std::vector<uint64_t> val;
      for (int mb = 0; mb < kernels::gemm_tiles_m(static_cast<int>(m_shard)); ++mb) {
        const int64_t r0 = int64_t{mb} * kernels::kGemmTileM, r1 = std::min(m_shard, r0 + kernels::kGemmTileM);
        for (size_t j = 0; j < pieces.size(); ++j)
          if (pieces[j].first < r1 && pieces[j].second > r0)
            for (int q = 0; q < world; ++q)
              if (q != rank) {
                idx.push_back(q * chunks + static_cast<int>(j));
                val.push_back(1);
                from.push_back(q);
              }
        begin.push_back(static_cast<int32_t>(idx.size()));
      }
      TableBlob blob;
      blob.add(begin);
      blob.add(idx);
      blob.add(val);
      blob.add(from);
      rs_fold_tables = blob.upload();
      kernels::GemmHooks& h = rs_fold_hooks;
      h.wait_begin = blob.table<int32_t>(rs_fold_tables, 0);
      h.wait_idx = blob.table<int32_t>(rs_fold_tables, 1);
      h.wait_val = blob.table<uint64_t>(rs_fold_tables, 2);
      h.wait_peer = blob.table<int32_t>(rs_fold_tables, 3);
      h.wait_off = rs_signals.at(0);
      h.wait_per_mblock = true;
      h.wait_scale_dev = b.ctx().ptr<const uint64_t>(rank, epoch_off);  // the call counter
      WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&ev_guard, cudaEventDisableTiming));
    }
  } else {
    ev_piece.resize(pieces.size());
  }
  for (auto& e : ev_piece) WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));

  if (fused_gpu) fused_method = std::make_unique<detail::FusedGpu>(*this, rs_stage);
}

void GemmOverlap::Impl::memop_guard(cudaStream_t s) {
  const dev::DeviceCtx& ctx = b.ctx();
  for (int q = 0; q < world; ++q) {
    if (q == rank) continue;
    char* word = ctx.peer_base[q] + rs_guard.at(static_cast<uint32_t>(rank));
    if (!sm_copies && copy_engine_took(cudaMemcpyAsync(word, one, sizeof(uint64_t), cudaMemcpyDefault, s), s)) continue;
    signal(q, rs_guard.at(static_cast<uint32_t>(rank)), 1, s);  // the same word, by a kernel (>= 1 either way)
  }
  for (int q = 0; q < world; ++q) {
    if (q == rank) continue;
    const char* mine = ctx.peer_base[rank] + rs_guard.at(static_cast<uint32_t>(q));
    detail::stream_wait_geq(s, mine, 1);
    detail::stream_write(s, mine, 0);
  }
}

void GemmOverlap::Impl::gpu_decomposed(const void* a, const void* bp, void* c, cudaStream_t s, bool tracing) {
  const dev::DeviceCtx& ctx = b.ctx();
  const int64_t N = cfg.n;
  WEFT_CUDA_CHECK(kernels::overlap_epoch_bump(ctx, epoch_off, s));
  WEFT_CUDA_CHECK(cudaEventRecord(ev_fork, s));
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(cs, ev_fork, 0));

  if (cfg.op == GemmOp::kGemmAr) {
    // GEMM of chunk j on the compute stream, weft's all-reduce of its rows on the other.
    for (size_t j = 0; j < pieces.size(); ++j) {
      const auto [r0, r1] = pieces[j];
      size_t x = mark(s, TraceKind::kTile, static_cast<int64_t>(j), 0, "compute stream",
                      fmt::format("gemm rows [{},{})", r0, r1), tracing);
      gemm(s, at(a, static_cast<uint64_t>(r0 * k_local) * eb), bp, at(c, static_cast<uint64_t>(r0 * N) * eb), r1 - r0,
           k_local, 0, N, Blas::kLt);
      mark_end(x, s, tracing);
      WEFT_CUDA_CHECK(cudaEventRecord(ev_piece[j], s));
      WEFT_CUDA_CHECK(cudaStreamWaitEvent(cs, ev_piece[j], 0));
      if (world > 1) {
        x = mark(cs, TraceKind::kChunk, static_cast<int64_t>(j), 1, "all_reduce stream",
                 fmt::format("all_reduce rows [{},{})", r0, r1), tracing);
        void* rows = at(c, static_cast<uint64_t>(r0 * N) * eb);
        coll.all_reduce(rows, rows, static_cast<uint64_t>((r1 - r0) * N), cfg.dtype, Method::kAuto, cs);
        mark_end(x, cs, tracing);
      }
    }
  } else {
    // The epoch guard: peers write into this rank's symmetric buffers only after every rank
    // has finished reading them for the previous call (this stream waited for ev_fork,
    // which follows that call's last GEMM or reduce on the compute stream).
    // (gemm_rs's gathered inputs and reduce pass: without an SM, memop_guard.)
    if (rs_memop_guard)
      memop_guard(cs);
    else if (world > 1)
      WEFT_CUDA_CHECK(kernels::device_barrier(ctx, barrier, cs));
    if (rs_fold == RsFold::kWeft) WEFT_CUDA_CHECK(cudaEventRecord(ev_guard, cs));
    if (cfg.op == GemmOp::kAgGemm) {
      const plan::LoweredRank& lr = ag.lowered.ranks[static_cast<size_t>(rank)];
      auto ptr = [&](int r, int32_t t, int64_t row, int64_t col) -> char* {
        const plan::Tensor& x = ag.plan.tensors[static_cast<size_t>(t)];
        const uint64_t o = static_cast<uint64_t>(row * x.cols + col) * eb;
        if (t == ag.input) {
          WEFT_CHECK(r == rank, fmt::format("ag_gemm decomposed: a transfer reads rank {}'s input in place", r));
          return at(a, o);
        }
        // Device work uses the window's addresses, this rank's own included (architecture.md).
        return ctx.peer_base[r] + ag_tensor_off[static_cast<size_t>(t)] + o;
      };
      const int64_t own0 = rank * m_shard, own1 = own0 + m_shard;
      // Transfers in the plan's issue order on the copy stream: memcpy, then a signal kernel.
      for (size_t i = 0; i < lr.transfers.size(); ++i) {
        const plan::TransferDesc& d = lr.transfers[i];
        const bool own_copy = ag_own_in_place && d.src_tensor == ag.input && d.src_rank == rank && d.dst_rank == rank;
        std::vector<std::tuple<int, uint64_t, int64_t>> waits;
        for (int32_t j = d.wait_begin; j < d.wait_begin + d.wait_count; ++j) {
          const plan::WaitEntry& w = lr.transfer_waits[static_cast<size_t>(j)];
          waits.emplace_back(lr.signal_producer[static_cast<size_t>(w.signal)], ag_signals.at(static_cast<uint32_t>(w.signal)),
                             w.threshold);
        }
        wait_list(cs, waits);
        const plan::Tensor& st = ag.plan.tensors[static_cast<size_t>(d.src_tensor)];
        const plan::Tensor& dt = ag.plan.tensors[static_cast<size_t>(d.dst_tensor)];
        if (!own_copy) {
          size_t x = mark(cs, TraceKind::kChunk, d.chunk, 1, engine_name(),
                          fmt::format("chunk {} {} {}->{}", d.chunk, plan::to_string(static_cast<plan::Kind>(d.kind)),
                                      d.src_rank, d.dst_rank),
                          tracing);
          copy2d(ptr(d.dst_rank, d.dst_tensor, d.dst_row, d.dst_col), static_cast<size_t>(dt.cols) * eb,
                 ptr(d.src_rank, d.src_tensor, d.src_row, d.src_col), static_cast<size_t>(st.cols) * eb,
                 static_cast<size_t>(d.cols) * eb, static_cast<size_t>(d.rows), cs);
          mark_end(x, cs, tracing);
        }
        if (d.signal_rank >= 0) {
          signal(d.signal_rank, ag_signals.at(static_cast<uint32_t>(d.signal)), static_cast<uint64_t>(d.increment), cs);
        }
      }
      // Tiles (chunks of rows x all of N) in arrival order on the compute stream; own-row
      // tiles read the input in place (above) and wait for nothing.
      const char* gathered = ctx.peer_base[rank] + ag_tensor_off[static_cast<size_t>(ag.gemm)];
      for (size_t i = 0; i < lr.tiles.size(); ++i) {
        const plan::TileEntry& t = lr.tiles[i];
        const int64_t r0 = int64_t{t.m} * ag.schedule.tile_rows, r1 = std::min(cfg.m, r0 + ag.schedule.tile_rows);
        const int64_t c0 = int64_t{t.n} * ag.schedule.tile_cols, c1 = std::min(N, c0 + ag.schedule.tile_cols);
        const bool own = ag_own_in_place && r0 >= own0 && r1 <= own1;
        std::vector<std::tuple<int, uint64_t, int64_t>> waits;
        for (int32_t j = t.wait_begin; !own && j < t.wait_begin + t.wait_count; ++j) {
          const plan::WaitEntry& w = lr.tile_waits[static_cast<size_t>(j)];
          waits.emplace_back(lr.signal_producer[static_cast<size_t>(w.signal)], ag_signals.at(static_cast<uint32_t>(w.signal)),
                             w.threshold);
        }
        wait_list(s, waits);
        size_t x = mark(s, TraceKind::kTile, static_cast<int64_t>(i), 0, "compute stream",
                        fmt::format("gemm rows [{},{}){}", r0, r1, own ? " (own, in place)" : ""), tracing);
        const char* arows = own ? static_cast<const char*>(a) + static_cast<uint64_t>((r0 - own0) * k_local) * eb
                                : gathered + static_cast<uint64_t>(r0 * k_local) * eb;
        gemm(s, arows, bp, at(c, static_cast<uint64_t>(r0 * N) * eb), r1 - r0, k_local, c0, c1 - c0, Blas::kLt);
        mark_end(x, s, tracing);
      }
    } else if (rs_fold == RsFold::kGather) {
      gather_rs(a, bp, c, s, tracing);
    } else {
      // gemm_rs: partial products for the other ranks first (rotated by rank), each chunk
      // copied into its owner's staging slot `rank` as soon as it is computed. Then this
      // rank's own block: RsFold::kWeft, one launch of weft's GEMM that waits per M-block for
      // the peers' pieces and adds them in its epilogue, straight into C; RsFold::kLt (2
      // ranks), per piece a wait for the peer's piece, then cuBLASLt's D = A B + that piece
      // into C; else the own block into its own slot, then the owner sums the slots (a reduce
      // pass).
      char* stage_local = ctx.peer_base[rank] + rs_stage;
      const uint64_t slot_bytes = static_cast<uint64_t>(m_shard * N) * eb;
      size_t ev = 0;
      for (int d = 1; d < world; ++d) {
        const int p = (rank + d) % world;
        for (size_t j = 0; j < pieces.size(); ++j, ++ev) {
          const auto [r0, r1] = pieces[j];
          const int64_t g0 = p * m_shard + r0;
          const uint64_t sig_off = rs_signals.at(static_cast<uint32_t>(rank * chunks + static_cast<int>(j)));
          char* owner_slot = ctx.peer_base[p] + rs_stage + slot_bytes * static_cast<uint64_t>(rank) +
                             static_cast<uint64_t>(r0 * N) * eb;
          size_t x = mark(s, TraceKind::kTile, static_cast<int64_t>(ev), 0, "compute stream",
                          fmt::format("gemm rows [{},{}) for rank {}", g0, g0 + (r1 - r0), p), tracing);
          gemm(s, at(a, static_cast<uint64_t>(g0 * k_local) * eb), bp, at(scratch, static_cast<uint64_t>(g0 * N) * eb),
               r1 - r0, k_local, 0, N, Blas::kLt);
          mark_end(x, s, tracing);
          WEFT_CUDA_CHECK(cudaEventRecord(ev_piece[ev], s));
          WEFT_CUDA_CHECK(cudaStreamWaitEvent(cs, ev_piece[ev], 0));
          x = mark(cs, TraceKind::kChunk, static_cast<int64_t>(ev), 1, engine_name(),
                   fmt::format("partial rows [{},{}) -> rank {}", g0, g0 + (r1 - r0), p), tracing);
          const size_t bytes = static_cast<size_t>((r1 - r0) * N) * eb;
          copy2d(owner_slot, bytes, at(scratch, static_cast<uint64_t>(g0 * N) * eb), bytes, bytes, 1, cs);
          mark_end(x, cs, tracing);
          // The signal by the copy engine where it takes peer pointers: no SM needed while a
          // GEMM holds them all (the peer's folded GEMM -- always so for weft's fold, whose
          // GEMM waits for it holding every SM; this rank's own block, before the reduce pass).
          if (rs_fold == RsFold::kWeft || !sm_copies)
            put_count(p, sig_off, cs);
          else
            signal(p, sig_off, 1, cs);
          if (rs_fold == RsFold::kLt) {
            // The wait for the peer's piece j on this stream, after this rank's own piece j
            // went out (the peer's is due about then: a short spin), the compute stream
            // joining it by an event: between the compute stream's cuBLAS GEMMs only the
            // launch gap stays, not a wait kernel (docs/gemm_overlap.md, cuBLASLt fold). (The
            // reduce pass meets its waits inside the reduce kernel, below.)
            wait_list(cs, {{p, rs_signals.at(static_cast<uint32_t>(p * chunks + static_cast<int>(j))), 1}});
            WEFT_CUDA_CHECK(cudaEventRecord(ev_recv[j], cs));
          }
        }
      }
      const int64_t g0 = rank * m_shard;
      if (rs_fold == RsFold::kWeft) {
        kernels::GemmArgs ga = weft_gemm_args(at(a, static_cast<uint64_t>(g0 * k_local) * eb), bp, c, m_shard);
        for (int q = 0; q < world; ++q)
          if (q != rank) ga.src[ga.num_src++] = stage_local + slot_bytes * static_cast<uint64_t>(q);
        ga.ld_src = N;
        // Row blocks in piece order (a raster group per piece, <= 16 blocks), so the first
        // waves need the first pieces only.
        ga.group_m = static_cast<int>(std::clamp<int64_t>(
            ceil_div(ceil_div(m_shard, static_cast<int64_t>(pieces.size())), kernels::kGemmTileM), 1, 16));
        kernels::GemmHooks h = rs_fold_hooks;
        h.ctx = ctx;
        // Waits before each tile's main loop (not wait_at_epilogue): the peers' pieces were
        // computed before this GEMM and have mostly landed, and the first source half then
        // loads early under the main loop (waits at the epilogue measured slower:
        // docs/gemm_overlap.md, "Folded into weft's GEMM").
        // Not before this rank's epoch barrier has run: the peers' pushes wait for it, and
        // this GEMM, waiting for them, holds every SM.
        WEFT_CUDA_CHECK(cudaStreamWaitEvent(s, ev_guard, 0));
        size_t x = mark(s, TraceKind::kTile, static_cast<int64_t>(ev), 0, "compute stream",
                        fmt::format("gemm rows [{},{}) (own) + peers' pieces", g0, g0 + m_shard), tracing);
        ops::gemm_gpu(ga, h, s);
        mark_end(x, s, tracing);
      } else if (rs_fold == RsFold::kLt) {
        const int q = 1 - rank;  // the peer (2 ranks)
        for (size_t j = 0; j < pieces.size(); ++j) {
          const auto [r0, r1] = pieces[j];
          WEFT_CUDA_CHECK(cudaStreamWaitEvent(s, ev_recv[j], 0));  // the peer's piece j is in
          size_t x = mark(s, TraceKind::kTile, static_cast<int64_t>(ev + j), 0, "compute stream",
                          fmt::format("gemm rows [{},{}) (own) + rank {}'s piece", g0 + r0, g0 + r1, q), tracing);
          gemm(s, at(a, static_cast<uint64_t>((g0 + r0) * k_local) * eb), bp, at(c, static_cast<uint64_t>(r0 * N) * eb),
               r1 - r0, k_local, 0, N, Blas::kLt,
               stage_local + slot_bytes * static_cast<uint64_t>(q) + static_cast<uint64_t>(r0 * N) * eb);
          mark_end(x, s, tracing);
        }
      } else {
        size_t x = mark(s, TraceKind::kTile, static_cast<int64_t>(ev), 0, "compute stream",
                        fmt::format("gemm rows [{},{}) (own)", g0, g0 + m_shard), tracing);
        gemm(s, at(a, static_cast<uint64_t>(g0 * k_local) * eb), bp,
             stage_local + slot_bytes * static_cast<uint64_t>(rank), m_shard, k_local, 0, N, Blas::kLt);
        mark_end(x, s, tracing);
        for (size_t j = 0; j < pieces.size(); ++j) {
          const auto [r0, r1] = pieces[j];
          std::vector<std::tuple<int, uint64_t, int64_t>> waits;
          for (int q = 0; q < world; ++q)
            if (q != rank)
              waits.emplace_back(q, rs_signals.at(static_cast<uint32_t>(q * chunks + static_cast<int>(j))), 1);
          // The waits inside the reduce kernel (one launch after the own block's GEMM, not a
          // wait kernel and then the reduce), unless there are more than one kernel's list.
          const bool in_kernel = waits.size() <= static_cast<size_t>(kernels::kOverlapListMax);
          if (!in_kernel) wait_list(s, waits);
          const kernels::OverlapWaits w = in_kernel ? overlap_waits(waits) : kernels::OverlapWaits{};
          x = mark(s, TraceKind::kTile, static_cast<int64_t>(ev + 1 + j), 0, "compute stream",
                   fmt::format("reduce rows [{},{})", r0, r1), tracing);
          WEFT_CUDA_CHECK(kernels::overlap_wait_reduce(
              ctx, epoch_off, w, stage_local + static_cast<uint64_t>(r0 * N) * eb, static_cast<uint64_t>(m_shard * N),
              world, at(c, static_cast<uint64_t>(r0 * N) * eb), static_cast<uint64_t>((r1 - r0) * N), cfg.dtype, s));
          mark_end(x, s, tracing);
        }
      }
    }
  }
  WEFT_CUDA_CHECK(cudaEventRecord(ev_join, cs));
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(s, ev_join, 0));
}

// gemm_rs decomposed, RsFold::kGather (2 ranks; the fork to cs is done): this rank's block of
// C over all of K. The copy stream pushes this rank's rows of A for the peer's block and its B
// (in g_cols pieces) into the peer's g_a / g_b once the peer has begun this call; the compute
// stream computes C = A_own-rows · B (this rank's K-half), then per column piece j, once the
// peer's data up to j is here, C[:, j] += the peer's rows of A · the peer's B[:, j] (cuBLAS in
// place: its epilogue adds C). No SM kernel may run beside a GEMM (a running cuBLAS GEMM holds
// every SM to its last wave; a kernel waiting for one could stall a CTA of the next): the
// guard is a stream memory operation, each data flag a copy-engine copy of the sender's call
// counter, and each wait for data (a kernel: it has the deadline that names a missing peer)
// becomes runnable only when it can find an SM in the last wave of the GEMM before the one
// that needs it: once this rank's push of piece j is out (the peer's arrives about then) and
// (j > 0) piece j-1's GEMM is launched. Those pushes sit behind the guard, which has no
// deadline; so a second wait for piece 0, on its own stream once the own K-half's GEMM is done
// (its data is in by then: it passes at once), names a peer that never comes.
void GemmOverlap::Impl::gather_rs(const void* a, const void* bp, void* c, cudaStream_t s, bool tracing) {
  const dev::DeviceCtx& ctx = b.ctx();
  const int p = 1 - rank;
  const int64_t N = cfg.n;
  const bool nk = cfg.b_layout == BLayout::kNK;
  // (The epoch guard, memop_guard, is on cs already: the peer began this call, so it has read
  // what this rank wrote into it last call. No deadline: a missing peer is named by the data
  // waits below, which do not wait for this stream.)
  // Out: this rank's rows of A for the peer's block, then B piece by piece, each followed by
  // the peer's flag for it = this rank's call counter (the copy engine runs them in order).
  const uint64_t a_bytes = static_cast<uint64_t>(m_shard * k_local) * eb;
  size_t x = mark(cs, TraceKind::kChunk, 0, 1, engine_name(),
                  fmt::format("A rows [{},{}) -> rank {}", p * m_shard, (p + 1) * m_shard, p), tracing);
  WEFT_CUDA_CHECK(cudaMemcpyAsync(ctx.peer_base[p] + g_a, at(a, static_cast<uint64_t>(p) * a_bytes), a_bytes,
                                  cudaMemcpyDefault, cs));
  mark_end(x, cs, tracing);
  for (size_t j = 0; j < g_cols.size(); ++j) {
    const auto [c0, c1] = g_cols[j];
    x = mark(cs, TraceKind::kChunk, static_cast<int64_t>(j + 1), 1, engine_name(),
             fmt::format("B columns [{},{}) -> rank {}", c0, c1, p), tracing);
    if (nk) {  // W[N, K_local]: rows c0..c1
      const uint64_t row = static_cast<uint64_t>(k_local) * eb;
      WEFT_CUDA_CHECK(cudaMemcpyAsync(ctx.peer_base[p] + g_b + static_cast<uint64_t>(c0) * row,
                                      at(bp, static_cast<uint64_t>(c0) * row), static_cast<size_t>(c1 - c0) * row,
                                      cudaMemcpyDefault, cs));
    } else {  // B[K_local, N]: columns c0..c1 of every row
      copy2d(ctx.peer_base[p] + g_b + static_cast<uint64_t>(c0) * eb, static_cast<size_t>(N) * eb,
             at(bp, static_cast<uint64_t>(c0) * eb), static_cast<size_t>(N) * eb, static_cast<size_t>(c1 - c0) * eb,
             static_cast<size_t>(k_local), cs);
    }
    mark_end(x, cs, tracing);
    put_count(p, g_flags.at(static_cast<uint32_t>(j)), cs);
    WEFT_CUDA_CHECK(cudaEventRecord(ev_out[j], cs));
  }
  const int64_t r0 = rank * m_shard;
  x = mark(s, TraceKind::kTile, 0, 0, "compute stream", fmt::format("gemm rows [{},{}) (own K)", r0, r0 + m_shard),
           tracing);
  gemm(s, at(a, static_cast<uint64_t>(r0 * k_local) * eb), bp, c, m_shard, k_local, 0, N, Blas::kLt);
  mark_end(x, s, tracing);
  WEFT_CUDA_CHECK(cudaEventRecord(ev_piece[0], s));  // the own K-half is done
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(cb, ev_piece[0], 0));
  wait_list(cb, {{p, g_flags.at(0), 1}});
  WEFT_CUDA_CHECK(cudaEventRecord(ev_backup, cb));
  const char* pa = ctx.peer_base[rank] + g_a;
  const char* pb = ctx.peer_base[rank] + g_b;
  for (size_t j = 0; j < g_cols.size(); ++j) {
    const auto [c0, c1] = g_cols[j];
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(cw, ev_out[j], 0));
    if (j > 0) WEFT_CUDA_CHECK(cudaStreamWaitEvent(cw, ev_piece[j], 0));  // piece j-1's GEMM launched
    wait_list(cw, {{p, g_flags.at(static_cast<uint32_t>(j)), 1}});
    WEFT_CUDA_CHECK(cudaEventRecord(ev_recv[j], cw));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(s, ev_recv[j], 0));
    if (j + 1 < g_cols.size()) WEFT_CUDA_CHECK(cudaEventRecord(ev_piece[j + 1], s));
    x = mark(s, TraceKind::kTile, static_cast<int64_t>(j + 1), 0, "compute stream",
             fmt::format("gemm rows [{},{}) cols [{},{}) += rank {}'s K", r0, r0 + m_shard, c0, c1, p), tracing);
    gemm(s, pa, pb, c, m_shard, k_local, c0, c1 - c0, Blas::kLt, c);
    mark_end(x, s, tracing);
  }
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(s, ev_backup, 0));
}

void GemmOverlap::Impl::run_gpu(GemmMethod m, const void* a, const void* bp, void* c, cudaStream_t s, bool tracing) {
  if (m == GemmMethod::kFused) {
    if (!fused_gpu)
      throw Error(fmt::format("{}: the fused method on GPUs {}", to_string(cfg.op),
                              fused::fused_available() ? "runs ag_gemm and gemm_rs only (docs/gemm_overlap.md)"
                                                       : "needs an sm_90 GPU (weft's GEMM)"));
    return fused_method->run(a, bp, c, s, tracing);
  }
  if (m == GemmMethod::kBaseline) return baseline_method->run(a, bp, c, s, tracing);
  begin(s, tracing);
  gpu_decomposed(a, bp, c, s, tracing);
  if (tracing) collect(s);
}
#endif

GemmOverlap::Impl::~Impl() {
#ifdef WEFT_HAVE_CUDA
  for (auto& e : ev_piece) cudaEventDestroy(e);
  for (auto& e : ev_recv) cudaEventDestroy(e);
  for (auto& e : ev_out) cudaEventDestroy(e);
  if (ev_fork) cudaEventDestroy(ev_fork);
  if (ev_join) cudaEventDestroy(ev_join);
  if (cs) cudaStreamDestroy(cs);
  if (cw) cudaStreamDestroy(cw);
  if (cb) cudaStreamDestroy(cb);
  if (ev_backup) cudaEventDestroy(ev_backup);
  if (one) cudaFree(one);
  if (rs_fold_tables) cudaFree(rs_fold_tables);
  if (ev_guard) cudaEventDestroy(ev_guard);
#endif
}

// ---- GemmOverlap -------------------------------------------------------------------------

namespace {
// What every rank of one op must agree on: the ranks would otherwise allocate, plan and move
// different things (caught later, if at all, as a symmetric allocation mismatch or a hang).
std::string describe(const GemmOverlapConfig& c) {
  return fmt::format("{} M x K x N = {} x {} x {} {} {}{}{}{}", to_string(c.op), c.m, c.k, c.n, dev::dtype_name(c.dtype),
                     to_string(c.b_layout), c.chunks ? fmt::format(" chunks {}", c.chunks) : std::string(),
                     c.algo.empty() ? std::string() : fmt::format(" algo {}", c.algo),
                     c.tile_rows || c.tile_cols ? fmt::format(" host tile {} x {}", c.tile_rows, c.tile_cols)
                                                : std::string());
}
}  // namespace

GemmOverlap::GemmOverlap(Backend& backend, const GemmOverlapConfig& config)
    : impl_(std::make_unique<Impl>(backend, config)) {
  Impl& I = *impl_;
  I.op.agree("the configuration", describe(config));
  I.validate();
#ifdef WEFT_HAVE_CUDA
  if (backend.kind() == BackendKind::kNccl) {
    I.fused_gpu =
        fused::fused_available() && fused::fused_supports(static_cast<fused::Op>(static_cast<int32_t>(config.op)));
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
}

GemmOverlap::~GemmOverlap() = default;

void GemmOverlap::run(const void* a, const void* b, void* c, const GemmRunOptions& opt) {
  Impl& I = *impl_;
  const uint64_t a_bytes = static_cast<uint64_t>(I.a_rows * I.a_cols) * I.eb;
  const uint64_t b_bytes = static_cast<uint64_t>(I.b_rows * I.b_cols) * I.eb;
  const uint64_t c_bytes = static_cast<uint64_t>(I.c_rows * I.c_cols) * I.eb;
  I.check_ptr(a, "A", a_bytes);
  I.check_ptr(b, "B", b_bytes);
  I.check_ptr(c, "C", c_bytes);
  auto overlaps = [](const void* x, uint64_t nx, const void* y, uint64_t ny) {
    const auto p = reinterpret_cast<uintptr_t>(x), q = reinterpret_cast<uintptr_t>(y);
    return p < q + ny && q < p + nx;
  };
  WEFT_REQUIRE(!overlaps(c, c_bytes, a, a_bytes) && !overlaps(c, c_bytes, b, b_bytes),
               fmt::format("{}: C overlaps A or B (C is written while they are read)", to_string(I.cfg.op)));
  const GemmMethod m = I.resolve(opt.method);
  if (opt.trace) I.trace.clear();
  if (I.b.kind() == BackendKind::kHost) return I.run_host(m, a, b, c, opt.trace);
#ifdef WEFT_HAVE_CUDA
  I.run_gpu(m, a, b, c, static_cast<cudaStream_t>(opt.stream), opt.trace);
#endif
}

void GemmOverlap::run_gemm_only(const void* a, const void* b, void* c, void* stream, GemmAlone which) {
  Impl& I = *impl_;
  I.check_ptr(a, "A", 0);
  I.check_ptr(b, "B", 0);
  I.check_ptr(c, "C", 0);
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
  return impl_->lt && impl_->lt->tuning() == detail::LtGemm::Tune::kAll;
#else
  return false;
#endif
}

std::vector<std::string> GemmOverlap::gemm_choices() const {
#ifdef WEFT_HAVE_CUDA
  if (impl_->lt) return impl_->lt->report();
#endif
  return {};
}

std::vector<GemmMethod> GemmOverlap::available_methods() const { return impl_->available(); }
const AutoChoice& GemmOverlap::auto_choice() const { return impl_->autoc; }
const GemmOverlapConfig& GemmOverlap::config() const { return impl_->cfg; }
int GemmOverlap::chunks() const { return impl_->chunks; }
int64_t GemmOverlap::a_rows() const { return impl_->a_rows; }
int64_t GemmOverlap::a_cols() const { return impl_->a_cols; }
int64_t GemmOverlap::b_rows() const { return impl_->b_rows; }
int64_t GemmOverlap::b_cols() const { return impl_->b_cols; }
int64_t GemmOverlap::c_rows() const { return impl_->c_rows; }
int64_t GemmOverlap::c_cols() const { return impl_->c_cols; }
const std::vector<TraceEvent>& GemmOverlap::trace() const { return impl_->trace; }

std::string GemmOverlap::tuning_key() const { return impl_->tuning_key(); }

void GemmOverlap::store_tuning(GemmMethod method, int chunks, double us) const {
  const Impl& I = *impl_;
  if (I.rank != 0 || I.cache.empty()) return;
  WEFT_REQUIRE(method != GemmMethod::kAuto, "store_tuning: store a concrete method, not auto");
  detail::store_tuned_choice(I.cache, tuning_key(), {to_string(method), chunks}, us);
}

}  // namespace weft::ops
