#include "weft/plan/host_executor.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>

#include "weft/core/error.hpp"
#include "weft/device/api.hpp"
#include "weft/plan/verify.hpp"
#include "weft/runtime/host_exec.hpp"

namespace weft::plan {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool in_bounds(const Tensor& t, int64_t row, int64_t col, int64_t rows, int64_t cols) {
  return rows >= 1 && cols >= 1 && row >= 0 && col >= 0 && row + rows <= t.rows && col + cols <= t.cols;
}

// [begin, end) of n items, share `me` of `parts` contiguous shares.
std::pair<int64_t, int64_t> share(int64_t begin, int64_t end, int me, int parts) {
  const int64_t n = end - begin;
  return {begin + n * me / parts, begin + n * (me + 1) / parts};
}

// dst[i] += src[i] for i in [0, n): the add in float, rounded to T once per add.
template <class T>
void add_into(void* dst, const void* src, int64_t n) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  for (int64_t i = 0; i < n; ++i) d[i] = dev::from_float<T>(dev::to_float(d[i]) + dev::to_float(s[i]));
}

void add_into(dev::DType t, void* dst, const void* src, int64_t n) {
  switch (t) {
    case dev::DType::kBF16:
      return add_into<dev::bf16_t>(dst, src, n);
    case dev::DType::kF16:
      return add_into<dev::f16_t>(dst, src, n);
    case dev::DType::kF32:
      return add_into<float>(dst, src, n);
  }
}

// Items are taken in table order by whichever worker of the group is free next, as the
// progress verifier models (a worker holds its item while it waits). The team leader takes
// the index and hands it to its team through `slot`; -1 ends the team's loop.
template <class F>
void take_in_order(CoopHostTeam team, std::atomic<int64_t>& next, int64_t count, std::atomic<bool>& stop, int64_t& slot,
                   F&& body) {
  for (;;) {
    if (team.rank() == 0) {
      const int64_t i = stop.load(std::memory_order_relaxed) ? count : next.fetch_add(1);
      slot = i < count ? i : -1;
    }
    team.sync();
    const int64_t i = slot;
    team.sync();  // everyone has read the slot before the leader writes the next one
    if (i < 0) return;
    try {
      body(i);
    } catch (...) {
      // Later items would only wait for the same missing peer: stop taking them.
      stop.store(true, std::memory_order_relaxed);
      throw;
    }
  }
}

}  // namespace

HostExecutor::HostExecutor(Backend& backend, CommPlan plan, TileSchedule schedule, Lowered lowered,
                           const std::string& tag, HostExecutorOptions options)
    : backend_(backend),
      plan_(std::move(plan)),
      schedule_(std::move(schedule)),
      lowered_(std::move(lowered)),
      opt_(options),
      rank_(backend.rank()) {
  WEFT_REQUIRE(opt_.transfer_workers >= 1 && opt_.tile_workers >= 1 && opt_.threads >= 1,
               fmt::format("host executor of plan {}: {} transfer workers, {} tile workers, {} threads (need >= 1 "
                           "each)",
                           plan_.name, opt_.transfer_workers, opt_.tile_workers, opt_.threads));
  WEFT_REQUIRE(backend.kind() == BackendKind::kHost,
               fmt::format("the plan executor runs on the host backend, not {}", to_string(backend.kind())));
  check_tables();
  if (opt_.verify) {
    verify_or_throw(plan_, {.workers_per_rank = opt_.transfer_workers});
    const VerifyResult v =
        verify_schedule(plan_, schedule_, {.comm_workers = opt_.transfer_workers, .tile_workers = opt_.tile_workers});
    WEFT_REQUIRE(v.ok, fmt::format("host executor: schedule for plan {} is invalid:\n{}", plan_.name, v.text()));
  }

  // Collective from here on: every rank allocates the same sizes in the same order (the
  // sizes depend only on the plan and the tables, which every rank holds whole).
  SymmetricHeap& heap = backend_.heap();
  for (size_t t = 0; t < plan_.tensors.size(); ++t)
    tensor_off_.push_back(
        heap.alloc_bytes(tensor_bytes(static_cast<int>(t)), fmt::format("{}.{}", tag, plan_.tensors[t].name)));
  signals_ = heap.alloc_signals(static_cast<uint32_t>(lowered_.max_signals()), tag + ".signals");
  const size_t slots = static_cast<size_t>(plan_.world) * lowered_.counters.size();
  counters_ = heap.alloc_signals(static_cast<uint32_t>(std::max<size_t>(1, slots)), tag + ".counters");
  barrier_ = heap.alloc_barrier(tag + ".epoch");
}

uint64_t HostExecutor::tensor_offset(int t) const {
  WEFT_REQUIRE(t >= 0 && static_cast<size_t>(t) < tensor_off_.size(),
               fmt::format("host executor: plan {} has no tensor {}", plan_.name, t));
  return tensor_off_[static_cast<size_t>(t)];
}

void* HostExecutor::tensor(int t) const { return backend_.ctx().local<unsigned char>(tensor_offset(t)); }

size_t HostExecutor::tensor_bytes(int t) const {
  WEFT_REQUIRE(t >= 0 && static_cast<size_t>(t) < plan_.tensors.size(),
               fmt::format("host executor: plan {} has no tensor {}", plan_.name, t));
  const Tensor& x = plan_.tensors[static_cast<size_t>(t)];
  return static_cast<size_t>(x.rows * x.cols * x.elem_bytes);
}

uint64_t HostExecutor::counter_slot(int rank, int counter) const {
  return counters_.at(
      static_cast<uint32_t>(static_cast<size_t>(rank) * lowered_.counters.size() + static_cast<size_t>(counter)));
}

void HostExecutor::check_tables() {
  const int w = plan_.world;
  const std::string who = fmt::format("host executor of plan {}", plan_.name);
  WEFT_REQUIRE(w == backend_.size() && schedule_.world == w && lowered_.world == w &&
                   lowered_.ranks.size() == static_cast<size_t>(w),
               fmt::format("{}: backend has {} ranks, plan {}, schedule {}, tables {}", who, backend_.size(), w,
                           schedule_.world, lowered_.ranks.size()));
  const int sched_tensor = plan_.tensor_id(schedule_.tensor);
  WEFT_REQUIRE(sched_tensor >= 0 && schedule_.rows == plan_.tensors[static_cast<size_t>(sched_tensor)].rows &&
                   schedule_.cols >= 1 && schedule_.tile_rows >= 1 && schedule_.tile_cols >= 1 &&
                   schedule_.band_rows >= 0,
               fmt::format("{}: the schedule's tensor '{}' ({} rows, {}x{} tiles of {}x{}) does not fit the plan", who,
                           schedule_.tensor, schedule_.rows, schedule_.rows, schedule_.cols, schedule_.tile_rows,
                           schedule_.tile_cols));
  for (const Tensor& t : plan_.tensors)
    WEFT_REQUIRE(
        t.rows >= 1 && t.cols >= 1 && t.elem_bytes >= 1,
        fmt::format("{}: tensor '{}' is {}x{} of {}-byte elements", who, t.name, t.rows, t.cols, t.elem_bytes));
  const auto ncounters = static_cast<int32_t>(lowered_.counters.size());
  WEFT_REQUIRE(lowered_.counters == schedule_.counters,
               fmt::format("{}: the tables have {} counters, the schedule {}, or their totals differ", who, ncounters,
                           schedule_.counters.size()));
  const auto nt = static_cast<int32_t>(plan_.tensors.size());
  remote_read_.assign(plan_.tensors.size(), false);
  const int tiles_m = schedule_.tiles_m(), tiles_n = schedule_.tiles_n();

  for (int r = 0; r < w; ++r) {
    const LoweredRank& lr = lowered_.ranks[static_cast<size_t>(r)];
    const auto nsig = static_cast<int32_t>(lr.signal_expected.size());
    auto where = [&](int64_t chunk) { return fmt::format("{}: rank {} chunk {}", who, r, chunk); };
    auto waits_ok = [&](int32_t begin, int32_t count, const std::vector<WaitEntry>& ws) {
      if (begin < 0 || count < 0 || static_cast<size_t>(begin) + static_cast<size_t>(count) > ws.size()) return false;
      for (int32_t j = begin; j < begin + count; ++j) {
        const WaitEntry& e = ws[static_cast<size_t>(j)];
        if (e.signal < 0 || e.signal >= nsig || e.threshold < 0) return false;
      }
      return true;
    };
    WEFT_REQUIRE(
        lr.signal_producer.size() == lr.signal_expected.size() &&
            std::all_of(lr.signal_producer.begin(), lr.signal_producer.end(),
                        [&](int32_t p) { return p >= -1 && p < w; }),
        fmt::format("{}: rank {} names producers of {} signals, it has {}", who, r, lr.signal_producer.size(), nsig));
    WEFT_REQUIRE(lr.counter_wait_begin.size() == lr.transfers.size() + 1,
                 fmt::format("{}: rank {} has {} counter-wait offsets for {} transfers (need transfers + 1)", who, r,
                             lr.counter_wait_begin.size(), lr.transfers.size()));
    WEFT_REQUIRE(lr.notify_begin.size() == static_cast<size_t>(ncounters) + 1,
                 fmt::format("{}: rank {} has {} notify offsets for {} counters (need counters + 1)", who, r,
                             lr.notify_begin.size(), ncounters));
    for (int32_t c = 0; c < ncounters; ++c) {
      const int32_t b = lr.notify_begin[static_cast<size_t>(c)], e = lr.notify_begin[static_cast<size_t>(c) + 1];
      bool ok = b >= 0 && b <= e && static_cast<size_t>(e) <= lr.notify_ranks.size();
      for (int32_t j = b; ok && j < e; ++j)
        ok = lr.notify_ranks[static_cast<size_t>(j)] >= 0 && lr.notify_ranks[static_cast<size_t>(j)] < w;
      WEFT_REQUIRE(ok, fmt::format("{}: rank {} counter {}: notify ranks [{}, {}) are not valid", who, r, c, b, e));
    }
    WEFT_REQUIRE(waits_ok(0, static_cast<int32_t>(lr.final_waits.size()), lr.final_waits),
                 fmt::format("{}: rank {} has a final wait on a signal it does not have", who, r));

    for (size_t i = 0; i < lr.transfers.size(); ++i) {
      const TransferDesc& d = lr.transfers[i];
      WEFT_REQUIRE(d.kind >= 0 && d.kind <= static_cast<int32_t>(Kind::kCopy),
                   fmt::format("{}: unknown transfer kind {}", where(d.chunk), d.kind));
      const auto kind = static_cast<Kind>(d.kind);
      WEFT_REQUIRE(kind != Kind::kReduce || opt_.dtype.has_value(),
                   fmt::format("{}: reduce transfers add elements: they need the element type "
                               "(HostExecutorOptions::dtype)",
                               where(d.chunk)));
      const bool exec_ok = kind == Kind::kPush     ? d.src_rank == r
                           : kind == Kind::kPull   ? d.dst_rank == r
                           : kind == Kind::kReduce ? d.src_rank == r || d.dst_rank == r
                                                   : d.src_rank == r && d.dst_rank == r;
      WEFT_REQUIRE(exec_ok, fmt::format("{}: a {} from rank {} to rank {} cannot run on rank {}", where(d.chunk),
                                        to_string(kind), d.src_rank, d.dst_rank, r));
      WEFT_REQUIRE(d.src_rank >= 0 && d.src_rank < w && d.dst_rank >= 0 && d.dst_rank < w && d.src_tensor >= 0 &&
                       d.src_tensor < nt && d.dst_tensor >= 0 && d.dst_tensor < nt,
                   fmt::format("{}: rank or tensor out of range", where(d.chunk)));
      const Tensor& st = plan_.tensors[static_cast<size_t>(d.src_tensor)];
      const Tensor& dt = plan_.tensors[static_cast<size_t>(d.dst_tensor)];
      // The heap has no bounds of its own: a region past its tensor would corrupt a neighbour.
      WEFT_REQUIRE(in_bounds(st, d.src_row, d.src_col, d.rows, d.cols) &&
                       in_bounds(dt, d.dst_row, d.dst_col, d.rows, d.cols) && st.elem_bytes == dt.elem_bytes,
                   fmt::format("{}: {}x{} elements at '{}'[{},{}] -> '{}'[{},{}] do not fit", where(d.chunk), d.rows,
                               d.cols, st.name, d.src_row, d.src_col, dt.name, d.dst_row, d.dst_col));
      if (opt_.dtype) {
        const size_t eb = dev::dtype_size(*opt_.dtype);
        WEFT_REQUIRE(static_cast<size_t>(st.elem_bytes) == eb && static_cast<size_t>(dt.elem_bytes) == eb,
                     fmt::format("{}: {} elements are {} bytes, but '{}' has {} and '{}' {}", where(d.chunk),
                                 dev::dtype_name(*opt_.dtype), eb, st.name, st.elem_bytes, dt.name, dt.elem_bytes));
      }
      WEFT_REQUIRE(waits_ok(d.wait_begin, d.wait_count, lr.transfer_waits),
                   fmt::format("{}: waits [{}, +{}) are not valid entries of its transfer_waits", where(d.chunk),
                               d.wait_begin, d.wait_count));
      const int32_t cb = lr.counter_wait_begin[i], ce = lr.counter_wait_begin[i + 1];
      bool counters_ok = cb >= 0 && cb <= ce && static_cast<size_t>(ce) <= lr.counter_waits.size();
      for (int32_t j = cb; counters_ok && j < ce; ++j) {
        const CounterWait& cw = lr.counter_waits[static_cast<size_t>(j)];
        counters_ok = cw.rank >= 0 && cw.rank < w && cw.counter >= 0 && cw.counter < ncounters && cw.threshold >= 0;
      }
      WEFT_REQUIRE(counters_ok,
                   fmt::format("{}: counter waits [{}, {}) are not valid entries", where(d.chunk), cb, ce));
      if (d.signal_rank >= 0)
        WEFT_REQUIRE(d.signal_rank < w && d.signal >= 0 &&
                         static_cast<size_t>(d.signal) <
                             lowered_.ranks[static_cast<size_t>(d.signal_rank)].signal_expected.size(),
                     fmt::format("{}: signals {}.{}, which rank {} does not have", where(d.chunk), d.signal_rank,
                                 d.signal, d.signal_rank));
      if (d.src_rank != r) remote_read_[static_cast<size_t>(d.src_tensor)] = true;
    }

    WEFT_REQUIRE(lr.tiles.size() == static_cast<size_t>(tiles_m) * static_cast<size_t>(tiles_n),
                 fmt::format("{}: rank {} has {} tiles, the {}x{} grid {}", who, r, lr.tiles.size(), tiles_m, tiles_n,
                             int64_t{tiles_m} * tiles_n));
    std::set<std::pair<int, int>> seen;
    for (const TileEntry& t : lr.tiles) {
      WEFT_REQUIRE(t.m >= 0 && t.m < tiles_m && t.n >= 0 && t.n < tiles_n && seen.emplace(t.m, t.n).second,
                   fmt::format("{}: rank {} tile ({},{}) is outside the {}x{} grid or repeated", who, r, t.m, t.n,
                               tiles_m, tiles_n));
      WEFT_REQUIRE(waits_ok(t.wait_begin, t.wait_count, lr.tile_waits),
                   fmt::format("{}: rank {} tile ({},{}): waits [{}, +{}) are not valid entries", who, r, t.m, t.n,
                               t.wait_begin, t.wait_count));
      WEFT_REQUIRE(
          t.notify >= -1 && t.notify < ncounters,
          fmt::format("{}: rank {} tile ({},{}) notifies counter {} of {}", who, r, t.m, t.n, t.notify, ncounters));
    }
  }
}

void HostExecutor::wait_signals(const dev::DeviceCtx& c, const std::vector<WaitEntry>& ws, int32_t begin, int32_t count,
                                int64_t epoch) const {
  const LoweredRank& lr = lowered_.ranks[static_cast<size_t>(rank_)];
  for (int32_t j = begin; j < begin + count; ++j) {
    const WaitEntry& w = ws[static_cast<size_t>(j)];
    dev::wait_ge(c, signals_.at(static_cast<uint32_t>(w.signal)), static_cast<uint64_t>(epoch * w.threshold),
                 lr.signal_producer[static_cast<size_t>(w.signal)]);
  }
}

void HostExecutor::run_transfer(const dev::DeviceCtx& c, int32_t index, int64_t epoch, CoopHostTeam team) const {
  const LoweredRank& lr = lowered_.ranks[static_cast<size_t>(rank_)];
  const TransferDesc& d = lr.transfers[static_cast<size_t>(index)];
  if (team.rank() == 0) {
    wait_signals(c, lr.transfer_waits, d.wait_begin, d.wait_count, epoch);
    for (int32_t j = lr.counter_wait_begin[static_cast<size_t>(index)];
         j < lr.counter_wait_begin[static_cast<size_t>(index) + 1]; ++j) {
      const CounterWait& w = lr.counter_waits[static_cast<size_t>(j)];
      dev::wait_ge(c, counter_slot(w.rank, w.counter), static_cast<uint64_t>(epoch * w.threshold), w.rank);
    }
  }
  team.sync();  // the leader's acquire, passed on to the team by the barrier's ordering
  const Tensor& st = plan_.tensors[static_cast<size_t>(d.src_tensor)];
  const Tensor& dt = plan_.tensors[static_cast<size_t>(d.dst_tensor)];
  const auto eb = static_cast<uint64_t>(st.elem_bytes);
  auto off = [&](int32_t t, const Tensor& tt, int64_t row, int64_t col) {
    return tensor_off_[static_cast<size_t>(t)] + static_cast<uint64_t>(row * tt.cols + col) * eb;
  };
  // Whole rows on both sides are one contiguous block; otherwise one piece per row.
  const bool contiguous = d.cols == st.cols && d.cols == dt.cols;
  const int64_t pieces = contiguous ? 1 : d.rows;
  const int64_t per_piece = (contiguous ? d.rows : 1) * d.cols;  // elements
  const auto kind = static_cast<Kind>(d.kind);
  for (int64_t i = 0; i < pieces; ++i) {
    const uint64_t so = off(d.src_tensor, st, d.src_row + i, d.src_col);
    const uint64_t dof = off(d.dst_tensor, dt, d.dst_row + i, d.dst_col);
    switch (kind) {
      case Kind::kPull:
        dev::get(team, c, c.local<unsigned char>(dof), d.src_rank, so, static_cast<size_t>(per_piece) * eb);
        break;
      case Kind::kPush:
      case Kind::kCopy:  // a put to this rank
        dev::put(team, c, d.dst_rank, dof, c.local<unsigned char>(so), static_cast<size_t>(per_piece) * eb);
        break;
      case Kind::kReduce: {
        // The host backend maps every rank's heap: add through the peer's pointer, each
        // thread of the team its own share of the elements.
        const auto [e0, e1] = share(0, per_piece, team.rank(), team.size());
        add_into(*opt_.dtype, c.ptr<unsigned char>(d.dst_rank, dof + static_cast<uint64_t>(e0) * eb),
                 c.ptr<unsigned char>(d.src_rank, so + static_cast<uint64_t>(e0) * eb), e1 - e0);
        break;
      }
    }
  }
  team.sync();
  if (team.rank() == 0 && d.signal_rank >= 0) {
    // As put_signal: the team's other workers wrote part of the data; the cumulative fence
    // carries their writes (ordered before this one by the team barrier) to the peer.
    if (team.size() > 1) dev::fence_acq_rel();
    dev::signal_add(c, d.signal_rank, signals_.at(static_cast<uint32_t>(d.signal)), static_cast<uint64_t>(d.increment));
  }
}

void HostExecutor::run_tile(const dev::DeviceCtx& c, const TileEntry& t, int64_t epoch, const TileFn& fn,
                            CoopHostTeam team) const {
  const LoweredRank& lr = lowered_.ranks[static_cast<size_t>(rank_)];
  if (team.rank() == 0) wait_signals(c, lr.tile_waits, t.wait_begin, t.wait_count, epoch);
  team.sync();
  const TileSchedule& s = schedule_;
  const auto [r0, r1] = s.block_rows(t.m);
  const int64_t c0 = int64_t{t.n} * s.tile_cols, c1 = std::min(s.cols, c0 + s.tile_cols);
  const auto [a, b] = share(r0, r1, team.rank(), team.size());
  if (a < b) fn(t, a, b, c0, c1);
  team.sync();
  if (team.rank() == 0 && t.notify >= 0) {
    if (team.size() > 1) dev::fence_acq_rel();
    const uint64_t slot = counter_slot(rank_, t.notify);
    dev::signal_add(c, rank_, slot, 1);
    for (int32_t j = lr.notify_begin[static_cast<size_t>(t.notify)];
         j < lr.notify_begin[static_cast<size_t>(t.notify) + 1]; ++j)
      dev::signal_add(c, lr.notify_ranks[static_cast<size_t>(j)], slot, 1);
  }
}

void HostExecutor::run(const ExecCall& call) {
  WEFT_REQUIRE(!broken_, fmt::format("host executor of plan {} on rank {}: an earlier call failed; its signals are "
                                     "out of step with the other ranks",
                                     plan_.name, rank_));
  const LoweredRank& lr = lowered_.ranks[static_cast<size_t>(rank_)];
  const auto nt = static_cast<int>(plan_.tensors.size());
  WEFT_REQUIRE(call.input_tensor == -1 || (call.input_tensor >= 0 && call.input_tensor < nt && call.input),
               fmt::format("host executor of plan {}: input tensor {} (of {}) with pointer {}", plan_.name,
                           call.input_tensor, nt, call.input));
  std::vector<ExecInput> inputs;
  if (call.input_tensor >= 0) inputs.push_back({call.input_tensor, call.input});
  inputs.insert(inputs.end(), call.more_inputs.begin(), call.more_inputs.end());
  std::set<int> input_tensors;
  for (const ExecInput& in : call.more_inputs)
    WEFT_REQUIRE(in.tensor >= 0 && in.tensor < nt && in.data,
                 fmt::format("host executor of plan {}: further input tensor {} (of {}) with pointer {}", plan_.name,
                             in.tensor, nt, in.data));
  for (const ExecInput& in : inputs)
    WEFT_REQUIRE(input_tensors.insert(in.tensor).second,
                 fmt::format("host executor of plan {}: input tensor {} given twice in one call", plan_.name,
                             in.tensor));
  WEFT_REQUIRE(call.output_tensor == -1 || (call.output_tensor >= 0 && call.output_tensor < nt && call.output),
               fmt::format("host executor of plan {}: output tensor {} (of {}) with pointer {}", plan_.name,
                           call.output_tensor, nt, call.output));
  WEFT_REQUIRE(call.tile || lr.tiles.empty(),
               fmt::format("host executor of plan {}: rank {} has tiles but no tile function", plan_.name, rank_));
  const dev::DeviceCtx& ctx = backend_.ctx();
  const int64_t epoch = epoch_ + 1;
  try {
    // Epoch guard (the plan does not express it): before a peer writes into this rank's
    // tensors for call e, this rank must be done with them for call e-1. run() returns only
    // after all of this rank's work and its output copy, so one barrier on entry suffices.
    // The input copies go before it; when peers read an input tensor remotely it must also
    // stay untouched until they are done with e-1: a barrier on each side of the copies.
    if (std::any_of(inputs.begin(), inputs.end(),
                    [&](const ExecInput& in) { return remote_read_[static_cast<size_t>(in.tensor)]; }))
      dev::barrier(dev::CoopThread{}, ctx, barrier_);
    for (const ExecInput& in : inputs)
      backend_.copy_from_host(tensor_off_[static_cast<size_t>(in.tensor)], in.data, tensor_bytes(in.tensor));
    dev::barrier(dev::CoopThread{}, ctx, barrier_);

    const int ntw = opt_.transfer_workers, nw = ntw + opt_.tile_workers;
    std::atomic<int64_t> next_transfer{0}, next_tile{0};
    std::atomic<bool> stop{false};
    std::vector<int64_t> slots(static_cast<size_t>(nw), 0);
    std::vector<std::vector<ExecEvent>> events(call.events ? static_cast<size_t>(nw) : 0);
    host_launch(nw, opt_.threads, [&](CoopHostTeam team, int block) {
      int64_t& slot = slots[static_cast<size_t>(block)];
      const bool is_transfer = block < ntw;
      // Only the team leader records: it starts before the waits and ends after the signal.
      auto record = [&](ExecEvent ev) {
        if (call.events && team.rank() == 0) events[static_cast<size_t>(block)].push_back(std::move(ev));
      };
      if (is_transfer) {
        take_in_order(team, next_transfer, static_cast<int64_t>(lr.transfers.size()), stop, slot, [&](int64_t i) {
          const int64_t t0 = call.events ? now_ns() : 0;
          run_transfer(ctx, static_cast<int32_t>(i), epoch, team);
          if (!call.events) return;
          const TransferDesc& d = lr.transfers[static_cast<size_t>(i)];
          record({ExecEvent::What::kTransfer, d.chunk, block, t0, now_ns(),
                  fmt::format("chunk {} {} {}->{}", d.chunk, to_string(static_cast<Kind>(d.kind)), d.src_rank,
                              d.dst_rank)});
        });
      } else {
        take_in_order(team, next_tile, static_cast<int64_t>(lr.tiles.size()), stop, slot, [&](int64_t i) {
          const int64_t t0 = call.events ? now_ns() : 0;
          const TileEntry& t = lr.tiles[static_cast<size_t>(i)];
          run_tile(ctx, t, epoch, call.tile, team);
          if (call.events)
            record({ExecEvent::What::kTile, i, block - ntw, t0, now_ns(), fmt::format("tile ({},{})", t.m, t.n)});
        });
      }
    });
    backend_.synchronize();
    // Writes into this rank's outputs by other ranks' transfers (rings, two-shot) are
    // complete once the signals guarding them are.
    wait_signals(ctx, lr.final_waits, 0, static_cast<int32_t>(lr.final_waits.size()), epoch);
    // Every tile of this rank has run, so each of its counters holds exactly its per-epoch
    // total times the epoch: a table whose notifies disagree with Lowered::counters shows here.
    for (size_t k = 0; k < lowered_.counters.size(); ++k) {
      const uint64_t got = dev::signal_read(ctx, counter_slot(rank_, static_cast<int>(k)));
      WEFT_CHECK(got == static_cast<uint64_t>(epoch * lowered_.counters[k]),
                 fmt::format("host executor of plan {} on rank {}: tile counter {} is {} after call {}, expected {}",
                             plan_.name, rank_, k, got, epoch, epoch * lowered_.counters[k]));
    }
    if (call.output_tensor >= 0)
      backend_.copy_to_host(call.output, tensor_off_[static_cast<size_t>(call.output_tensor)],
                            tensor_bytes(call.output_tensor));
    if (call.events)
      for (auto& v : events)
        for (auto& e : v) call.events->push_back(std::move(e));
  } catch (...) {
    broken_ = true;
    throw;
  }
  epoch_ = epoch;
}

}  // namespace weft::plan
