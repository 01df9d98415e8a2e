// The plan text format: round trips, errors that name line and column, and a bounded fuzz of
// random plans through the parser and the verifier.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>

#include "weft/core/error.hpp"
#include "weft/plan/templates.hpp"
#include "weft/plan/text.hpp"
#include "weft/plan/verify.hpp"

using namespace weft::plan;

namespace {

std::string parse_error(const std::string& text) {
  try {
    parse_plan(text, "t.plan");
  } catch (const weft::InvalidArgument& e) {
    return e.what();
  }
  return "(parsed)";
}

const char* kHandPlan = R"(# two ranks exchange four rows
plan hand
world 2
tensor in 4x8 input elem=2
tensor out 8x8 output elem=2
tensor flag 1x64 scratch elem=1
signal 0.0 expect 1
signal 1.0 expect 1   # rank 1's only signal
on 0 chunk 0 copy sm 0:in[0:4,0:8] -> 0:out[0:4,0:8]
on 0 chunk 2 push tma 0:in[0:4,0:8] -> 1:out[0:4,0:8] signal 1.0+1
on 1 chunk 1 copy copy_engine 1:in[0:4,0:8] -> 1:out[4:8,0:8]
on 1 chunk 3 push nccl 1:in[0:4,0:8] -> 0:out[4:8,0:8] signal 0.0+1 deps 2
on 1 chunk 4 copy sm 1:flag[0:16] -> 1:flag[16:32]
)";

}  // namespace

TEST(PlanText, ParsesAHandWrittenPlan) {
  const CommPlan p = parse_plan(kHandPlan);
  EXPECT_EQ(p.name, "hand");
  EXPECT_EQ(p.world, 2);
  ASSERT_EQ(p.tensors.size(), size_t{3});
  EXPECT_EQ(p.tensors[1].rows, 8);
  EXPECT_EQ(p.tensors[1].role, Role::kOutput);
  EXPECT_EQ(p.tensors[2].elem_bytes, 1);
  ASSERT_EQ(p.queues[1].size(), size_t{3});
  const Transfer& t = p.queues[1][1];
  EXPECT_EQ(t.chunk, 3);
  EXPECT_EQ(t.kind, Kind::kPush);
  EXPECT_EQ(t.engine, Engine::kNccl);
  EXPECT_EQ(t.src.rank, 1);
  EXPECT_EQ(t.dst, (Endpoint{0, 1, Region::rect(4, 8, 0, 8)}));
  EXPECT_EQ(t.signal, (SignalRef{0, 0}));
  EXPECT_EQ(t.deps, (std::vector<int64_t>{2}));
  EXPECT_EQ(p.queues[1][2].src.region, Region::bytes(0, 16));
  EXPECT_EQ(p.queues[1][0].engine, Engine::kCopyEngine);
  EXPECT_EQ(p.queues[1][0].signal.rank, -1);
}

TEST(PlanText, PrintsCanonicalText) {
  const CommPlan p = parse_plan(kHandPlan);
  const std::string s = print_plan(p);
  EXPECT_NE(s.find("\non 1 chunk 3 push nccl 1:in[0:4,0:8] -> 0:out[4:8,0:8] signal 0.0+1 deps 2\n"), std::string::npos)
      << s;
  EXPECT_NE(s.find("\ntensor flag 1x64 scratch elem=1\n"), std::string::npos) << s;
  EXPECT_NE(s.find("\non 1 chunk 4 copy sm 1:flag[0:1,0:16] -> 1:flag[0:1,16:32]\n"), std::string::npos) << s;
  EXPECT_EQ(print_plan(parse_plan(s)), s);
}

TEST(PlanText, EveryTemplateRoundTrips) {
  int n = 0;
  for (int w : {1, 2, 3, 5, 8})
    for (int splits : {1, 3}) {
      const TemplateOptions o{.splits = splits, .engine = Engine::kTma, .elem_bytes = 2};
      for (const CommPlan& p :
           {all_gather(AllGatherAlgo::kBidirectionalRing, w, 7, 4, o),
            reduce_scatter(ReduceScatterAlgo::kRing, w, 3, 4, o), all_reduce(AllReduceAlgo::kTwoShot, w, 9, 4, o),
            all_reduce(AllReduceAlgo::kRing, w, 9, 4, o),
            all_to_all_counts(std::vector<std::vector<int64_t>>(static_cast<size_t>(w),
                                                                std::vector<int64_t>(static_cast<size_t>(w), 2)),
                              4, o)}) {
        const CommPlan back = parse_plan(print_plan(p));
        EXPECT_EQ(back, p) << p.name << " world " << w;
        EXPECT_TRUE(verify(back).ok);
        ++n;
      }
    }
  EXPECT_EQ(n, 50);
}

TEST(PlanText, ErrorsNameLineAndColumn) {
  EXPECT_EQ(parse_error("world 2\ntensor in 4x8 inptu\n"),
            "t.plan:2:15: unknown tensor role 'inptu' (input, output, scratch)");
  EXPECT_EQ(parse_error("world 2\ntensor in 4x8 input\non 0 chunk 0 push sm 0:in[0:4,0:8] -> 1:oot[0:4,0:8]\n"),
            "t.plan:3:41: unknown tensor 'oot'");
  EXPECT_EQ(parse_error("world 2\ntensor in 4x8 input\non 0 chunk 0 push sm 0:in[0:4;0:8] -> 1:in[0:4,0:8]\n"),
            "t.plan:3:30: expected ']' or ',' in the region but found ';'");
  EXPECT_EQ(parse_error("world 2\ntensor in 4x8 input\non 2 chunk 0 push sm 0:in[0:4,0:8] -> 1:in[0:4,0:8]\n"),
            "t.plan:3:4: the executing rank 2 outside [0, 1]");
  EXPECT_EQ(parse_error("world 2\ntensor in 4x8 input\non 0 chunk 0 push sm 0:in[0:4,0:8] 1:in[0:4,0:8]\n"),
            "t.plan:3:36: expected '->' but found '1:in[0:4,0:8]'");
  EXPECT_EQ(parse_error("world 2\ntensor in 4x8 input\non 0 chunk 0 push sm 0:in[0:4,0:8] -> 1:in[0:4,0:8] deps\n"),
            "t.plan:3:57: expected a chunk id (an integer) but found end of line");
  EXPECT_EQ(parse_error("tensor in 4x8 input\n"), "t.plan:1:1: 'tensor' before 'world'");
  EXPECT_EQ(parse_error("# nothing\n"), "t.plan: no 'world' line");
  EXPECT_EQ(parse_error("world 2\nworld 3\n"), "t.plan:2:1: second 'world' line");
  EXPECT_EQ(parse_error("world 99999999999999999999\n"), "t.plan:1:7: the world size does not fit in 64 bits");
  EXPECT_EQ(parse_error("world 2\ntensor b 2x8 scratch\non 0 chunk 0 copy sm 0:b[0:4] -> 0:b[4:8]\n"),
            "t.plan:3:24: a byte range [b0:b1] needs a one-row tensor; 'b' has 2 rows");
  EXPECT_EQ(parse_error("world 1\nfrobnicate\n"),
            "t.plan:2:1: unknown keyword 'frobnicate' (plan, world, tensor, signal, on)");
}

// ---- fuzz ------------------------------------------------------------------------------

namespace {

// A random plan: in-range ranks and tensors (so that it prints), anything else may be wrong.
CommPlan random_plan(std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  CommPlan p;
  p.name = pick(0, 3) ? "fuzz" : "";
  p.world = static_cast<int>(pick(1, 4));
  p.queues.resize(static_cast<size_t>(p.world));
  const int nt = static_cast<int>(pick(1, 3));
  for (int i = 0; i < nt; ++i) {
    Tensor t;
    t.name = "t" + std::to_string(i);
    t.rows = pick(1, 6);
    t.cols = pick(1, 4);
    t.elem_bytes = static_cast<int>(pick(1, 4));
    t.role = static_cast<Role>(pick(0, 2));
    t.sum = pick(0, 3) == 0;
    if (pick(0, 4) == 0)
      for (int r = 0; r < p.world; ++r) t.valid_rows.push_back(pick(0, t.rows));
    p.tensors.push_back(t);
  }
  auto region = [&](const Tensor& t) {
    const int64_t r0 = pick(0, t.rows - 1), c0 = pick(0, t.cols - 1);
    return Region::rect(r0, pick(r0, t.rows + (pick(0, 9) == 0)), c0, pick(c0 + 1, t.cols));
  };
  const int64_t n = pick(0, 12);
  for (int64_t c = 0; c < n; ++c) {
    Transfer t;
    t.chunk = pick(0, 3) ? c : n + 7 * c;  // unique (the parser refuses duplicates), not always dense
    t.kind = static_cast<Kind>(pick(0, 3));
    t.engine = static_cast<Engine>(pick(0, 4));
    t.src.rank = static_cast<int>(pick(0, p.world - 1));
    t.src.tensor = static_cast<int>(pick(0, nt - 1));
    t.src.region = region(p.tensors[static_cast<size_t>(t.src.tensor)]);
    t.dst.rank = static_cast<int>(pick(0, p.world - 1));
    t.dst.tensor = static_cast<int>(pick(0, nt - 1));
    t.dst.region = pick(0, 1) ? t.src.region : region(p.tensors[static_cast<size_t>(t.dst.tensor)]);
    for (int64_t d = pick(0, 2); d > 0; --d) t.deps.push_back(pick(0, n));
    if (pick(0, 3)) {
      t.signal = SignalRef{static_cast<int>(pick(0, p.world - 1)), static_cast<int>(pick(0, 3))};
      t.increment = pick(1, 2);
    }
    const int exec = pick(0, 1) ? t.src.rank : t.dst.rank;
    p.queues[static_cast<size_t>(exec)].push_back(t);
  }
  recount_signals(p);
  for (auto& s : p.signals)
    if (pick(0, 5) == 0) s.expected += pick(-1, 1);
  return p;
}

}  // namespace

TEST(PlanFuzz, RandomPlansRoundTripAndNeverCrashTheVerifier) {
  std::mt19937_64 rng(20261121);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string alphabet = "0123456789:[],.x->#\n \tabcdefghijklmnopqrstuvwxyz+=";
  int plans = 0, parsed_mutants = 0, rejected_mutants = 0, valid = 0;
  // Bounded by count and by time (well under 3 s on a loaded CI machine).
  while (plans < 4000 && std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(2000)) {
    const CommPlan p = random_plan(rng);
    const std::string text = print_plan(p);
    const CommPlan back = parse_plan(text, "fuzz");
    ASSERT_EQ(back, p) << text;
    VerifyOptions vo;
    vo.workers_per_rank = static_cast<int>(rng() % 3);
    VerifyResult r;
    ASSERT_NO_THROW(r = verify(p, vo)) << text;
    valid += r.ok;
    EXPECT_EQ(r.ok, r.messages.empty()) << text;
    // Mutate the text: the parser either refuses it with InvalidArgument or yields a plan the
    // verifier judges without throwing.
    std::string m = text;
    for (int k = static_cast<int>(rng() % 3) + 1; k > 0 && !m.empty(); --k) {
      const size_t at = rng() % m.size();
      switch (rng() % 3) {
        case 0:
          m.erase(at, 1);
          break;
        case 1:
          m.insert(at, 1, alphabet[rng() % alphabet.size()]);
          break;
        default:
          m[at] = alphabet[rng() % alphabet.size()];
          break;
      }
    }
    try {
      const CommPlan q = parse_plan(m, "mutant");
      ++parsed_mutants;
      ASSERT_NO_THROW(verify(q, vo)) << m;
      ASSERT_NO_THROW(parse_plan(print_plan(q))) << m;
    } catch (const weft::InvalidArgument& e) {
      ++rejected_mutants;
      EXPECT_EQ(std::string(e.what()).rfind("mutant", 0), 0u) << e.what();
    }
    ++plans;
  }
  EXPECT_GT(plans, 200);
  EXPECT_GT(parsed_mutants, 20);
  EXPECT_GT(rejected_mutants, 20);
  EXPECT_GT(valid, 0);
}

TEST(PlanText, DocumentedExampleVerifies) {
  // The example in docs/plan.md, verbatim.
  const CommPlan p = parse_plan(R"(plan hand
world 2
tensor in 4x8 input elem=2
tensor out 8x8 output elem=2
signal 0.0 expect 1
signal 0.1 expect 1
signal 1.0 expect 1
signal 1.1 expect 1
on 0 chunk 0 copy sm 0:in[0:4,0:8] -> 0:out[0:4,0:8] signal 0.0+1
on 0 chunk 2 push sm 0:in[0:4,0:8] -> 1:out[0:4,0:8] signal 1.1+1
on 1 chunk 1 copy sm 1:in[0:4,0:8] -> 1:out[4:8,0:8] signal 1.0+1
on 1 chunk 3 push sm 1:in[0:4,0:8] -> 0:out[4:8,0:8] signal 0.1+1
)");
  const VerifyResult r = verify(p, {.workers_per_rank = 1});
  EXPECT_TRUE(r.ok) << r.text();
  EXPECT_EQ(p.num_transfers(), size_t{4});
}
