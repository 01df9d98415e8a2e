// The host backend executing lowered tables: a reference AG+GEMM.
//
// A is sharded by rows: rank r holds A_r [m x K] (the plan's `input` tensor). The plan (an
// all-gather template, any algorithm and split) gathers A [world*m x K] into its output
// tensor, the one the tile schedule belongs to; tiles compute C = A * B, B [K x N] local to
// each rank, C [world*m x N] in float. Every rank computes all of C (that is what an
// all-gather followed by a GEMM does; a real op would shard N or K).
//
// The executor reads only the lowered tables (`lower()`), the same rows a GPU kernel will
// read; the plan supplies tensor shapes and element sizes, the schedule the tile geometry:
//  - transfer workers take LoweredRank::transfers in issue order (the next free worker takes
//    the next descriptor, as the progress verifier models), wait with dev::wait_ge for every
//    transfer_waits entry (epoch-scaled), move the region with dev::put / dev::get, then one
//    release dev::signal_add of `increment` on (signal_rank, signal);
//  - tile workers take LoweredRank::tiles in order, wait for every tile_waits entry, compute
//    the tile with float accumulation and bump counter `notify` on their own rank.
// Both groups run in one host_launch as separate blocks (workers are CTAs); every wait has
// the backend's deadline, so a peer that never signals ends in a TimeoutError naming it.
#pragma once
#include <cstdint>
#include <vector>

#include "weft/device/barrier.hpp"
#include "weft/device/dtype.hpp"
#include "weft/device/signal.hpp"
#include "weft/plan/plan.hpp"
#include "weft/plan/schedule.hpp"
#include "weft/runtime/backend.hpp"
#include "weft/runtime/host_exec.hpp"

namespace weft::plan {

struct HostAgGemmOptions {
  // Element type of A (the plan's input and gathered tensors) and of B. C is float.
  dev::DType dtype = dev::DType::kBF16;
  // Worker blocks per rank that take transfers, and that take tiles; threads per block.
  int transfer_workers = 2;
  int tile_workers = 2;
  int threads = 1;
  // Run verify() and verify_schedule() with the worker counts above before executing, so a
  // table that could deadlock with this many resident workers is refused up front.
  bool verify = true;
};

// Owns the symmetric state of one AG+GEMM (every plan tensor, the plan's signals, the tile
// counters, an epoch barrier) and runs it one epoch per call. Construction and run() are
// collective: every rank makes the same calls in the same order with the same plan, schedule
// and tables (the heap checks sizes and order).
class HostAgGemm {
 public:
  // Checks that the tables fit the plan and schedule (ranks, tensors, shapes, signal and
  // counter indices, transfer kinds it can run), allocates from backend.heap(), and verifies
  // (options.verify). Throws InvalidArgument naming what does not fit.
  HostAgGemm(Backend& backend, const CommPlan& plan, const TileSchedule& schedule, const Lowered& lowered,
             HostAgGemmOptions options = {});

  // One epoch: a_local is this rank's A_r [m x K], b is B [K x N] (both row-major, of
  // `dtype`), c receives C [world*m x N] row-major float. Returns when this rank's transfers
  // and tiles are done. Throws TimeoutError (naming the peer) when a wait passes the deadline;
  // after that the object is unusable (signals are no longer in step across ranks).
  void run(const void* a_local, const void* b, float* c);

  int64_t epoch() const { return epoch_; }  // completed calls
  int64_t m() const { return m_; }          // rows of A_r
  int64_t k() const { return k_; }
  int64_t n() const { return n_; }
  int64_t rows() const { return rows_; }  // rows of A and C (world * m)

 private:
  // Derives the geometry (m, K, N, tensors, producers) and checks every rank's tables
  // against the plan and schedule; run before anything is allocated.
  void check_tables();
  void run_transfer(const dev::DeviceCtx& c, const TransferDesc& d, int64_t epoch, CoopHostTeam team) const;
  void run_tile(const dev::DeviceCtx& c, const TileEntry& t, int64_t epoch, const void* b, float* out,
                CoopHostTeam team) const;

  Backend& backend_;
  CommPlan plan_;
  TileSchedule schedule_;
  Lowered lowered_;
  HostAgGemmOptions opt_;
  int rank_ = 0;
  int input_ = -1;     // plan tensor holding A_r
  int gathered_ = -1;  // plan tensor holding A (the schedule's)
  int64_t m_ = 0, k_ = 0, n_ = 0, rows_ = 0;
  size_t elem_ = 2;
  bool remote_input_reads_ = false;   // some peer reads an input tensor of another rank
  std::vector<uint64_t> tensor_off_;  // heap offset of each plan tensor
  dev::SignalSlab signals_{};         // lowered plan signals (same slab size on every rank)
  dev::SignalSlab counters_{};        // tile counters
  dev::BarrierHandle barrier_{};
  // producer_[g]: the rank that bumps lowered signal g of this rank, -1 when several do; it
  // is the peer a timed-out wait on g names.
  std::vector<int> producer_;
  int64_t epoch_ = 0;
  bool broken_ = false;
};

}  // namespace weft::plan
