// GEMM + communication ops on the host backend (issue 6), world sizes 1, 2, 3, 4, 8:
// ag_gemm, gemm_rs and gemm_ar, every method (baseline, decomposed, fused, auto), both B
// layouts, bf16 and f16, every plan template, shapes that divide no tile or chunk evenly,
// two calls in a row with fresh inputs, compared bit for bit with a plain reference; shapes
// and pointers that must be refused; traces and their summary; the tuning cache; a rank that
// skips a call.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <utility>

#include "gemm_overlap_check.hpp"
#include "rank_harness.hpp"
#include "weft/bench/gemm_overlap_bench.hpp"
#include "weft/bench/shape.hpp"
#include "weft/core/error.hpp"
#include "weft/device/dtype.hpp"
#include "weft/ops/gemm_overlap.hpp"
#include "ops/gemm_overlap/fused.hpp"
#include "ops/gemm_overlap/plan.hpp"
#include "weft/ops/trace.hpp"
#include "weft/runtime/backend.hpp"

using namespace weft;
using namespace weft::ops;
using namespace weft::testing;

namespace {

// 16-byte aligned host buffers of 16-bit elements.
struct Buf {
  std::vector<uint16_t> v;
  explicit Buf(size_t n) : v(n + 8) {}
  uint16_t* p() { return reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(v.data()) + 15) & ~uintptr_t{15}); }
};

struct Inputs {
  Buf a, b;
  Inputs(size_t na, size_t nb) : a(na), b(nb) {}
};

// This rank's A_r and B for call e (dense B: gemm_overlap_check.hpp).
void fill(const GemmOverlap& op, Inputs& in, int rank, int64_t e) {
  fill_overlap_inputs(op, rank, e, /*sparse=*/false, in.a.p(), in.b.p());
}

using Shape = OverlapShape;

// Shapes that divide no tile (8 x 16 on the host) or chunk evenly.
std::vector<Shape> shapes_for(int w) {
  return {{GemmOp::kAgGemm, 5 * w, 24, 13}, {GemmOp::kGemmRs, 5 * w, 16 * w, 13}, {GemmOp::kGemmAr, 11, 8 * w, 7}};
}

std::vector<std::string> algos_for(GemmOp op) {
  if (op == GemmOp::kAgGemm) return {"direct", "ring", "bidir"};
  if (op == GemmOp::kGemmRs) return {"direct", "ring", "staged"};
  return {"two-shot", "one-shot", "ring"};
}

// Runs `calls` calls of each method on one op, each checked exactly.
int run_methods(Backend& b, const GemmOverlapConfig& cfg, const std::vector<GemmMethod>& methods, int calls) {
  GemmOverlap op(b, cfg);
  const int rank = b.rank(), world = b.size();
  Inputs in(static_cast<size_t>(op.a_rows() * op.a_cols()), static_cast<size_t>(op.b_rows() * op.b_cols()));
  Buf out(static_cast<size_t>(op.c_rows() * op.c_cols()));
  int checks = 0;
  int64_t e = 0;
  for (GemmMethod m : methods)
    for (int call = 0; call < calls; ++call) {
      ++e;
      fill(op, in, rank, e);
      std::fill(out.v.begin(), out.v.end(), uint16_t{0x7FC1});  // NaN in bf16 and f16
      op.run(in.a.p(), in.b.p(), out.p(), {.method = m});
      check_overlap_output(op, out.p(), rank, world, e, /*sparse=*/false,
                           fmt::format("{} {} {} {} algo {} world {} chunks {}", to_string(cfg.op), to_string(m),
                                       dev::dtype_name(cfg.dtype), to_string(cfg.b_layout),
                                       cfg.algo.empty() ? "default" : cfg.algo, world, op.chunks()));
      ++checks;
    }
  return checks;
}

GemmOverlapConfig config(const Shape& s, dev::DType t = dev::DType::kBF16, BLayout l = BLayout::kNK, int chunks = 2,
                         std::string algo = "") {
  return overlap_config(s, t, l, chunks, std::move(algo));
}


}  // namespace

class GemmOverlapHost : public ::testing::TestWithParam<int> {};

TEST_P(GemmOverlapHost, EveryOpMethodLayoutAndDtypeIsExact) {
  const int world = GetParam();
  expect_all_ok(run_host_ranks(world, [world] {
    auto b = make_backend();
    const std::vector<GemmMethod> all{GemmMethod::kBaseline, GemmMethod::kDecomposed, GemmMethod::kFused,
                                      GemmMethod::kAuto};
    int checks = 0;
    for (const Shape& s : shapes_for(world)) {
      checks += run_methods(*b, config(s, dev::DType::kBF16, BLayout::kNK), all, 2);
      checks += run_methods(*b, config(s, dev::DType::kBF16, BLayout::kKN), all, 1);
      checks += run_methods(*b, config(s, dev::DType::kF16, BLayout::kKN, 3), all, 1);
    }
    WEFT_CHECK(checks == 3 * 4 * 4, fmt::format("{} checks ran", checks));
  }));
}

TEST_P(GemmOverlapHost, EveryPlanTemplateAndChunkCount) {
  const int world = GetParam();
  expect_all_ok(run_host_ranks(world, [world] {
    auto b = make_backend();
    for (const Shape& s : shapes_for(world))
      for (const std::string& algo : algos_for(s.op))
        for (int chunks : {1, 4, 9})  // 9 > rows per shard: clamped
          run_methods(*b, config(s, dev::DType::kBF16, BLayout::kNK, chunks, algo),
                      {GemmMethod::kDecomposed, GemmMethod::kFused}, 1);
  }));
}

INSTANTIATE_TEST_SUITE_P(Worlds, GemmOverlapHost, ::testing::Values(1, 2, 3, 4, 8));

// Shapes that do not divide the world, K per rank not a multiple of 8, other dtypes, bad
// pointers: refused on every rank, with a message that names the shape and the world.
TEST(GemmOverlapHostErrors, ShapesAndPointersAreRefusedClearly) {
  expect_all_ok(run_host_ranks(3, [] {
    auto b = make_backend();
    std::string got;
    auto expect = [&](const GemmOverlapConfig& c, const std::string& want) {
      const std::string got = message_of([&] { GemmOverlap op(*b, c); });
      WEFT_CHECK(got.find(want) != std::string::npos, fmt::format("expected '{}' in: {}", want, got));
    };
    expect(config({GemmOp::kAgGemm, 10, 16, 8}),
           "ag_gemm: M x K x N = 10 x 16 x 8: M = 10 does not divide among 3 ranks");
    expect(config({GemmOp::kGemmRs, 10, 48, 8}),
           "gemm_rs: M x K x N = 10 x 48 x 8: M = 10 does not divide among 3 ranks");
    expect(config({GemmOp::kGemmRs, 12, 40, 8}),
           "gemm_rs: M x K x N = 12 x 40 x 8: K = 40 does not divide among 3 ranks");
    // K per rank not a multiple of 8: the baseline runs the operands as they are, decomposed
    // and fused on K padded to 16 (exact, both B layouts; auto picks the padded op's choice on
    // the host backend); gathered_a is the baseline's only.
    for (const Shape& s : {Shape{GemmOp::kGemmAr, 12, 36, 8}, Shape{GemmOp::kAgGemm, 12, 12, 8},
                           Shape{GemmOp::kGemmRs, 12, 36, 8}}) {
      const std::vector<GemmMethod> all{GemmMethod::kBaseline, GemmMethod::kDecomposed, GemmMethod::kFused,
                                        GemmMethod::kAuto};
      WEFT_CHECK(run_methods(*b, config(s), all, 2) == 8, "unaligned K");
      WEFT_CHECK(run_methods(*b, config(s, dev::DType::kF16, BLayout::kKN), all, 2) == 8, "unaligned K, B [K x N]");
      GemmOverlap op(*b, config(s));
      WEFT_CHECK(op.auto_choice().method == GemmMethod::kDecomposed &&
                     op.auto_choice().source.find("K per rank = 12 padded to 16") == 0,
                 op.auto_choice().source);
      WEFT_CHECK(op.available_methods().size() == 3, "unaligned K: every method");
      if (s.op == GemmOp::kAgGemm) {
        Buf a(static_cast<size_t>(op.a_rows() * op.a_cols())), w(static_cast<size_t>(op.b_rows() * op.b_cols())),
            c(static_cast<size_t>(op.c_rows() * op.c_cols())), g(static_cast<size_t>(12 * 12));
        got = message_of(
            [&] { op.run(a.p(), w.p(), c.p(), {.method = GemmMethod::kDecomposed, .gathered_a = g.p()}); });
        WEFT_CHECK(got.find("gathered_a with K per rank = 12 (not a multiple of 8): only the baseline") !=
                       std::string::npos,
                   got);
      }
    }
    expect(config({GemmOp::kAgGemm, 12, 16, 0}), "every dimension must be at least 1");
    expect(config({GemmOp::kAgGemm, 12, 16, 8}, dev::DType::kF32), "dtype f32 (GEMM ops take bf16 or f16 inputs)");
    expect(config({GemmOp::kGemmRs, 12, 48, 8}, dev::DType::kBF16, BLayout::kNK, 2, "bidir"),
           "gemm_rs: unknown plan algo 'bidir' (expected direct, ring, staged)");
    expect(config({GemmOp::kAgGemm, 12, 16, 8}, dev::DType::kBF16, BLayout::kNK, -1), "-1 chunks");

    GemmOverlap op(*b, config({GemmOp::kAgGemm, 12, 16, 8}));
    Buf a(64), w(128), c(96);
    got = message_of([&] { op.run(a.p() + 1, w.p(), c.p()); });
    WEFT_CHECK(got.find("A: pointer") != std::string::npos && got.find("is not aligned to 16 bytes") != std::string::npos,
               got);
    got = message_of([&] { op.run(a.p(), nullptr, c.p()); });
    WEFT_CHECK(got.find("B: null pointer") != std::string::npos, got);
    got = message_of([&] { op.run(a.p(), w.p(), a.p()); });
    WEFT_CHECK(got.find("C overlaps A or B") != std::string::npos, got);
    WEFT_CHECK(parse_gemm_method("decomposed") == GemmMethod::kDecomposed, "parse");
    got = message_of([] { parse_gemm_method("chunked"); });
    WEFT_CHECK(got.find("unknown method 'chunked'") != std::string::npos, got);
    got = message_of([] { parse_gemm_op("gemm_a2a"); });
    WEFT_CHECK(got.find("expected ag_gemm, gemm_rs or gemm_ar") != std::string::npos, got);
  }));
}

// Ranks that construct one op with different configurations are refused at construction,
// every rank with the same message naming both configurations (not a symmetric-allocation
// mismatch or a hang later).
TEST(GemmOverlapHostErrors, RanksThatDisagreeAreRefused) {
  expect_all_ok(run_host_ranks(3, [] {
    auto b = make_backend();
    const int r = b->rank();
    std::string got = message_of([&] { GemmOverlap op(*b, config({GemmOp::kAgGemm, r == 2 ? 24 : 12, 16, 8})); });
    WEFT_CHECK(got.find("ranks disagree on the configuration: rank 0 has ag_gemm M x K x N = 12 x 16 x 8 bf16 "
                        "nk chunks 2, rank 2 has ag_gemm M x K x N = 24 x 16 x 8") != std::string::npos,
               got);
    got = message_of([&] {
      GemmOverlap op(*b, config({GemmOp::kGemmRs, 12, 48, 8}, r == 1 ? dev::DType::kF16 : dev::DType::kBF16));
    });
    WEFT_CHECK(got.find("rank 1 has gemm_rs M x K x N = 12 x 48 x 8 f16") != std::string::npos, got);
    // Agreeing ranks still build the op.
    GemmOverlap op(*b, config({GemmOp::kAgGemm, 12, 16, 8}));
  }));
}

// Host-only builds link the hook's stub: unavailable, and it says so when called.
#ifndef WEFT_HAVE_CUDA  // a CUDA build links the fused kernel instead (tests/gpu covers it)
TEST(GemmOverlapFusedHook, StubRefusesClearly) {
  EXPECT_FALSE(fused::fused_available());
  const std::string msg = message_of([] { fused::make_state(fused::FusedArgs{}); });
  EXPECT_TRUE(!msg.empty() && msg != "(no exception)") << msg;
}
#endif

// `auto` reads the tuning cache (rank 0's copy, broadcast): a stored choice wins.
TEST(GemmOverlapHostAuto, TuningCacheIsUsed) {
  const std::string path = fmt::format("/tmp/weft-tune-test-{}.json", ::getpid());
  std::filesystem::remove(path);
  expect_all_ok(run_host_ranks(2, [path] {
    auto b = make_backend();
    GemmOverlapConfig c = config({GemmOp::kGemmRs, 10, 32, 9}, dev::DType::kBF16, BLayout::kNK, 0);
    c.tune_cache = path;
    {
      GemmOverlap op(*b, c);
      WEFT_CHECK(op.auto_choice().method == GemmMethod::kDecomposed, op.auto_choice().source);
      WEFT_CHECK(op.auto_choice().source.find("host backend default") != std::string::npos, op.auto_choice().source);
      op.store_tuning(GemmMethod::kBaseline, 3, 12.5);
    }
    b->barrier();
    GemmOverlap op(*b, c);
    WEFT_CHECK(op.auto_choice().method == GemmMethod::kBaseline && op.chunks() == 3,
               fmt::format("auto: {} chunks {} from {}", to_string(op.auto_choice().method), op.chunks(),
                           op.auto_choice().source));
    WEFT_CHECK(op.auto_choice().source == "tuning cache " + path, op.auto_choice().source);
    WEFT_CHECK(op.tuning_key().rfind("gemm_rs|", 0) == 0, op.tuning_key());
    run_methods(*b, c, {GemmMethod::kAuto}, 1);
  }));
  std::filesystem::remove(path);
}

// A cache entry with fields of the wrong type or range (or an unknown method, or a file that
// is not a JSON object) is ignored: the op is built, `auto` decides without it.
TEST(GemmOverlapHostAuto, BrokenTuningCacheEntriesAreIgnored) {
  const std::string path = fmt::format("/tmp/weft-tune-broken-{}.json", ::getpid());
  const std::vector<std::string> entries = {
      R"({"method": "baseline", "chunks": "abc"})", R"({"method": 5, "chunks": 2})",
      R"({"method": "baseline", "chunks": -3})",    R"({"method": "baseline", "chunks": 1e300})",
      R"({"method": "chunked", "chunks": 2})",      R"("baseline")"};
  for (const std::string& entry : entries) {
    SCOPED_TRACE(entry);
    expect_all_ok(run_host_ranks(2, [path, entry] {
      auto b = make_backend();
      GemmOverlapConfig c = config({GemmOp::kGemmRs, 10, 32, 9}, dev::DType::kBF16, BLayout::kNK, 0);
      c.tune_cache = path;
      if (b->rank() == 0) {
        GemmOverlap probe(*b, c);  // collective: every rank builds it
        std::ofstream(path) << "{\"" << probe.tuning_key() << "\": " << entry << "}\n";
      } else {
        GemmOverlap probe(*b, c);
      }
      b->barrier();
      GemmOverlap op(*b, c);
      WEFT_CHECK(op.auto_choice().source.find("tuning cache") == std::string::npos, op.auto_choice().source);
      run_methods(*b, c, {GemmMethod::kAuto}, 1);
    }));
  }
  std::ofstream(path) << "[1, 2, 3]\n";  // not an object
  expect_all_ok(run_host_ranks(2, [path] {
    auto b = make_backend();
    GemmOverlapConfig c = config({GemmOp::kAgGemm, 12, 16, 8});
    c.tune_cache = path;
    GemmOverlap op(*b, c);
    WEFT_CHECK(op.auto_choice().source.find("tuning cache") == std::string::npos, op.auto_choice().source);
  }));
  std::filesystem::remove(path);
}

// The tables the GPU methods upload (fused: 128 x 128 tiles, SM transfers; decomposed
// ag_gemm: a tile per chunk of rows, copy-engine transfers) come from the same plan functions
// (fused_plan_params, decomposed_plan_params + build_op_plan) that this test hands to the host
// executor: CI runs exactly the GPU methods' protocol, exact, for worlds 2-4 and 2 calls.
TEST(GemmOverlapHostGpuTables, TheGpuMethodsTablesRunExactlyOnTheHost) {
  for (int w : {2, 3, 4}) {
    SCOPED_TRACE(fmt::format("world {}", w));
    expect_all_ok(run_host_ranks(w, [] {
      auto b = make_backend();
      const int rank = b->rank(), world = b->size();
      // Row blocks of 128 with a partial last one per shard, two column blocks (the last partial).
      // gemm_ar: the last shard one row shorter.
      for (const Shape& sh : {Shape{GemmOp::kAgGemm, 300 * world, 24, 200},
                              Shape{GemmOp::kGemmRs, 260 * world, 16 * world, 200},
                              Shape{GemmOp::kGemmAr, 260 * world - 1, 16 * world, 200}}) {
        const GemmOverlapConfig cfg = config(sh, dev::DType::kBF16, BLayout::kNK, 3);
        GemmOverlap op(*b, cfg);  // for the shapes, inputs and reference
        // gemm_rs decomposed: m_shard is the shard's rows, C's (a_rows() is all of M there);
        // gemm_ar: the shard rows of its plan.
        const int64_t m_shard = sh.op == GemmOp::kAgGemm   ? op.a_rows()
                                : sh.op == GemmOp::kGemmRs ? op.c_rows()
                                                           : (op.c_rows() + world - 1) / world;
        const std::vector<std::pair<std::string, detail::OpPlanParams>> plans = {
            {"fused", detail::fused_plan_params(cfg, world, op.a_cols(), op.chunks())},
            {"decomposed", detail::decomposed_plan_params(cfg, world, op.a_cols(), op.chunks(), m_shard)}};
        for (const auto& [name, params] : plans) {
          detail::OpPlan plan = detail::build_op_plan(params);
          if (sh.op == GemmOp::kGemmRs && name == "decomposed") {
            // What the GPU method reads of these tables (rs_decomposed_tables, at its setup)
            // fits every rank's: the pieces (3 chunks: 87 + 87 + 86 rows of a 260-row shard,
            // the tiles of its band), a push of each to each peer, the sums' waits.
            for (int r = 0; r < world; ++r) {
              const detail::RsDecomposedTables t = detail::rs_decomposed_tables(plan, r, m_shard);
              WEFT_CHECK(t.pieces.size() == 3 && t.pieces[1].r0 == 87 && t.pieces[2].r1 == 260 &&
                             t.pushes.size() == static_cast<size_t>(3 * (world - 1)) &&
                             t.own_tiles_begin == 3 * (world - 1) && t.pushes.back().tiles_end == t.own_tiles_begin,
                         fmt::format("rank {}: {} pieces, {} pushes, own tiles from {}", r, t.pieces.size(),
                                     t.pushes.size(), t.own_tiles_begin));
              for (const auto& pc : t.pieces)
                WEFT_CHECK(pc.waits.size() == static_cast<size_t>(world - 1),
                           fmt::format("rank {}: rows [{},{}) wait for {} pushes", r, pc.r0, pc.r1, pc.waits.size()));
            }
          }
          if (sh.op == GemmOp::kGemmAr && name == "decomposed") {
            // What the GPU method reads of these tables (ar_chain_tables): per rank its sums
            // (3 pieces of its shard: 87 + 87 + 86 rows, or 86 + 86 + 87 of the last, shorter
            // one), each adding every rank's rows and pushed to every peer, waiting for the
            // tiles of those rows on every rank; the peers' sums landing in the other rows.
            for (int r = 0; r < world; ++r) {
              const detail::ArChainTables t = detail::ar_chain_tables(plan, r);
              WEFT_CHECK(t.chains.size() == 3 && t.landings.size() == static_cast<size_t>(3 * (world - 1)) &&
                             t.chains[0].r0 == r * m_shard && t.chains[0].r1 == r * m_shard + 87,
                         fmt::format("rank {}: {} sums, {} landings, the first rows [{},{})", r, t.chains.size(),
                                     t.landings.size(), t.chains[0].r0, t.chains[0].r1));
              for (const auto& c : t.chains)
                WEFT_CHECK(c.sources.size() == static_cast<size_t>(world) && c.sources[0] == r &&
                               c.signals.size() == static_cast<size_t>(world - 1) &&
                               c.tile_waits.size() == static_cast<size_t>(world) && c.after_tile >= 1,
                           fmt::format("rank {}: the sum of rows [{},{}) adds {} ranks, pushes to {}, waits for {} "
                                       "tiles",
                                       r, c.r0, c.r1, c.sources.size(), c.signals.size(), c.tile_waits.size()));
              // Interleaved pieces: every rank's first sum needs only the first `world` tiles.
              WEFT_CHECK(t.chains[0].after_tile <= world && t.chains[2].after_tile > 2 * world,
                         fmt::format("rank {}: sums after tiles {} and {}", r, t.chains[0].after_tile,
                                     t.chains[2].after_tile));
              for (const auto& l : t.landings)
                WEFT_CHECK(l.waits.size() == 1 && l.producers[0] == static_cast<int>(l.r0 / m_shard),
                           fmt::format("rank {}: rows [{},{}) land from {} waits", r, l.r0, l.r1, l.waits.size()));
            }
          }
          detail::HostGemmExec exec(*b, std::move(plan), cfg.dtype, cfg.b_layout, op.a_cols(), 1, 1,
                                    fmt::format("gpu-tables.{}.{}", to_string(cfg.op), name));
          Inputs in(static_cast<size_t>(op.a_rows() * op.a_cols()), static_cast<size_t>(op.b_rows() * op.b_cols()));
          Buf out(static_cast<size_t>(op.c_rows() * op.c_cols()));
          for (int64_t e = 1; e <= 2; ++e) {
            fill(op, in, rank, e);
            std::fill(out.v.begin(), out.v.end(), uint16_t{0x7FC1});
            exec.run(in.a.p(), in.b.p(), out.p(), nullptr);
            check_overlap_output(op, out.p(), rank, world, e, /*sparse=*/false,
                                 fmt::format("{}'s GPU {} tables on the host, world {}", to_string(cfg.op), name, world));
          }
        }
      }
    }));
  }
}

// Decomposed gemm_ar's tables fit what the GPU method runs of them (ar_chain_tables) for
// Ms below, at and above the world (ranks owning no rows), chunk counts that do and do not
// divide the shards, and worlds 2-8: every row summed by one rank and landing on the others.
TEST(GemmOverlapHostGpuTables, GemmArSumsFitEveryShape) {
  for (int w : {2, 3, 4, 8})
    for (int64_t m : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{64}, int64_t{1000}})
      for (int chunks : {1, 3, 4}) {
        GemmOverlapConfig cfg = config({GemmOp::kGemmAr, m, 8 * w, 24}, dev::DType::kBF16, BLayout::kNK, chunks);
        const int64_t m_shard = (m + w - 1) / w;
        const int ch = static_cast<int>(std::min<int64_t>(chunks, m_shard));
        const detail::OpPlan plan = detail::build_op_plan(detail::decomposed_plan_params(cfg, w, 8, ch, m_shard));
        std::vector<int64_t> summed(static_cast<size_t>(m), 0), landed(static_cast<size_t>(m), 0);
        for (int r = 0; r < w; ++r) {
          const detail::ArChainTables t = detail::ar_chain_tables(plan, r);
          for (const auto& c : t.chains)
            for (int64_t i = c.r0; i < c.r1; ++i) ++summed[static_cast<size_t>(i)];
          for (const auto& l : t.landings)
            for (int64_t i = l.r0; i < l.r1; ++i) ++landed[static_cast<size_t>(i)];
        }
        for (int64_t i = 0; i < m; ++i)
          ASSERT_TRUE(summed[static_cast<size_t>(i)] == 1 && landed[static_cast<size_t>(i)] == w - 1)
              << fmt::format("world {} M {} chunks {}: row {} summed {} times, landed {} times", w, m, chunks, i,
                             summed[static_cast<size_t>(i)], landed[static_cast<size_t>(i)]);
      }
}

// One op object, every M up to its maximum (issue 21): gemm_ar with M = 1, 7, 64, 4096 from
// one object, prepared Ms on every method and an unprepared one (100) on the baseline, the
// calls interleaved and each exact; ag_gemm and gemm_rs (Ms that are multiples of the world).
TEST(GemmOverlapHostEveryM, OneObjectServesEveryM) {
  for (int w : {1, 2, 3}) {
    SCOPED_TRACE(fmt::format("world {}", w));
    expect_all_ok(run_host_ranks(w, [] {
      auto b = make_backend();
      const int rank = b->rank(), world = b->size();
      struct Case {
        Shape shape;
        std::vector<int64_t> buckets, calls;
      };
      const std::vector<Case> cases = {
          {{GemmOp::kGemmAr, 4096, 8 * world, 5}, {1, 7, 64}, {1, 4096, 7, 64, 100, 1, 7}},
          {{GemmOp::kAgGemm, 96 * world, 24, 13}, {world, 8 * world}, {world, 96 * world, 8 * world, 5 * world}},
          {{GemmOp::kGemmRs, 96 * world, 16 * world, 13}, {world, 8 * world}, {8 * world, world, 3 * world, 96 * world}},
      };
      const std::vector<GemmMethod> all{GemmMethod::kBaseline, GemmMethod::kDecomposed, GemmMethod::kFused,
                                        GemmMethod::kAuto};
      for (const Case& cs : cases) {
        GemmOverlapConfig cfg = config(cs.shape, dev::DType::kBF16, BLayout::kNK, 2);
        cfg.m_buckets = cs.buckets;
        GemmOverlap op(*b, cfg);
        std::vector<int64_t> want = cs.buckets;
        want.push_back(cfg.m);
        std::sort(want.begin(), want.end());
        WEFT_CHECK(op.prepared_m() == want, "prepared_m() is not the buckets and M");
        Inputs in(static_cast<size_t>(op.a_rows() * op.a_cols()), static_cast<size_t>(op.b_rows() * op.b_cols()));
        Buf out(static_cast<size_t>(op.c_rows() * op.c_cols()));
        int64_t e = 0;
        for (int64_t m : cs.calls) {
          const bool prepared = std::find(want.begin(), want.end(), m) != want.end();
          WEFT_CHECK(prepared || op.auto_choice(m).method == GemmMethod::kBaseline,
                     fmt::format("auto for the unprepared M = {} is not the baseline", m));
          for (GemmMethod method : all) {
            ++e;
            fill_overlap_inputs(op, rank, e, /*sparse=*/false, in.a.p(), in.b.p(), m);
            std::fill(out.v.begin(), out.v.end(), uint16_t{0x7FC1});
            op.run(in.a.p(), in.b.p(), out.p(), {.method = method, .m = m});
            check_overlap_output(op, out.p(), rank, world, e, /*sparse=*/false,
                                 fmt::format("{} {} M = {} of {} world {}", to_string(cfg.op), to_string(method), m,
                                             cfg.m, world),
                                 m);
            // Rows past the call's C stay untouched.
            for (size_t i = static_cast<size_t>(op.c_rows(m) * op.c_cols()); i < static_cast<size_t>(op.c_rows() * op.c_cols()); ++i)
              WEFT_CHECK(out.p()[i] == 0x7FC1, fmt::format("{} M = {} wrote past its C", to_string(method), m));
          }
        }
      }
    }));
  }
}

// ag_gemm's gathered_a: every method leaves A of every rank there, for prepared and
// unprepared Ms; other ops and overlapping buffers are refused.
TEST(GemmOverlapHostGathered, EveryMethodLeavesTheGatheredA) {
  for (int w : {1, 2, 3}) {
    SCOPED_TRACE(fmt::format("world {}", w));
    expect_all_ok(run_host_ranks(w, [] {
      auto b = make_backend();
      const int rank = b->rank(), world = b->size();
      GemmOverlapConfig cfg = config({GemmOp::kAgGemm, 16 * world, 24, 40}, dev::DType::kBF16, BLayout::kNK, 2);
      cfg.m_buckets = {4 * world};
      GemmOverlap op(*b, cfg);
      Inputs in(static_cast<size_t>(op.a_rows() * op.a_cols()), static_cast<size_t>(op.b_rows() * op.b_cols()));
      Buf out(static_cast<size_t>(op.c_rows() * op.c_cols()));
      Buf gathered(static_cast<size_t>(cfg.m * op.a_cols()));
      int64_t e = 0;
      for (int64_t m : {16 * world, 4 * world, 2 * world}) {
        for (GemmMethod method : {GemmMethod::kBaseline, GemmMethod::kDecomposed, GemmMethod::kFused, GemmMethod::kAuto}) {
          ++e;
          fill_overlap_inputs(op, rank, e, /*sparse=*/false, in.a.p(), in.b.p(), m);
          std::fill(gathered.v.begin(), gathered.v.end(), uint16_t{0x7FC1});
          op.run(in.a.p(), in.b.p(), out.p(), {.method = method, .m = m, .gathered_a = gathered.p()});
          const std::string what = fmt::format("{} M = {}", to_string(method), m);
          check_overlap_output(op, out.p(), rank, world, e, /*sparse=*/false, what, m);
          const int64_t shard = m / world;
          for (int64_t g = 0; g < m; ++g)
            for (int64_t k = 0; k < op.a_cols(); ++k) {
              const uint16_t want = dev::to_bits16(weft::testing::overlap_a(g, k, e), cfg.dtype);
              WEFT_CHECK(gathered.p()[g * op.a_cols() + k] == want,
                         fmt::format("{}: gathered A row {} (rank {}'s) col {} is wrong", what, g, g / shard, k));
            }
          for (size_t i = static_cast<size_t>(m * op.a_cols()); i < gathered.v.size(); ++i)
            WEFT_CHECK(gathered.p()[i] == 0x7FC1, fmt::format("{}: wrote past the gathered A", what));
        }
      }
      std::string got = message_of([&] { op.run(in.a.p(), in.b.p(), out.p(), {.gathered_a = out.p()}); });
      WEFT_CHECK(got.find("gathered_a overlaps A, B or C") != std::string::npos, got);
      GemmOverlap rs(*b, config({GemmOp::kGemmRs, 8 * world, 8 * world, 16}, dev::DType::kBF16, BLayout::kNK, 1));
      Inputs ri(static_cast<size_t>(rs.a_rows() * rs.a_cols()), static_cast<size_t>(rs.b_rows() * rs.b_cols()));
      Buf ro(static_cast<size_t>(rs.c_rows() * rs.c_cols()));
      got = message_of([&] { rs.run(ri.a.p(), ri.b.p(), ro.p(), {.gathered_a = gathered.p()}); });
      WEFT_CHECK(got.find("gathered_a is for ag_gemm only") != std::string::npos, got);
    }));
  }
}

TEST(GemmOverlapHostEveryM, BadMsAreRefusedClearly) {
  expect_all_ok(run_host_ranks(2, [] {
    auto b = make_backend();
    GemmOverlapConfig cfg = config({GemmOp::kAgGemm, 32, 24, 13});
    cfg.m_buckets = {7};
    const std::string odd = message_of([&] { GemmOverlap op(*b, cfg); });
    WEFT_CHECK(odd.find("m_buckets: M = 7 does not divide among 2 ranks") != std::string::npos, odd);
    cfg.m_buckets = {64};
    const std::string big = message_of([&] { GemmOverlap op(*b, cfg); });
    WEFT_CHECK(big.find("m_buckets: M = 64 is outside 1 .. 32") != std::string::npos, big);
    cfg.m_buckets = {8};
    GemmOverlap op(*b, cfg);
    Inputs in(static_cast<size_t>(op.a_rows() * op.a_cols()), static_cast<size_t>(op.b_rows() * op.b_cols()));
    Buf out(static_cast<size_t>(op.c_rows() * op.c_cols()));
    for (int64_t m : {int64_t{0} - 2, int64_t{33}, int64_t{5}}) {
      const std::string msg = message_of([&] { op.run(in.a.p(), in.b.p(), out.p(), {.m = m}); });
      WEFT_CHECK(msg.find(fmt::format("this call's M = {}", m)) != std::string::npos, msg);
    }
  }));
}

// A hand-made Chrome trace: comm [0,10) and [30,40), compute [5,35): 10 of 20 us hidden.
TEST(GemmOverlapTrace, SummaryMeasuresHiddenCommunication) {
  nlohmann::json t = {{"traceEvents",
                       {{{"ph", "X"}, {"cat", "comm"}, {"pid", 0}, {"tid", 1}, {"ts", 0.0}, {"dur", 10.0}},
                        {{"ph", "X"}, {"cat", "comm"}, {"pid", 0}, {"tid", 2}, {"ts", 30.0}, {"dur", 10.0}},
                        {{"ph", "X"}, {"cat", "comm"}, {"pid", 0}, {"tid", 1}, {"ts", 32.0}, {"dur", 2.0}},
                        {{"ph", "X"}, {"cat", "compute"}, {"pid", 0}, {"tid", 0}, {"ts", 5.0}, {"dur", 30.0}},
                        {{"ph", "M"}, {"name", "thread_name"}, {"pid", 0}, {"tid", 0}}}}};
  const auto s = summarize_trace(t.dump());
  ASSERT_EQ(s.size(), 1u);
  EXPECT_DOUBLE_EQ(s[0].comm_us, 20.0);
  EXPECT_DOUBLE_EQ(s[0].compute_us, 30.0);
  EXPECT_DOUBLE_EQ(s[0].overlap_us, 10.0);
  EXPECT_DOUBLE_EQ(s[0].hidden, 0.5);
  EXPECT_DOUBLE_EQ(s[0].span_us, 40.0);
  EXPECT_NE(format_trace_summary(s).find("communication hidden behind computation: 50.0%"), std::string::npos);
  EXPECT_THROW(summarize_trace("{}"), InvalidArgument);
  EXPECT_THROW(summarize_trace("{\"traceEvents\": ["), InvalidArgument);  // not JSON
  EXPECT_THROW(to_chrome_trace({}, "{"), InvalidArgument);                // metadata not JSON
}

// Traced calls on two ranks: every transfer and tile of the plan appears once per call, on
// lanes named after the workers; the gathered Chrome trace summarises; `weft trace` prints it.
TEST(GemmOverlapTrace, HostRunsRecordEveryChunkAndTile) {
  const std::string path = fmt::format("/tmp/weft-trace-test-{}.json", ::getpid());
  expect_all_ok(run_host_ranks(2, [path] {
    auto b = make_backend();
    for (GemmOp o : {GemmOp::kAgGemm, GemmOp::kGemmRs, GemmOp::kGemmAr}) {
      const Shape s = o == GemmOp::kAgGemm ? Shape{o, 16, 32, 24} : Shape{o, 16, 32, 24};
      GemmOverlap op(*b, config(s, dev::DType::kBF16, BLayout::kNK, 2));
      Inputs in(static_cast<size_t>(op.a_rows() * op.a_cols()), static_cast<size_t>(op.b_rows() * op.b_cols()));
      Buf out(static_cast<size_t>(op.c_rows() * op.c_cols()));
      for (GemmMethod m : {GemmMethod::kBaseline, GemmMethod::kDecomposed, GemmMethod::kFused}) {
        fill(op, in, b->rank(), 1);
        op.run(in.a.p(), in.b.p(), out.p(), {.method = m, .trace = true});
        int tiles = 0, chunks = 0;
        for (const auto& e : op.trace()) {
          WEFT_CHECK(e.end_ns >= e.start_ns && e.rank == b->rank() && !e.lane_name.empty(), e.name);
          (e.kind == TraceKind::kTile ? tiles : chunks) += 1;
        }
        WEFT_CHECK(tiles > 0 && chunks > 0,
                   fmt::format("{} {}: {} tiles, {} chunks", to_string(o), to_string(m), tiles, chunks));
        if (m == GemmMethod::kDecomposed)  // one "GEMM" per chunk of rows: 2 chunks x 2 shards
          WEFT_CHECK(tiles == 4, fmt::format("{}: {} tiles", to_string(o), tiles));
        const auto all = gather_trace(*b, op.trace());
        const nlohmann::json meta{{"op", to_string(o)}, {"method", to_string(m)}};
        const auto j = to_chrome_trace(all, meta.dump());
        WEFT_CHECK(nlohmann::json::parse(j)["weft"] == meta, j.substr(0, 200));
        const auto sum = summarize_trace(j);
        WEFT_CHECK(sum.size() == 2 && sum[0].comm_us > 0 && sum[0].compute_us > 0, format_trace_summary(sum));
        if (b->rank() == 0 && o == GemmOp::kAgGemm && m == GemmMethod::kDecomposed) write_chrome_trace(path, all);
      }
    }
  }));
  const std::string cmd = fmt::format("{} trace {} 2>&1", WEFT_CLI_PATH, path);
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, f)) out += buf;
  EXPECT_EQ(pclose(f), 0) << out;
  EXPECT_NE(out.find("communication hidden behind computation"), std::string::npos) << out;
  EXPECT_NE(out.find("rank"), std::string::npos) << out;
  std::filesystem::remove(path);
}

// A rank that skips the second call: the others end in a TimeoutError naming it, in time.
TEST(GemmOverlapHostFaults, RankThatSkipsACallIsNamed) {
  const int64_t timeout_ms = 800;
  const auto t0 = std::chrono::steady_clock::now();
  auto res = run_host_ranks(
      3,
      [timeout_ms] {
        auto b = make_backend();
        GemmOverlap op(*b, config({GemmOp::kGemmRs, 6, 24, 5}));
        Inputs in(static_cast<size_t>(op.a_rows() * op.a_cols()), static_cast<size_t>(op.b_rows() * op.b_cols()));
        Buf out(static_cast<size_t>(op.c_rows() * op.c_cols()));
        fill(op, in, b->rank(), 1);
        op.run(in.a.p(), in.b.p(), out.p(), {.method = GemmMethod::kDecomposed});
        if (b->rank() == 1) {
          std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms + 700));
          return;
        }
        try {
          op.run(in.a.p(), in.b.p(), out.p(), {.method = GemmMethod::kDecomposed});
        } catch (const TimeoutError& e) {
          throw Error(fmt::format("TimeoutError naming rank {}: {}", e.peer(), e.what()));
        }
      },
      {}, timeout_ms);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, timeout_ms / 1000.0 + 5.0);
  for (const auto& r : res) {
    if (r.rank == 1) {
      EXPECT_EQ(r.exit_code, 0) << r.message;
      continue;
    }
    EXPECT_NE(r.message.find("TimeoutError naming rank 1"), std::string::npos) << r.message;
  }
}

// The bench's check against the baseline: max |got - ref| / max |ref|, NaN = infinitely wrong.
TEST(GemmOverlapBench, RelativeErrorAgainstTheBaseline) {
  auto bf = [](std::initializer_list<float> v) {
    std::vector<uint16_t> out;
    for (float x : v) out.push_back(dev::from_float<dev::bf16_t>(x).bits);
    return out;
  };
  const auto ref = bf({1.f, -4.f, 2.f, 0.f});
  EXPECT_EQ(bench::relative_error_bf16(ref, ref), 0.0);
  EXPECT_DOUBLE_EQ(bench::relative_error_bf16(bf({1.f, -4.f, 2.f, 0.5f}), ref), 0.5 / 4.0);
  EXPECT_DOUBLE_EQ(bench::relative_error_bf16(bf({1.f, -3.f, 2.f, 0.f}), ref), 1.0 / 4.0);
  EXPECT_TRUE(std::isinf(bench::relative_error_bf16(bf({1.f, NAN, 2.f, 0.f}), ref)));
  EXPECT_GT(bench::relative_error_bf16(bf({1.f, 4.f, 2.f, 0.f}), ref), bench::overlap_bench_tolerance("gemm_rs", 8));
  EXPECT_DOUBLE_EQ(bench::overlap_bench_tolerance("ag_gemm", 8), 2e-2);
  EXPECT_DOUBLE_EQ(bench::overlap_bench_tolerance("gemm_rs", 2), 2e-2);
  EXPECT_DOUBLE_EQ(bench::overlap_bench_tolerance("gemm_ar", 8), 8e-2);
  EXPECT_THROW(bench::relative_error_bf16(bf({1.f}), ref), Error);
}

// `weft bench ag_gemm|gemm_rs|gemm_ar` runs on the host backend (CI has no GPU): every
// column, JSON written, the table printed last.
TEST(GemmOverlapCli, BenchRunsOnTheHostBackend) {
  const std::string dir = fmt::format("/tmp/weft-gemm-bench-{}", ::getpid());
  for (const char* op : {"ag_gemm", "gemm_rs", "gemm_ar"}) {
    const std::string cmd =
        fmt::format("WEFT_BACKEND=host WEFT_HOST_RANKS=3 WEFT_TUNE_CACHE=- {} bench {} --quick --out {} 2>&1",
                    WEFT_CLI_PATH, op, dir);
    FILE* f = popen(cmd.c_str(), "r");
    ASSERT_NE(f, nullptr);
    std::string out;
    char buf[512];
    while (fgets(buf, sizeof buf, f)) out += buf;
    EXPECT_EQ(pclose(f), 0) << out;
    EXPECT_NE(out.find(fmt::format("{} on host", op)), std::string::npos) << out;
    EXPECT_NE(out.find("gemm only"), std::string::npos) << out;
    // Random inputs by default, and every method checked against the baseline (a method
    // off by more than the tolerance fails the command: the exit code above).
    EXPECT_NE(out.find("bf16 random data"), std::string::npos) << out;
    EXPECT_NE(out.find("max err"), std::string::npos) << out;
    EXPECT_EQ(out.find("WRONG"), std::string::npos) << out;
    EXPECT_NE(out.find("wrote " + dir), std::string::npos) << out;
  }
  std::filesystem::remove_all(dir);
}

// --random's shapes: seeded (the same set for the same seed, another for another), n of them,
// M, K and N multiples of 16 within the range, spread over it; bad counts and ranges refused.
TEST(GemmOverlapCli, RandomShapesAreSeededAndInRange) {
  const auto a = bench::random_gemm_shapes(200, 1), b = bench::random_gemm_shapes(200, 1),
             c = bench::random_gemm_shapes(200, 2);
  ASSERT_EQ(a.size(), 200u);
  int64_t lo = 1 << 30, hi = 0;
  size_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(a[i].m == b[i].m && a[i].k == b[i].k && a[i].n == b[i].n) << i;
    same += a[i].m == c[i].m && a[i].k == c[i].k && a[i].n == c[i].n;
    for (int64_t x : {a[i].m, a[i].k, a[i].n}) {
      EXPECT_EQ(x % 16, 0) << x;
      EXPECT_GE(x, 256);
      EXPECT_LE(x, 8192);
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
  }
  EXPECT_LT(same, 5u);  // another seed, another set
  EXPECT_LT(lo, 1024);  // spread over the range
  EXPECT_GT(hi, 7168);
  EXPECT_TRUE(bench::random_gemm_shapes(0, 1).empty());
  const auto small = bench::random_gemm_shapes(50, 3, 16, 128);
  for (const auto& d : small) EXPECT_TRUE(d.m >= 16 && d.n <= 128 && d.k % 16 == 0);
  EXPECT_THROW(bench::random_gemm_shapes(-1, 1), InvalidArgument);
  EXPECT_THROW(bench::random_gemm_shapes(1, 1, 100, 110), InvalidArgument);  // no multiple of 16
}

namespace {
std::pair<int, std::string> run_cmd(const std::string& cmd) {
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (!f) return {-1, ""};
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, f)) out += buf;
  const int st = pclose(f);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}
}  // namespace

// --trace-dir: one traced call per method (the 4th of 4 enqueued back to back), a Chrome-trace
// JSON per method that `weft trace` reads back with every rank's tiles and chunks.
TEST(GemmOverlapCli, BenchTracesEveryMethod) {
  const std::string dir = fmt::format("/tmp/weft-gemm-trace-{}", ::getpid());
  const auto [rc, out] = run_cmd(fmt::format(
      "WEFT_BACKEND=host WEFT_HOST_RANKS=2 WEFT_TUNE_CACHE=- {} bench gemm_rs --quick --out {} --trace-dir {}",
      WEFT_CLI_PATH, dir, dir));
  ASSERT_EQ(rc, 0) << out;
  for (const char* m : {"baseline", "decomposed", "fused"}) {
    std::string path;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().filename().string().find(std::string("-") + m + "-") != std::string::npos &&
          e.path().extension() == ".json")
        path = e.path().string();
    ASSERT_FALSE(path.empty()) << m << "\n" << out;
    std::ifstream in(path);
    const nlohmann::json j = nlohmann::json::parse(in);
    EXPECT_EQ(j.at("weft").at("method"), m);
    EXPECT_EQ(j.at("weft").at("call"), "4th of 4 enqueued back to back");
    std::set<int> ranks;
    for (const auto& e : j.at("traceEvents"))
      if (e.at("ph") == "X") ranks.insert(e.at("pid").get<int>());
    EXPECT_EQ(ranks, (std::set<int>{0, 1})) << path;
    const auto [trc, summary] = run_cmd(fmt::format("{} trace {}", WEFT_CLI_PATH, path));
    EXPECT_EQ(trc, 0) << summary;
    EXPECT_NE(summary.find("communication hidden behind computation"), std::string::npos) << summary;
  }
  std::filesystem::remove_all(dir);
}

// --tune times decomposed at other chunk counts beside the rest (each checked against the
// baseline) and stores the fastest exact method with its chunk count.
TEST(GemmOverlapCli, BenchTuneSweepsChunkCounts) {
  const std::string dir = fmt::format("/tmp/weft-gemm-tune-{}", ::getpid()), cache = dir + "/cache.json";
  std::filesystem::remove_all(dir);
  const auto [rc, out] = run_cmd(
      fmt::format("WEFT_BACKEND=host WEFT_HOST_RANKS=2 WEFT_TUNE_CACHE={} {} bench gemm_rs --quick --shapes 64x32x48 "
                  "--tune --out {}",
                  cache, WEFT_CLI_PATH, dir));
  ASSERT_EQ(rc, 0) << out;
  std::string json;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind("gemm_rs-", 0) == 0 && e.path().extension() == ".json")
      json = e.path().string();
  ASSERT_FALSE(json.empty()) << out;
  std::ifstream in(json);
  const nlohmann::json j = nlohmann::json::parse(in);
  std::map<std::string, double> us;
  std::set<int> swept;
  for (const auto& p : j.at("points")) {
    const std::string m = p.at("method");
    us[m] = p.at("median_us");
    if (m.rfind("decomposed_c", 0) == 0) {
      swept.insert(p.at("chunks").get<int>());
      EXPECT_EQ(m, fmt::format("decomposed_c{}", p.at("chunks").get<int>()));
      EXPECT_GE(p.at("rel_err_vs_baseline").get<double>(), 0.0) << m << " was not checked";
      EXPECT_LE(p.at("rel_err_vs_baseline").get<double>(), j.at("tolerance_vs_baseline").get<double>()) << m;
    }
  }
  EXPECT_EQ(swept.size(), 4u) << out;  // 1, 2, 3, 4, 6 less the op's own count
  std::ifstream cf(cache);
  ASSERT_TRUE(cf.good()) << "no tuning cache written\n" << out;
  const nlohmann::json c = nlohmann::json::parse(cf);
  ASSERT_EQ(c.size(), 1u) << c.dump();
  const auto& entry = c.begin().value();
  const std::string method = entry.at("method");
  const int chunks = entry.at("chunks");
  // The stored choice is the fastest of the candidates, at the chunk count that ran fastest.
  double best = 1e300;
  std::string best_name;
  for (const auto& [m, t] : us)
    if ((m == "baseline" || m == "decomposed" || m == "fused" || m.rfind("decomposed_c", 0) == 0) && t < best) {
      best = t;
      best_name = m;
    }
  EXPECT_DOUBLE_EQ(entry.at("us").get<double>(), best) << c.dump();
  if (best_name.rfind("decomposed_c", 0) == 0) {
    EXPECT_EQ(method, "decomposed");
    EXPECT_EQ(fmt::format("decomposed_c{}", chunks), best_name);
  } else {
    EXPECT_EQ(method, best_name);
  }
  std::filesystem::remove_all(dir);
}

// The bench's knobs are checked: a value that is not an integer is refused by name.
TEST(GemmOverlapCli, BenchRefusesAMalformedKnob) {
  const auto [rc, out] = run_cmd(
      fmt::format("WEFT_BACKEND=host WEFT_HOST_RANKS=2 WEFT_BENCH_PER_GRAPH=three {} bench gemm_rs --quick --out /tmp",
                  WEFT_CLI_PATH));
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("WEFT_BENCH_PER_GRAPH='three' is not an integer"), std::string::npos) << out;
}

// `--random n`: n seeded shapes on the host backend (small ones there), every method checked,
// the table's summary of auto against the baseline and the JSON's; misuse is a usage error.
TEST(GemmOverlapCli, BenchTakesRandomShapes) {
  const std::string dir = fmt::format("/tmp/weft-gemm-random-{}", ::getpid());
  const std::string env = "WEFT_BACKEND=host WEFT_HOST_RANKS=2 WEFT_TUNE_CACHE=- ";
  const auto [rc, out] = run_cmd(env + WEFT_CLI_PATH + " bench gemm_rs --quick --random 3 --seed 5 --out " + dir);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("auto / baseline over 3 shapes (3 random, seed 5): geometric mean"), std::string::npos) << out;
  EXPECT_EQ(out.find("WRONG"), std::string::npos) << out;
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const auto j = nlohmann::json::parse(std::ifstream(e.path()));
    EXPECT_EQ(j.value("random", 0), 3);
    EXPECT_EQ(j.value("seed", 0), 5);
    EXPECT_EQ(j["auto_vs_baseline"].value("shapes", 0), 3);
    std::set<std::string> shapes;
    for (const auto& p : j["points"])
      shapes.insert(fmt::format("{}x{}x{}", p.value("m", 0), p.value("k", 0), p.value("n", 0)));
    EXPECT_EQ(shapes.size(), 3u);
    ++files;
  }
  EXPECT_EQ(files, 1);
  std::filesystem::remove_all(dir);
  for (const std::string bad :
       {" bench gemm_rs --random -1", " bench moe --random 2", " bench ag_gemm --random 1001"}) {
    const auto [code, text] = run_cmd(env + WEFT_CLI_PATH + bad + " --out " + dir);
    EXPECT_EQ(code, 2) << bad << ": " << text;
    EXPECT_NE(text.find("--random"), std::string::npos) << text;
  }
}
