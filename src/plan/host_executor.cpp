#include "weft/plan/host_executor.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <set>

#include "weft/core/error.hpp"
#include "weft/device/api.hpp"
#include "weft/plan/verify.hpp"
#include "weft/runtime/host_exec.hpp"

namespace weft::plan {
namespace {

bool in_bounds(const Tensor& t, int64_t row, int64_t col, int64_t rows, int64_t cols) {
  return rows >= 1 && cols >= 1 && row >= 0 && col >= 0 && row + rows <= t.rows && col + cols <= t.cols;
}

// Computes rows [r0, r1) x cols [c0, c1) of C = A * B, A [.. x K] and B [K x N] of T, every
// product accumulated in float in k order (the reference does the same, so results agree to
// the bit). Thread `me` of `threads` takes every threads-th row.
template <class T>
void gemm_tile(const T* a, const T* b, float* c, int64_t k, int64_t n, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
               int me, int threads) {
  for (int64_t i = r0 + me; i < r1; i += threads) {
    const T* arow = a + i * k;
    for (int64_t j = c0; j < c1; ++j) {
      float acc = 0.0f;
      for (int64_t kk = 0; kk < k; ++kk) acc += dev::to_float(arow[kk]) * dev::to_float(b[kk * n + j]);
      c[i * n + j] = acc;
    }
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

HostAgGemm::HostAgGemm(Backend& backend, const CommPlan& plan, const TileSchedule& schedule, const Lowered& lowered,
                       HostAgGemmOptions options)
    : backend_(backend), plan_(plan), schedule_(schedule), lowered_(lowered), opt_(options), rank_(backend.rank()) {
  WEFT_REQUIRE(opt_.transfer_workers >= 1 && opt_.tile_workers >= 1 && opt_.threads >= 1,
               fmt::format("host AG+GEMM: {} transfer workers, {} tile workers, {} threads (need >= 1 each)",
                           opt_.transfer_workers, opt_.tile_workers, opt_.threads));
  WEFT_REQUIRE(backend.kind() == BackendKind::kHost,
               fmt::format("host AG+GEMM runs on the host backend, not {}", to_string(backend.kind())));
  check_tables();
  if (opt_.verify) {
    verify_or_throw(plan_, {.workers_per_rank = opt_.transfer_workers});
    const VerifyResult v =
        verify_schedule(plan_, schedule_, {.comm_workers = opt_.transfer_workers, .tile_workers = opt_.tile_workers});
    WEFT_REQUIRE(v.ok, fmt::format("host AG+GEMM: schedule for plan {} is invalid:\n{}", plan_.name, v.text()));
  }

  // Collective from here on: every rank allocates the same sizes in the same order (the
  // sizes depend only on the plan and the tables, which every rank holds whole).
  SymmetricHeap& heap = backend_.heap();
  for (const Tensor& t : plan_.tensors)
    tensor_off_.push_back(heap.alloc_bytes(static_cast<size_t>(t.rows * t.cols * t.elem_bytes),
                                           fmt::format("ag_gemm.{}.{}", plan_.name, t.name)));
  size_t nsig = 1;
  for (const LoweredRank& lr : lowered_.ranks) nsig = std::max(nsig, lr.signal_expected.size());
  signals_ = heap.alloc_signals(static_cast<uint32_t>(nsig), fmt::format("ag_gemm.{}.signals", plan_.name));
  counters_ = heap.alloc_signals(static_cast<uint32_t>(std::max<size_t>(1, lowered_.counters.size())),
                                 fmt::format("ag_gemm.{}.counters", plan_.name));
  barrier_ = heap.alloc_barrier(fmt::format("ag_gemm.{}.epoch", plan_.name));
}

void HostAgGemm::check_tables() {
  const int w = plan_.world;
  WEFT_REQUIRE(w == backend_.size() && schedule_.world == w && lowered_.world == w &&
                   lowered_.ranks.size() == static_cast<size_t>(w),
               fmt::format("host AG+GEMM: backend has {} ranks, plan {} {}, schedule {}, tables {}", backend_.size(),
                           plan_.name, w, schedule_.world, lowered_.ranks.size()));
  int inputs = 0;
  for (size_t t = 0; t < plan_.tensors.size(); ++t)
    if (plan_.tensors[t].role == Role::kInput) {
      input_ = static_cast<int>(t);
      ++inputs;
    }
  WEFT_REQUIRE(inputs == 1,
               fmt::format("host AG+GEMM: plan {} has {} input tensors (need exactly one: A_r)", plan_.name, inputs));
  gathered_ = plan_.tensor_id(schedule_.tensor);
  WEFT_REQUIRE(gathered_ >= 0 && gathered_ != input_,
               fmt::format("host AG+GEMM: the schedule's tensor '{}' is not an output of plan {}", schedule_.tensor,
                           plan_.name));
  const Tensor& in = plan_.tensors[static_cast<size_t>(input_)];
  const Tensor& a = plan_.tensors[static_cast<size_t>(gathered_)];
  m_ = in.rows;
  k_ = in.cols;
  rows_ = a.rows;
  n_ = schedule_.cols;
  elem_ = dev::dtype_size(opt_.dtype);
  WEFT_REQUIRE(
      a.rows == int64_t{w} * in.rows && a.cols == in.cols && schedule_.rows == a.rows,
      fmt::format("host AG+GEMM: '{}' is {}x{} and '{}' {}x{}, schedule rows {}; an all-gather of {} ranks "
                  "needs {}x{}",
                  in.name, in.rows, in.cols, a.name, a.rows, a.cols, schedule_.rows, w, int64_t{w} * in.rows, in.cols));
  WEFT_REQUIRE(static_cast<size_t>(in.elem_bytes) == elem_ && static_cast<size_t>(a.elem_bytes) == elem_,
               fmt::format("host AG+GEMM: {} elements are {} bytes, but '{}' has {} and '{}' {}",
                           dev::dtype_name(opt_.dtype), elem_, in.name, in.elem_bytes, a.name, a.elem_bytes));

  size_t nsig = 0;
  for (const LoweredRank& lr : lowered_.ranks) nsig = std::max(nsig, lr.signal_expected.size());
  const int tiles_m = schedule_.tiles_m(), tiles_n = schedule_.tiles_n();
  producer_.assign(nsig, -2);  // -2: nobody yet
  for (int r = 0; r < w; ++r) {
    const LoweredRank& lr = lowered_.ranks[static_cast<size_t>(r)];
    auto where = [&](int64_t chunk) { return fmt::format("host AG+GEMM: rank {} chunk {}", r, chunk); };
    auto waits_ok = [&](int32_t begin, int32_t count, const std::vector<WaitEntry>& ws) {
      if (begin < 0 || count < 0 || static_cast<size_t>(begin) + static_cast<size_t>(count) > ws.size()) return false;
      for (int32_t j = begin; j < begin + count; ++j)
        if (ws[static_cast<size_t>(j)].signal < 0 ||
            static_cast<size_t>(ws[static_cast<size_t>(j)].signal) >= lr.signal_expected.size() ||
            ws[static_cast<size_t>(j)].threshold < 0)
          return false;
      return true;
    };
    for (const TransferDesc& d : lr.transfers) {
      const auto kind = static_cast<Kind>(d.kind);
      WEFT_REQUIRE(kind == Kind::kPush || kind == Kind::kPull || kind == Kind::kCopy,
                   fmt::format("{}: {} transfers are not supported (an all-gather moves data, it does not add)",
                               where(d.chunk), kind == Kind::kReduce ? "reduce" : "unknown"));
      const bool exec_ok = kind == Kind::kPush   ? d.src_rank == r
                           : kind == Kind::kPull ? d.dst_rank == r
                                                 : d.src_rank == r && d.dst_rank == r;
      WEFT_REQUIRE(exec_ok, fmt::format("{}: a {} from rank {} to rank {} cannot run on rank {}", where(d.chunk),
                                        to_string(kind), d.src_rank, d.dst_rank, r));
      const auto nt = static_cast<int32_t>(plan_.tensors.size());
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
      WEFT_REQUIRE(waits_ok(d.wait_begin, d.wait_count, lr.transfer_waits),
                   fmt::format("{}: waits [{}, +{}) are not valid entries of its transfer_waits", where(d.chunk),
                               d.wait_begin, d.wait_count));
      if (d.signal_rank >= 0) {
        WEFT_REQUIRE(d.signal_rank < w && d.signal >= 0 &&
                         static_cast<size_t>(d.signal) <
                             lowered_.ranks[static_cast<size_t>(d.signal_rank)].signal_expected.size(),
                     fmt::format("{}: signals {}.{}, which rank {} does not have", where(d.chunk), d.signal_rank,
                                 d.signal, d.signal_rank));
        if (d.signal_rank == rank_) {
          int& p = producer_[static_cast<size_t>(d.signal)];
          p = p == -2 || p == r ? r : -1;
        }
      }
      if (kind == Kind::kPull && st.role == Role::kInput && d.src_rank != r) remote_input_reads_ = true;
    }
    WEFT_REQUIRE(lr.tiles.size() == static_cast<size_t>(tiles_m) * static_cast<size_t>(tiles_n),
                 fmt::format("host AG+GEMM: rank {} has {} tiles, the {}x{} grid {}", r, lr.tiles.size(), tiles_m,
                             tiles_n, int64_t{tiles_m} * tiles_n));
    std::set<std::pair<int, int>> seen;
    for (const TileEntry& t : lr.tiles) {
      WEFT_REQUIRE(t.m >= 0 && t.m < tiles_m && t.n >= 0 && t.n < tiles_n && seen.emplace(t.m, t.n).second,
                   fmt::format("host AG+GEMM: rank {} tile ({},{}) is outside the {}x{} grid or repeated", r, t.m, t.n,
                               tiles_m, tiles_n));
      WEFT_REQUIRE(waits_ok(t.wait_begin, t.wait_count, lr.tile_waits),
                   fmt::format("host AG+GEMM: rank {} tile ({},{}): waits [{}, +{}) are not valid entries", r, t.m, t.n,
                               t.wait_begin, t.wait_count));
      WEFT_REQUIRE(t.notify < static_cast<int32_t>(lowered_.counters.size()),
                   fmt::format("host AG+GEMM: rank {} tile ({},{}) notifies counter {} of {}", r, t.m, t.n, t.notify,
                               lowered_.counters.size()));
    }
  }
  for (int& p : producer_)
    if (p == -2) p = -1;
}

void HostAgGemm::run_transfer(const dev::DeviceCtx& c, const TransferDesc& d, int64_t epoch, CoopHostTeam team) const {
  if (team.rank() == 0) {
    const LoweredRank& lr = lowered_.ranks[static_cast<size_t>(rank_)];
    for (int32_t j = d.wait_begin; j < d.wait_begin + d.wait_count; ++j) {
      const WaitEntry& w = lr.transfer_waits[static_cast<size_t>(j)];
      dev::wait_ge(c, signals_.at(static_cast<uint32_t>(w.signal)), static_cast<uint64_t>(epoch * w.threshold),
                   producer_[static_cast<size_t>(w.signal)]);
    }
  }
  team.sync();  // the leader's acquire, passed on to the team by the barrier's ordering
  const Tensor& st = plan_.tensors[static_cast<size_t>(d.src_tensor)];
  const Tensor& dt = plan_.tensors[static_cast<size_t>(d.dst_tensor)];
  const auto eb = static_cast<uint64_t>(st.elem_bytes);
  auto off = [&](int t, const Tensor& tt, int64_t row, int64_t col) {
    return tensor_off_[static_cast<size_t>(t)] + static_cast<uint64_t>(row * tt.cols + col) * eb;
  };
  // Whole rows on both sides are one contiguous block; otherwise one copy per row.
  const bool contiguous = d.cols == st.cols && d.cols == dt.cols;
  const int64_t pieces = contiguous ? 1 : d.rows;
  const auto bytes = static_cast<size_t>((contiguous ? d.rows : 1) * d.cols) * eb;
  for (int64_t i = 0; i < pieces; ++i) {
    const uint64_t so = off(d.src_tensor, st, d.src_row + i, d.src_col);
    const uint64_t dof = off(d.dst_tensor, dt, d.dst_row + i, d.dst_col);
    if (static_cast<Kind>(d.kind) == Kind::kPull)
      dev::get(team, c, c.local<unsigned char>(dof), d.src_rank, so, bytes);
    else  // push, or copy (a put to this rank)
      dev::put(team, c, d.dst_rank, dof, c.local<unsigned char>(so), bytes);
  }
  team.sync();
  if (team.rank() == 0 && d.signal_rank >= 0) {
    // As put_signal: the team's other workers wrote part of the data; the cumulative fence
    // carries their writes (ordered before this one by the team barrier) to the peer.
    if (team.size() > 1) dev::fence_acq_rel();
    dev::signal_add(c, d.signal_rank, signals_.at(static_cast<uint32_t>(d.signal)), static_cast<uint64_t>(d.increment));
  }
}

void HostAgGemm::run_tile(const dev::DeviceCtx& c, const TileEntry& t, int64_t epoch, const void* b, float* out,
                          CoopHostTeam team) const {
  const LoweredRank& lr = lowered_.ranks[static_cast<size_t>(rank_)];
  if (team.rank() == 0)
    for (int32_t j = t.wait_begin; j < t.wait_begin + t.wait_count; ++j) {
      const WaitEntry& w = lr.tile_waits[static_cast<size_t>(j)];
      dev::wait_ge(c, signals_.at(static_cast<uint32_t>(w.signal)), static_cast<uint64_t>(epoch * w.threshold),
                   producer_[static_cast<size_t>(w.signal)]);
    }
  team.sync();
  const int64_t r0 = int64_t{t.m} * schedule_.tile_rows, r1 = std::min(rows_, r0 + schedule_.tile_rows);
  const int64_t c0 = int64_t{t.n} * schedule_.tile_cols, c1 = std::min(n_, c0 + schedule_.tile_cols);
  const void* a = c.local<unsigned char>(tensor_off_[static_cast<size_t>(gathered_)]);
  switch (opt_.dtype) {
    case dev::DType::kF32:
      gemm_tile(static_cast<const float*>(a), static_cast<const float*>(b), out, k_, n_, r0, r1, c0, c1, team.rank(),
                team.size());
      break;
    case dev::DType::kBF16:
      gemm_tile(static_cast<const dev::bf16_t*>(a), static_cast<const dev::bf16_t*>(b), out, k_, n_, r0, r1, c0, c1,
                team.rank(), team.size());
      break;
    case dev::DType::kF16:
      gemm_tile(static_cast<const dev::f16_t*>(a), static_cast<const dev::f16_t*>(b), out, k_, n_, r0, r1, c0, c1,
                team.rank(), team.size());
      break;
  }
  team.sync();
  if (team.rank() == 0 && t.notify >= 0) {
    if (team.size() > 1) dev::fence_acq_rel();
    dev::signal_add(c, rank_, counters_.at(static_cast<uint32_t>(t.notify)), 1);
  }
}

void HostAgGemm::run(const void* a_local, const void* b, float* c) {
  WEFT_REQUIRE(!broken_, fmt::format("host AG+GEMM on rank {}: an earlier call failed; its signals are out of step "
                                     "with the other ranks",
                                     rank_));
  WEFT_REQUIRE(a_local && b && c, "host AG+GEMM: null input or output");
  const dev::DeviceCtx& ctx = backend_.ctx();
  const int64_t epoch = epoch_ + 1;
  try {
    // Epoch guard (the plan does not express it): before a peer writes into this rank's
    // tensors for call e, this rank must be done reading them for call e-1. run() returns
    // only after all of this rank's work, so one barrier on entry suffices. A plan whose
    // peers read this rank's input remotely also needs the input left alone until they are
    // done with e-1, and in place before they start e: a barrier on each side of the copy.
    if (remote_input_reads_) dev::barrier(dev::CoopThread{}, ctx, barrier_);
    backend_.copy_from_host(tensor_off_[static_cast<size_t>(input_)], a_local, static_cast<size_t>(m_ * k_) * elem_);
    dev::barrier(dev::CoopThread{}, ctx, barrier_);

    const LoweredRank& lr = lowered_.ranks[static_cast<size_t>(rank_)];
    const int nt = opt_.transfer_workers;
    std::atomic<int64_t> next_transfer{0}, next_tile{0};
    std::atomic<bool> stop{false};
    std::vector<int64_t> slots(static_cast<size_t>(nt + opt_.tile_workers), 0);
    host_launch(nt + opt_.tile_workers, opt_.threads, [&](CoopHostTeam team, int block) {
      int64_t& slot = slots[static_cast<size_t>(block)];
      if (block < nt) {
        take_in_order(team, next_transfer, static_cast<int64_t>(lr.transfers.size()), stop, slot,
                      [&](int64_t i) { run_transfer(ctx, lr.transfers[static_cast<size_t>(i)], epoch, team); });
      } else {
        take_in_order(team, next_tile, static_cast<int64_t>(lr.tiles.size()), stop, slot,
                      [&](int64_t i) { run_tile(ctx, lr.tiles[static_cast<size_t>(i)], epoch, b, c, team); });
      }
    });
    backend_.synchronize();
    // Every tile of this rank has run, so each counter holds exactly its per-epoch total
    // times the epoch: a table whose notifies disagree with Lowered::counters shows here.
    for (size_t k = 0; k < lowered_.counters.size(); ++k) {
      const uint64_t got = dev::signal_read(ctx, counters_.at(static_cast<uint32_t>(k)));
      WEFT_CHECK(got == static_cast<uint64_t>(epoch * lowered_.counters[k]),
                 fmt::format("host AG+GEMM on rank {}: counter {} is {} after call {}, expected {}", rank_, k, got,
                             epoch, epoch * lowered_.counters[k]));
    }
  } catch (...) {
    broken_ = true;
    throw;
  }
  epoch_ = epoch;
}

}  // namespace weft::plan
