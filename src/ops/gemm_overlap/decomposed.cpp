// `decomposed` on GPUs: per-chunk cuBLAS GEMMs on the caller's stream beside the transfers on
// the copy stream, by stream order and events (docs/gemm_overlap.md, "The GPU decomposed
// method"). One object per op; its constructor allocates what the op's shape and its
// decisions (chunks, the gemm_rs fold) need, in the same order on every rank.
#include <fmt/format.h>

#include "../collectives/collectives_impl.hpp"
#include "gemm_overlap_impl.hpp"
#include "stream_memops.hpp"
#include "weft/core/error.hpp"
#include "weft/kernels/runtime_kernels.hpp"
#include "weft/ops/gemm.hpp"

namespace weft::ops::detail {

DecomposedGpu::DecomposedGpu(GemmOpContext& op) : op_(op) {
  try {
    setup();
  } catch (...) {  // the destructor does not run for a constructor that throws
    release();
    throw;
  }
}

void DecomposedGpu::setup() {
  const GemmOverlapConfig& cfg = op_.cfg;
  const int world = op_.world;
  const int rank = op_.rank;
  const size_t eb = op_.eb;
  const int64_t k_local = op_.k_local;
  const int64_t m_shard = op_.m_shard;
  const int chunks = op_.chunks;
  const RsFold rs_fold = op_.rs_fold;
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&ev_fork, cudaEventDisableTiming));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&ev_join, cudaEventDisableTiming));
  SymmetricHeap& heap = op_.b.heap();
  const std::string tag = fmt::format("{}.{}x{}x{}", to_string(cfg.op), cfg.m, cfg.k, cfg.n);
  const int64_t rows = cfg.op == GemmOp::kGemmAr ? cfg.m : m_shard;
  pieces = plan::split_range(0, rows, chunks);
  if (cfg.op == GemmOp::kAgGemm) {
    // decomposed: the all-gather plan's tables, one GEMM per chunk of rows (all of N).
    ag = detail::build_op_plan(detail::decomposed_plan_params(cfg, world, k_local, chunks, m_shard));
    for (const auto& d : ag.lowered.ranks[static_cast<size_t>(rank)].transfers)
      WEFT_REQUIRE(static_cast<plan::Kind>(d.kind) != plan::Kind::kReduce,
                   fmt::format("ag_gemm decomposed: plan {} has a reduce transfer", ag.plan.name));
    for (size_t t = 0; t < ag.plan.tensors.size(); ++t) {
      const plan::Tensor& x = ag.plan.tensors[t];
      // The input tensor is the user's A_r (read in place): nothing to allocate.
      ag_tensor_off.push_back(
          static_cast<int>(t) == ag.input
              ? 0
              : op_.data_buffer(static_cast<size_t>(x.rows * x.cols * x.elem_bytes), "decomposed." + x.name));
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
    rs_stage = op_.data_buffer(static_cast<size_t>(world) * m_shard * cfg.n * eb, "decomposed.staging");
    // The staged reduce-scatter's tables (decomposed_plan_params, shared with the host's
    // decomposed method and tests): its pushes, tiles, signals and the owner's sums. (The
    // gathered-inputs fold, a different algorithm, runs its own plan: gather_inputs_plan.)
    rs = detail::build_op_plan(detail::decomposed_plan_params(cfg, world, k_local, chunks, m_shard));
    rs_tables = detail::rs_decomposed_tables(rs, rank, m_shard);
    const plan::Tensor& st = rs.plan.tensors[static_cast<size_t>(rs.plan.tensor_id("stage"))];
    WEFT_CHECK(st.rows == world * m_shard && st.cols == cfg.n,
               fmt::format("gemm_rs decomposed: plan {}'s staging is {}x{}", rs.plan.name, st.rows, st.cols));
    rs_signals = heap.alloc_signals(static_cast<uint32_t>(rs.lowered.max_signals()), tag + ".decomposed.signals");
    // One per push of the plan (a record after its GEMMs); gather_rs: one per tile (at most
    // `chunks`: gather_inputs_plan).
    ev_piece.resize(std::max(rs_tables.pushes.size(), static_cast<size_t>(chunks)));
    if (rs_fold == RsFold::kLt || rs_fold == RsFold::kGather) {
      ev_recv.resize(static_cast<size_t>(chunks));
      for (auto& e : ev_recv) WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    rs_memop_guard = rs_fold == RsFold::kGather ||
                     (rs_fold == RsFold::kNone && world > 1 && !op_.sm_copies && detail::stream_memops_available());
    if (rs_memop_guard) {
      rs_guard = heap.alloc_signals(static_cast<uint32_t>(world), tag + ".decomposed.guard");
      WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&cg, cudaStreamNonBlocking));
      WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&ev_watch, cudaEventDisableTiming));
      WEFT_CUDA_CHECK(cudaMalloc(&one, sizeof(uint64_t)));
      const uint64_t v = 1;
      WEFT_CUDA_CHECK(cudaMemcpy(one, &v, sizeof v, cudaMemcpyHostToDevice));
    }
    if (rs_fold == RsFold::kGather) {
      // The gathered inputs' tables (gather_inputs_plan, shared with the host tests): its
      // scratch tensors (the peer's rows of A for this block, the peer's B), its signals, and
      // per tile its waits. Checked here once: this rank's transfers are copy-engine pushes of
      // its inputs into the peer's scratch, each bumping a signal of the peer whose per-epoch
      // total is 1 (so a copy of the call count stands for its +1: put_count), and every tile
      // covers the whole block's rows.
      const std::string who = fmt::format("gemm_rs decomposed (gathered inputs) on rank {}", rank);
      WEFT_CHECK(world == 2, who + ": needs 2 ranks");
      gp = gather_inputs_plan(cfg, k_local, m_shard, chunks);
      for (const plan::Tensor& x : gp.plan.tensors)
        g_tensor_off.push_back(x.role == plan::Role::kInput
                                   ? 0
                                   : op_.data_buffer(static_cast<size_t>(x.rows * x.cols * x.elem_bytes),
                                                     "gather." + x.name));
      g_signals = heap.alloc_signals(static_cast<uint32_t>(gp.lowered.max_signals()), tag + ".gather.signals");
      const int p = 1 - rank;
      const plan::LoweredRank& lr = gp.lowered.ranks[static_cast<size_t>(rank)];
      const plan::LoweredRank& lp = gp.lowered.ranks[static_cast<size_t>(p)];
      for (const plan::TransferDesc& d : lr.transfers) {
        const plan::Tensor& st = gp.plan.tensors[static_cast<size_t>(d.src_tensor)];
        const plan::Tensor& dt = gp.plan.tensors[static_cast<size_t>(d.dst_tensor)];
        WEFT_CHECK(static_cast<plan::Kind>(d.kind) == plan::Kind::kPush && d.src_rank == rank && d.dst_rank == p &&
                       st.role == plan::Role::kInput && dt.role != plan::Role::kInput && d.wait_count == 0 &&
                       d.signal_rank == p && d.increment == 1 &&
                       lp.signal_expected[static_cast<size_t>(d.signal)] == 1,
                   fmt::format("{}: chunk {} is not a push of an input into the peer's scratch bumping a signal of "
                               "total 1",
                               who, d.chunk));
      }
      const plan::TileSchedule& sch = gp.schedule;
      for (const plan::TileEntry& t : lr.tiles) {
        WEFT_CHECK(sch.block_rows(t.m) == std::make_pair(int64_t{0}, m_shard),
                   fmt::format("{}: tile ({},{}) does not cover the block's rows", who, t.m, t.n));
        std::vector<std::tuple<int, uint64_t, int64_t>> waits;
        int32_t after = -1;
        for (int32_t k = t.wait_begin; k < t.wait_begin + t.wait_count; ++k) {
          const plan::WaitEntry& w = lr.tile_waits[static_cast<size_t>(k)];
          const int32_t from = lr.signal_producer[static_cast<size_t>(w.signal)];
          WEFT_CHECK(from == p, fmt::format("{}: tile ({},{}) waits for signal {} of rank {}", who, t.m, t.n,
                                            w.signal, from));
          waits.emplace_back(from, g_signals.at(static_cast<uint32_t>(w.signal)), w.threshold);
          // The peer's push that bumps it; this rank's push in the same position goes out
          // about when it arrives (the two ranks' queues mirror each other).
          for (size_t i = 0; i < lp.transfers.size(); ++i)
            if (lp.transfers[i].signal_rank == rank && lp.transfers[i].signal == w.signal)
              after = std::max(after, static_cast<int32_t>(i));
        }
        WEFT_CHECK(after >= 0 && static_cast<size_t>(after) < lr.transfers.size(),
                   fmt::format("{}: tile ({},{}) waits for no push of the peer's", who, t.m, t.n));
        g_waits.push_back(std::move(waits));
        g_out_after.push_back(after);
      }
      WEFT_CHECK(!lr.tiles.empty() && lr.tiles.size() <= ev_piece.size() && lr.tiles.size() <= ev_recv.size(),
                 fmt::format("{}: {} tiles for {} chunks", who, lr.tiles.size(), chunks));
      WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&cw, cudaStreamNonBlocking));
      ev_out.resize(lr.tiles.size());
      for (auto& e : ev_out) WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    if (rs_fold == RsFold::kWeft) {  // (never with SM copies: choose_rs_fold)
      // Per M-block of the own block: for each piece its rows overlap, the waits of the plan's
      // sum of that piece (the peers' pushes of it; thresholds times the call count).
      std::vector<int32_t> begin{0}, idx, from;
      std::vector<uint64_t> val;
      for (int mb = 0; mb < kernels::gemm_tiles_m(static_cast<int>(m_shard)); ++mb) {
        const int64_t r0 = int64_t{mb} * kernels::kGemmTileM, r1 = std::min(m_shard, r0 + kernels::kGemmTileM);
        for (const auto& pc : rs_tables.pieces)
          if (pc.r0 < r1 && pc.r1 > r0)
            for (size_t k = 0; k < pc.waits.size(); ++k) {
              idx.push_back(pc.waits[k].signal);
              val.push_back(static_cast<uint64_t>(pc.waits[k].threshold));
              from.push_back(pc.producers[k]);
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
      h.wait_scale_dev = op_.b.ctx().ptr<const uint64_t>(rank, op_.epoch_off);  // the call counter
      WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&ev_guard, cudaEventDisableTiming));
    }
  } else if (world == 1) {
    ev_piece.resize(pieces.size());  // gemm_ar on one rank: the GEMM alone, by chunks
  } else {
    // gemm_ar: the two-shot all-reduce plan's tables (decomposed_plan_params, shared with the
    // host's decomposed method and tests), each sum this rank owns one pass (ar_chain_tables).
    ar = detail::build_op_plan(detail::decomposed_plan_params(cfg, world, k_local, chunks, m_shard));
    ar_tables = detail::ar_chain_tables(ar, rank);
    for (int64_t total : ar.lowered.counters)
      WEFT_CHECK(total == 1, fmt::format("gemm_ar decomposed: plan {} has a tile counter of {} notifies per call (a "
                                         "copy of the call count stands for one)",
                                         ar.plan.name, total));
    WEFT_REQUIRE(world <= kernels::kOverlapListMax,
                 fmt::format("gemm_ar decomposed: {} ranks (at most {}: one pass sums every rank's rows)", world,
                             kernels::kOverlapListMax));
    const size_t bytes = static_cast<size_t>(cfg.m * cfg.n) * eb;
    ar_in = op_.data_buffer(bytes, "decomposed.in");
    ar_out = op_.data_buffer(bytes, "decomposed.out");
    ar_signals = heap.alloc_signals(static_cast<uint32_t>(ar.lowered.max_signals()), tag + ".decomposed.signals");
    ar_counters = heap.alloc_signals(static_cast<uint32_t>(world * ar.lowered.counters.size()),
                                     tag + ".decomposed.counters");
    ev_piece.resize(ar.lowered.ranks[static_cast<size_t>(rank)].tiles.size());
    const size_t nchains = ar_tables.chains.size();
    WEFT_CUDA_CHECK(cudaMalloc(&ar_arrivals, std::max<size_t>(nchains, 1) * sizeof(unsigned long long)));
    WEFT_CUDA_CHECK(cudaMemset(ar_arrivals, 0, std::max<size_t>(nchains, 1) * sizeof(unsigned long long)));
    // What every call issues, resolved to heap offsets once: per tile its counter's slot and
    // the ranks it is set on (this one and those whose sums read it); per sum its kernel's
    // arguments (C's rows, dst[0], added per call), its waits where they pass one kernel's
    // list, and its CTAs (the collectives' rule for a two-shot all-reduce of the same rows of
    // every rank); per landing its waits.
    const plan::LoweredRank& lr = ar.lowered.ranks[static_cast<size_t>(rank)];
    const int64_t counters = static_cast<int64_t>(ar.lowered.counters.size());
    auto counter_off = [&](int32_t tiles_rank, int32_t counter) {
      return ar_counters.at(static_cast<uint32_t>(tiles_rank * counters + counter));
    };
    const auto row_bytes = [&](int64_t r) { return static_cast<uint64_t>(r * cfg.n) * eb; };
    const dev::DeviceCtx& ctx = op_.b.ctx();
    for (const plan::TileEntry& t : lr.tiles) {
      ArTile tile{counter_off(rank, t.notify), {rank}};
      for (int32_t k = lr.notify_begin[static_cast<size_t>(t.notify)];
           k < lr.notify_begin[static_cast<size_t>(t.notify) + 1]; ++k)
        if (lr.notify_ranks[static_cast<size_t>(k)] != rank) tile.to.push_back(lr.notify_ranks[static_cast<size_t>(k)]);
      ar_tile.push_back(std::move(tile));
    }
    for (size_t j = 0; j < ar_tables.chains.size(); ++j) {
      const detail::ArChainTables::Chain& ch = ar_tables.chains[j];
      std::vector<std::tuple<int, uint64_t, int64_t>> waits;
      for (const plan::CounterWait& w : ch.tile_waits)
        waits.emplace_back(w.rank, counter_off(w.rank, w.counter), w.threshold);
      kernels::OverlapChain k;
      if (waits.size() <= static_cast<size_t>(kernels::kOverlapListMax)) {
        k.waits = op_.overlap_waits(waits);
        waits.clear();
      }
      for (int32_t q : ch.sources) k.src[k.nsrc++] = ctx.peer_base[q] + ar_in + row_bytes(ch.r0);
      k.dst[k.ndst++] = nullptr;  // this call's C
      for (const auto& [p, sig] : ch.signals) {
        k.dst[k.ndst++] = ctx.peer_base[p] + ar_out + row_bytes(ch.r0);
        const int32_t i = k.signals.count++;
        k.signals.peer[i] = p;
        k.signals.off[i] = ar_signals.at(static_cast<uint32_t>(sig));
        k.signals.inc[i] = 1;
      }
      k.n = static_cast<uint64_t>((ch.r1 - ch.r0) * cfg.n);
      k.arrivals = ar_arrivals + j;
      ar_chain_args.push_back(k);
      ar_chain_waits.push_back(std::move(waits));
      ar_ctas.push_back(detail::coll_ctas(coll::Algo::kAllReduceTwoShot, static_cast<uint64_t>(world) * row_bytes(ch.r1 - ch.r0), 0));
    }
    for (const detail::ArChainTables::Landing& l : ar_tables.landings) {
      std::vector<std::tuple<int, uint64_t, int64_t>> waits;
      for (size_t i = 0; i < l.waits.size(); ++i)
        waits.emplace_back(l.producers[i], ar_signals.at(static_cast<uint32_t>(l.waits[i].signal)), l.waits[i].threshold);
      ar_landing_waits.push_back(std::move(waits));
    }
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&cn, cudaStreamNonBlocking));
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&cl, cudaStreamNonBlocking));
    WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&ev_cn, cudaEventDisableTiming));
    WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&ev_cl, cudaEventDisableTiming));
  }
  for (auto& e : ev_piece) WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

DecomposedGpu::~DecomposedGpu() { release(); }

void DecomposedGpu::release() {
  for (auto& e : ev_piece) cudaEventDestroy(e);
  for (auto& e : ev_recv) cudaEventDestroy(e);
  for (auto& e : ev_out) cudaEventDestroy(e);
  if (ev_fork) cudaEventDestroy(ev_fork);
  if (ev_join) cudaEventDestroy(ev_join);
  if (cs) cudaStreamDestroy(cs);
  if (cw) cudaStreamDestroy(cw);
  if (cg) cudaStreamDestroy(cg);
  if (ev_watch) cudaEventDestroy(ev_watch);
  if (one) cudaFree(one);
  if (rs_fold_tables) cudaFree(rs_fold_tables);
  if (ev_guard) cudaEventDestroy(ev_guard);
  if (ar_arrivals) cudaFree(ar_arrivals);
  for (cudaStream_t x : {cn, cl})
    if (x) cudaStreamDestroy(x);
  for (cudaEvent_t e : {ev_cn, ev_cl})
    if (e) cudaEventDestroy(e);
}

void DecomposedGpu::keep_gathered(int64_t m, const void* a, void* dst, void* stream) {
  op_.copy_gathered(op_.b.ctx().peer_base[op_.rank] + ag_tensor_off[static_cast<size_t>(ag.gemm)], ag_own_in_place, m, a,
                    dst, static_cast<cudaStream_t>(stream));
}

void DecomposedGpu::run(int64_t m, const void* a, const void* bp, void* c, void* stream, bool tracing) {
  WEFT_CHECK(m == op_.cfg.m, "decomposed runs its prepared M only");
  const auto s = static_cast<cudaStream_t>(stream);
  op_.begin(s, tracing);
  gpu_decomposed(a, bp, c, s, tracing);
  if (tracing) op_.collect(s);
}

void DecomposedGpu::memop_guard(cudaStream_t s) {
  const int world = op_.world;
  const int rank = op_.rank;
  const dev::DeviceCtx& ctx = op_.b.ctx();
  // The guard's deadline: a kernel on cg waits for every peer's call counter to reach this
  // rank's (the peer began this call: it bumps its counter before it writes the guard) and
  // traps naming a peer that never comes -- the stream wait below has no deadline of its own.
  // Issued first, so that it runs even where device work executes in issue order (under
  // compute-sanitizer); the call's end waits for it (gpu_decomposed).
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(cg, ev_fork, 0));
  WEFT_CUDA_CHECK(kernels::overlap_peer_epochs(ctx, op_.epoch_off, dev::op_tag("gemm_rs"), cg));
  WEFT_CUDA_CHECK(cudaEventRecord(ev_watch, cg));
  for (int q = 0; q < world; ++q) {
    if (q == rank) continue;
    char* word = ctx.peer_base[q] + rs_guard.at(static_cast<uint32_t>(rank));
    if (!op_.sm_copies && op_.copy_engine_took(cudaMemcpyAsync(word, one, sizeof(uint64_t), cudaMemcpyDefault, s), s))
      continue;
    op_.signal(q, rs_guard.at(static_cast<uint32_t>(rank)), 1, s);  // the same word, by a kernel (>= 1 either way)
  }
  for (int q = 0; q < world; ++q) {
    if (q == rank) continue;
    const char* mine = ctx.peer_base[rank] + rs_guard.at(static_cast<uint32_t>(q));
    detail::stream_wait_geq(s, mine, 1);
    detail::stream_write(s, mine, 0);
  }
}

std::vector<std::tuple<int, uint64_t, int64_t>> DecomposedGpu::piece_waits(size_t j) const {
  const detail::RsDecomposedTables::Piece& pc = rs_tables.pieces[j];
  std::vector<std::tuple<int, uint64_t, int64_t>> waits;
  for (size_t k = 0; k < pc.waits.size(); ++k)
    waits.emplace_back(pc.producers[k], rs_signals.at(static_cast<uint32_t>(pc.waits[k].signal)), pc.waits[k].threshold);
  return waits;
}

void DecomposedGpu::gpu_decomposed(const void* a, const void* bp, void* c, cudaStream_t s, bool tracing) {
  const GemmOverlapConfig& cfg = op_.cfg;
  const int world = op_.world;
  const int rank = op_.rank;
  const size_t eb = op_.eb;
  const int64_t k_local = op_.k_local;
  const int64_t m_shard = op_.m_shard;
  const RsFold rs_fold = op_.rs_fold;
  const dev::DeviceCtx& ctx = op_.b.ctx();
  const int64_t N = cfg.n;
  WEFT_CUDA_CHECK(kernels::overlap_epoch_bump(ctx, op_.epoch_off, s));
  WEFT_CUDA_CHECK(cudaEventRecord(ev_fork, s));
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(cs, ev_fork, 0));

  if (cfg.op == GemmOp::kGemmAr && world > 1) {
    ar_sums(a, bp, c, s, tracing);
  } else if (cfg.op == GemmOp::kGemmAr) {
    for (size_t j = 0; j < pieces.size(); ++j) {  // one rank: the GEMM alone, by chunks
      const auto [r0, r1] = pieces[j];
      size_t x = op_.mark(s, TraceKind::kTile, static_cast<int64_t>(j), 0, "compute stream",
                          fmt::format("gemm rows [{},{})", r0, r1), tracing);
      op_.gemm(s, at(a, static_cast<uint64_t>(r0 * k_local) * eb), bp, at(c, static_cast<uint64_t>(r0 * N) * eb),
               r1 - r0, k_local, 0, N, GemmOpContext::Blas::kLt);
      op_.mark_end(x, s, tracing);
    }
  } else {
    // The epoch guard: peers write into this rank's symmetric buffers only after every rank
    // has finished reading them for the previous call (this stream waited for ev_fork,
    // which follows that call's last GEMM or reduce on the compute stream).
    // (gemm_rs's gathered inputs and reduce pass: without an SM, memop_guard.)
    if (rs_memop_guard)
      memop_guard(cs);
    else if (world > 1)
      WEFT_CUDA_CHECK(kernels::device_barrier(ctx, op_.barrier, cs));
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
          waits.emplace_back(lr.signal_producer[static_cast<size_t>(w.signal)],
                             ag_signals.at(static_cast<uint32_t>(w.signal)), w.threshold);
        }
        op_.wait_list(cs, waits);
        const plan::Tensor& st = ag.plan.tensors[static_cast<size_t>(d.src_tensor)];
        const plan::Tensor& dt = ag.plan.tensors[static_cast<size_t>(d.dst_tensor)];
        if (!own_copy) {
          size_t x = op_.mark(cs, TraceKind::kChunk, d.chunk, 1, op_.engine_name(),
                              fmt::format("chunk {} {} {}->{}", d.chunk,
                                          plan::to_string(static_cast<plan::Kind>(d.kind)), d.src_rank, d.dst_rank),
                              tracing);
          op_.copy2d(ptr(d.dst_rank, d.dst_tensor, d.dst_row, d.dst_col), static_cast<size_t>(dt.cols) * eb,
                     ptr(d.src_rank, d.src_tensor, d.src_row, d.src_col), static_cast<size_t>(st.cols) * eb,
                     static_cast<size_t>(d.cols) * eb, static_cast<size_t>(d.rows), cs);
          op_.mark_end(x, cs, tracing);
        }
        if (d.signal_rank >= 0) {
          op_.signal(d.signal_rank, ag_signals.at(static_cast<uint32_t>(d.signal)), static_cast<uint64_t>(d.increment),
                     cs);
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
          waits.emplace_back(lr.signal_producer[static_cast<size_t>(w.signal)],
                             ag_signals.at(static_cast<uint32_t>(w.signal)), w.threshold);
        }
        op_.wait_list(s, waits);
        size_t x = op_.mark(s, TraceKind::kTile, static_cast<int64_t>(i), 0, "compute stream",
                            fmt::format("gemm rows [{},{}){}", r0, r1, own ? " (own, in place)" : ""), tracing);
        const char* arows = own ? static_cast<const char*>(a) + static_cast<uint64_t>((r0 - own0) * k_local) * eb
                                : gathered + static_cast<uint64_t>(r0 * k_local) * eb;
        op_.gemm(s, arows, bp, at(c, static_cast<uint64_t>(r0 * N) * eb), r1 - r0, k_local, c0, c1 - c0,
                 GemmOpContext::Blas::kLt);
        op_.mark_end(x, s, tracing);
      }
    } else if (rs_fold == RsFold::kGather) {
      gather_rs(a, bp, c, s, tracing);
    } else {
      // gemm_rs: the staged plan's tables (rs_decomposed_tables): the pushes in issue order,
      // each after the GEMM tiles its counter waits name (partial rows for the owner, in the
      // op's scratch: the plan's "in"), copied into the owner's staging slot `rank` and
      // signalled. The plan rotates owners by rank and computes the other ranks' rows first.
      // Then this rank's own block, whose sum consumes the plan's reduce entries (their waits):
      // RsFold::kWeft, one launch of weft's GEMM that waits per M-block for the peers' pieces
      // and adds them in its epilogue, straight into C; RsFold::kLt (2 ranks), per piece a wait
      // for the peer's piece, then cuBLASLt's D = A B + that piece into C; else the own block
      // into its own slot (the plan's local copy of it left out), then the owner sums the
      // slots (a reduce pass).
      const plan::LoweredRank& lr = rs.lowered.ranks[static_cast<size_t>(rank)];
      const plan::TileSchedule& sch = rs.schedule;
      char* stage_local = ctx.peer_base[rank] + rs_stage;
      const uint64_t slot_bytes = static_cast<uint64_t>(m_shard * N) * eb;
      // pushes_left[j]: this rank's pushes of piece j still to go (kLt waits after the last).
      std::vector<int> pushes_left(rs_tables.pieces.size(), 0);
      for (const auto& x : rs_tables.pushes) ++pushes_left[static_cast<size_t>(x.piece)];
      int32_t tile = 0;
      for (size_t i = 0; i < rs_tables.pushes.size(); ++i) {
        const detail::RsDecomposedTables::Push& x = rs_tables.pushes[i];
        const plan::TransferDesc& d = lr.transfers[static_cast<size_t>(x.transfer)];
        const int p = d.dst_rank;
        if (tile < x.tiles_end) {
          for (; tile < x.tiles_end; ++tile) {
            const auto [g0, g1] = sch.block_rows(lr.tiles[static_cast<size_t>(tile)].m);
            size_t mk = op_.mark(s, TraceKind::kTile, tile, 0, "compute stream",
                                 fmt::format("gemm rows [{},{}) for rank {}", g0, g1, g0 / m_shard), tracing);
            op_.gemm(s, at(a, static_cast<uint64_t>(g0 * k_local) * eb), bp,
                     at(op_.scratch, static_cast<uint64_t>(g0 * N) * eb), g1 - g0, k_local, 0, N,
                     GemmOpContext::Blas::kLt);
            op_.mark_end(mk, s, tracing);
          }
          WEFT_CUDA_CHECK(cudaEventRecord(ev_piece[i], s));
          WEFT_CUDA_CHECK(cudaStreamWaitEvent(cs, ev_piece[i], 0));
        }
        size_t mk = op_.mark(cs, TraceKind::kChunk, d.chunk, 1, op_.engine_name(),
                             fmt::format("partial rows [{},{}) -> rank {}", d.src_row, d.src_row + d.rows, p), tracing);
        const size_t bytes = static_cast<size_t>(d.rows * N) * eb;  // whole rows: one block
        op_.copy2d(ctx.peer_base[p] + rs_stage + static_cast<uint64_t>(d.dst_row * N) * eb, bytes,
                   at(op_.scratch, static_cast<uint64_t>(d.src_row * N) * eb), bytes, bytes, 1, cs);
        op_.mark_end(mk, cs, tracing);
        // The signal by the copy engine where it takes peer pointers: no SM needed while a
        // GEMM holds them all (the peer's folded GEMM -- always so for weft's fold, whose
        // GEMM waits for it holding every SM; this rank's own block, before the reduce pass).
        // A copy of the call count stands for the plan's +1 (its increment and total are 1:
        // rs_decomposed_tables).
        const uint64_t sig_off = rs_signals.at(static_cast<uint32_t>(d.signal));
        if (rs_fold == RsFold::kWeft || !op_.sm_copies)
          op_.put_count(p, sig_off, cs);
        else
          op_.signal(p, sig_off, static_cast<uint64_t>(d.increment), cs);
        if (rs_fold == RsFold::kLt && --pushes_left[static_cast<size_t>(x.piece)] == 0) {
          // The wait for the peers' piece j on this stream, after this rank's own piece j
          // went out (the peer's is due about then: a short spin), the compute stream
          // joining it by an event: between the compute stream's cuBLAS GEMMs only the
          // launch gap stays, not a wait kernel (docs/gemm_overlap.md, cuBLASLt fold). (The
          // reduce pass meets its waits inside the reduce kernel, below.)
          op_.wait_list(cs, piece_waits(static_cast<size_t>(x.piece)));
          WEFT_CUDA_CHECK(cudaEventRecord(ev_recv[static_cast<size_t>(x.piece)], cs));
        }
      }
      const int64_t g0 = rank * m_shard;
      const int64_t own_id = rs_tables.own_tiles_begin;  // trace ids of the own block's work
      if (rs_fold == RsFold::kWeft) {
        kernels::GemmArgs ga = op_.weft_gemm_args(at(a, static_cast<uint64_t>(g0 * k_local) * eb), bp, c, m_shard);
        for (int q = 0; q < world; ++q)
          if (q != rank) ga.src[ga.num_src++] = stage_local + slot_bytes * static_cast<uint64_t>(q);
        ga.ld_src = N;
        // Row blocks in piece order (a raster group per piece, <= 16 blocks), so the first
        // waves need the first pieces only.
        ga.group_m = static_cast<int>(std::clamp<int64_t>(
            ceil_div(ceil_div(m_shard, static_cast<int64_t>(rs_tables.pieces.size())), kernels::kGemmTileM), 1, 16));
        kernels::GemmHooks h = rs_fold_hooks;
        h.ctx = ctx;
        h.op = dev::op_tag("gemm_rs");  // named by a timeout
        // Waits before each tile's main loop (not wait_at_epilogue): the peers' pieces were
        // computed before this GEMM and have mostly landed, and the first source half then
        // loads early under the main loop (waits at the epilogue measured slower:
        // docs/gemm_overlap.md, "Folded into weft's GEMM").
        // Not before this rank's epoch barrier has run: the peers' pushes wait for it, and
        // this GEMM, waiting for them, holds every SM.
        WEFT_CUDA_CHECK(cudaStreamWaitEvent(s, ev_guard, 0));
        size_t x = op_.mark(s, TraceKind::kTile, own_id, 0, "compute stream",
                            fmt::format("gemm rows [{},{}) (own) + peers' pieces", g0, g0 + m_shard), tracing);
        ops::gemm_gpu(ga, h, s);
        op_.mark_end(x, s, tracing);
      } else if (rs_fold == RsFold::kLt) {
        const int q = 1 - rank;  // the peer (2 ranks)
        for (size_t j = 0; j < rs_tables.pieces.size(); ++j) {
          const int64_t r0 = rs_tables.pieces[j].r0, r1 = rs_tables.pieces[j].r1;
          WEFT_CUDA_CHECK(cudaStreamWaitEvent(s, ev_recv[j], 0));  // the peer's piece j is in
          size_t x = op_.mark(s, TraceKind::kTile, own_id + static_cast<int64_t>(j), 0, "compute stream",
                              fmt::format("gemm rows [{},{}) (own) + rank {}'s piece", g0 + r0, g0 + r1, q), tracing);
          op_.gemm(s, at(a, static_cast<uint64_t>((g0 + r0) * k_local) * eb), bp,
                   at(c, static_cast<uint64_t>(r0 * N) * eb), r1 - r0, k_local, 0, N, GemmOpContext::Blas::kLt,
                   stage_local + slot_bytes * static_cast<uint64_t>(q) + static_cast<uint64_t>(r0 * N) * eb);
          op_.mark_end(x, s, tracing);
        }
      } else {
        size_t x = op_.mark(s, TraceKind::kTile, own_id, 0, "compute stream",
                            fmt::format("gemm rows [{},{}) (own)", g0, g0 + m_shard), tracing);
        op_.gemm(s, at(a, static_cast<uint64_t>(g0 * k_local) * eb), bp,
                 stage_local + slot_bytes * static_cast<uint64_t>(rank), m_shard, k_local, 0, N,
                 GemmOpContext::Blas::kLt);
        op_.mark_end(x, s, tracing);
        for (size_t j = 0; j < rs_tables.pieces.size(); ++j) {
          const int64_t r0 = rs_tables.pieces[j].r0, r1 = rs_tables.pieces[j].r1;
          const auto waits = piece_waits(j);
          // The waits inside the reduce kernel (one launch after the own block's GEMM, not a
          // wait kernel and then the reduce), unless there are more than one kernel's list.
          const bool in_kernel = waits.size() <= static_cast<size_t>(kernels::kOverlapListMax);
          if (!in_kernel) op_.wait_list(s, waits);
          const kernels::OverlapWaits w = in_kernel ? op_.overlap_waits(waits) : kernels::OverlapWaits{};
          x = op_.mark(s, TraceKind::kTile, own_id + 1 + static_cast<int64_t>(j), 0, "compute stream",
                       fmt::format("reduce rows [{},{})", r0, r1), tracing);
          // The plan's sum of piece j (its own slot, then every peer's: rs_decomposed_tables
          // checked each slot comes once) as one kernel over the `world` slots.
          WEFT_CUDA_CHECK(kernels::overlap_wait_reduce(
              ctx, op_.epoch_off, w, stage_local + static_cast<uint64_t>(r0 * N) * eb,
              static_cast<uint64_t>(m_shard * N), world, at(c, static_cast<uint64_t>(r0 * N) * eb),
              static_cast<uint64_t>((r1 - r0) * N), cfg.dtype, s));
          op_.mark_end(x, s, tracing);
        }
      }
    }
  }
  WEFT_CUDA_CHECK(cudaEventRecord(ev_join, cs));
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(s, ev_join, 0));
  if (rs_memop_guard) WEFT_CUDA_CHECK(cudaStreamWaitEvent(s, ev_watch, 0));  // the guard's deadline kernel
}

// gemm_ar decomposed (2+ ranks; the fork to cs is done): the two-shot plan's tables
// (ar_chain_tables). The compute stream runs the tiles in the plan's order, each GEMM straight
// into this rank's rows of "in" (the window), and never waits for anything: after each tile
// the stream cn sets the tile's counter on this rank and on every rank whose sums read it to
// the call count (copy engine). The stream cs runs this rank's sums, each once its own tiles
// are done (an event): one kernel that waits for every rank's tiles of those rows, sums them
// into this rank's C and every peer's "out", and signals the peers. The stream cl copies the
// peers' sums from "out" into C as their signals arrive, each after this rank's next tile
// (then the owner's sum, which began with that tile, has mostly landed: its wait spins least
// beside a GEMM). No epoch guard: a peer writes this rank's "out" rows in a call only after
// reading this rank's tiles of them in the same call, which follow its previous call's end.
void DecomposedGpu::ar_sums(const void* a, const void* bp, void* c, cudaStream_t s, bool tracing) {
  const GemmOverlapConfig& cfg = op_.cfg;
  const size_t eb = op_.eb;
  const int64_t k_local = op_.k_local;
  const int64_t N = cfg.n;
  const dev::DeviceCtx& ctx = op_.b.ctx();
  const plan::LoweredRank& lr = ar.lowered.ranks[static_cast<size_t>(op_.rank)];
  const auto row_bytes = [&](int64_t r) { return static_cast<uint64_t>(r * N) * eb; };
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(cn, ev_fork, 0));
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(cl, ev_fork, 0));
  char* in_local = ctx.peer_base[op_.rank] + ar_in;
  for (size_t i = 0; i < lr.tiles.size(); ++i) {
    const auto [r0, r1] = ar.schedule.block_rows(lr.tiles[i].m);
    size_t x = op_.mark(s, TraceKind::kTile, static_cast<int64_t>(i), 0, "compute stream",
                        fmt::format("gemm rows [{},{})", r0, r1), tracing);
    op_.gemm(s, at(a, static_cast<uint64_t>(r0 * k_local) * eb), bp, in_local + row_bytes(r0), r1 - r0, k_local, 0,
             N, GemmOpContext::Blas::kLt);
    op_.mark_end(x, s, tracing);
    WEFT_CUDA_CHECK(cudaEventRecord(ev_piece[i], s));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(cn, ev_piece[i], 0));
    for (int32_t q : ar_tile[i].to) {
      if (op_.sm_copies)
        op_.signal(q, ar_tile[i].counter, 1, cn);
      else
        op_.put_count(q, ar_tile[i].counter, cn);
    }
  }
  for (size_t j = 0; j < ar_tables.chains.size(); ++j) {
    const detail::ArChainTables::Chain& ch = ar_tables.chains[j];
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(cs, ev_piece[static_cast<size_t>(ch.after_tile - 1)], 0));
    if (!ar_chain_waits[j].empty()) op_.wait_list(cs, ar_chain_waits[j]);
    kernels::OverlapChain k = ar_chain_args[j];
    k.dst[0] = at(c, row_bytes(ch.r0));
    size_t x = op_.mark(cs, TraceKind::kChunk, static_cast<int64_t>(j), 1, "sum stream",
                        fmt::format("sum rows [{},{}) of {} ranks -> C, {} peers", ch.r0, ch.r1, ch.sources.size(),
                                    ch.signals.size()),
                        tracing);
    WEFT_CUDA_CHECK(kernels::overlap_chain(ctx, op_.epoch_off, k, cfg.dtype, ar_ctas[j], cs));
    op_.mark_end(x, cs, tracing);
  }
  const size_t ntiles = lr.tiles.size();
  for (size_t j = 0; j < ar_tables.landings.size(); ++j) {
    const detail::ArChainTables::Landing& l = ar_tables.landings[j];
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(cl, ev_piece[std::min(static_cast<size_t>(l.after_tile), ntiles - 1)], 0));
    op_.wait_list(cl, ar_landing_waits[j]);
    size_t x = op_.mark(cl, TraceKind::kChunk, static_cast<int64_t>(ar_tables.chains.size() + j), 2, "landing stream",
                        fmt::format("rows [{},{}) from rank {} -> C", l.r0, l.r1, l.producers.front()), tracing);
    WEFT_CUDA_CHECK(cudaMemcpyAsync(at(c, row_bytes(l.r0)), ctx.peer_base[op_.rank] + ar_out + row_bytes(l.r0),
                                    row_bytes(l.r1 - l.r0), cudaMemcpyDeviceToDevice, cl));
    op_.mark_end(x, cl, tracing);
  }
  WEFT_CUDA_CHECK(cudaEventRecord(ev_cn, cn));
  WEFT_CUDA_CHECK(cudaEventRecord(ev_cl, cl));
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(s, ev_cn, 0));
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(s, ev_cl, 0));
}

// gemm_rs decomposed, RsFold::kGather (2 ranks; the fork to cs is done): this rank's block of
// C over all of K, from the tables of plan "gemm_rs.gather_inputs" (gather_inputs_plan). The
// copy stream runs this rank's transfers in issue order -- its rows of A for the peer's block
// into the peer's g_a, then its B piece by piece into the peer's g_b -- once the peer has
// begun this call; the compute stream computes C = A_own-rows · B (this rank's K-half), then
// per tile (a column piece of the block), once its waits pass (the peer's A and its B piece),
// C[:, piece] += g_a · g_b[:, piece] (cuBLAS in place: its epilogue adds C). No SM kernel may
// run beside a GEMM (a running cuBLAS GEMM holds every SM to its last wave; a kernel waiting
// for one could stall a CTA of the next): the guard is a stream memory operation, each
// transfer's signal a copy-engine copy of the sender's call counter, and each tile's wait (a
// kernel: it has the deadline that names a missing peer) becomes runnable only when it can
// find an SM in the last wave of the GEMM before the one that needs it: once this rank's push
// mirroring the last one it waits for is out (the peer's arrives about then; g_out_after) and
// (after the first) the previous tile's GEMM is launched. Those pushes sit behind the guard,
// whose deadline kernel (memop_guard) names a peer that never comes.
void DecomposedGpu::gather_rs(const void* a, const void* bp, void* c, cudaStream_t s, bool tracing) {
  const GemmOverlapConfig& cfg = op_.cfg;
  const int rank = op_.rank;
  const size_t eb = op_.eb;
  const int64_t k_local = op_.k_local;
  const int64_t m_shard = op_.m_shard;
  const dev::DeviceCtx& ctx = op_.b.ctx();
  const int p = 1 - rank;
  const int64_t N = cfg.n;
  const plan::LoweredRank& lr = gp.lowered.ranks[static_cast<size_t>(rank)];
  const plan::TileSchedule& sch = gp.schedule;
  auto ptr = [&](int r, int32_t t, int64_t row, int64_t col) -> char* {
    const plan::Tensor& x = gp.plan.tensors[static_cast<size_t>(t)];
    const uint64_t o = static_cast<uint64_t>(row * x.cols + col) * eb;
    if (x.role == plan::Role::kInput) return at(t == gp.input ? a : bp, o);  // this rank's (setup checked)
    return ctx.peer_base[r] + g_tensor_off[static_cast<size_t>(t)] + o;
  };
  // (The epoch guard, memop_guard, is on cs already: the peer began this call, so it has read
  // what this rank wrote into it last call; a peer that never comes is named by its deadline
  // kernel.)
  // Out: the plan's transfers, each followed by its signal = this rank's call counter (the
  // copy engine runs them in order).
  for (size_t i = 0; i < lr.transfers.size(); ++i) {
    const plan::TransferDesc& d = lr.transfers[i];
    const plan::Tensor& st = gp.plan.tensors[static_cast<size_t>(d.src_tensor)];
    const plan::Tensor& dt = gp.plan.tensors[static_cast<size_t>(d.dst_tensor)];
    size_t x = op_.mark(cs, TraceKind::kChunk, static_cast<int64_t>(i), 1, op_.engine_name(),
                        fmt::format("{} rows [{},{}) cols [{},{}) -> rank {}", st.name, d.src_row, d.src_row + d.rows,
                                    d.src_col, d.src_col + d.cols, d.dst_rank),
                        tracing);
    char* dst = ptr(d.dst_rank, d.dst_tensor, d.dst_row, d.dst_col);
    const char* src = ptr(d.src_rank, d.src_tensor, d.src_row, d.src_col);
    if (d.cols == st.cols && d.cols == dt.cols)  // whole rows (A; W's rows): one block
      WEFT_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(d.rows * d.cols) * eb, cudaMemcpyDefault, cs));
    else  // B[K_local, N]: columns of every row
      op_.copy2d(dst, static_cast<size_t>(dt.cols) * eb, src, static_cast<size_t>(st.cols) * eb,
                 static_cast<size_t>(d.cols) * eb, static_cast<size_t>(d.rows), cs);
    op_.mark_end(x, cs, tracing);
    op_.put_count(d.signal_rank, g_signals.at(static_cast<uint32_t>(d.signal)), cs);
    for (size_t k = 0; k < g_out_after.size(); ++k)
      if (g_out_after[k] == static_cast<int32_t>(i)) WEFT_CUDA_CHECK(cudaEventRecord(ev_out[k], cs));
  }
  const int64_t r0 = rank * m_shard;
  size_t x = op_.mark(s, TraceKind::kTile, 0, 0, "compute stream",
                      fmt::format("gemm rows [{},{}) (own K)", r0, r0 + m_shard), tracing);
  op_.gemm(s, at(a, static_cast<uint64_t>(r0 * k_local) * eb), bp, c, m_shard, k_local, 0, N, GemmOpContext::Blas::kLt);
  op_.mark_end(x, s, tracing);
  WEFT_CUDA_CHECK(cudaEventRecord(ev_piece[0], s));  // the own K-half is done
  const char* pa = ctx.peer_base[rank] + g_tensor_off[static_cast<size_t>(gp.gemm)];
  const char* pb = ctx.peer_base[rank] + g_tensor_off[static_cast<size_t>(gp.plan.tensor_id("g_b"))];
  for (size_t j = 0; j < lr.tiles.size(); ++j) {
    const int64_t c0 = int64_t{lr.tiles[j].n} * sch.tile_cols, c1 = std::min(N, c0 + sch.tile_cols);
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(cw, ev_out[j], 0));
    if (j > 0) WEFT_CUDA_CHECK(cudaStreamWaitEvent(cw, ev_piece[j], 0));  // tile j-1's GEMM launched
    op_.wait_list(cw, g_waits[j]);
    WEFT_CUDA_CHECK(cudaEventRecord(ev_recv[j], cw));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(s, ev_recv[j], 0));
    if (j + 1 < lr.tiles.size()) WEFT_CUDA_CHECK(cudaEventRecord(ev_piece[j + 1], s));
    x = op_.mark(s, TraceKind::kTile, static_cast<int64_t>(j + 1), 0, "compute stream",
                 fmt::format("gemm rows [{},{}) cols [{},{}) += rank {}'s K", r0, r0 + m_shard, c0, c1, p), tracing);
    op_.gemm(s, pa, pb, c, m_shard, k_local, c0, c1 - c0, GemmOpContext::Blas::kLt, c);
    op_.mark_end(x, s, tracing);
  }
}

}  // namespace weft::ops::detail
