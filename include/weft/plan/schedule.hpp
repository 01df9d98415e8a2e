// Tile schedules: the order in which a persistent kernel's workers take output tiles, what
// each tile waits for, and the counter it notifies; transforms that reorder tiles; and the
// lowering of a plan plus a schedule to the flat tables kernels read.
//
// A schedule belongs to one tensor of a plan (`tensor`, e.g. the all-gather's `out`, which
// is A of an AG+GEMM): output tile (m, n) reads rows [m*tile_rows, (m+1)*tile_rows) of it
// (fewer in the last row block) and so waits, on its own rank, for every signal bumped by a
// chunk that writes those rows there, each for its whole per-epoch total.
// After a tile, the worker bumps counter `notify` on its own rank (counters are a slab of
// their own, separate from the plan's signals); counter m counts row block m's tiles, so a
// consumer of row block m (e.g. a reduce-scatter chunk) waits for tiles_n notifies.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "weft/plan/plan.hpp"
#include "weft/plan/verify.hpp"

namespace weft::plan {

struct TileWait {
  int signal = 0;         // index in the plan's signal slab of the tile's own rank
  int64_t threshold = 0;  // per epoch: epoch e waits for e * threshold
  bool operator==(const TileWait&) const = default;
};

struct Tile {
  int m = 0;  // row block
  int n = 0;  // column block (always 0 on a 1-D grid)
  std::vector<TileWait> waits;
  int notify = -1;  // counter bumped after the tile (-1: none)
  bool operator==(const Tile&) const = default;
};

// A further tensor that tiles read by the grid's columns (a GEMM's B operand that the plan
// moves in column pieces): tile (m, n) reads the grid columns [n*tile_cols, ..) of it -- its
// rows of that range when `transposed` (W[N, K]: rows = the grid's columns), else its columns
// (B[K, N]) -- on its own rank, and so waits there for every signal bumped by a chunk that
// writes that range, each for its whole per-epoch total, as for the rows of `tensor`.
struct ColumnRead {
  std::string tensor;
  bool transposed = false;
  bool operator==(const ColumnRead&) const = default;
};

struct TileSchedule {
  int world = 1;
  std::string tensor;  // the plan tensor whose rows tiles wait for
  int64_t rows = 0;    // output rows (M) = rows of `tensor`
  int64_t cols = 0;    // output columns (N); 1-D grids: any, tiles_n == 1
  int64_t tile_rows = 1;
  int64_t tile_cols = 1;
  // Rows are cut into bands of band_rows (0: one band of all rows), and each band into row
  // blocks of tile_rows, the band's last block shorter when tile_rows does not divide it: no
  // tile straddles a band's edge. A reduce-scatter GEMM's bands are the owners' shards, so a
  // tile's rows go to one owner and its tiles are the chunks the transfers move (the split
  // of each shard by split_range). gemm_schedule stores 0 where the bands change nothing.
  int64_t band_rows = 0;
  // order[r]: rank r's tiles, in the order its workers take them. Every tile once per rank.
  std::vector<std::vector<Tile>> order;
  // counters[c]: notifies counter c receives per epoch on every rank.
  std::vector<int64_t> counters;
  // Tiles write `tensor`'s rows (a GEMM whose output the plan's transfers read: reduce-scatter,
  // all-reduce) instead of reading them (an all-gather feeding a GEMM). Lowering then makes the
  // transfers that read those rows wait for the tiles' counters (LoweredRank::counter_waits).
  bool tiles_write = false;
  // Tensors tiles also read by column block (ColumnRead); attach_waits and verify_schedule
  // treat their writers as they treat the writers of `tensor`'s rows.
  std::vector<ColumnRead> column_reads;

  int tiles_m() const;
  int tiles_n() const { return static_cast<int>((cols + tile_cols - 1) / tile_cols); }
  // Rows [r0, r1) of row block m (0 <= m < tiles_m()), and the row block holding `row`.
  std::pair<int64_t, int64_t> block_rows(int m) const;
  int block_of(int64_t row) const;
  bool operator==(const TileSchedule&) const = default;
};

// A GEMM output grid rows x cols in tiles of tile_rows x tile_cols, row-major order on every
// rank, with waits attached from `plan` for `tensor`. Tile (m, n) notifies counter m.
// band_rows > 0: row blocks restart at every multiple of band_rows (TileSchedule::band_rows).
TileSchedule gemm_schedule(const CommPlan& plan, const std::string& tensor, int64_t cols, int64_t tile_rows,
                           int64_t tile_cols, int64_t band_rows = 0);
// A 1-D grid (GEMV-like): row blocks of tile_rows.
TileSchedule row_schedule(const CommPlan& plan, const std::string& tensor, int64_t tile_rows);

// (Re)computes every tile's waits from the plan: the signals of the chunks that write the
// tile's rows of `tensor` on its rank, and its column range of each of `column_reads`, each
// with its declared total as threshold.
void attach_waits(TileSchedule& s, const CommPlan& plan);

// ---- transforms (each keeps every tile once per rank) ----------------------------------

// Longest dependency chain before each chunk of the plan (Kahn over its raw deps; deps on
// chunks the plan does not hold are ignored). Chunks on a cycle, which the verifier rejects,
// get INT32_MAX, so orders built on it put them last.
std::unordered_map<int64_t, int> chain_depth(const CommPlan& plan);

// Stable sort of each rank's tiles by when the chunks they wait for arrive: a chunk's
// arrival is (longest dependency chain before it, position in its issuing queue); a tile's
// is the latest of its chunks'.
void order_by_arrival(TileSchedule& s, const CommPlan& plan);
// Rank r starts at row block r * tiles_m / world (its own shard in an all-gather) and wraps.
void rotate_by_rank(TileSchedule& s);
// L2 reuse: walks `group` consecutive row blocks (in the current order) column by column,
// so the tiles in flight share A rows and B columns.
void swizzle(TileSchedule& s, int group);
// Splits the plan's chunks (split_chunks) and re-attaches the waits, keeping the order.
void split_chunks(TileSchedule& s, CommPlan& plan, int splits);

// ---- verification ------------------------------------------------------------------------

struct ScheduleVerifyOptions {
  int comm_workers = 0;  // workers per rank taking transfers; 0: unlimited
  int tile_workers = 1;  // workers per rank taking tiles; 0: unlimited
  size_t max_messages = 32;
};

// Every tile once per rank; every wait on a declared signal of its rank with a threshold equal
// to the notifies that reach it; every chunk that writes rows a tile reads (or its columns of
// a column read) is waited for;
// counters match the tiles that notify them; and transfers plus tiles make progress with the
// given workers. Does not repeat verify(plan): run that too.
VerifyResult verify_schedule(const CommPlan& plan, const TileSchedule& s, const ScheduleVerifyOptions& opt = {});

// ---- lowering ----------------------------------------------------------------------------

// POD rows of the tables a kernel reads. Thresholds are per epoch.
struct WaitEntry {
  int32_t signal;
  int32_t pad;
  int64_t threshold;
};
struct TileEntry {
  int32_t m, n;
  int32_t wait_begin, wait_count;  // into LoweredRank::tile_waits
  int32_t notify;                  // counter, -1: none
  int32_t pad;
};
struct TransferDesc {
  int64_t chunk;
  int32_t kind, engine;  // Kind, Engine
  int32_t src_rank, src_tensor, dst_rank, dst_tensor;
  int64_t src_row, src_col, dst_row, dst_col, rows, cols;  // elements
  int32_t wait_begin, wait_count;                          // into LoweredRank::transfer_waits
  int32_t signal_rank, signal;                             // -1: none
  int64_t increment;
};

// A schedule whose order and waits follow a formula (row-major, rotated by rank, swizzled in
// groups; uniform chunks): a kernel can compute its tables instead of reading them.
struct ClosedForm {
  int tiles_m = 0, tiles_n = 0;
  std::vector<int> first_block;  // per rank: row block of its first tile (the rotation)
  int group = 1;                 // swizzle group, in row blocks
  int64_t tile_rows = 1;
  int64_t rows_per_signal = 1;  // tile rows [a, b) wait for lowered signals a/rps .. (b-1)/rps
  int64_t threshold = 1;

  // The tile rank r takes k-th.
  std::pair<int, int> tile_at(int rank, int k) const;
  // Lowered signals [first, last] that row block m waits for.
  std::pair<int, int> waits_of(int m, int64_t rows) const;
};

// A wait for a tile counter: counter `counter` of rank `rank`'s tiles, as this rank's copy of
// it (counter slot rank * counters + counter of this rank's counter slab; the tiles' rank
// bumps it here, TileEntry::notify + LoweredRank::notify_ranks), for epoch x threshold.
struct CounterWait {
  int32_t rank;
  int32_t counter;
  int64_t threshold;
  bool operator==(const CounterWait&) const = default;
};

struct LoweredRank {
  std::vector<TileEntry> tiles;  // in the order workers take them
  std::vector<WaitEntry> tile_waits;
  std::vector<TransferDesc> transfers;  // in issue order
  std::vector<WaitEntry> transfer_waits;
  // Tiles that write the schedule's tensor (TileSchedule::tiles_write): transfer i reads rows
  // of it only after counter_waits[counter_wait_begin[i] .. counter_wait_begin[i + 1]).
  std::vector<int32_t> counter_wait_begin;  // transfers + 1 offsets
  std::vector<CounterWait> counter_waits;
  // A tile notifying counter c bumps it on its own rank and on every rank of
  // notify_ranks[notify_begin[c] .. notify_begin[c + 1]) (the ranks whose transfers wait for it).
  std::vector<int32_t> notify_begin;  // counters + 1 offsets
  std::vector<int32_t> notify_ranks;
  // Signals guarding what other ranks' transfers write into this rank's output tensors (role
  // output) where no tile waits for them: the output is complete once these are.
  std::vector<WaitEntry> final_waits;
  // signal_map[old index] = lowered index on this rank. Lowering renumbers each rank's signals
  // so the ones tiles wait for come first, in the row order they guard.
  std::vector<int32_t> signal_map;
  std::vector<int64_t> signal_expected;  // by lowered index
  // By lowered index: the one rank whose transfers bump the signal (-1: several or none), the
  // peer a timed-out wait on it names.
  std::vector<int32_t> signal_producer;
};

struct Lowered {
  int world = 1;
  std::vector<LoweredRank> ranks;
  std::vector<int64_t> counters;
  std::optional<ClosedForm> closed;  // set when the tables follow the formula exactly
  // The largest signal count of any rank: the size of every rank's signal slab.
  int32_t max_signals() const;
};

// Lowers a plan and its schedule (verify them first: lowering assumes a valid plan).
Lowered lower(const CommPlan& plan, const TileSchedule& s);

}  // namespace weft::plan
