// The host backend executing lowered tables: one executor for every verified (CommPlan,
// TileSchedule, Lowered), whatever the op around it computes in its tiles.
//
// The executor reads only the lowered tables (`lower()`), the same rows a GPU kernel reads;
// the plan supplies tensor shapes and element sizes, the schedule the tile geometry. It owns
// the symmetric state (every plan tensor, the plan's signals, the tile counters, an epoch
// barrier) and runs one epoch per call:
//  - transfer workers take LoweredRank::transfers in issue order (the next free worker takes
//    the next descriptor, as the progress verifier models), wait for every transfer_waits
//    entry and every counter_waits entry (epoch-scaled), move the region with dev::put
//    (push, copy), dev::get (pull) or an add (reduce: dst += src in float, rounded to the
//    element type), then one release dev::signal_add of `increment` on (signal_rank, signal);
//  - tile workers take LoweredRank::tiles in order, wait for every tile_waits entry, call
//    the caller's tile function, then bump counter `notify` on their own rank and on every
//    rank of notify_ranks (the ranks whose transfers wait for it);
//  - after both, the final waits (outputs written by other ranks' transfers), a check that
//    every counter holds exactly its per-epoch total times the epoch, and the output copy.
// Both groups run in one host_launch as separate blocks (workers are CTAs); every wait has
// the backend's deadline and names the rank expected to signal (LoweredRank::signal_producer
// for plan signals, the tiles' rank for counters), so a peer that never signals ends in a
// TimeoutError naming it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "weft/device/barrier.hpp"
#include "weft/device/dtype.hpp"
#include "weft/device/signal.hpp"
#include "weft/plan/plan.hpp"
#include "weft/plan/schedule.hpp"
#include "weft/runtime/backend.hpp"
#include "weft/runtime/host_exec.hpp"

namespace weft::plan {

struct HostExecutorOptions {
  // Worker blocks per rank that take transfers, and that take tiles; threads per block.
  int transfer_workers = 1;
  int tile_workers = 1;
  int threads = 1;
  // Element type of the plan's tensors. Reduce transfers need it (they add elements); when
  // set, every tensor a transfer touches must have its size.
  std::optional<dev::DType> dtype;
  // Run verify() and verify_schedule() with the worker counts above before allocating, so a
  // table that could deadlock with this many resident workers is refused up front.
  bool verify = true;
};

// One transfer or tile of a call, for tracing.
struct ExecEvent {
  enum class What : uint8_t { kTransfer, kTile };
  What what = What::kTile;
  int64_t id = 0;                    // transfer: its chunk; tile: its index in LoweredRank::tiles (take order)
  int worker = 0;                    // index of the worker block within its group (transfer or tile workers)
  int64_t start_ns = 0, end_ns = 0;  // steady clock; start is before the waits
  std::string name;                  // "chunk 5 push 0->1", "tile (2,3)"
};

// Computes rows [r0, r1) x columns [c0, c1) of the schedule's grid for tile `t`, after the
// tile's waits. With HostExecutorOptions::threads > 1 every thread of the worker's team calls
// it with its own contiguous share of the tile's rows (threads without rows are not called),
// concurrently; the executor bumps the tile's counter once all of them have returned.
using TileFn = std::function<void(const TileEntry& t, int64_t r0, int64_t r1, int64_t c0, int64_t c1)>;

// A further input of a call: copied into plan tensor `tensor` (its whole size) as `input` is.
struct ExecInput {
  int tensor = -1;
  const void* data = nullptr;
};

struct ExecCall {
  // Copied into plan tensor `input_tensor` (its whole size) before any peer may read it, and,
  // where peers read that tensor remotely, only once every peer is done with the previous
  // call's contents.
  const void* input = nullptr;
  int input_tensor = -1;  // -1: no input copy
  // Plans with several inputs (a GEMM's A and B): the others, copied the same way (each
  // tensor at most once in a call, `input_tensor` included).
  std::vector<ExecInput> more_inputs;
  TileFn tile;            // may be empty only when this rank has no tiles
  // Plan tensor `output_tensor` (its whole size) copied out to `output` after the final waits.
  int output_tensor = -1;  // -1: no output copy
  void* output = nullptr;
  std::vector<ExecEvent>* events = nullptr;  // appended to when not null
};

// Construction and run() are collective: every rank makes the same calls in the same order
// with the same plan, schedule and tables (the heap checks sizes and order).
class HostExecutor {
 public:
  // Checks that the tables fit the plan and schedule (ranks, tensors, regions in bounds,
  // signal, counter and notify indices, every tile once, transfer kinds it can run on the
  // rank whose table holds them, element sizes), verifies (options.verify), then allocates
  // from backend.heap() under names starting with `tag`. Throws InvalidArgument naming what
  // does not fit.
  HostExecutor(Backend& backend, CommPlan plan, TileSchedule schedule, Lowered lowered, const std::string& tag,
               HostExecutorOptions options = {});

  // One epoch (see the file comment). Returns when this rank's transfers and tiles are done,
  // its output is complete and copied out. Throws TimeoutError (naming the peer) when a wait
  // passes the deadline; after any failure the object refuses further calls (signals are no
  // longer in step across ranks).
  void run(const ExecCall& call);

  int64_t epoch() const { return epoch_; }  // completed calls
  int rank() const { return rank_; }
  // Plan tensor t: its heap offset (the same on every rank), this rank's copy, its size.
  uint64_t tensor_offset(int t) const;
  void* tensor(int t) const;
  size_t tensor_bytes(int t) const;

  const CommPlan& plan() const { return plan_; }
  const TileSchedule& schedule() const { return schedule_; }
  const Lowered& lowered() const { return lowered_; }
  const HostExecutorOptions& options() const { return opt_; }

 private:
  // Checks every rank's tables against the plan and schedule; run before anything is
  // allocated.
  void check_tables();
  void wait_signals(const dev::DeviceCtx& c, const std::vector<WaitEntry>& ws, int32_t begin, int32_t count,
                    int64_t epoch) const;
  void run_transfer(const dev::DeviceCtx& c, int32_t index, int64_t epoch, CoopHostTeam team) const;
  void run_tile(const dev::DeviceCtx& c, const TileEntry& t, int64_t epoch, const TileFn& fn, CoopHostTeam team) const;
  uint64_t counter_slot(int rank, int counter) const;

  Backend& backend_;
  CommPlan plan_;
  TileSchedule schedule_;
  Lowered lowered_;
  HostExecutorOptions opt_;
  int rank_ = 0;
  // remote_read_[t]: some rank's transfer reads tensor t on another rank, so a call's input
  // copy into t must wait until peers are done with the previous call's contents.
  std::vector<bool> remote_read_;
  std::vector<uint64_t> tensor_off_;  // heap offset of each plan tensor
  dev::SignalSlab signals_{};         // lowered plan signals (Lowered::max_signals() on every rank)
  dev::SignalSlab counters_{};        // world x counters: slot (rank, c) is rank's counter c, here
  dev::BarrierHandle barrier_{};
  int64_t epoch_ = 0;
  bool broken_ = false;
};

}  // namespace weft::plan
