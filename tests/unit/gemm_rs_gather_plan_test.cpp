// gemm_rs decomposed with the gathered-inputs fold (RsFold::kGather, 2 ranks): the host runs
// the tables of plan "gemm_rs.gather_inputs", built by gather_inputs_plan, the function the GPU
// method (DecomposedGpu::gather_rs) builds its copies and waits from, through
// plan::HostExecutor (A and B its two inputs), with a tile function that computes the fold's
// GEMMs: C[:, piece] = A_own-rows · B[:, piece] + g_a · g_b[:, piece]. Both B layouts, N a
// multiple of 128 * chunks and not, three calls, C compared bit for bit with the reference;
// the plan's shape (pieces of whole 128-column tiles, each tile waiting for the A push and
// its B piece); the schedule verifier refusing a tile without its B piece's wait.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "gemm_overlap_check.hpp"
#include "ops/gemm_overlap/plan.hpp"
#include "rank_harness.hpp"
#include "weft/core/error.hpp"
#include "weft/device/dtype.hpp"
#include "weft/ops/gemm_overlap.hpp"
#include "weft/plan/host_executor.hpp"
#include "weft/plan/schedule.hpp"
#include "weft/plan/verify.hpp"
#include "weft/runtime/backend.hpp"

using namespace weft;
using namespace weft::ops;
using namespace weft::testing;

namespace {

struct Case {
  int64_t m, k, n;
  int chunks;
};

// N = 512 = 128 * 2 * 2 (two whole 256-column pieces); 300 (a 256-column piece and a 44-column
// one); 700 in 3 (256, 256, 188); 13 (one piece, narrower than a tile); 9 in 4 chunks.
const Case kCases[] = {{10, 16, 512, 2}, {6, 32, 300, 2}, {14, 48, 700, 3}, {6, 16, 13, 3}, {4, 16, 9, 4}};

GemmOverlapConfig config(const Case& c, BLayout layout) {
  return overlap_config({GemmOp::kGemmRs, c.m, c.k, c.n}, dev::DType::kBF16, layout, c.chunks);
}

// The piece width the plan must use: ceil(N / chunks) rounded up to whole 128-column tiles,
// at most N.
int64_t want_tile_cols(const Case& c) { return std::min(c.n, ((c.n + c.chunks - 1) / c.chunks + 127) / 128 * 128); }

}  // namespace

// The plan's shape: per rank the A push then one B push per column piece, each into the
// peer's scratch with a fresh signal of total 1; one tile per piece, waiting for the A push's
// signal and its piece's, both bumped by the peer.
TEST(GemmRsGatherPlan, PiecesAndWaits) {
  for (const Case& c : kCases)
    for (BLayout layout : {BLayout::kNK, BLayout::kKN}) {
      SCOPED_TRACE(fmt::format("{}x{}x{} chunks {} {}", c.m, c.k, c.n, c.chunks, to_string(layout)));
      const GemmOverlapConfig cfg = config(c, layout);
      const detail::OpPlan o = detail::gather_inputs_plan(cfg, c.k / 2, c.m / 2, c.chunks);
      EXPECT_EQ(o.plan.name, "gemm_rs.gather_inputs");
      const int64_t tc = want_tile_cols(c);
      EXPECT_EQ(o.schedule.tile_cols, tc);
      EXPECT_TRUE(tc % 128 == 0 || tc == c.n);
      const int pieces = static_cast<int>((c.n + tc - 1) / tc);
      EXPECT_LE(pieces, c.chunks);
      EXPECT_EQ(o.tiles_m, 1);
      EXPECT_EQ(o.tiles_n, pieces);
      const int gb = o.plan.tensor_id("g_b");
      for (int r = 0; r < 2; ++r) {
        const plan::LoweredRank& lr = o.lowered.ranks[static_cast<size_t>(r)];
        const plan::LoweredRank& lp = o.lowered.ranks[static_cast<size_t>(1 - r)];
        ASSERT_EQ(lr.transfers.size(), static_cast<size_t>(pieces) + 1);
        for (size_t i = 0; i < lr.transfers.size(); ++i) {
          const plan::TransferDesc& d = lr.transfers[i];
          EXPECT_EQ(static_cast<plan::Kind>(d.kind), plan::Kind::kPush);
          EXPECT_EQ(static_cast<plan::Engine>(d.engine), plan::Engine::kCopyEngine);
          EXPECT_EQ(d.dst_tensor, i == 0 ? o.gemm : gb);
          EXPECT_EQ(d.signal_rank, 1 - r);
          EXPECT_EQ(lp.signal_expected[static_cast<size_t>(d.signal)], 1);
          if (i == 0) {  // this rank's rows of A for the peer's block
            EXPECT_EQ(d.src_row, (1 - r) * c.m / 2);
            EXPECT_EQ(d.rows, c.m / 2);
          } else {  // piece i - 1 of B: W's rows or B's columns
            const int64_t c0 = static_cast<int64_t>(i - 1) * tc, c1 = std::min(c.n, c0 + tc);
            EXPECT_EQ(layout == BLayout::kNK ? d.src_row : d.src_col, c0);
            EXPECT_EQ(layout == BLayout::kNK ? d.rows : d.cols, c1 - c0);
          }
        }
        ASSERT_EQ(lr.tiles.size(), static_cast<size_t>(pieces));
        for (size_t j = 0; j < lr.tiles.size(); ++j) {
          const plan::TileEntry& t = lr.tiles[j];
          EXPECT_EQ(t.n, static_cast<int>(j));
          ASSERT_EQ(t.wait_count, 2);
          std::vector<int32_t> got, want{lp.transfers[0].signal, lp.transfers[j + 1].signal};
          for (int32_t k = t.wait_begin; k < t.wait_begin + t.wait_count; ++k) {
            got.push_back(lr.tile_waits[static_cast<size_t>(k)].signal);
            EXPECT_EQ(lr.tile_waits[static_cast<size_t>(k)].threshold, 1);
            EXPECT_EQ(lr.signal_producer[static_cast<size_t>(got.back())], 1 - r);
          }
          std::sort(want.begin(), want.end());
          EXPECT_EQ(got, want);
        }
      }
    }
}

// verify_schedule refuses a tile of the plan without its B piece's wait (the column read of
// g_b), and one without the A push's (the rows of g_a).
TEST(GemmRsGatherPlan, ScheduleVerifierRejectsATileMissingAWait) {
  for (BLayout layout : {BLayout::kNK, BLayout::kKN}) {
    const Case c{6, 32, 300, 2};
    const detail::OpPlan o = detail::gather_inputs_plan(config(c, layout), c.k / 2, c.m / 2, c.chunks);
    ASSERT_TRUE(plan::verify_schedule(o.plan, o.schedule).ok);
    // Rank 1's tile 1 waits for the A push (signal of rank 0's chunk 0) and B piece 1 (chunk 2).
    const plan::Transfer& a_push = o.plan.queues[0][0];
    const plan::Transfer& b_push = o.plan.queues[0][2];
    for (const plan::Transfer* drop : {&b_push, &a_push}) {
      plan::TileSchedule s = o.schedule;
      auto& w = s.order[1][1].waits;
      const size_t before = w.size();
      w.erase(std::remove_if(w.begin(), w.end(),
                             [&](const plan::TileWait& x) { return x.signal == drop->signal.index; }),
              w.end());
      ASSERT_EQ(w.size(), before - 1);
      const plan::VerifyResult v = plan::verify_schedule(o.plan, s);
      EXPECT_FALSE(v.ok);
      const std::string want =
          drop == &b_push ? fmt::format("tile (0,1) on rank 1 reads grid columns [256,300) of 'g_b'")
                          : fmt::format("tile (0,1) on rank 1 reads rows [0,3) of 'g_a' that chunk {}", a_push.chunk);
      EXPECT_NE(v.text().find(want), std::string::npos) << v.text();
    }
  }
}

// The host runs the plan's tables: C exact for both layouts and every case, three calls.
TEST(GemmRsGatherPlan, HostExecutorRunsTheGpuTablesExactly) {
  expect_all_ok(run_host_ranks(2, [] {
    auto backend = make_backend();
    const int rank = backend->rank();
    for (const Case& c : kCases)
      for (BLayout layout : {BLayout::kNK, BLayout::kKN}) {
        const std::string what = fmt::format("gather_inputs {}x{}x{} chunks {} {}", c.m, c.k, c.n, c.chunks,
                                             to_string(layout));
        const GemmOverlapConfig cfg = config(c, layout);
        GemmOverlap op(*backend, cfg);  // sizes the inputs and fills them (gemm_overlap_check.hpp)
        const int64_t k_local = op.a_cols(), m_shard = c.m / 2, n = c.n;
        detail::OpPlan o = detail::gather_inputs_plan(cfg, k_local, m_shard, c.chunks);
        const int b_in = o.plan.tensor_id("b"), g_b = o.plan.tensor_id("g_b");
        plan::HostExecutorOptions opt;
        opt.dtype = cfg.dtype;
        plan::HostExecutor x(*backend, o.plan, o.schedule, o.lowered, "gather_test", opt);
        const auto* a_t = static_cast<const uint16_t*>(x.tensor(o.input));
        const void* b_t = x.tensor(b_in);
        const auto* ga = static_cast<const uint16_t*>(x.tensor(o.gemm));
        const void* gb = x.tensor(g_b);
        std::vector<uint16_t> a(static_cast<size_t>(op.a_rows() * op.a_cols())),
            b(static_cast<size_t>(op.b_rows() * op.b_cols())), own(static_cast<size_t>(m_shard * n)),
            peer(own.size()), cout(own.size());
        for (int64_t e = 1; e <= 3; ++e) {
          fill_overlap_inputs(op, rank, e, /*sparse=*/false, a.data(), b.data());
          std::fill(cout.begin(), cout.end(), uint16_t{0x7fc0});  // NaN
          plan::ExecCall call;
          call.input = a.data();
          call.input_tensor = o.input;
          call.more_inputs = {{b_in, b.data()}};
          // Rows [r0, r1) x cols [c0, c1) of this rank's block: its own K-half (its rows of A,
          // its B, from the executor's input tensors) plus the peer's (g_a, g_b), each a GEMM
          // rounded to bf16 as cuBLAS stores it, added as cuBLAS's epilogue adds C.
          call.tile = [&](const plan::TileEntry&, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
            detail::host_gemm(cfg.dtype, layout, a_t + rank * m_shard * k_local, b_t, own.data(), k_local, n, r0, r1,
                              c0, c1);
            detail::host_gemm(cfg.dtype, layout, ga, gb, peer.data(), k_local, n, r0, r1, c0, c1);
            for (int64_t i = r0; i < r1; ++i)
              for (int64_t j = c0; j < c1; ++j) {
                const size_t q = static_cast<size_t>(i * n + j);
                cout[q] = dev::to_bits16(
                    dev::from_bits16(own[q], cfg.dtype) + dev::from_bits16(peer[q], cfg.dtype), cfg.dtype);
              }
          };
          x.run(call);
          check_overlap_output(op, cout.data(), rank, 2, e, /*sparse=*/false, what);
        }
      }
  }));
}
