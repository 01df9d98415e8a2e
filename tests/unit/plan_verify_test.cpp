// Templates verify for every world size and split; hand-broken plans are rejected with a
// message that names the problem.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>

#include "weft/core/error.hpp"
#include "weft/plan/plan.hpp"
#include "weft/plan/templates.hpp"
#include "weft/plan/verify.hpp"

using namespace weft::plan;

namespace {

std::string all_messages(const VerifyResult& r) { return r.text(); }

bool has(const VerifyResult& r, const std::string& needle) {
  for (const auto& m : r.messages)
    if (m.find(needle) != std::string::npos) return true;
  return false;
}

// Every template at every world size 1..8, several splits, shapes that do and do not divide.
struct Case {
  std::string name;
  std::function<CommPlan(int world, int64_t rows, TemplateOptions)> make;
};

std::vector<Case> all_templates() {
  return {
      {"ag.direct", [](int w, int64_t r, TemplateOptions o) { return all_gather(AllGatherAlgo::kDirect, w, r, 3, o); }},
      {"ag.ring", [](int w, int64_t r, TemplateOptions o) { return all_gather(AllGatherAlgo::kRing, w, r, 3, o); }},
      {"ag.bidir",
       [](int w, int64_t r, TemplateOptions o) { return all_gather(AllGatherAlgo::kBidirectionalRing, w, r, 3, o); }},
      {"rs.direct",
       [](int w, int64_t r, TemplateOptions o) { return reduce_scatter(ReduceScatterAlgo::kDirect, w, r, 3, o); }},
      {"rs.ring",
       [](int w, int64_t r, TemplateOptions o) { return reduce_scatter(ReduceScatterAlgo::kRing, w, r, 3, o); }},
      {"rs.staged",
       [](int w, int64_t r, TemplateOptions o) { return reduce_scatter(ReduceScatterAlgo::kStaged, w, r, 3, o); }},
      {"ar.one_shot",
       [](int w, int64_t r, TemplateOptions o) { return all_reduce(AllReduceAlgo::kOneShot, w, r, 3, o); }},
      {"ar.two_shot",
       [](int w, int64_t r, TemplateOptions o) { return all_reduce(AllReduceAlgo::kTwoShot, w, r, 3, o); }},
      {"ar.ring", [](int w, int64_t r, TemplateOptions o) { return all_reduce(AllReduceAlgo::kRing, w, r, 3, o); }},
      {"a2a.uniform", [](int w, int64_t r, TemplateOptions o) { return all_to_all(w, r, 3, o); }},
      {"a2a.counts",
       [](int w, int64_t r, TemplateOptions o) {
         std::vector<std::vector<int64_t>> counts(static_cast<size_t>(w), std::vector<int64_t>(static_cast<size_t>(w)));
         for (int q = 0; q < w; ++q)
           for (int p = 0; p < w; ++p) counts[static_cast<size_t>(q)][static_cast<size_t>(p)] = (q * 3 + p * 5 + r) % 4;
         return all_to_all_counts(counts, 3, o);
       }},
  };
}

}  // namespace

TEST(PlanTemplates, EveryTemplateVerifiesForWorldSizes1To8) {
  int checked = 0;
  for (const auto& c : all_templates())
    for (int w = 1; w <= 8; ++w)
      for (int64_t rows : {1, 5, 8})
        for (int splits : {1, 2, 3, 4}) {
          TemplateOptions o;
          o.splits = splits;
          const CommPlan p = c.make(w, rows, o);
          ASSERT_EQ(p.world, w);
          // Unlimited workers, and the strictest case: one resident worker per rank.
          for (int workers : {0, 1}) {
            VerifyOptions vo;
            vo.workers_per_rank = workers;
            const VerifyResult r = verify(p, vo);
            ASSERT_TRUE(r.ok) << c.name << " world " << w << " rows " << rows << " splits " << splits << " workers "
                              << workers << ":\n"
                              << all_messages(r);
            ASSERT_TRUE(r.notes.empty()) << r.text();
          }
          ++checked;
        }
  EXPECT_EQ(checked, 11 * 8 * 3 * 4);
}

TEST(PlanTemplates, ChunkCountsAreExact) {
  // Ring all-gather: one local copy per rank plus world-1 hops per rank, each split in k.
  const CommPlan ring = all_gather(AllGatherAlgo::kRing, 4, 8, 16, {.splits = 2});
  EXPECT_EQ(ring.num_transfers(), size_t{4 * 2 + 4 * 3 * 2});
  // 10 rows in 4 splits: 3, 3, 3, 1 (ceil-sized, uneven last chunk).
  const CommPlan direct = all_gather(AllGatherAlgo::kDirect, 2, 10, 16, {.splits = 4});
  ASSERT_EQ(direct.queues[0].size(), size_t{8});
  EXPECT_EQ(direct.queues[0][0].dst.region, Region::rect(0, 3, 0, 16));
  EXPECT_EQ(direct.queues[0][3].dst.region, Region::rect(9, 10, 0, 16));
  EXPECT_EQ(direct.queues[0][4].dst.rank, 1);
  EXPECT_EQ(direct.queues[0][4].dst.region, Region::rect(0, 3, 0, 16));
  // One signal per chunk, on the rank that consumes it, each expecting one notify.
  EXPECT_EQ(direct.signals.size(), size_t{16});
  for (const auto& s : direct.signals) EXPECT_EQ(s.expected, 1);
  // Two-shot all-reduce with 3 rows on 4 ranks: rank 3 owns no shard and issues nothing.
  const CommPlan ts = all_reduce(AllReduceAlgo::kTwoShot, 4, 3, 2);
  EXPECT_TRUE(ts.queues[3].empty());
  EXPECT_EQ(ts.queues[0].size(), size_t{1 + 3 + 3});
}

TEST(PlanTemplates, RingForwardWaitsForTheSamePieceOnly) {
  // Pipelining: hop 2 of piece j waits for hop 1 of piece j, not the whole shard.
  const CommPlan p = all_gather(AllGatherAlgo::kRing, 3, 4, 2, {.splits = 2});
  // Rank 1's queue: copy (2 pieces), hop 1 (2 pieces), hop 2 (2 pieces).
  const auto& q = p.queues[1];
  ASSERT_EQ(q.size(), size_t{6});
  const Transfer& hop2_piece1 = q[5];
  ASSERT_EQ(hop2_piece1.deps.size(), size_t{1});
  int dep_rank = -1;
  const Transfer* dep = p.find(hop2_piece1.deps[0], &dep_rank);
  ASSERT_NE(dep, nullptr);
  EXPECT_EQ(dep_rank, 0);
  EXPECT_EQ(dep->dst.region, hop2_piece1.src.region);
  EXPECT_EQ(dep->signal.rank, 1);
}

TEST(PlanTemplates, RefusesBadShapes) {
  EXPECT_THROW(all_gather(AllGatherAlgo::kRing, 0, 4, 4), weft::InvalidArgument);
  EXPECT_THROW(all_gather(AllGatherAlgo::kRing, 2, 0, 4), weft::InvalidArgument);
  EXPECT_THROW(reduce_scatter(ReduceScatterAlgo::kRing, 2, 4, 4, {.splits = 0}), weft::InvalidArgument);
  EXPECT_THROW(all_to_all_counts({{1, 2}, {3}}, 4), weft::InvalidArgument);
  EXPECT_THROW(all_to_all_counts({{1, -2}, {3, 4}}, 4), weft::InvalidArgument);
  try {
    all_gather(AllGatherAlgo::kDirect, 2, -3, 4);
    FAIL();
  } catch (const weft::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("shape -3x4"), std::string::npos) << e.what();
  }
}

// ---- hand-written broken plans ----------------------------------------------------------

namespace {

// A correct two-rank all-gather of 4 rows, written out by hand: chunk 0/1 local copies,
// chunk 2 (rank 0 -> 1) and chunk 3 (rank 1 -> 0).
CommPlan hand_all_gather() {
  CommPlan p;
  p.name = "hand";
  p.world = 2;
  p.tensors.push_back(Tensor{"in", 4, 8, 2, Role::kInput, false, {}});
  p.tensors.push_back(Tensor{"out", 8, 8, 2, Role::kOutput, false, {}});
  p.queues.resize(2);
  auto add = [&](int exec, int64_t id, Kind k, Endpoint s, Endpoint d, SignalRef sig) {
    Transfer t;
    t.chunk = id;
    t.kind = k;
    t.src = s;
    t.dst = d;
    t.signal = sig;
    p.queues[static_cast<size_t>(exec)].push_back(t);
  };
  add(0, 0, Kind::kCopy, {0, 0, Region::rect(0, 4, 0, 8)}, {0, 1, Region::rect(0, 4, 0, 8)}, {0, 0});
  add(0, 2, Kind::kPush, {0, 0, Region::rect(0, 4, 0, 8)}, {1, 1, Region::rect(0, 4, 0, 8)}, {1, 1});
  add(1, 1, Kind::kCopy, {1, 0, Region::rect(0, 4, 0, 8)}, {1, 1, Region::rect(4, 8, 0, 8)}, {1, 0});
  add(1, 3, Kind::kPush, {1, 0, Region::rect(0, 4, 0, 8)}, {0, 1, Region::rect(4, 8, 0, 8)}, {0, 1});
  p.signals = {{0, 0, 1}, {0, 1, 1}, {1, 0, 1}, {1, 1, 1}};
  return p;
}

}  // namespace

TEST(PlanVerifier, HandWrittenPlanIsValid) {
  const VerifyResult r = verify(hand_all_gather(), {.workers_per_rank = 1});
  EXPECT_TRUE(r.ok) << r.text();
  EXPECT_TRUE(r.messages.empty());
}

TEST(PlanVerifier, RejectsMissingChunk) {
  CommPlan p = hand_all_gather();
  p.queues[1].pop_back();  // chunk 3: rank 1's rows never reach rank 0
  p.signals = {{0, 0, 1}, {1, 0, 1}, {1, 1, 1}};
  const VerifyResult r = verify(p);
  EXPECT_FALSE(r.ok);
  ASSERT_EQ(r.messages.size(), size_t{1}) << r.text();
  EXPECT_EQ(r.messages[0], "missing chunk: rank 0 tensor 'out' rows [4,8) cols [0,8) is never written");
}

TEST(PlanVerifier, RejectsDuplicateWrite) {
  CommPlan p = hand_all_gather();
  // Rank 1 copies its shard over rank 0's rows in its own out as well: rows [0,4) twice.
  p.queues[1][0].dst.region = Region::rect(0, 4, 0, 8);
  const VerifyResult r = verify(p);
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(has(r, "element written twice: rank 1 tensor 'out' rows [0,4) cols [0,8) by chunk 2 and chunk 1") ||
              has(r, "element written twice: rank 1 tensor 'out' rows [0,4) cols [0,8) by chunk 1 and chunk 2"))
      << r.text();
  EXPECT_TRUE(has(r, "missing chunk: rank 1 tensor 'out' rows [4,8) cols [0,8) is never written")) << r.text();
  // The two writes are unordered, too.
  EXPECT_TRUE(has(r, "race: ")) << r.text();
}

TEST(PlanVerifier, RejectsCycle) {
  CommPlan p = hand_all_gather();
  // Chunk 2 (rank 0) waits for chunk 3 (signals rank 0); chunk 3 (rank 1) waits for chunk 2 (signals rank 1).
  p.queues[0][1].deps = {3};
  p.queues[1][1].deps = {2};
  const VerifyResult r = verify(p);
  EXPECT_FALSE(r.ok);
  ASSERT_EQ(r.messages.size(), size_t{1}) << r.text();
  EXPECT_EQ(r.messages[0], "cycle through chunks 2 -> 3 -> 2 (ranks 0 -> 1 -> 0; each waits for the next)");
}

TEST(PlanVerifier, RejectsThresholdOffByOne) {
  CommPlan p = hand_all_gather();
  p.signals[1].expected = 2;  // signal 1 on rank 0: only chunk 3 bumps it, once
  const VerifyResult r = verify(p);
  EXPECT_FALSE(r.ok);
  ASSERT_EQ(r.messages.size(), size_t{1}) << r.text();
  EXPECT_EQ(r.messages[0], "threshold 2 but 1 notifies reach signal 1 on rank 0 (from chunks 3)");
}

TEST(PlanVerifier, RejectsPersistentWorkerDeadlock) {
  // Rank 0 issues a forward that waits for data from rank 1 *before* the push rank 1 waits for.
  // With one worker per rank: rank 0's worker holds chunk 10 waiting for chunk 3, rank 1's
  // worker holds chunk 3 waiting for chunk 2, which sits behind chunk 10 in rank 0's queue.
  CommPlan p = hand_all_gather();
  p.tensors.push_back(Tensor{"fwd", 4, 8, 2, Role::kScratch, false, {}});
  Transfer fwd;
  fwd.chunk = 10;
  fwd.kind = Kind::kCopy;
  fwd.src = {0, 1, Region::rect(4, 8, 0, 8)};
  fwd.dst = {0, 2, Region::rect(0, 4, 0, 8)};
  fwd.deps = {3};
  p.queues[0].insert(p.queues[0].begin(), fwd);
  p.queues[1][1].deps = {2};
  VerifyResult ok = verify(p, {.workers_per_rank = 2});
  EXPECT_TRUE(ok.ok) << ok.text();
  const VerifyResult r = verify(p, {.workers_per_rank = 1});
  EXPECT_FALSE(r.ok);
  ASSERT_EQ(r.messages.size(), size_t{1}) << r.text();
  EXPECT_EQ(
      r.messages[0],
      "deadlock with 1 worker per rank: rank 0 worker 0 holds chunk 10, waiting for chunk 3 (rank 1, held by a "
      "worker that is blocked itself); rank 1 worker 0 holds chunk 3, waiting for chunk 2 (rank 0, not yet taken: "
      "every worker of rank 0 is blocked); 2 items never taken");
}

TEST(PlanVerifier, RejectsMissingContributionAndRace) {
  // Two-rank one-shot all-reduce with rank 1's add into rank 0 removed, and the remaining add
  // on rank 1 not waiting for its local copy.
  CommPlan p = all_reduce(AllReduceAlgo::kOneShot, 2, 4, 4);
  ASSERT_EQ(p.queues[0].size(), size_t{2});
  p.queues[0].pop_back();
  p.queues[1][1].deps.clear();
  recount_signals(p);
  const VerifyResult r = verify(p);
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(has(r, "rank 0 tensor 'out' rows [0,4) cols [0,4) lacks the contribution of rank 1")) << r.text();
  EXPECT_TRUE(has(r,
                  "race: chunk 3 (rank 1) adds into rank 1 tensor 'out' rows [0,4) cols [0,4), which chunk 2 also "
                  "accesses, and neither waits for the other"))
      << r.text();
}

TEST(PlanVerifier, RejectsDepWithNothingToWaitOn) {
  CommPlan p = hand_all_gather();
  p.queues[1][1].deps = {0};  // chunk 0 signals rank 0, chunk 3 runs on rank 1
  const VerifyResult r = verify(p);
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(has(r, "chunk 3 on rank 1 depends on chunk 0, which signals rank 0: nothing to wait on at rank 1"))
      << r.text();
}

TEST(PlanVerifier, RejectsMalformedPlansWithoutCrashing) {
  CommPlan p = hand_all_gather();
  p.queues[0][1].dst.rank = 5;
  p.queues[1][0].src.region = Region::rect(0, 9, 0, 8);
  p.queues[1][1].chunk = 0;
  p.queues[1][1].deps = {77};
  const VerifyResult r = verify(p);
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(has(r, "chunk 2 on rank 0: destination rank 5 outside the world of 2 ranks")) << r.text();
  EXPECT_TRUE(has(r, "chunk 1 on rank 1: source rows [0,9) cols [0,8) is empty or outside tensor 'in' (4x8)"))
      << r.text();
  EXPECT_TRUE(has(r, "chunk 0 on rank 1: chunk id 0 used twice")) << r.text();
  EXPECT_TRUE(has(r, "depends on chunk 77, which does not exist")) << r.text();
}

TEST(PlanVerifier, ThrowingVariantListsTheProblems) {
  CommPlan p = hand_all_gather();
  p.signals[1].expected = 2;
  try {
    verify_or_throw(p);
    FAIL() << "no exception";
  } catch (const weft::InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()),
              "plan hand is invalid:\n  threshold 2 but 1 notifies reach signal 1 on rank 0 (from chunks 3)");
  }
  EXPECT_NO_THROW(verify_or_throw(hand_all_gather()));
}

TEST(PlanTemplates, DroppingOrDelayingAnyChunkIsCaught) {
  // The verifier must not pass plans by construction: every single-chunk mutation of every
  // template is rejected.
  int mutants = 0;
  for (const auto& c : all_templates()) {
    const CommPlan p = c.make(3, 5, {.splits = 2});
    for (size_t r = 0; r < p.queues.size(); ++r)
      for (size_t k = 0; k < p.queues[r].size(); ++k) {
        CommPlan dropped = p;
        dropped.queues[r].erase(dropped.queues[r].begin() + static_cast<std::ptrdiff_t>(k));
        EXPECT_FALSE(verify(dropped).ok) << c.name << ": dropping chunk " << p.queues[r][k].chunk << " passed";
        // Losing its deps makes a chunk race with (or read before) what it waited for.
        if (!p.queues[r][k].deps.empty()) {
          CommPlan eager = p;
          eager.queues[r][k].deps.clear();
          EXPECT_FALSE(verify(eager).ok) << c.name << ": chunk " << p.queues[r][k].chunk << " without deps passed";
        }
        ++mutants;
      }
  }
  EXPECT_GT(mutants, 200);
}

TEST(PlanVerifier, RealShapesCostChunksNotBytes) {
  // 8 ranks, 8192 x 8192 per rank, 16 splits: thousands of chunks, 2^26 elements per tensor.
  const CommPlan p = all_reduce(AllReduceAlgo::kRing, 8, 8192, 8192, {.splits = 16});
  EXPECT_EQ(p.num_transfers(), size_t{(8 * 7 + 7 * 8 + 7 * 8) * 16});
  const auto t0 = std::chrono::steady_clock::now();
  const VerifyResult r = verify(p, {.workers_per_rank = 1});
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(r.ok) << r.text();
  EXPECT_TRUE(r.notes.empty()) << r.text();
  EXPECT_LT(ms, 5000.0);
}
