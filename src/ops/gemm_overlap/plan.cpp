#include "plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <unordered_map>

#include "weft/core/error.hpp"
#include "weft/device/api.hpp"
#include "weft/ops/gemm.hpp"
#include "weft/plan/templates.hpp"
#include "weft/plan/verify.hpp"
#include "weft/runtime/host_exec.hpp"

namespace weft::ops::detail {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

template <class T>
void add_rows(T* dst, const T* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = dev::from_float<T>(dev::to_float(dst[i]) + dev::to_float(src[i]));
}

}  // namespace

std::string default_algo(GemmOp op) { return op == GemmOp::kGemmAr ? "two-shot" : "direct"; }

void check_algo(GemmOp op, const std::string& algo) {
  const std::vector<std::string> ok = op == GemmOp::kAgGemm ? std::vector<std::string>{"direct", "ring", "bidir"}
                                      : op == GemmOp::kGemmRs
                                          ? std::vector<std::string>{"direct", "ring"}
                                          : std::vector<std::string>{"one-shot", "two-shot", "ring"};
  WEFT_REQUIRE(algo.empty() || std::find(ok.begin(), ok.end(), algo) != ok.end(),
               fmt::format("{}: unknown plan algo '{}' (expected {})", to_string(op), algo, fmt::join(ok, ", ")));
}

void order_by_demand(plan::TileSchedule& s, const plan::CommPlan& p) {
  const int t = p.tensor_id(s.tensor);
  WEFT_REQUIRE(t >= 0, fmt::format("order_by_demand: plan {} has no tensor '{}'", p.name, s.tensor));
  const auto depth = plan::chain_depth(p);
  using Key = std::pair<int, int>;
  const Key none{INT32_MAX, INT32_MAX};
  // need[q][m]: the earliest transfer reading row block m of tensor t on rank q.
  std::vector<std::vector<Key>> need(s.order.size(), std::vector<Key>(static_cast<size_t>(s.tiles_m()), none));
  for (const auto& q : p.queues)
    for (size_t pos = 0; pos < q.size(); ++pos) {
      const plan::Transfer& x = q[pos];
      if (x.src.tensor != t || x.src.rank < 0 || static_cast<size_t>(x.src.rank) >= need.size()) continue;
      const Key k{depth.at(x.chunk), static_cast<int>(pos)};
      const int m0 = static_cast<int>(x.src.region.row_begin / s.tile_rows);
      const int m1 = static_cast<int>((x.src.region.row_end - 1) / s.tile_rows);
      for (int m = m0; m <= m1 && m < s.tiles_m(); ++m) {
        Key& cur = need[static_cast<size_t>(x.src.rank)][static_cast<size_t>(m)];
        cur = std::min(cur, k);
      }
    }
  for (size_t r = 0; r < s.order.size(); ++r)
    std::stable_sort(s.order[r].begin(), s.order[r].end(), [&](const plan::Tile& a, const plan::Tile& b) {
      return need[r][static_cast<size_t>(a.m)] < need[r][static_cast<size_t>(b.m)];
    });
}

OpPlan build_op_plan(const OpPlanParams& p) {
  OpPlan o;
  o.op = p.op;
  const std::string algo = p.algo.empty() ? default_algo(p.op) : p.algo;
  check_algo(p.op, algo);
  const int w = p.world;
  plan::TemplateOptions t;
  t.splits = p.chunks;
  t.engine = p.engine;
  t.elem_bytes = p.elem_bytes;
  std::string sched;
  switch (p.op) {
    case GemmOp::kAgGemm: {
      const auto a = algo == "direct" ? plan::AllGatherAlgo::kDirect
                     : algo == "ring" ? plan::AllGatherAlgo::kRing
                                      : plan::AllGatherAlgo::kBidirectionalRing;
      o.plan = plan::all_gather(a, w, p.m / w, p.k_local, t);
      sched = "out";
      o.input = o.plan.tensor_id("in");
      o.gemm = o.output = o.plan.tensor_id("out");
      break;
    }
    case GemmOp::kGemmRs: {
      const auto a = algo == "direct" ? plan::ReduceScatterAlgo::kDirect : plan::ReduceScatterAlgo::kRing;
      o.plan = plan::reduce_scatter(a, w, p.m / w, p.n, t);
      sched = "in";
      break;
    }
    case GemmOp::kGemmAr: {
      const auto a = algo == "one-shot"   ? plan::AllReduceAlgo::kOneShot
                     : algo == "two-shot" ? plan::AllReduceAlgo::kTwoShot
                                          : plan::AllReduceAlgo::kRing;
      o.plan = plan::all_reduce(a, w, p.m, p.n, t);
      sched = "in";
      break;
    }
  }
  if (p.op != GemmOp::kAgGemm) {
    o.input = o.gemm = o.plan.tensor_id("in");
    o.output = o.plan.tensor_id("out");
  }
  o.plan.name = fmt::format("{}.{}", to_string(p.op), o.plan.name);
  o.schedule = plan::gemm_schedule(o.plan, sched, p.n, p.tile_rows, p.tile_cols);
  if (p.op == GemmOp::kAgGemm)
    plan::order_by_arrival(o.schedule, o.plan);
  else
    order_by_demand(o.schedule, o.plan);
  plan::verify_or_throw(o.plan, {.workers_per_rank = p.transfer_workers});
  const plan::VerifyResult v =
      plan::verify_schedule(o.plan, o.schedule, {.comm_workers = p.transfer_workers, .tile_workers = p.tile_workers});
  WEFT_CHECK(v.ok,
             fmt::format("{}: the tile schedule of plan {} is invalid:\n{}", to_string(p.op), o.plan.name, v.text()));
  o.schedule.tiles_write = p.op != GemmOp::kAgGemm;
  o.lowered = plan::lower(o.plan, o.schedule);
  o.tiles_m = o.schedule.tiles_m();
  o.tiles_n = o.schedule.tiles_n();

  return o;
}

void host_gemm(dev::DType t, BLayout layout, const void* a, const void* b, void* c, int64_t k, int64_t n, int64_t r0,
               int64_t r1, int64_t c0, int64_t c1, int me, int threads) {
  // The CPU tile reference (ops::gemm_tile_cpu), one row at a time: thread `me` of `threads`
  // takes rows r0 + me, r0 + me + threads, ...
  const CpuGemm g{t, t, layout == BLayout::kKN, a, k, b, layout == BLayout::kKN ? n : k, c, n, k};
  for (int64_t i = r0 + me; i < r1; i += threads) gemm_tile_cpu(g, i, i + 1, c0, c1);
}

// ---- the host executor -----------------------------------------------------------------

HostGemmExec::HostGemmExec(Backend& backend, OpPlan plan, dev::DType dtype, BLayout layout, int64_t k_local,
                           int transfer_workers, int tile_workers, const std::string& tag)
    : b_(backend),
      p_(std::move(plan)),
      dtype_(dtype),
      layout_(layout),
      k_local_(k_local),
      transfer_workers_(transfer_workers),
      tile_workers_(tile_workers),
      rank_(backend.rank()) {
  WEFT_REQUIRE(b_.kind() == BackendKind::kHost,
               fmt::format("the plan executor runs on the host backend, not {}", to_string(b_.kind())));
  WEFT_REQUIRE(p_.plan.world == b_.size(),
               fmt::format("plan {} is for {} ranks, the backend has {}", p_.plan.name, p_.plan.world, b_.size()));
  for (const auto& lr : p_.lowered.ranks)
    for (const auto& d : lr.transfers)
      if (static_cast<plan::Kind>(d.kind) == plan::Kind::kPull &&
          p_.plan.tensors[static_cast<size_t>(d.src_tensor)].role == plan::Role::kInput && d.src_rank != d.dst_rank)
        remote_input_reads_ = true;
  SymmetricHeap& heap = b_.heap();
  for (const plan::Tensor& t : p_.plan.tensors)
    tensor_off_.push_back(
        heap.alloc_bytes(static_cast<size_t>(t.rows * t.cols * t.elem_bytes), fmt::format("{}.{}", tag, t.name)));
  signals_ = heap.alloc_signals(static_cast<uint32_t>(p_.lowered.max_signals()), tag + ".signals");
  counters_ = heap.alloc_signals(static_cast<uint32_t>(std::max(1, b_.size() * p_.tiles_m)), tag + ".counters");
  barrier_ = heap.alloc_barrier(tag + ".epoch");
}

void HostGemmExec::run_transfer(const dev::DeviceCtx& c, const plan::TransferDesc& d, int32_t index,
                                int64_t epoch) const {
  const plan::LoweredRank& lr = p_.lowered.ranks[static_cast<size_t>(rank_)];
  
  for (int32_t j = d.wait_begin; j < d.wait_begin + d.wait_count; ++j) {
    const plan::WaitEntry& w = lr.transfer_waits[static_cast<size_t>(j)];
    dev::wait_ge(c, signals_.at(static_cast<uint32_t>(w.signal)), static_cast<uint64_t>(epoch * w.threshold),
                 lr.signal_producer[static_cast<size_t>(w.signal)]);
  }
  for (int32_t j = lr.counter_wait_begin[static_cast<size_t>(index)];
       j < lr.counter_wait_begin[static_cast<size_t>(index) + 1]; ++j) {
    const plan::CounterWait& w = lr.counter_waits[static_cast<size_t>(j)];
    dev::wait_ge(c, counters_.at(static_cast<uint32_t>(w.rank * p_.tiles_m + w.counter)),
                 static_cast<uint64_t>(epoch * w.threshold), w.rank);
  }
  const plan::Tensor& st = p_.plan.tensors[static_cast<size_t>(d.src_tensor)];
  const plan::Tensor& dt = p_.plan.tensors[static_cast<size_t>(d.dst_tensor)];
  const auto eb = static_cast<uint64_t>(st.elem_bytes);
  auto off = [&](int32_t t, const plan::Tensor& tt, int64_t row, int64_t col) {
    return tensor_off_[static_cast<size_t>(t)] + static_cast<uint64_t>(row * tt.cols + col) * eb;
  };
  const auto kind = static_cast<plan::Kind>(d.kind);
  const bool contiguous = d.cols == st.cols && d.cols == dt.cols;
  const int64_t pieces = contiguous ? 1 : d.rows;
  const int64_t per_piece = (contiguous ? d.rows : 1) * d.cols;
  for (int64_t i = 0; i < pieces; ++i) {
    const uint64_t so = off(d.src_tensor, st, d.src_row + i, d.src_col);
    const uint64_t dof = off(d.dst_tensor, dt, d.dst_row + i, d.dst_col);
    switch (kind) {
      case plan::Kind::kPull:
        dev::get(dev::CoopThread{}, c, c.ptr<unsigned char>(d.dst_rank, dof), d.src_rank, so,
                 static_cast<size_t>(per_piece) * eb);
        break;
      case plan::Kind::kPush:
      case plan::Kind::kCopy:
        dev::put(dev::CoopThread{}, c, d.dst_rank, dof, c.ptr<unsigned char>(d.src_rank, so),
                 static_cast<size_t>(per_piece) * eb);
        break;
      case plan::Kind::kReduce: {
        void* dst = c.ptr<unsigned char>(d.dst_rank, dof);
        const void* src = c.ptr<unsigned char>(d.src_rank, so);
        switch (dtype_) {
          case dev::DType::kBF16:
            add_rows(static_cast<dev::bf16_t*>(dst), static_cast<const dev::bf16_t*>(src), per_piece);
            break;
          case dev::DType::kF16:
            add_rows(static_cast<dev::f16_t*>(dst), static_cast<const dev::f16_t*>(src), per_piece);
            break;
          case dev::DType::kF32:
            add_rows(static_cast<float*>(dst), static_cast<const float*>(src), per_piece);
            break;
        }
        break;
      }
    }
  }
  if (d.signal_rank >= 0)
    dev::signal_add(c, d.signal_rank, signals_.at(static_cast<uint32_t>(d.signal)), static_cast<uint64_t>(d.increment));
}

void HostGemmExec::run_tile(const dev::DeviceCtx& c, const plan::TileEntry& t, int64_t epoch, const void* a,
                            const void* b, void* out) const {
  const plan::LoweredRank& lr = p_.lowered.ranks[static_cast<size_t>(rank_)];
  
  for (int32_t j = t.wait_begin; j < t.wait_begin + t.wait_count; ++j) {
    const plan::WaitEntry& w = lr.tile_waits[static_cast<size_t>(j)];
    dev::wait_ge(c, signals_.at(static_cast<uint32_t>(w.signal)), static_cast<uint64_t>(epoch * w.threshold),
                 lr.signal_producer[static_cast<size_t>(w.signal)]);
  }
  const plan::TileSchedule& s = p_.schedule;
  const int64_t r0 = int64_t{t.m} * s.tile_rows, r1 = std::min(s.rows, r0 + s.tile_rows);
  const int64_t c0 = int64_t{t.n} * s.tile_cols, c1 = std::min(s.cols, c0 + s.tile_cols);
  if (p_.op == GemmOp::kAgGemm) {
    // A is the gathered tensor; C is the user's.
    host_gemm(dtype_, layout_, c.local<unsigned char>(tensor_off_[static_cast<size_t>(p_.gemm)]), b, out, k_local_,
              s.cols, r0, r1, c0, c1);
  } else {
    // A is the user's A_r; the partial product goes into the plan's input tensor.
    host_gemm(dtype_, layout_, a, b, c.local<unsigned char>(tensor_off_[static_cast<size_t>(p_.gemm)]), k_local_,
              s.cols, r0, r1, c0, c1);
  }
  if (t.notify >= 0) {
    const uint64_t slot = counters_.at(static_cast<uint32_t>(rank_ * p_.tiles_m + t.notify));
    dev::signal_add(c, rank_, slot, 1);
    for (int32_t j = lr.notify_begin[static_cast<size_t>(t.notify)];
         j < lr.notify_begin[static_cast<size_t>(t.notify) + 1]; ++j)
      dev::signal_add(c, lr.notify_ranks[static_cast<size_t>(j)], slot, 1);
  }
}

void HostGemmExec::run(const void* a, const void* b, void* c, std::vector<TraceEvent>* trace) {
  WEFT_REQUIRE(!broken_, fmt::format("{} on rank {}: an earlier call failed; its signals are out of step with the "
                                     "other ranks",
                                     p_.plan.name, rank_));
  const dev::DeviceCtx& ctx = b_.ctx();
  const int64_t epoch = epoch_ + 1;
  const plan::LoweredRank& lr = p_.lowered.ranks[static_cast<size_t>(rank_)];
  
  try {
    // Epoch guard (not in the plan): before a peer writes into this rank's tensors for call
    // e, this rank must be done with them for call e-1 (run() returns after all of its own
    // work and after its output is complete, so one barrier on entry suffices). ag_gemm's
    // input copy goes before it, or between two barriers when peers read the input remotely.
    if (p_.op == GemmOp::kAgGemm) {
      const plan::Tensor& in = p_.plan.tensors[static_cast<size_t>(p_.input)];
      if (remote_input_reads_) dev::barrier(dev::CoopThread{}, ctx, barrier_);
      b_.copy_from_host(tensor_off_[static_cast<size_t>(p_.input)], a,
                        static_cast<size_t>(in.rows * in.cols * in.elem_bytes));
    }
    dev::barrier(dev::CoopThread{}, ctx, barrier_);

    const int nt = transfer_workers_, nw = nt + tile_workers_;
    std::atomic<int64_t> next_transfer{0}, next_tile{0};
    std::atomic<bool> stop{false};
    std::vector<std::vector<TraceEvent>> events(static_cast<size_t>(nw));
    host_launch(nw, 1, [&](CoopHostTeam, int block) {
      const bool is_transfer = block < nt;
      std::atomic<int64_t>& next = is_transfer ? next_transfer : next_tile;
      const auto count = static_cast<int64_t>(is_transfer ? lr.transfers.size() : lr.tiles.size());
      for (;;) {
        const int64_t i = stop.load(std::memory_order_relaxed) ? count : next.fetch_add(1);
        if (i >= count) return;
        try {
          TraceEvent ev;
          ev.rank = rank_;
          ev.lane = block;
          ev.start_ns = now_ns();
          if (is_transfer) {
            const plan::TransferDesc& d = lr.transfers[static_cast<size_t>(i)];
            run_transfer(ctx, d, static_cast<int32_t>(i), epoch);
            ev.kind = TraceKind::kChunk;
            ev.id = d.chunk;
            ev.lane_name = fmt::format("transfer worker {}", block);
            ev.name = fmt::format("chunk {} {} {}->{}", d.chunk, plan::to_string(static_cast<plan::Kind>(d.kind)),
                                  d.src_rank, d.dst_rank);
          } else {
            const plan::TileEntry& t = lr.tiles[static_cast<size_t>(i)];
            run_tile(ctx, t, epoch, a, b, c);
            ev.kind = TraceKind::kTile;
            ev.id = i;
            ev.lane_name = fmt::format("tile worker {}", block - nt);
            ev.name = fmt::format("tile ({},{})", t.m, t.n);
          }
          ev.end_ns = now_ns();
          if (trace) events[static_cast<size_t>(block)].push_back(std::move(ev));
        } catch (...) {
          stop.store(true, std::memory_order_relaxed);
          throw;
        }
      }
    });
    b_.synchronize();
    // Writes into this rank's output by other ranks' transfers (rings, two-shot) are complete
    // once the signals guarding them are.
    for (const plan::WaitEntry& w : lr.final_waits)
      dev::wait_ge(ctx, signals_.at(static_cast<uint32_t>(w.signal)), static_cast<uint64_t>(epoch * w.threshold),
                   lr.signal_producer[static_cast<size_t>(w.signal)]);
    for (int m = 0; m < p_.tiles_m; ++m) {
      const uint64_t got = dev::signal_read(ctx, counters_.at(static_cast<uint32_t>(rank_ * p_.tiles_m + m)));
      const int64_t want = epoch * p_.lowered.counters[static_cast<size_t>(m)];
      WEFT_CHECK(got == static_cast<uint64_t>(want), fmt::format("{} on rank {}: tile counter {} is {} after call {}, "
                                                                 "expected {}",
                                                                 p_.plan.name, rank_, m, got, epoch, want));
    }
    if (p_.op != GemmOp::kAgGemm) {
      const plan::Tensor& out = p_.plan.tensors[static_cast<size_t>(p_.output)];
      b_.copy_to_host(c, tensor_off_[static_cast<size_t>(p_.output)],
                      static_cast<size_t>(out.rows * out.cols * out.elem_bytes));
    }
    if (trace)
      for (auto& v : events)
        for (auto& e : v) trace->push_back(std::move(e));
  } catch (...) {
    broken_ = true;
    throw;
  }
  epoch_ = epoch;
}

}  // namespace weft::ops::detail
