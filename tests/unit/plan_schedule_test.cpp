// Tile schedules: waits from the plan, transforms, the schedule verifier and the lowering.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "weft/core/error.hpp"
#include "weft/plan/schedule.hpp"
#include "weft/plan/templates.hpp"
#include "weft/plan/verify.hpp"

using namespace weft::plan;

namespace {

std::vector<int> row_blocks(const TileSchedule& s, int rank) {
  std::vector<int> ms;
  for (const Tile& t : s.order[static_cast<size_t>(rank)])
    if (ms.empty() || ms.back() != t.m) ms.push_back(t.m);
  return ms;
}

bool has(const VerifyResult& r, const std::string& needle) {
  for (const auto& m : r.messages)
    if (m.find(needle) != std::string::npos) return true;
  return false;
}

// AG+GEMM on 4 ranks: each rank holds 8 rows of A; the gathered A is 32 rows; C is 32x16 in
// 4x8 tiles (8 row blocks x 2 column blocks); every shard goes in 2 chunks of 4 rows.
CommPlan ring4() { return all_gather(AllGatherAlgo::kRing, 4, 8, 64, {.splits = 2}); }

}  // namespace

TEST(PlanSchedule, GemmGridWaitsForTheChunksOfItsRows) {
  const CommPlan p = ring4();
  const TileSchedule s = gemm_schedule(p, "out", 16, 4, 8);
  EXPECT_EQ(s.tiles_m(), 8);
  EXPECT_EQ(s.tiles_n(), 2);
  ASSERT_EQ(s.order[1].size(), size_t{16});
  EXPECT_EQ(s.counters, std::vector<int64_t>(8, 2));
  for (int r = 0; r < 4; ++r)
    for (const Tile& t : s.order[static_cast<size_t>(r)]) {
      ASSERT_EQ(t.waits.size(), size_t{1}) << "tile " << t.m << "," << t.n;
      EXPECT_EQ(t.waits[0].threshold, 1);
      EXPECT_EQ(t.notify, t.m);
    }
  // Tile rows that straddle two chunks wait for both: 6-row tiles over 4-row chunks.
  const TileSchedule wide = row_schedule(p, "out", 6);
  EXPECT_EQ(wide.tiles_m(), 6);
  EXPECT_EQ(wide.order[0][1].waits.size(), size_t{2});  // rows [6,12): chunks [4,8) and [8,12)
  EXPECT_EQ(wide.order[0][5].waits.size(), size_t{1});  // rows [30,32)
  for (int tw : {1, 2, 0})
    for (int cw : {1, 0}) {
      const VerifyResult r = verify_schedule(p, wide, {.comm_workers = cw, .tile_workers = tw});
      EXPECT_TRUE(r.ok) << r.text();
    }
}

TEST(PlanSchedule, OrderByArrivalFollowsTheRing) {
  const CommPlan p = ring4();
  TileSchedule s = gemm_schedule(p, "out", 16, 4, 8);
  order_by_arrival(s, p);
  // Rank 1 has its own shard (rows 8..15: blocks 2,3) first, then what rank 0 sends it at hop 1
  // (shard 0), then shard 3 (hop 2), then shard 2 (hop 3).
  EXPECT_EQ(row_blocks(s, 1), (std::vector<int>{2, 3, 0, 1, 6, 7, 4, 5}));
  EXPECT_EQ(row_blocks(s, 0), (std::vector<int>{0, 1, 6, 7, 4, 5, 2, 3}));
  EXPECT_TRUE(verify_schedule(p, s).ok);
  // A direct all-gather delivers every shard at once: the order is by issue position.
  const CommPlan d = all_gather(AllGatherAlgo::kDirect, 4, 8, 64);
  TileSchedule sd = row_schedule(d, "out", 8);
  order_by_arrival(sd, d);
  // Rank 2 gets its own shard (copy, position 0), then from rank 1 (its first push), rank 0, rank 3.
  EXPECT_EQ(row_blocks(sd, 2), (std::vector<int>{2, 1, 0, 3}));
}

TEST(PlanSchedule, RotateAndSwizzle) {
  const CommPlan p = ring4();
  TileSchedule s = gemm_schedule(p, "out", 16, 4, 8);
  rotate_by_rank(s);
  EXPECT_EQ(row_blocks(s, 1), (std::vector<int>{2, 3, 4, 5, 6, 7, 0, 1}));
  EXPECT_EQ(row_blocks(s, 3), (std::vector<int>{6, 7, 0, 1, 2, 3, 4, 5}));
  swizzle(s, 2);
  // Groups of two row blocks, column by column.
  std::vector<std::pair<int, int>> first6;
  for (size_t k = 0; k < 6; ++k) first6.emplace_back(s.order[1][k].m, s.order[1][k].n);
  EXPECT_EQ(first6, (std::vector<std::pair<int, int>>{{2, 0}, {3, 0}, {2, 1}, {3, 1}, {4, 0}, {5, 0}}));
  EXPECT_TRUE(verify_schedule(p, s).ok);
  EXPECT_THROW(swizzle(s, 0), weft::InvalidArgument);
}

TEST(PlanSchedule, SplitChunksReattachesWaits) {
  CommPlan p = all_gather(AllGatherAlgo::kRing, 2, 8, 4);
  TileSchedule s = row_schedule(p, "out", 2);
  rotate_by_rank(s);
  EXPECT_EQ(s.order[0][0].waits.size(), size_t{1});
  split_chunks(s, p, 4);  // 2-row chunks: one per tile
  EXPECT_EQ(p.num_transfers(), size_t{2 * 4 + 2 * 4});
  EXPECT_EQ(row_blocks(s, 1), (std::vector<int>{4, 5, 6, 7, 0, 1, 2, 3}));
  for (const Tile& t : s.order[1]) EXPECT_EQ(t.waits.size(), size_t{1});
  EXPECT_TRUE(verify(p).ok);
  EXPECT_TRUE(verify_schedule(p, s).ok);
}

TEST(PlanSchedule, VerifierRejectsBrokenSchedules) {
  const CommPlan p = ring4();
  const TileSchedule good = gemm_schedule(p, "out", 16, 4, 8);
  {
    TileSchedule s = good;
    s.order[2][3].waits[0].threshold = 2;
    const VerifyResult r = verify_schedule(p, s);
    ASSERT_FALSE(r.ok);
    EXPECT_EQ(r.messages[0], fmt::format("tile (1,1) on rank 2: threshold 2 but 1 notifies reach signal {} on rank 2",
                                         s.order[2][3].waits[0].signal));
  }
  {
    TileSchedule s = good;
    s.order[0][2].waits.clear();  // tile (1,0): rows [4,8) of rank 0's own shard
    const VerifyResult r = verify_schedule(p, s);
    ASSERT_FALSE(r.ok);
    ASSERT_EQ(r.messages.size(), size_t{1}) << r.text();
    EXPECT_EQ(r.messages[0].rfind("tile (1,0) on rank 0 reads rows [4,8) of 'out' that chunk ", 0), 0u) << r.text();
    EXPECT_NE(r.messages[0].find(" writes, but does not wait for it"), std::string::npos);
  }
  {
    TileSchedule s = good;
    s.order[3][5] = s.order[3][4];
    const VerifyResult r = verify_schedule(p, s);
    EXPECT_TRUE(has(r, "tile (2,0) on rank 3 is scheduled twice")) << r.text();
    EXPECT_TRUE(has(r, "tile (2,1) on rank 3 is never scheduled")) << r.text();
  }
  {
    TileSchedule s = good;
    s.order[3][5].notify = 3;
    const VerifyResult r = verify_schedule(p, s);
    EXPECT_TRUE(has(r, "threshold 2 but 1 notifies reach counter 2 on rank 3")) << r.text();
    EXPECT_TRUE(has(r, "threshold 2 but 3 notifies reach counter 3 on rank 3")) << r.text();
  }
}

TEST(PlanSchedule, ScheduleVerifierFindsCommDeadlockThroughTiles) {
  // Every rank issues its hop-2 forward before its local copy and hop 1: with one transfer
  // worker each waits for a hop 1 that sits behind a blocked forward, and the tiles waiting on
  // those chunks never run.
  CommPlan p = all_gather(AllGatherAlgo::kRing, 3, 4, 4);
  for (auto& q : p.queues) std::rotate(q.begin(), q.begin() + 2, q.end());  // [hop2, copy, hop1]
  const TileSchedule s = row_schedule(p, "out", 4);
  EXPECT_TRUE(verify_schedule(p, s, {.comm_workers = 2, .tile_workers = 1}).ok);
  const VerifyResult r = verify_schedule(p, s, {.comm_workers = 1, .tile_workers = 1});
  ASSERT_FALSE(r.ok);
  EXPECT_EQ(r.messages[0].rfind("deadlock with 1 transfer worker per rank and 1 tile worker per rank: rank 0 worker 0 "
                                "holds chunk ",
                                0),
            0u)
      << r.text();
  EXPECT_NE(r.messages[0].find("rank 0 tiles worker 0 holds tile (0,0) on rank 0"), std::string::npos) << r.text();
}

TEST(PlanLowering, TablesAndClosedForm) {
  const CommPlan p = ring4();
  TileSchedule s = gemm_schedule(p, "out", 16, 4, 8);
  rotate_by_rank(s);
  swizzle(s, 2);
  ASSERT_TRUE(verify_schedule(p, s).ok);
  const Lowered L = lower(p, s);
  ASSERT_EQ(L.ranks.size(), size_t{4});
  const LoweredRank& r1 = L.ranks[1];
  ASSERT_EQ(r1.tiles.size(), size_t{16});
  // Lowered signals guard rows in order: tile rows [8,12) (block 2) wait for signal 2.
  EXPECT_EQ(r1.tiles[0].m, 2);
  ASSERT_EQ(r1.tiles[0].wait_count, 1);
  EXPECT_EQ(r1.tile_waits[static_cast<size_t>(r1.tiles[0].wait_begin)].signal, 2);
  EXPECT_EQ(r1.tile_waits[static_cast<size_t>(r1.tiles[0].wait_begin)].threshold, 1);
  EXPECT_EQ(r1.tiles[0].notify, 2);
  ASSERT_TRUE(L.closed.has_value());
  const ClosedForm& f = *L.closed;
  EXPECT_EQ(f.first_block, (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(f.group, 2);
  EXPECT_EQ(f.rows_per_signal, 4);
  EXPECT_EQ(f.threshold, 1);
  for (int r = 0; r < 4; ++r)
    for (int k = 0; k < 16; ++k) {
      const TileEntry& e = L.ranks[static_cast<size_t>(r)].tiles[static_cast<size_t>(k)];
      EXPECT_EQ(f.tile_at(r, k), std::make_pair(e.m, e.n));
      EXPECT_EQ(f.waits_of(e.m, s.rows).first,
                L.ranks[static_cast<size_t>(r)].tile_waits[static_cast<size_t>(e.wait_begin)].signal);
    }
  // Transfers: rank 1's hop-2 pieces wait for the hop-1 piece that brought their rows.
  // Queue: copy x2, hop1 x2, hop2 x2, hop3 x2.
  ASSERT_EQ(r1.transfers.size(), size_t{8});
  const TransferDesc& hop2 = r1.transfers[4];
  EXPECT_EQ(hop2.kind, static_cast<int32_t>(Kind::kPush));
  EXPECT_EQ(hop2.src_rank, 1);
  EXPECT_EQ(hop2.dst_rank, 2);
  EXPECT_EQ(hop2.src_row, 0);  // shard 0, first piece
  EXPECT_EQ(hop2.rows, 4);
  EXPECT_EQ(hop2.cols, 64);
  ASSERT_EQ(hop2.wait_count, 1);
  EXPECT_EQ(r1.transfer_waits[static_cast<size_t>(hop2.wait_begin)].signal, 0);  // guards rows [0,4) of rank 1's out
  EXPECT_EQ(hop2.signal_rank, 2);
  EXPECT_EQ(hop2.signal, 0);  // rows [0,4) of rank 2's out
  EXPECT_EQ(r1.transfers[0].wait_count, 0);
}

TEST(PlanLowering, IrregularOrderHasNoClosedForm) {
  const CommPlan p = ring4();
  TileSchedule s = gemm_schedule(p, "out", 16, 4, 8);
  order_by_arrival(s, p);
  const Lowered L = lower(p, s);
  EXPECT_FALSE(L.closed.has_value());
  EXPECT_EQ(L.ranks[1].tiles[0].m, 2);
  // Uneven chunks (5 rows in 2 splits: 3 + 2) are not a closed form either.
  const CommPlan u = all_gather(AllGatherAlgo::kDirect, 2, 5, 4, {.splits = 2});
  EXPECT_FALSE(lower(u, row_schedule(u, "out", 1)).closed.has_value());
  // Evenly split rows are, even with a 1-row tile grid.
  const CommPlan e = all_gather(AllGatherAlgo::kDirect, 2, 6, 4, {.splits = 2});
  const Lowered le = lower(e, row_schedule(e, "out", 1));
  ASSERT_TRUE(le.closed.has_value());
  EXPECT_EQ(le.closed->rows_per_signal, 3);
}

// Tiles that write the schedule's tensor (a GEMM whose partial product a reduce-scatter
// reads): lowering makes each transfer wait for the tile counters of the rows it reads on its
// source rank, has those tiles notify the transfer's rank, waits for the signals guarding the
// output before it is read, and names each signal's producer.
static void check_tile_written_lowering(const CommPlan& p, bool remote_output_writes) {
  TileSchedule s = gemm_schedule(p, "in", 8, 2, 8);  // 4 row blocks of 2 rows, one column block
  s.tiles_write = true;
  ASSERT_EQ(s.tiles_m(), 4);
  const Lowered L = lower(p, s);
  const int in = p.tensor_id("in"), out = p.tensor_id("out");
  for (int r = 0; r < 2; ++r) {
    const LoweredRank& lr = L.ranks[static_cast<size_t>(r)];
    ASSERT_EQ(lr.counter_wait_begin.size(), lr.transfers.size() + 1);
    for (size_t i = 0; i < lr.transfers.size(); ++i) {
      const TransferDesc& d = lr.transfers[i];
      std::vector<CounterWait> got(lr.counter_waits.begin() + lr.counter_wait_begin[i],
                                   lr.counter_waits.begin() + lr.counter_wait_begin[i + 1]);
      std::vector<CounterWait> want;
      if (d.src_tensor == in)  // rows [d.src_row, +d.rows) of `in`: row blocks of 2 rows, counter m each
        for (int64_t m = d.src_row / 2; m <= (d.src_row + d.rows - 1) / 2; ++m)
          want.push_back(CounterWait{d.src_rank, static_cast<int32_t>(m), 1});
      EXPECT_EQ(got, want) << "rank " << r << " transfer " << i;
    }
    // Rank r's tiles of the rows the peer reads (the peer's block) notify the peer, only those.
    const int peer = 1 - r;
    ASSERT_EQ(lr.notify_begin.size(), 5u);
    for (int c = 0; c < 4; ++c) {
      std::vector<int32_t> got(lr.notify_ranks.begin() + lr.notify_begin[static_cast<size_t>(c)],
                               lr.notify_ranks.begin() + lr.notify_begin[static_cast<size_t>(c) + 1]);
      bool read_by_peer = false;
      for (const TransferDesc& d : L.ranks[static_cast<size_t>(peer)].transfers)
        if (d.src_tensor == in && d.src_rank == r && d.src_row / 2 <= c && c <= (d.src_row + d.rows - 1) / 2)
          read_by_peer = true;
      EXPECT_EQ(got, read_by_peer ? std::vector<int32_t>{peer} : std::vector<int32_t>{}) << "rank " << r << " c " << c;
    }
    // Every write by the peer into this rank's `out` is waited for before `out` is read.
    std::set<int32_t> want_finals;
    for (const TransferDesc& d : L.ranks[static_cast<size_t>(peer)].transfers)
      if (d.dst_tensor == out && d.dst_rank == r) want_finals.insert(d.signal);
    std::set<int32_t> got_finals;
    for (const WaitEntry& w : lr.final_waits) {
      got_finals.insert(w.signal);
      EXPECT_EQ(w.threshold, lr.signal_expected[static_cast<size_t>(w.signal)]);
    }
    EXPECT_EQ(got_finals, want_finals) << "rank " << r;
    EXPECT_EQ(want_finals.empty(), !remote_output_writes) << p.name;
    // Each signal has one producer: the rank whose transfers bump it.
    ASSERT_EQ(lr.signal_producer.size(), lr.signal_expected.size());
    for (int x = 0; x < 2; ++x)
      for (const TransferDesc& d : L.ranks[static_cast<size_t>(x)].transfers)
        if (d.signal_rank == r) {
          EXPECT_EQ(lr.signal_producer[static_cast<size_t>(d.signal)], x);
        }
  }
  // Tiles that read the tensor (the default) leave transfers without counter waits.
  s.tiles_write = false;
  for (const LoweredRank& lr : lower(p, s).ranks) EXPECT_TRUE(lr.counter_waits.empty());
}

TEST(PlanLowering, TileWrittenRowsAndOutputs) {
  // 2 ranks, `in` 8 rows x 8 cols per rank. Direct reduce-scatter: each rank pulls the peer's
  // block and reduces into its own `out` (no remote writes into an output); two-shot
  // all-reduce: the second shot pushes into the peer's `out` (final waits).
  SCOPED_TRACE("reduce-scatter direct");
  check_tile_written_lowering(reduce_scatter(ReduceScatterAlgo::kDirect, 2, 4, 8), false);
  SCOPED_TRACE("all-reduce two-shot");
  check_tile_written_lowering(all_reduce(AllReduceAlgo::kTwoShot, 2, 8, 8), true);
}

// Bands (TileSchedule::band_rows): the staged reduce-scatter on 3 ranks, 5 rows per shard in
// 2 pieces (3 + 2 rows). With bands of 5 rows the GEMM's row blocks are the pieces of each
// shard, so each push waits for exactly its piece's tile; uniform blocks of 3 rows would
// straddle the shards' edges.
TEST(PlanSchedule, BandsKeepTilesInsideShards) {
  const CommPlan p = reduce_scatter(ReduceScatterAlgo::kStaged, 3, 5, 4, {.splits = 2});
  ASSERT_TRUE(verify(p, {.workers_per_rank = 1}).ok) << verify(p).text();
  TileSchedule s = gemm_schedule(p, "in", 4, 3, 4, 5);
  EXPECT_EQ(s.band_rows, 5);
  ASSERT_EQ(s.tiles_m(), 6);
  const std::vector<std::pair<int64_t, int64_t>> want{{0, 3}, {3, 5}, {5, 8}, {8, 10}, {10, 13}, {13, 15}};
  for (int m = 0; m < 6; ++m) {
    EXPECT_EQ(s.block_rows(m), want[static_cast<size_t>(m)]) << "row block " << m;
    for (int64_t r = want[static_cast<size_t>(m)].first; r < want[static_cast<size_t>(m)].second; ++r)
      EXPECT_EQ(s.block_of(r), m) << "row " << r;
  }
  EXPECT_EQ(gemm_schedule(p, "in", 4, 3, 4).tiles_m(), 5);
  EXPECT_EQ(gemm_schedule(p, "in", 4, 3, 4).block_rows(1), std::make_pair(int64_t{3}, int64_t{6}));
  // Bands that change nothing are stored as 0 (equal grids compare equal).
  EXPECT_EQ(gemm_schedule(p, "in", 4, 5, 4, 5).band_rows, 0);
  EXPECT_EQ(gemm_schedule(p, "in", 4, 3, 4, 15).band_rows, 0);
  EXPECT_THROW(gemm_schedule(p, "in", 4, 3, 4, -1), weft::InvalidArgument);

  s.tiles_write = true;
  const VerifyResult v = verify_schedule(p, s, {.comm_workers = 1, .tile_workers = 1});
  EXPECT_TRUE(v.ok) << v.text();
  const Lowered L = lower(p, s);
  EXPECT_FALSE(L.closed.has_value());
  const int in = p.tensor_id("in");
  for (int r = 0; r < 3; ++r) {
    const LoweredRank& lr = L.ranks[static_cast<size_t>(r)];
    int reads = 0;
    for (size_t i = 0; i < lr.transfers.size(); ++i) {
      const TransferDesc& d = lr.transfers[i];
      if (d.src_tensor != in) continue;
      ++reads;
      ASSERT_EQ(lr.counter_wait_begin[i + 1] - lr.counter_wait_begin[i], 1) << "rank " << r << " chunk " << d.chunk;
      const CounterWait& w = lr.counter_waits[static_cast<size_t>(lr.counter_wait_begin[i])];
      EXPECT_EQ(w.rank, r);
      EXPECT_EQ(s.block_rows(w.counter), std::make_pair(d.src_row, d.src_row + d.rows)) << "chunk " << d.chunk;
    }
    EXPECT_EQ(reads, 6);  // 2 pieces to each of the 2 peers and into the own slot
  }
  TileSchedule bad = s;
  bad.band_rows = -1;
  EXPECT_FALSE(verify_schedule(p, bad).ok);
}

namespace {

// 2 ranks; each pushes its input 'x' [4 x 6] into the peer's 'g' (rows), then its 'w' into
// the peer's 'gw' in column pieces of 2 (transposed: 'w' is [6 x 3], rows = the grid's columns;
// else [3 x 6], columns). A 4 x 6 grid in tiles of 4 x 2 over 'g' reads 'gw' by columns.
CommPlan column_plan(bool transposed) {
  PlanBuilder b("column_reads", 2);
  Tensor t;
  t.role = Role::kInput;
  t.elem_bytes = 4;
  t.name = "x";
  t.rows = 4;
  t.cols = 6;
  const int x = b.add_tensor(t);
  t.name = "w";
  t.rows = transposed ? 6 : 3;
  t.cols = transposed ? 3 : 6;
  const int w = b.add_tensor(t);
  t.role = Role::kScratch;
  t.name = "g";
  t.rows = 4;
  t.cols = 6;
  const int g = b.add_tensor(t);
  t.name = "gw";
  t.rows = transposed ? 6 : 3;
  t.cols = transposed ? 3 : 6;
  const int gw = b.add_tensor(t);
  for (int r = 0; r < 2; ++r) {
    Transfer a;
    a.src = {r, x, Region::rect(0, 4, 0, 6)};
    a.dst = {1 - r, g, Region::rect(0, 4, 0, 6)};
    a.signal = b.new_signal(1 - r);
    b.add(r, a);
    for (int64_t c0 = 0; c0 < 6; c0 += 2) {
      Transfer p;
      const Region reg = transposed ? Region::rect(c0, c0 + 2, 0, 3) : Region::rect(0, 3, c0, c0 + 2);
      p.src = {r, w, reg};
      p.dst = {1 - r, gw, reg};
      p.signal = b.new_signal(1 - r);
      b.add(r, p);
    }
  }
  return b.finish();
}

}  // namespace

// TileSchedule::column_reads: tile n waits for the chunks that write its columns of the read
// tensor (by rows when transposed), the verifier insists on them, and they lower like row waits.
TEST(PlanSchedule, ColumnReadsWaitForTheChunksOfTheirColumns) {
  for (bool transposed : {false, true}) {
    SCOPED_TRACE(transposed ? "transposed" : "by columns");
    const CommPlan p = column_plan(transposed);
    ASSERT_TRUE(verify(p).ok) << verify(p).text();
    TileSchedule s = gemm_schedule(p, "g", 6, 4, 2);
    // Without the column read, every tile waits for the rows of 'g' alone.
    for (const Tile& t : s.order[0]) EXPECT_EQ(t.waits.size(), size_t{1});
    s.column_reads.push_back(ColumnRead{"gw", transposed});
    attach_waits(s, p);
    ASSERT_EQ(s.order[0].size(), size_t{3});
    for (int r = 0; r < 2; ++r)
      for (const Tile& t : s.order[static_cast<size_t>(r)]) {
        // Signals of rank r: 0 for 'g', 1 + n for column piece n.
        const std::vector<TileWait> want{{0, 1}, {1 + t.n, 1}};
        EXPECT_EQ(t.waits, want) << "rank " << r << " tile " << t.n;
      }
    const VerifyResult ok = verify_schedule(p, s, {.comm_workers = 1, .tile_workers = 1});
    EXPECT_TRUE(ok.ok) << ok.text();
    const Lowered L = lower(p, s);
    EXPECT_FALSE(L.closed.has_value());
    const LoweredRank& l1 = L.ranks[1];
    ASSERT_EQ(l1.tiles.size(), size_t{3});
    for (const TileEntry& e : l1.tiles) {
      ASSERT_EQ(e.wait_count, 2);
      // Lowered: the row signal first (it guards the schedule's rows), then the piece's.
      EXPECT_EQ(l1.tile_waits[static_cast<size_t>(e.wait_begin)].signal, 0);
      EXPECT_EQ(l1.tile_waits[static_cast<size_t>(e.wait_begin) + 1].signal, 1 + e.n);
      EXPECT_EQ(l1.signal_producer[static_cast<size_t>(1 + e.n)], 0);
    }

    // A tile without its column piece's wait is refused (and only because of the column read).
    TileSchedule missing = s;
    auto& w = missing.order[1][1].waits;
    w.erase(std::remove_if(w.begin(), w.end(), [](const TileWait& x) { return x.signal == 2; }), w.end());
    const VerifyResult bad = verify_schedule(p, missing);
    EXPECT_FALSE(bad.ok);
    EXPECT_TRUE(has(bad, "tile (0,1) on rank 1 reads grid columns [2,4) of 'gw'")) << bad.text();
    missing.column_reads.clear();
    EXPECT_TRUE(verify_schedule(p, missing).ok);

    // A column read of a tensor the plan lacks, or whose extent is not the grid's columns.
    TileSchedule unknown = s;
    unknown.column_reads[0].tensor = "nope";
    EXPECT_TRUE(has(verify_schedule(p, unknown), "tensor 'nope'"));
    EXPECT_THROW(attach_waits(unknown, p), weft::InvalidArgument);
    TileSchedule flipped = s;
    flipped.column_reads[0].transposed = !transposed;
    EXPECT_TRUE(has(verify_schedule(p, flipped), "the schedule has 6 columns, tensor 'gw'"));
  }
}

// Issue 28 item 19: a GEMM over the output of every template (the ring all-reduce and ring
// reduce-scatter included) verifies: a tile waits for the last chunk writing its rows, and the
// earlier writers (the ring's first copy into the output, which the reduce hops wait for)
// happen before it. Leaving a tile without its waits is still refused.
TEST(PlanSchedule, EveryTemplateScheduleVerifiesWritersBeforeItsWaits) {
  for (int w : {1, 2, 3, 4, 8})
    for (int splits : {1, 2}) {
      TemplateOptions o;
      o.splits = splits;
      const std::vector<CommPlan> plans = {
          all_reduce(AllReduceAlgo::kRing, w, 256 * w, 64, o), all_reduce(AllReduceAlgo::kTwoShot, w, 256 * w, 64, o),
          all_reduce(AllReduceAlgo::kOneShot, w, 256 * w, 64, o),
          reduce_scatter(ReduceScatterAlgo::kRing, w, 256, 64, o),
          reduce_scatter(ReduceScatterAlgo::kDirect, w, 256, 64, o),
          reduce_scatter(ReduceScatterAlgo::kStaged, w, 256, 64, o), all_gather(AllGatherAlgo::kRing, w, 256, 64, o),
          all_gather(AllGatherAlgo::kBidirectionalRing, w, 256, 64, o)};
      for (const CommPlan& p : plans) {
        SCOPED_TRACE(fmt::format("{} world {} splits {}", p.name, w, splits));
        TileSchedule s = gemm_schedule(p, "out", 128, 128, 128);
        const VerifyResult ok = verify_schedule(p, s);
        EXPECT_TRUE(ok.ok) << ok.text();
        if (w < 2) continue;
        for (auto& t : s.order[0]) t.waits.clear();
        const VerifyResult bad = verify_schedule(p, s);
        EXPECT_FALSE(bad.ok);
        EXPECT_TRUE(has(bad, "but does not wait for it")) << bad.text();
      }
    }
}
