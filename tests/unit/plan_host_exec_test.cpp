// The host backend executing lowered tables (plan::HostExecutor): AG+GEMM (all-gather of A
// by rows, then C = A*B tile by tile, the tile function below) for world sizes 1, 2, 3, 4 and
// 8, every all-gather algorithm, splits 1 and 3, bf16 and float, three calls in a row with
// fresh inputs; a hand-written text plan; a plan with two inputs; the fault tests (a rank that
// skips a call, a rank whose transfers never run) and tables the executor must refuse. The
// reduce transfers and tile counters of GEMM+RS / GEMM+AR run through the same executor in
// gemm_overlap_host_test.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <thread>

#include "rank_harness.hpp"
#include "weft/core/error.hpp"
#include "weft/device/dtype.hpp"
#include "weft/plan/host_executor.hpp"
#include "weft/plan/schedule.hpp"
#include "weft/plan/templates.hpp"
#include "weft/plan/text.hpp"
#include "weft/runtime/backend.hpp"

using namespace weft;
using namespace weft::plan;
using namespace weft::testing;

namespace {

// Shapes that divide nothing evenly: 13-row shards in 8-row tiles (tiles straddle shards and
// split chunks), N = 23 in 5-column tiles, K = 19.
constexpr int64_t kM = 13, kK = 19, kN = 23, kTileRows = 8, kTileCols = 5;

// Inputs are small integers, exact in bf16 (|a| <= 120 < 256) and in float; every product
// sum is below 2^24, so the float result is exact whatever the order of the adds. A encodes
// the global row g = rank*m + i and the column (241 is prime and larger than any row count
// here, so no two rows of A are equal) and the epoch; B encodes the rank that holds it.
float a_value(int64_t g, int64_t k, int64_t epoch) {
  return static_cast<float>(((g * kK + k) * 37 + epoch * 101) % 241 - 120);
}
float b_value(int rank, int64_t k, int64_t j, int64_t epoch) {
  return static_cast<float>((k * 3 + j * 7 + epoch + rank * 5) % 11 - 5);
}

std::vector<unsigned char> encode(const std::vector<float>& v, dev::DType t) {
  std::vector<unsigned char> out(v.size() * dev::dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == dev::DType::kF32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const dev::bf16_t x = dev::from_float<dev::bf16_t>(v[i]);
      std::memcpy(out.data() + 2 * i, &x, 2);
    }
  }
  return out;
}

const char* algo_name(AllGatherAlgo a) {
  return a == AllGatherAlgo::kDirect ? "direct" : a == AllGatherAlgo::kRing ? "ring" : "bidirectional_ring";
}

struct AgGemmCase {
  CommPlan plan;
  TileSchedule schedule;
  Lowered lowered;
  HostExecutorOptions options;
  dev::DType dtype = dev::DType::kBF16;  // of A and B; C is float
};

HostExecutor make_executor(Backend& b, const AgGemmCase& s) {
  return HostExecutor(b, s.plan, s.schedule, s.lowered, "ag_gemm_test", s.options);
}

// Rows [r0, r1) x cols [c0, c1) of C = A * B, A [.. x K] and B [K x N] of T, every product
// accumulated in float in k order (the reference does the same, so results agree to the bit).
template <class T>
void gemm_tile(const void* a, const void* b, float* c, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  const T* at = static_cast<const T*>(a);
  const T* bt = static_cast<const T*>(b);
  for (int64_t i = r0; i < r1; ++i)
    for (int64_t j = c0; j < c1; ++j) {
      float acc = 0.0f;
      for (int64_t k = 0; k < kK; ++k) acc += dev::to_float(at[i * kK + k]) * dev::to_float(bt[k * kN + j]);
      c[i * kN + j] = acc;
    }
}

// Splits 1: tiles in chunk-arrival order, one worker of each kind (the tightest progress).
// Splits 3: rotated by rank and swizzled, two teams of two workers each.
AgGemmCase make_setup(AllGatherAlgo algo, int world, int splits, dev::DType dtype) {
  AgGemmCase s;
  s.plan = all_gather(algo, world, kM, kK, {.splits = splits, .elem_bytes = static_cast<int>(dev::dtype_size(dtype))});
  s.schedule = gemm_schedule(s.plan, "out", kN, kTileRows, kTileCols);
  if (splits == 1) {
    order_by_arrival(s.schedule, s.plan);
  } else {
    rotate_by_rank(s.schedule);
    swizzle(s.schedule, 2);
  }
  s.lowered = lower(s.plan, s.schedule);
  s.dtype = dtype;
  s.options.dtype = dtype;
  s.options.transfer_workers = splits == 1 ? 1 : 2;
  s.options.tile_workers = splits == 1 ? 1 : 2;
  s.options.threads = splits == 1 ? 1 : 2;
  return s;
}

// One call (epoch `e`) on this rank: fresh inputs, C poisoned with NaN, compared exactly
// with a host reference computed from the same formulas. The plan gathers its input tensor
// 'in' (A_r) into 'out' (A, the schedule's tensor); tiles read 'out' on this rank.
void run_and_check(HostExecutor& x, int rank, int world, int64_t e, dev::DType dtype, const std::string& what,
                   std::vector<ExecEvent>* events = nullptr) {
  std::vector<float> a(static_cast<size_t>(kM * kK)), b(static_cast<size_t>(kK * kN));
  for (int64_t i = 0; i < kM; ++i)
    for (int64_t k = 0; k < kK; ++k) a[static_cast<size_t>(i * kK + k)] = a_value(rank * kM + i, k, e);
  for (int64_t k = 0; k < kK; ++k)
    for (int64_t j = 0; j < kN; ++j) b[static_cast<size_t>(k * kN + j)] = b_value(rank, k, j, e);
  const auto a_bytes = encode(a, dtype), b_bytes = encode(b, dtype);
  const int64_t rows = int64_t{world} * kM;
  std::vector<float> c(static_cast<size_t>(rows * kN), std::numeric_limits<float>::quiet_NaN());
  const void* gathered = x.tensor(x.plan().tensor_id("out"));
  ExecCall call;
  call.input = a_bytes.data();
  call.input_tensor = x.plan().tensor_id("in");
  call.tile = [&](const TileEntry&, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    if (dtype == dev::DType::kF32)
      gemm_tile<float>(gathered, b_bytes.data(), c.data(), r0, r1, c0, c1);
    else
      gemm_tile<dev::bf16_t>(gathered, b_bytes.data(), c.data(), r0, r1, c0, c1);
  };
  call.events = events;
  x.run(call);
  for (int64_t g = 0; g < rows; ++g)
    for (int64_t j = 0; j < kN; ++j) {
      float want = 0.0f;
      for (int64_t k = 0; k < kK; ++k) want += a_value(g, k, e) * b_value(rank, k, j, e);
      const float got = c[static_cast<size_t>(g * kN + j)];
      WEFT_CHECK(got == want,
                 fmt::format("{} rank {} call {}: C[{}][{}] = {}, expected {}", what, rank, e, g, j, got, want));
    }
  WEFT_CHECK(x.epoch() == e, fmt::format("{}: epoch {} after call {}", what, x.epoch(), e));
}

}  // namespace

class PlanHostExec : public ::testing::TestWithParam<int> {};

TEST_P(PlanHostExec, AgGemmIsExactForEveryAlgorithmSplitDtypeAndEpoch) {
  const int world = GetParam();
  expect_all_ok(run_host_ranks(world, [world] {
    auto backend = make_backend();
    const int rank = backend->rank();
    for (AllGatherAlgo algo : {AllGatherAlgo::kDirect, AllGatherAlgo::kRing, AllGatherAlgo::kBidirectionalRing})
      for (int splits : {1, 3})
        for (dev::DType dtype : {dev::DType::kBF16, dev::DType::kF32}) {
          const std::string what = fmt::format("all_gather.{} world {} splits {} {}", algo_name(algo), world, splits,
                                               dev::dtype_name(dtype));
          AgGemmCase s = make_setup(algo, world, splits, dtype);
          HostExecutor x = make_executor(*backend, s);
          for (int64_t e = 1; e <= 3; ++e) run_and_check(x, rank, world, e, dtype, what);
        }
  }));
}

INSTANTIATE_TEST_SUITE_P(PlanWorlds, PlanHostExec, ::testing::Values(1, 2, 3, 4, 8));

// A plan from text, not a template: an all-gather in which each rank *pulls* its peer's input
// in two column pieces (row-by-row copies, a remote read of an input tensor, which needs
// the input in place on every rank before anyone pulls) on two ranks, three calls.
TEST(PlanHostExecText, HandWrittenPullPlanWithColumnPieces) {
  expect_all_ok(run_host_ranks(2, [] {
    auto backend = make_backend();
    const int rank = backend->rank();
    const int64_t half = kK / 2;
    std::string text =
        fmt::format("plan pull_halves\nworld 2\ntensor in {m}x{k} input elem=4\ntensor out {m2}x{k} output elem=4\n",
                    fmt::arg("m", kM), fmt::arg("k", kK), fmt::arg("m2", 2 * kM));
    for (int r = 0; r < 2; ++r)
      for (int i = 0; i < 3; ++i) text += fmt::format("signal {}.{} expect 1\n", r, i);
    for (int r = 0; r < 2; ++r) {
      const int q = 1 - r;
      text += fmt::format(
          "on {r} chunk {c0} copy sm {r}:in[0:{m},0:{k}] -> {r}:out[{o}:{o1},0:{k}] signal {r}.0+1\n"
          "on {r} chunk {c1} pull sm {q}:in[0:{m},0:{h}] -> {r}:out[{p}:{p1},0:{h}] signal {r}.1+1\n"
          "on {r} chunk {c2} pull sm {q}:in[0:{m},{h}:{k}] -> {r}:out[{p}:{p1},{h}:{k}] signal {r}.2+1\n",
          fmt::arg("r", r), fmt::arg("q", q), fmt::arg("m", kM), fmt::arg("k", kK), fmt::arg("h", half),
          fmt::arg("o", r * kM), fmt::arg("o1", (r + 1) * kM), fmt::arg("p", q * kM), fmt::arg("p1", (q + 1) * kM),
          fmt::arg("c0", 3 * r), fmt::arg("c1", 3 * r + 1), fmt::arg("c2", 3 * r + 2));
    }
    AgGemmCase s;
    s.plan = parse_plan(text, "pull_halves.plan");
    s.dtype = dev::DType::kF32;
    s.options.transfer_workers = s.options.tile_workers = 2;
    s.schedule = gemm_schedule(s.plan, "out", kN, kTileRows, kTileCols);
    s.lowered = lower(s.plan, s.schedule);
    s.options.threads = 3;
    HostExecutor x = make_executor(*backend, s);
    const LoweredRank& lr = s.lowered.ranks[static_cast<size_t>(rank)];
    for (int64_t e = 1; e <= 3; ++e) {
      std::vector<ExecEvent> events;
      run_and_check(x, rank, 2, e, dev::DType::kF32, "pull_halves", &events);
      // One event per transfer and per tile, each once, named after what it ran.
      WEFT_CHECK(
          events.size() == lr.transfers.size() + lr.tiles.size(),
          fmt::format("{} events for {} transfers and {} tiles", events.size(), lr.transfers.size(), lr.tiles.size()));
      std::set<int64_t> chunks, tiles;
      for (const ExecEvent& ev : events) {
        WEFT_CHECK(ev.end_ns >= ev.start_ns && ev.worker >= 0 && ev.worker < 2, ev.name);
        if (ev.what == ExecEvent::What::kTransfer) {
          WEFT_CHECK(chunks.insert(ev.id).second && ev.name.rfind(fmt::format("chunk {} ", ev.id), 0) == 0, ev.name);
        } else {
          const TileEntry& t = lr.tiles.at(static_cast<size_t>(ev.id));
          WEFT_CHECK(tiles.insert(ev.id).second && ev.name == fmt::format("tile ({},{})", t.m, t.n), ev.name);
        }
      }
      WEFT_CHECK(chunks.size() == lr.transfers.size() && tiles.size() == lr.tiles.size(), "events repeat");
    }
  }));
}

// A plan with two input tensors (ExecCall::more_inputs), each pulled remotely by the peer:
// both are copied in before anyone reads them and stay untouched until the peer is done with
// the previous call's contents (the calls' values differ, so a late pull of a new input or an
// early one of an old input shows), three calls; an input given twice is refused.
TEST(PlanHostExecText, TwoInputsPulledByThePeer) {
  expect_all_ok(run_host_ranks(2, [] {
    auto backend = make_backend();
    const int rank = backend->rank();
    PlanBuilder b("pull_two", 2);
    Tensor t;
    t.elem_bytes = 4;
    t.cols = kK;
    t.rows = kM;
    t.role = Role::kInput;
    t.name = "in";
    const int in = b.add_tensor(t);
    t.name = "in2";
    const int in2 = b.add_tensor(t);
    t.rows = 2 * kM;
    t.role = Role::kOutput;
    t.name = "out";
    const int out = b.add_tensor(t);
    t.name = "out2";
    const int out2 = b.add_tensor(t);
    for (int r = 0; r < 2; ++r) {
      const int q = 1 - r;
      for (auto [src, dst] : {std::pair{in, out}, std::pair{in2, out2}}) {
        Transfer own;
        own.kind = Kind::kCopy;
        own.src = {r, src, Region::rect(0, kM, 0, kK)};
        own.dst = {r, dst, Region::rect(r * kM, (r + 1) * kM, 0, kK)};
        own.signal = b.new_signal(r);
        b.add(r, own);
        Transfer pull;
        pull.kind = Kind::kPull;
        pull.src = {q, src, Region::rect(0, kM, 0, kK)};
        pull.dst = {r, dst, Region::rect(q * kM, (q + 1) * kM, 0, kK)};
        pull.signal = b.new_signal(r);
        b.add(r, pull);
      }
    }
    AgGemmCase s;
    s.plan = b.finish();
    s.schedule = row_schedule(s.plan, "out", kTileRows);
    s.lowered = lower(s.plan, s.schedule);
    s.options.dtype = dev::DType::kF32;
    HostExecutor x = make_executor(*backend, s);
    auto value = [](int which, int64_t g, int64_t k, int64_t e) { return a_value(g, k, e) + 300.0f * which; };
    for (int64_t e = 1; e <= 3; ++e) {
      std::vector<float> v1(static_cast<size_t>(kM * kK)), v2(v1.size());
      for (int64_t i = 0; i < kM; ++i)
        for (int64_t k = 0; k < kK; ++k) {
          v1[static_cast<size_t>(i * kK + k)] = value(0, rank * kM + i, k, e);
          v2[static_cast<size_t>(i * kK + k)] = value(1, rank * kM + i, k, e);
        }
      std::vector<float> got(static_cast<size_t>(2 * kM * kK), std::numeric_limits<float>::quiet_NaN());
      ExecCall call;
      call.input = v1.data();
      call.input_tensor = in;
      call.more_inputs = {{in2, v2.data()}};
      call.tile = [](const TileEntry&, int64_t, int64_t, int64_t, int64_t) {};
      call.output_tensor = out;
      call.output = got.data();
      x.run(call);
      const auto* got2 = static_cast<const float*>(x.tensor(out2));
      for (int64_t g = 0; g < 2 * kM; ++g)
        for (int64_t k = 0; k < kK; ++k) {
          const size_t i = static_cast<size_t>(g * kK + k);
          WEFT_CHECK(got[i] == value(0, g, k, e) && got2[i] == value(1, g, k, e),
                     fmt::format("rank {} call {}: out[{}][{}] = {}, out2 = {} (expected {}, {})", rank, e, g, k,
                                 got[i], got2[i], value(0, g, k, e), value(1, g, k, e)));
        }
    }
    ExecCall twice;
    std::vector<float> v(static_cast<size_t>(kM * kK), 0.0f);
    twice.input = v.data();
    twice.input_tensor = in;
    twice.more_inputs = {{in2, v.data()}, {in, v.data()}};
    twice.tile = [](const TileEntry&, int64_t, int64_t, int64_t, int64_t) {};
    std::string msg;
    try {
      x.run(twice);
    } catch (const InvalidArgument& e) {
      msg = e.what();
    }
    WEFT_CHECK(msg.find("input tensor 0 given twice") != std::string::npos, "not refused: " + msg);
    WEFT_CHECK(x.epoch() == 3, "the refused call counted");
  }));
}

// A rank that skips the second call: every other rank ends in a TimeoutError that names it
// (here at the epoch barrier, which no rank passes without every peer), within the deadline.
TEST(PlanHostExecFaults, RankThatSkipsACallIsNamedByEveryPeer) {
  const int world = 3, victim = 1;
  const int64_t timeout_ms = 800;
  const auto t0 = std::chrono::steady_clock::now();
  auto res = run_host_ranks(
      world,
      [] {
        auto backend = make_backend();
        const int rank = backend->rank();
        AgGemmCase s = make_setup(AllGatherAlgo::kDirect, world, 1, dev::DType::kBF16);
        HostExecutor x = make_executor(*backend, s);
        run_and_check(x, rank, world, 1, dev::DType::kBF16, "first call");
        if (rank == victim) {
          // Alive but silent past everyone's deadline: the peers must not rely on its exit.
          std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms + 700));
          return;
        }
        try {
          run_and_check(x, rank, world, 2, dev::DType::kBF16, "second call");
        } catch (const TimeoutError& e) {
          throw Error(fmt::format("TimeoutError naming rank {}: {}", e.peer(), e.what()));
        }
      },
      {}, timeout_ms);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, timeout_ms / 1000.0 + 5.0) << "the waiters did not give up within the deadline";
  for (const auto& r : res) {
    if (r.rank == victim) {
      EXPECT_EQ(r.exit_code, 0) << r.message;
      continue;
    }
    EXPECT_EQ(r.exit_code, 1) << "rank " << r.rank << (r.killed_by_launcher ? " hung" : "");
    EXPECT_NE(r.message.find("TimeoutError naming rank 1:"), std::string::npos) << r.message;
    EXPECT_NE(r.message.find("rank 1 did not arrive"), std::string::npos) << r.message;
  }
}

// A rank that calls but whose transfer tables are empty (its chunks never move): the peers'
// tiles time out on the signals its chunks would have bumped, and the error names it.
TEST(PlanHostExecFaults, RankWhoseTransfersNeverRunIsNamedBySignalWaits) {
  const int world = 3, victim = 1;
  auto res = run_host_ranks(
      world,
      [] {
        auto backend = make_backend();
        const int rank = backend->rank();
        AgGemmCase s = make_setup(AllGatherAlgo::kDirect, world, 1, dev::DType::kF32);
        if (rank == victim) {
          LoweredRank& lr = s.lowered.ranks[victim];
          lr.transfers.clear();
          lr.transfer_waits.clear();
          lr.counter_wait_begin = {0};
          lr.counter_waits.clear();
        }
        HostExecutor x = make_executor(*backend, s);
        try {
          run_and_check(x, rank, world, 1, dev::DType::kF32, "call");
        } catch (const TimeoutError& e) {
          throw Error(fmt::format("TimeoutError naming rank {}: {}", e.peer(), e.what()));
        }
      },
      {}, 800);
  for (const auto& r : res) {
    EXPECT_EQ(r.exit_code, 1) << "rank " << r.rank << (r.killed_by_launcher ? " hung" : "");
    if (r.rank == victim) continue;  // it waits for its own copy, which never ran either
    EXPECT_NE(r.message.find("TimeoutError naming rank 1:"), std::string::npos) << r.message;
    EXPECT_NE(r.message.find("signal wait timed out"), std::string::npos) << r.message;
    EXPECT_NE(r.message.find("rank 1 did not arrive"), std::string::npos) << r.message;
  }
}

// Tables the executor cannot run are refused before anything is allocated, by message.
TEST(PlanHostExecFaults, RefusesTablesItCannotRun) {
  expect_all_ok(run_host_ranks(2, [] {
    auto backend = make_backend();
    auto expect_refusal = [&](const AgGemmCase& s, const std::string& needle) {
      std::string msg;
      try {
        make_executor(*backend, s);
      } catch (const InvalidArgument& e) {
        msg = e.what();
      }
      WEFT_CHECK(msg.find(needle) != std::string::npos,
                 fmt::format("expected a refusal containing '{}', got '{}'", needle, msg));
    };
    AgGemmCase s = make_setup(AllGatherAlgo::kRing, 2, 3, dev::DType::kBF16);
    // Element size of the plan differs from the element type given.
    AgGemmCase wrong_type = s;
    wrong_type.options.dtype = dev::DType::kF32;
    expect_refusal(wrong_type, "f32 elements are 4 bytes");
    // A region past the end of its tensor would write into a neighbour on the heap.
    AgGemmCase overrun = s;
    overrun.lowered.ranks[1].transfers[0].rows += 100;
    expect_refusal(overrun, "do not fit");
    // A tile missing from a rank's table would leave a hole in C.
    AgGemmCase hole = s;
    hole.lowered.ranks[0].tiles.pop_back();
    expect_refusal(hole, "rank 0 has 19 tiles, the 4x5 grid 20");
    // A reduce adds elements: without an element type the executor cannot.
    AgGemmCase reduce = s;
    reduce.options.dtype.reset();
    reduce.lowered.ranks[1].transfers[1].kind = static_cast<int32_t>(Kind::kReduce);
    expect_refusal(reduce, "need the element type");
    // A push in rank 0's table from rank 1's memory is rank 1's to run.
    AgGemmCase misplaced = s;
    misplaced.lowered.ranks[0].transfers[0].kind = static_cast<int32_t>(Kind::kPush);
    misplaced.lowered.ranks[0].transfers[0].src_rank = 1;
    expect_refusal(misplaced, "a push from rank 1 to rank 0 cannot run on rank 0");
    AgGemmCase unknown = s;
    unknown.lowered.ranks[0].transfers[0].kind = 9;
    expect_refusal(unknown, "unknown transfer kind 9");
    // A wait on a signal past the rank's slab.
    AgGemmCase bad_wait = s;
    bad_wait.lowered.ranks[0].tile_waits[0].signal = 99;
    expect_refusal(bad_wait, "are not valid entries");
    // Counter tables: a wait on a counter that does not exist, a notify of a rank outside.
    AgGemmCase bad_counter = s;
    bad_counter.lowered.ranks[1].counter_waits.push_back(CounterWait{0, 7, 1});
    bad_counter.lowered.ranks[1].counter_wait_begin.back() += 1;
    expect_refusal(bad_counter, "counter waits");
    AgGemmCase bad_notify = s;
    bad_notify.lowered.ranks[0].notify_ranks.push_back(5);
    for (size_t c = 1; c < bad_notify.lowered.ranks[0].notify_begin.size(); ++c)
      bad_notify.lowered.ranks[0].notify_begin[c] += 1;
    expect_refusal(bad_notify, "notify ranks [0, 1) are not valid");
    // Tables lowered from another schedule (4 row blocks there, 2 here).
    AgGemmCase other = s;
    other.schedule = gemm_schedule(s.plan, "out", kN, 2 * kTileRows, kTileCols);
    expect_refusal(other, "counters");
    // A schedule for a tensor the plan does not have.
    AgGemmCase no_tensor = s;
    no_tensor.schedule.tensor = "nowhere";
    expect_refusal(no_tensor, "the schedule's tensor 'nowhere'");
    // The verifier's verdict (options.verify): a dependency rank 1 has no signal to wait on.
    AgGemmCase invalid = make_setup(AllGatherAlgo::kRing, 2, 1, dev::DType::kBF16);
    invalid.plan.queues[1].back().deps.push_back(invalid.plan.queues[0][0].chunk);
    expect_refusal(invalid, "plan all_gather.ring is invalid");
  }));
}
