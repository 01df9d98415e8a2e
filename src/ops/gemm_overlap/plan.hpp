// Private to src/ops: the plans of the GEMM ops (from the plan compiler's templates, lowered
// with their tile schedules: every table the methods read, GPU and host, is in
// OpPlan::lowered), and the host backend's methods running them on plan::HostExecutor.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "fused.hpp"
#include "weft/ops/gemm_overlap.hpp"
#include "weft/plan/host_executor.hpp"
#include "weft/plan/plan.hpp"
#include "weft/plan/schedule.hpp"
#include "weft/runtime/backend.hpp"

namespace weft::ops::detail {

struct OpPlanParams {
  GemmOp op = GemmOp::kAgGemm;
  int world = 1;
  int64_t m = 0, n = 0, k_local = 0;  // global M, N; this rank's GEMM depth
  int chunks = 1;                     // the plan's splits
  std::string algo;                   // empty: the op's default
  plan::Engine engine = plan::Engine::kSm;
  int elem_bytes = 2;
  int64_t tile_rows = 1, tile_cols = 1;
  int64_t band_rows = 0;  // TileSchedule::band_rows (0: uniform row blocks)
  int transfer_workers = 1, tile_workers = 1;  // verified with these resident workers
};

// The plans the GPU methods build their tables from, defined once so that the host tests run
// exactly those tables through the host executor: the fused kernel's (128 x 128 output tiles
// unless the config says otherwise, SM transfers) and decomposed's (one tile per chunk of
// rows, all of N; copy-engine transfers). Decomposed gemm_rs is the staged reduce-scatter
// and decomposed gemm_ar the two-shot all-reduce (SM transfers) whatever config.algo says
// (that picks the fused method's template), their tiles the pieces of each owner's shard
// (band_rows = m_shard; gemm_ar's pieces of every shard interleaved, so that every rank
// computes the rows of the first sums first): the host's decomposed method runs the same
// plan. k_local, m_shard: the op's per-rank K and rows (gemm_ar: the shard rows of its plan).
OpPlanParams fused_plan_params(const GemmOverlapConfig& cfg, int world, int64_t k_local, int chunks);
OpPlanParams decomposed_plan_params(const GemmOverlapConfig& cfg, int world, int64_t k_local, int chunks,
                                    int64_t m_shard);

struct OpPlan {
  GemmOp op = GemmOp::kAgGemm;
  plan::CommPlan plan;
  plan::TileSchedule schedule;
  plan::Lowered lowered;
  int input = -1, gemm = -1, output = -1;  // plan tensors
  int tiles_m = 0, tiles_n = 0;
};

// The plan template's name for the op (the default when algo is empty). Throws
// InvalidArgument for an unknown algo.
std::string default_algo(GemmOp op);
void check_algo(GemmOp op, const std::string& algo);

// Builds, verifies (verify + verify_schedule with the given workers) and lowers the op's plan
// and tile schedule; ag_gemm tiles are ordered by chunk arrival, gemm_rs / gemm_ar tiles by
// when transfers need their rows (order_by_demand).
OpPlan build_op_plan(const OpPlanParams& p);

// Stable sort of each rank's tiles by their block's place in its band of band_rows rows (the
// schedule's band_rows, or where gemm_schedule stored 0 for it, the one it was built with),
// then the band: block 0 of every band, then block 1 of every band, ... (on every rank alike).
void interleave_bands(plan::TileSchedule& s, int64_t band_rows);

// Stable sort of each rank's tiles by the earliest transfer (any rank's) that reads their rows
// of the schedule's tensor on that rank: (longest dependency chain before it, queue position).
void order_by_demand(plan::TileSchedule& s, const plan::CommPlan& plan);

// What the GPU decomposed gemm_rs (RsFold kNone, kWeft, kLt) reads from one rank's lowered
// tables of the staged plan (decomposed_plan_params), checked here once at setup:
//  - pushes: the transfers that move a piece of this rank's partial product ("in", the
//    op's scratch) into an owner's staging slot, in issue order; before push i the compute
//    stream runs the tiles [pushes[i-1].tiles_end, pushes[i].tiles_end) of LoweredRank::tiles
//    (those its counter waits name, in table order);
//  - own_tiles: tiles [own_tiles_begin, tiles.size()) are this rank's own shard, in row order;
//    the GPU writes them straight into its own staging slot or folds them (the plan's local
//    copy of them is left out);
//  - pieces: per piece of the own shard (the own tiles' rows), the owner's sum of every slot:
//    the waits of the plan's reduce chain for it on signals other ranks' pushes bump.
// Throws Error naming what does not fit that shape.
struct RsDecomposedTables {
  struct Push {
    int32_t transfer = 0;   // index in LoweredRank::transfers
    int32_t tiles_end = 0;  // LoweredRank::tiles issued before it: [.., tiles_end)
    int32_t piece = 0;      // the piece of the owner's shard it moves
  };
  struct Piece {
    int64_t r0 = 0, r1 = 0;               // rows of the own shard (= of C)
    std::vector<plan::WaitEntry> waits;   // lowered signals of this rank, per-epoch thresholds
    std::vector<int32_t> producers;       // the rank bumping each
  };
  std::vector<Push> pushes;
  int32_t own_tiles_begin = 0;
  std::vector<Piece> pieces;
};
RsDecomposedTables rs_decomposed_tables(const OpPlan& p, int rank, int64_t m_shard);

// What the GPU decomposed gemm_ar reads of one rank's lowered tables of its all-reduce plan
// (decomposed_plan_params: two-shot, a tile per piece of each shard, the pieces of every shard
// interleaved), checked here once at setup. Each sum the rank owns is a chain of its links: a
// copy of its own rows of "in" into "out", a reduce of each peer's same rows into them, then
// a push of the sum into every peer's "out". The GPU runs a chain as one pass (one kernel:
// every rank's rows summed in fp32 in the chain's order, rounded once, stored to this rank's
// C and to each peer's "out", then the pushes' signals): the links' own signals, which only
// the next link waits for, are left out (checked). The rows the peers push into this rank's
// "out" (the plan's final waits, by region) are its landings, copied out to C once in.
//  - chains: in the order of this rank's tiles they read (after_tile), each with the tile
//    counters its links wait for (any rank's tiles: CounterWait) and the (rank, lowered
//    signal) its pushes bump by 1;
//  - landings: the same, with the final waits guarding them and the rank bumping each.
// Every chain pushes to every peer: a peer's reads of this rank's "in" rows then precede
// this rank's landings, which end its call (so the next call's GEMM may overwrite "in").
// Throws Error naming what does not fit that shape.
struct ArChainTables {
  struct Chain {
    int64_t r0 = 0, r1 = 0;                            // rows of in / out / C (all N columns)
    std::vector<int32_t> sources;                      // ranks whose "in" rows are summed, in order
    std::vector<plan::CounterWait> tile_waits;         // the tiles the links read
    std::vector<std::pair<int32_t, int32_t>> signals;  // (peer, lowered signal there): +1 after the sum
    int32_t after_tile = 0;  // this rank's tiles [0, after_tile) hold every own tile it reads
  };
  struct Landing {
    int64_t r0 = 0, r1 = 0;
    std::vector<plan::WaitEntry> waits;  // lowered signals of this rank, per-epoch thresholds
    std::vector<int32_t> producers;      // the rank bumping each
    int32_t after_tile = 0;              // as Chain::after_tile: the owner's chain reads those tiles
  };
  std::vector<Chain> chains;
  std::vector<Landing> landings;
};
ArChainTables ar_chain_tables(const OpPlan& p, int rank);

// C rows [r0, r1) x cols [c0, c1) = A * op(B) with fp32 accumulation in k order, stored as T.
// A [.. x k] row-major (lda = k); B W [n x k] (kNK) or B [k x n] (kKN); C ldc = n. Rows are
// split over `threads` workers; each runs ops::gemm_tile_cpu.
void host_gemm(dev::DType t, BLayout layout, const void* a, const void* b, void* c, int64_t k, int64_t n, int64_t r0,
               int64_t r1, int64_t c0, int64_t c1, int me = 0, int threads = 1);

// The host backend's decomposed and fused methods: plan::HostExecutor running an OpPlan's
// tables, with host_gemm as the tile function (docs/gemm_overlap.md).
class HostGemmExec {
 public:
  HostGemmExec(Backend& backend, OpPlan plan, dev::DType dtype, BLayout layout, int64_t k_local, int transfer_workers,
               int tile_workers, const std::string& tag);
  // a: A_r; b: this rank's B; c: C. Appends events to *trace when it is not null.
  void run(const void* a, const void* b, void* c, std::vector<TraceEvent>* trace);

 private:
  GemmOp op_;
  int input_, gemm_, output_;  // plan tensors (OpPlan)
  dev::DType dtype_;
  BLayout layout_;
  int64_t k_local_;
  plan::HostExecutor x_;
};

}  // namespace weft::ops::detail

namespace weft::ops::detail {

// gemm_rs decomposed, RsFold::kGather (2 ranks): plan "gemm_rs.gather_inputs" (gather_plan.cpp),
// the tables the GPU method (DecomposedGpu::gather_rs) and the host tests run. Tensors: inputs
// "a" (A_r, M x k_local) and "b" (B in cfg.b_layout's shape: W[N, k_local] or B[k_local, N]),
// scratch "g_a" [m_shard x k_local] and "g_b" (b's shape). Each rank pushes (copy engine) its
// rows of A for the peer's block into the peer's g_a, then B in column pieces into the peer's
// g_b (W: rows [c0, c1); B: columns [c0, c1)), each push bumping a fresh signal of the peer
// (per-epoch total 1). Schedule over the rank's C block [m_shard x N] ("g_a"'s rows, b read by
// columns: TileSchedule::column_reads): one tile per column piece (tile_cols: ceil(N / chunks)
// rounded up to a multiple of 128, at most N; the last piece shorter), tile n waiting for the A
// push and B piece n. OpPlan: input = "a", gemm = "g_a", output = -1.
OpPlan gather_inputs_plan(const GemmOverlapConfig& cfg, int64_t k_local, int64_t m_shard, int chunks);

}  // namespace weft::ops::detail
