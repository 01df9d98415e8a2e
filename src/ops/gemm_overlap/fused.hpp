// THE HOOK FOR THE FUSED METHOD of ops::GemmOverlap (one persistent kernel per call).
//
// ops::GemmOverlap calls fused_available() and fused_supports(op) once at construction (GPU
// backend only) and, when both are true, builds the op's plan for the fused geometry,
// allocates the plan's tensors, signals, tile counters and an epoch barrier from the
// symmetric heap, uploads this rank's lowered tables to device memory, calls
// make_state(args) once (the op owns the returned state: its side stream, events and device
// tables live as long as the op), and then calls run_fused(args, state) for every call with
// method `fused` (and `auto` may choose it). Definitions: src/ops/gemm_overlap/fused.cpp in
// CUDA builds (the fused kernel); src/ops/gemm_overlap/fused_stub.cpp in host-only builds,
// where fused_available() is false and make_state() and run_fused() throw weft::Error (this
// header includes no fmt, so a .cu may define them too).
//
// What the kernel must do per call (epoch e = args.epoch, 1 for the first call):
//  - ag_gemm: this rank's A_r (args.a, a user pointer, not symmetric) is the plan's input
//    tensor: copy it into tensors[input_tensor] (or read it in place for local transfers),
//    then run the transfers of `transfers` (push/pull/copy; each waits for its
//    transfer_waits entries >= e * threshold on this rank's `signals`, moves its region, then
//    one release add of `increment` to signals[signal] on signal_rank) and the tiles of
//    `tiles` in order (each waits for its tile_waits entries, then computes C rows
//    [m*tile_rows, ...) x cols [n*tile_cols, ...) from tensors[gemm_tensor] (the gathered A)
//    and B into args.c, then adds 1 to counters[rank * tiles_m + notify]).
//  - gemm_rs: tiles compute the partial product A_r * B_r into tensors[gemm_tensor]
//    (= the plan's input, in the op's dtype) and, after a tile of row block m, add 1 to
//    counters[rank * tiles_m + m] on this rank and on every rank in
//    notify_ranks[notify_begin[m] .. notify_begin[m+1]). Transfers (push, pull, copy, reduce:
//    dst += src in fp32, rounded to dtype) additionally wait for their
//    transfer_tile_waits[tt_begin[i] .. tt_begin[i+1]) entries: counters[src_rank * tiles_m +
//    counter] >= e * threshold on this rank. When this rank's work is done and its final_waits
//    are met, tensors[output_tensor] holds C ([M/world x N]); copy it to args.c.
//  - Epoch guard (not in the plan): before a peer writes into this rank's tensors for call e,
//    this rank must be done reading them for call e-1; a dev::barrier on `barrier` at the
//    start of the call (after the input copy for ag_gemm) is what the host executor does.
//  - Tracing: when trace != nullptr, append one TraceRecord per tile and per transfer
//    (globaltimer ns) at trace[atomicAdd(trace_count, 1)] while the index is below
//    trace_capacity; GemmOverlap turns them into TraceEvents.
//  - Enqueue on `stream` only: no host synchronisation, no allocation (graph-capturable).
#pragma once
#include <cstdint>
#include <memory>

#include "weft/device/barrier.hpp"
#include "weft/device/ctx.hpp"
#include "weft/device/dtype.hpp"
#include "weft/device/signal.hpp"
#include "weft/plan/schedule.hpp"  // TileEntry, WaitEntry, TransferDesc (POD rows)

namespace weft::ops::fused {

enum class Op : int32_t { kAgGemm = 0, kGemmRs = 1, kGemmAr = 2 };

// A plan tensor in the symmetric heap: same offset on every rank.
struct TensorDesc {
  uint64_t offset;  // heap offset (ctx.ptr<T>(rank, offset))
  int64_t rows, cols;
  int32_t elem_bytes;
  int32_t pad;
};

// A transfer that reads rows of the GEMM's output waits for the tiles that write them:
// counters[src_rank * tiles_m + counter] on the executing rank >= epoch * threshold.

// One record per tile or transfer (globaltimer ns).
struct TraceRecord {
  int32_t kind;  // 0 tile, 1 transfer
  int32_t lane;  // SM id (or warp group) that ran it
  int64_t id;    // tile index in `tiles`, or chunk id of the transfer
  uint64_t start_ns, end_ns;
};

struct FusedArgs {
  Op op;
  dev::DType dtype;  // bf16 or f16
  int32_t b_layout;  // 0: W [N x K] (C = A W^T), 1: B [K x N]
  int64_t m, n, k;   // global shape (as GemmOverlapConfig)
  int64_t k_local;   // depth of this rank's GEMM: k (ag_gemm) or k / world
  const void* a;     // A_r, device memory, row-major, 16-byte aligned
  const void* b;     // W or B (of k_local depth)
  void* c;           // C of this rank
  int64_t epoch;     // 1-based call number
  dev::DeviceCtx ctx;

  // This rank's lowered tables (plan::lower), in device memory.
  const plan::TileEntry* tiles;
  int32_t num_tiles;
  const plan::WaitEntry* tile_waits;
  const plan::TransferDesc* transfers;
  int32_t num_transfers;
  const plan::WaitEntry* transfer_waits;
  const int32_t* tt_begin;  // num_transfers + 1 offsets into transfer_tile_waits
  const plan::CounterWait* transfer_tile_waits;  // counter: the row block
  const int32_t* notify_begin;  // tiles_m + 1 offsets into notify_ranks
  const int32_t* notify_ranks;
  const int32_t* signal_producer;  // per lowered signal: the rank that bumps it (-1: several)
  // Signals of this rank that guard writes into tensors[output_tensor] made by other ranks'
  // transfers (gemm_rs ring): wait for each (>= epoch * threshold)
  // before reading the output. Empty for ag_gemm (tiles already wait for what they read).
  const plan::WaitEntry* final_waits;
  int32_t num_final_waits;
  const TensorDesc* tensors;
  int32_t num_tensors;
  int32_t input_tensor;   // A_r (ag_gemm) or the partial product (gemm_rs / gemm_ar)
  int32_t gemm_tensor;    // the schedule's tensor: gathered A, or the partial product
  int32_t output_tensor;  // gathered A (ag_gemm) or the reduced C (gemm_rs / gemm_ar)
  int64_t tile_rows, tile_cols;
  int32_t tiles_m, tiles_n;
  dev::SignalSlab signals;   // the plan's signals, lowered numbering
  dev::SignalSlab counters;  // world * tiles_m tile counters
  dev::BarrierHandle barrier;
  // A word of this rank's heap, zero at first, for the kernel's own device-side call
  // counter: a CUDA-graph replay passes the same `epoch` every time, so a replayable kernel
  // advances this word instead (as ops::Collectives does).
  uint64_t epoch_off;
  // gemm_rs: the op's staging slots [world][M/world x N] (heap offset; 0: none), where each
  // peer's partial rows of this rank's block land (the copy-engine fold, below).
  uint64_t stage_off;

  TraceRecord* trace;  // nullptr: tracing off
  uint32_t* trace_count;
  uint32_t trace_capacity;

  void* stream;  // cudaStream_t
};

// True when a real fused kernel is linked in and the GPU runs it (the stub: false).
bool fused_available();
// True when the fused method runs `op` (GemmOverlap offers `fused` only then): ag_gemm and
// gemm_rs (the stub: none).
bool fused_supports(Op op);

// One op's fused state (side stream, events, device tables); opaque, owned by the op.
struct State;
struct StateDeleter {
  void operator()(State* state) const;
};
using StatePtr = std::unique_ptr<State, StateDeleter>;

// Builds the op's state from its set-up arguments (every field but a, b, c, epoch, stream
// and the trace's; ctx must be set): synchronous, allocates; call it at set-up, never during
// a graph capture. Throws weft::Error where the fused method cannot run the op (the stub
// always throws).
StatePtr make_state(const FusedArgs& args);
// ag_gemm: whether the kernel reads this rank's own rows of A in place, so that the gathered
// tensor holds every rank's rows but these.
bool own_rows_in_place(const State& state);
// Enqueues one call on args.stream with the state make_state built for the same op. Throws
// weft::Error on failure.
void run_fused(const FusedArgs& args, State& state);

}  // namespace weft::ops::fused
