// Fuzzing, bounded in time (issue 28): the plan text parser, the tunables' parsing, the tuning
// cache, and random shapes for every op on the host backend (exact results). Seeds are fixed,
// so a failure reproduces; each fuzzer stops at its iteration count or its time budget,
// whichever comes first (the ASan/UBSan build runs them several times slower).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "collectives_check.hpp"
#include "gemm_overlap_check.hpp"
#include "rank_harness.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/collectives.hpp"
#include "weft/ops/gemm_overlap.hpp"
#include "weft/plan/cost.hpp"
#include "weft/plan/templates.hpp"
#include "weft/plan/text.hpp"
#include "weft/plan/verify.hpp"

using namespace weft;
using namespace weft::testing;

namespace {

using Clock = std::chrono::steady_clock;

struct Budget {
  Clock::time_point end;
  int left;
  Budget(double seconds, int iterations)
      : end(Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000))), left(iterations) {}
  bool more() { return left-- > 0 && Clock::now() < end; }
};

// Tokens that break parsers: signs, overflow, separators, empties.
const std::vector<std::string> kNasty = {"",   "-1", "0", "18446744073709551616", "9223372036854775807", "-9223372036854775808",
                                         "1e9", "x",  ":", "[",                    "]",                   "->",
                                         ",",   "  ", "\t", "#",                   "4x",                  "x4",
                                         "0x10", "nan", "+3", "2147483648",        "99999999999999999999999999"};

std::string mutate(std::string s, std::mt19937_64& rng) {
  const int ops = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < ops && !s.empty(); ++i) {
    const size_t at = rng() % s.size();
    switch (rng() % 6) {
      case 0:  // a random printable character
        s[at] = static_cast<char>(32 + rng() % 95);
        break;
      case 1:  // delete a range
        s.erase(at, 1 + rng() % 16);
        break;
      case 2:  // insert a nasty token
        s.insert(at, kNasty[rng() % kNasty.size()]);
        break;
      case 3: {  // replace the number under `at` by a nasty token
        size_t b = at, e = at;
        while (b > 0 && std::isdigit(static_cast<unsigned char>(s[b - 1]))) --b;
        while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
        s.replace(b, e - b, kNasty[rng() % kNasty.size()]);
        break;
      }
      case 4: {  // duplicate a line
        const size_t b = s.rfind('\n', at), e = s.find('\n', at);
        const size_t lb = b == std::string::npos ? 0 : b + 1, le = e == std::string::npos ? s.size() : e;
        s.insert(le, "\n" + s.substr(lb, le - lb));
        break;
      }
      default:  // truncate
        s.resize(at);
    }
  }
  return s;
}

}  // namespace

// Mutated printed plans: parse_plan either refuses them with weft's InvalidArgument or
// returns a plan whose printed form parses back to itself; the verifier then answers (small
// plans: a plan's tensors are what the verifier walks) without crashing.
TEST(Fuzz, PlanTextParser) {
  std::vector<std::string> corpus;
  for (int w : {2, 3})
    for (int splits : {1, 2}) {
      plan::TemplateOptions o;
      o.splits = splits;
      corpus.push_back(plan::print_plan(plan::all_gather(plan::AllGatherAlgo::kRing, w, 6, 4, o)));
      corpus.push_back(plan::print_plan(plan::reduce_scatter(plan::ReduceScatterAlgo::kStaged, w, 6, 4, o)));
      corpus.push_back(plan::print_plan(plan::all_reduce(plan::AllReduceAlgo::kTwoShot, w, 6 * w, 4, o)));
      corpus.push_back(plan::print_plan(plan::all_to_all_counts({{1, 2, 0}, {0, 3, 1}, {2, 2, 2}}, 4, o)));
    }
  std::mt19937_64 rng(20261126);
  Budget budget(6.0, 4000);
  int parsed = 0, refused = 0;
  while (budget.more()) {
    const std::string text = mutate(corpus[rng() % corpus.size()], rng);
    plan::CommPlan p;
    try {
      p = plan::parse_plan(text, "fuzz");
    } catch (const InvalidArgument&) {
      ++refused;
      continue;
    }
    ++parsed;
    const std::string again = plan::print_plan(p);
    ASSERT_EQ(plan::parse_plan(again, "fuzz.again"), p) << "printed form does not parse back:\n" << text;
    int64_t elements = 0;
    for (const auto& t : p.tensors) elements += t.rows * t.cols;
    if (elements <= (1 << 20) && p.world <= 64) (void)plan::verify(p);
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(refused, 0);
}

// Random values for every tunable: validate_tunables accepts them or throws InvalidArgument
// naming the variable; nothing else (no std::out_of_range, no crash).
TEST(Fuzz, TunableValues) {
  std::mt19937_64 rng(7);
  const auto all = all_tunables();
  Budget budget(3.0, 3000);
  while (budget.more()) {
    const auto& t = all[rng() % all.size()];
    std::string v = kNasty[rng() % kNasty.size()];
    if (rng() % 2) v += std::to_string(static_cast<int64_t>(rng()));
    if (rng() % 4 == 0) v = std::string(1 + rng() % 300, static_cast<char>('0' + rng() % 10));
    const EnvMap env{{t.env, v}};
    try {
      validate_tunables(env);
    } catch (const InvalidArgument& e) {
      ASSERT_NE(std::string(e.what()).find(t.env), std::string::npos) << e.what();
    }
  }
}

// Random tuning-cache files: the op ignores what it cannot use and runs exact.
TEST(Fuzz, TuningCache) {
  const std::string path = fmt::format("/tmp/weft-fuzz-cache-{}.json", ::getpid());
  expect_all_ok(run_host_ranks(1, [path] {
    auto b = make_backend();
    ops::GemmOverlapConfig c = overlap_config({ops::GemmOp::kGemmRs, 8, 16, 9});
    c.tune_cache = path;
    std::string key;
    {
      std::ofstream(path) << "{}";
      ops::GemmOverlap probe(*b, c);
      key = probe.tuning_key();
    }
    const std::vector<std::string> values = {"\"baseline\"", "\"decomposed\"", "\"fused\"", "\"auto\"", "\"x\"",
                                             "1",            "-1",             "1e400",     "null",     "[]",
                                             "{}",           "true",           "2",         "0",        "\"\""};
    std::mt19937_64 rng(11);
    Budget budget(4.0, 150);
    int64_t e = 0;
    while (budget.more()) {
      std::string body;
      switch (rng() % 4) {
        case 0:
          body = fmt::format("{{\"{}\": {{\"method\": {}, \"chunks\": {}}}}}", key, values[rng() % values.size()],
                             values[rng() % values.size()]);
          break;
        case 1:
          body = fmt::format("{{\"{}\": {}}}", key, values[rng() % values.size()]);
          break;
        case 2:
          body = mutate(fmt::format("{{\"{}\": {{\"method\": \"decomposed\", \"chunks\": 2}}}}", key), rng);
          break;
        default:
          body = values[rng() % values.size()];
      }
      std::ofstream(path) << body;
      ops::GemmOverlap op(*b, c);
      std::vector<uint16_t> a(static_cast<size_t>(op.a_rows() * op.a_cols())),
          w(static_cast<size_t>(op.b_rows() * op.b_cols())), out(static_cast<size_t>(op.c_rows() * op.c_cols()));
      fill_overlap_inputs(op, 0, ++e, false, a.data(), w.data());
      op.run(a.data(), w.data(), out.data(), {});
      check_overlap_output(op, out.data(), 0, 1, e, false, "cache " + body);
    }
  }));
  std::remove(path.c_str());
}

// Files that never end (/dev/zero) or are not files: a tuning cache there is ignored (the op
// runs, exact), a device-constants file there is refused by name -- neither is read without end.
TEST(Fuzz, EndlessFilesAreNeverRead) {
  const auto t0 = std::chrono::steady_clock::now();
  for (const char* path : {"/dev/zero", "/tmp"}) {
    try {
      plan::load_device_constants(path);
      ADD_FAILURE() << path << " was accepted as device constants";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.message()).find(path), std::string::npos) << e.message();
    }
  }
  expect_all_ok(run_host_ranks(1, [] {
    auto b = make_backend();
    ops::GemmOverlapConfig c = overlap_config({ops::GemmOp::kGemmRs, 8, 16, 9});
    c.tune_cache = "/dev/zero";
    ops::GemmOverlap op(*b, c);
    std::vector<uint16_t> a(static_cast<size_t>(op.a_rows() * op.a_cols())),
        w(static_cast<size_t>(op.b_rows() * op.b_cols())), out(static_cast<size_t>(op.c_rows() * op.c_cols()));
    fill_overlap_inputs(op, 0, 1, false, a.data(), w.data());
    op.run(a.data(), w.data(), out.data(), {});
    check_overlap_output(op, out.data(), 0, 1, 1, false, "cache /dev/zero");
  }));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
}

// Random shapes, types, layouts and chunk counts for every GEMM + communication op and
// every method, and random counts for every collective and method, on 2 and 3 host ranks:
// every output exact.
TEST(Fuzz, RandomShapesEveryOpIsExact) {
  for (int world : {2, 3}) {
    SCOPED_TRACE(fmt::format("world {}", world));
    expect_all_ok(run_host_ranks(world, [] {
      auto b = make_backend();
      const int rank = b->rank(), w = b->size();
      std::mt19937_64 rng(1000 + static_cast<uint64_t>(w));  // the same on every rank
      Budget budget(12.0, 24);
      int64_t e = 0;
      while (true) {
        // Every rank draws the same case; the budget's clock may differ, so rank 0 decides.
        int go = budget.more() ? 1 : 0;
        b->bootstrap().broadcast(&go, sizeof go, 0);
        if (!go) break;
        const auto op = static_cast<ops::GemmOp>(rng() % 3);
        const int64_t m = op == ops::GemmOp::kGemmAr ? 1 + static_cast<int64_t>(rng() % 70)
                                                     : w * (1 + static_cast<int64_t>(rng() % 24));
        const int64_t k = w * 8 * (1 + static_cast<int64_t>(rng() % 3));
        const int64_t n = 1 + static_cast<int64_t>(rng() % 40);
        const auto t = rng() % 2 ? dev::DType::kBF16 : dev::DType::kF16;
        const auto layout = rng() % 2 ? ops::BLayout::kNK : ops::BLayout::kKN;
        const int chunks = static_cast<int>(rng() % 5);
        ops::GemmOverlap g(*b, overlap_config({op, m, k, n}, t, layout, chunks));
        std::vector<uint16_t> a(static_cast<size_t>(g.a_rows() * g.a_cols())),
            wt(static_cast<size_t>(g.b_rows() * g.b_cols())), c(static_cast<size_t>(g.c_rows() * g.c_cols()));
        for (ops::GemmMethod meth : {ops::GemmMethod::kBaseline, ops::GemmMethod::kDecomposed,
                                     ops::GemmMethod::kFused, ops::GemmMethod::kAuto}) {
          fill_overlap_inputs(g, rank, ++e, false, a.data(), wt.data());
          g.run(a.data(), wt.data(), c.data(), {.method = meth});
          check_overlap_output(g, c.data(), rank, w, e, false,
                               fmt::format("{} {}x{}x{} {} {} chunks {} {}", ops::to_string(op), m, k, n,
                                           dev::dtype_name(t), ops::to_string(layout), chunks,
                                           ops::to_string(meth)));
        }
        // A collectives object per case: its per-shape state goes back to the heap with it.
        ops::Collectives coll(*b);
        HostMemory mem;
        CollectivesSuite suite(*b, coll, mem);
        suite.run_all({1 + rng() % 5000});
      }
    }));
  }
}
