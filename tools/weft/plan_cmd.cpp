#include "plan_cmd.hpp"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>
#include <tuple>

#include "cli_util.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/gemm_overlap_model.hpp"
#include "weft/ops/gemv_ar.hpp"
#include "weft/plan/cost.hpp"
#include "weft/plan/dlrm.hpp"
#include "weft/plan/schedule.hpp"
#include "weft/plan/templates.hpp"
#include "weft/plan/text.hpp"
#include "weft/plan/verify.hpp"

namespace weft::cli {
namespace {

struct PlanOptions {
  std::string collective = "all_gather";
  std::string algo = "direct";
  std::string file;  // a hand-written plan instead of a template
  int world = 2;
  int64_t rows = 1024;
  int64_t cols = 1024;
  int splits = 1;
  int workers = 0;             // resident transfer workers per rank (verifier, simulation); 0: unlimited
  int ctas = 0;                // CTAs the op's SM transfers run on (simulation); 0: whole-GPU rates
  bool entry_barrier = false;  // ranks wait for every peer's entry flag first (simulation)
  int64_t gemm_n = 0, gemm_k = 0, tile = 128;  // a GEMM consuming the output (AG+GEMM)
  std::string order = "arrival";               // tile order: arrival, rotate, plain
  std::string constants;                       // empty: bench/constants/h200x2.json here or in the source tree
  std::string trace;                           // Chrome-trace JSON of the simulated timeline
  bool print = false;
  // plan --op: the GEMM op's methods as auto predicts them (global M x K x N, like the bench)
  std::string gemm_op;
  int64_t m = 0, k = 0, n = 0;
  int chunks = 0;         // 0: the model's best
  bool epilogue = false;  // --op gemv_ar
  // simulate
  int nodes = 1, gpus = 2;
  double link_gbps = 0, net_gbps = 50;
  int64_t bytes = 0;
  // simulate --model dlrm
  std::string model;
  std::string calibration;  // a `weft bench embedding_a2a` JSON; empty: bench/constants/embedding_a2a-h200x2.json
  int64_t batch = 4096;
};

// The transfers and tiles (over all ranks) the CLI builds and simulates for one plan.
// plan::simulate's time grows with the square of that count (each step scans every waiting
// item): at this bound it takes a few seconds on one core; all_to_all or a ring at world 64
// with the default sizes (4,096 transfers, 32,768 tiles) took 20 s, world 128 minutes.
constexpr int64_t kMaxPlanItems = 16384;

// The largest plan or constants file read (a plan at kMaxPlanItems is about a MiB of text).
constexpr size_t kMaxInputBytes = size_t{64} << 20;

void require_at_least(const char* option, int64_t value, int64_t least) {
  if (value < least)
    throw UsageError(fmt::format("{} must be {}, not {}", option, least == 0 ? "0 or more" : "positive", value));
}

void require_rate(const char* option, double value, bool zero_ok) {
  if (!std::isfinite(value) || value < 0 || (!zero_ok && value == 0))
    throw UsageError(fmt::format("{} must be a {} number of GB/s, not {}", option, zero_ok ? "non-negative" : "positive",
                                 value));
}

// Every number of plan/simulate: sizes positive, counts non-negative, and the byte count of a
// rank's output (rows x world x cols x 2 for an all-gather) within 64 bits.
void validate(const PlanOptions& o, int world, const char* world_option) {
  require_at_least(world_option, world, 1);
  require_at_least("--rows", o.rows, 1);
  require_at_least("--cols", o.cols, 1);
  require_at_least("--split", o.splits, 1);
  require_at_least("--workers", o.workers, 0);
  require_at_least("--ctas", o.ctas, 0);
  require_at_least("--gemm-n", o.gemm_n, 0);
  require_at_least("--gemm-k", o.gemm_k, 0);
  require_at_least("--tile", o.tile, 1);
  const int64_t out_rows = checked_mul(o.rows, world, fmt::format("--rows {} x world {}", o.rows, world));
  checked_mul(checked_mul(out_rows, o.cols, fmt::format("--rows {} x world {} x --cols {}", o.rows, world, o.cols)), 2,
              fmt::format("--rows {} x world {} x --cols {} x 2 bytes", o.rows, world, o.cols));
  if (o.gemm_n > 0)
    checked_mul(checked_mul(out_rows, o.gemm_n, "the GEMM's output rows x --gemm-n"), 2,
                "the GEMM's output rows x --gemm-n x 2 bytes");
}

std::string too_big(int64_t items) {
  return fmt::format(
      "; the CLI builds and simulates at most {} transfers and tiles over all ranks ({} here): the simulation's "
      "time grows with the square of that count. Use a smaller world, fewer --split, or larger --tile",
      kMaxPlanItems, items);
}

// Before building a template: about world^2 x splits transfers (all_to_all and the direct
// and ring templates; the all-reduces twice that), so a world of 1024 is refused before
// millions of transfers are allocated.
void check_template_size(const PlanOptions& o, int world, const char* world_option) {
  if (!o.file.empty()) return;
  const int64_t w2 = checked_mul(world, world, "world x world");
  const int64_t est = checked_mul(w2, o.splits, fmt::format("world^2 x --split {}", o.splits));
  if (est > kMaxPlanItems)
    throw UsageError(fmt::format("{} {} with --split {}: {} at this world has about world^2 x splits transfers{}",
                                 world_option, world, o.splits, o.collective, too_big(est)));
}

// After building: the exact transfer count plus the tiles of the schedule over tensor 'out'
// (computed in 64 bits, before the schedule's int tile indices are built).
void check_plan_size(const PlanOptions& o, const plan::CommPlan& p) {
  const int t = p.tensor_id("out");
  if (t < 0) return;  // build_schedule names the missing tensor
  const int64_t rows = p.tensors[static_cast<size_t>(t)].rows;
  const int64_t tiles_m = rows / o.tile + (rows % o.tile != 0);
  const int64_t tiles_n = o.gemm_n > 0 ? o.gemm_n / o.tile + (o.gemm_n % o.tile != 0) : 1;
  const int64_t per_rank = checked_mul(tiles_m, tiles_n, "tiles per rank");
  const int64_t tiles = checked_mul(per_rank, p.world, "tiles per rank x world");
  const auto transfers = static_cast<int64_t>(p.num_transfers());
  int64_t items = 0;
  if (__builtin_add_overflow(tiles, transfers, &items) || items > kMaxPlanItems)
    throw UsageError(fmt::format("plan {} on {} ranks: {} transfers and {} x {} tiles of {} rows on each rank of "
                                 "'out' ({} rows){}",
                                 p.name, p.world, transfers, tiles_m, tiles_n, o.tile, rows,
                                 too_big(items < 0 ? INT64_MAX : items)));
}

plan::CommPlan build_plan(const PlanOptions& o, int world, int64_t rows) {
  if (!o.file.empty()) return plan::parse_plan(read_input(o.file, "--file", kMaxInputBytes), o.file);
  plan::TemplateOptions t;
  t.splits = o.splits;
  const std::string& a = o.algo;
  if (o.collective == "all_gather") {
    auto algo = a == "direct"  ? plan::AllGatherAlgo::kDirect
                : a == "ring"  ? plan::AllGatherAlgo::kRing
                : a == "bidir" ? plan::AllGatherAlgo::kBidirectionalRing
                               : throw InvalidArgument("all_gather --algo: direct, ring or bidir, not '" + a + "'");
    return plan::all_gather(algo, world, rows, o.cols, t);
  }
  if (o.collective == "reduce_scatter") {
    auto algo = a == "direct"   ? plan::ReduceScatterAlgo::kDirect
                : a == "ring"   ? plan::ReduceScatterAlgo::kRing
                : a == "staged" ? plan::ReduceScatterAlgo::kStaged
                                : throw InvalidArgument("reduce_scatter --algo: direct, ring or staged, not '" + a + "'");
    return plan::reduce_scatter(algo, world, rows, o.cols, t);
  }
  if (o.collective == "all_reduce") {
    auto algo = a == "one-shot"   ? plan::AllReduceAlgo::kOneShot
                : a == "two-shot" ? plan::AllReduceAlgo::kTwoShot
                : a == "ring"     ? plan::AllReduceAlgo::kRing
                              : throw InvalidArgument("all_reduce --algo: one-shot, two-shot or ring, not '" + a + "'");
    return plan::all_reduce(algo, world, rows, o.cols, t);
  }
  if (o.collective == "all_to_all") return plan::all_to_all(world, rows, o.cols, t);
  throw InvalidArgument("--collective: all_gather, reduce_scatter, all_reduce or all_to_all, not '" + o.collective +
                        "'");
}

// The schedule of the consumer: a GEMM over the output when --gemm-n is given, else one
// 1-D tile per `tile` rows that only waits (so the prediction is the collective's time).
plan::TileSchedule build_schedule(const PlanOptions& o, const plan::CommPlan& p) {
  plan::TileSchedule s =
      o.gemm_n > 0 ? plan::gemm_schedule(p, "out", o.gemm_n, o.tile, o.tile) : plan::row_schedule(p, "out", o.tile);
  if (o.order == "arrival")
    plan::order_by_arrival(s, p);
  else if (o.order == "rotate")
    plan::rotate_by_rank(s);
  else
    WEFT_REQUIRE(o.order == "plain", "--order: arrival, rotate or plain, not '" + o.order + "'");
  return s;
}

plan::DeviceConstants constants(const PlanOptions& o) {
  if (!o.constants.empty())
    return plan::device_constants_from_json(read_input(o.constants, "--constants", kMaxInputBytes), o.constants);
  for (std::string path :
       {std::string("bench/constants/h200x2.json"), std::string(WEFT_SOURCE_DIR) + "/bench/constants/h200x2.json"}) {
    if (std::ifstream(path).good()) return plan::load_device_constants(path);
  }
  std::cerr << "weft: bench/constants/h200x2.json not found; using the built-in H200 constants\n";
  return plan::h200_constants();
}

void write_trace(const std::string& path, const plan::Prediction& pr) {
  // Chrome trace / Perfetto: a process per rank, a thread for transfers and one for tiles.
  nlohmann::json ev = nlohmann::json::array();
  for (const auto& e : pr.events)
    ev.push_back({{"name", fmt::format("{} {}", e.tile ? "tile" : "chunk", e.id)},
                  {"ph", "X"},
                  {"pid", e.rank},
                  {"tid", e.tile ? 1 : 0},
                  {"ts", e.start_us},
                  {"dur", e.end_us - e.start_us},
                  {"args", {{"took_us", e.take_us}}}});
  write_file(path, nlohmann::json{{"traceEvents", ev}, {"displayTimeUnit", "ns"}}.dump() + "\n");
}

constexpr const char* kWroteTrace = "wrote {} (open in Perfetto; tools/plot_timeline.py draws a PNG)\n";

// The report of `weft plan`. With --print it follows the plan as `#` comments, so that the
// whole output reads back with --file (the text format's comment syntax).
void say(const PlanOptions& o, const std::string& text) {
  if (!o.print) {
    std::cout << text;
    return;
  }
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::cout << "# " << std::string_view(text).substr(begin, end - begin) << "\n";
    begin = end + 1;
  }
}

// The GEMM op's methods predicted by the model GemmOverlap's auto uses (ops::predict_overlap,
// on the same formulas and constants as the plan simulation), with the fold and chunk count
// auto would take where weft's sm_90a GEMM and stream memory operations are available.
int run_gemm_op(const PlanOptions& o) {
  WEFT_REQUIRE(o.m > 0 && o.k > 0 && o.n > 0, "--op needs --m, --k and --n (the global GEMM shape)");
  require_at_least("--world", o.world, 1);
  require_at_least("--chunks", o.chunks, 0);
  for (const auto& [what, a, b] : {std::tuple{"--m x --k", o.m, o.k}, std::tuple{"--k x --n", o.k, o.n},
                                   std::tuple{"--m x --n", o.m, o.n}})
    checked_mul(checked_mul(a, b, fmt::format("{} ({} x {})", what, a, b)), 2, fmt::format("{} x 2 bytes", what));
  const ops::OverlapModelInput in{ops::parse_gemm_op(o.gemm_op), o.world, o.m, o.n, o.k, 2};
  const plan::DeviceConstants dev = constants(o);
  const ops::RsFold fold = ops::default_rs_fold(in, dev, /*weft_fold_ok=*/true);
  const ops::OverlapPrediction p = ops::predict_overlap(in, dev, fold, o.chunks);
  static constexpr const char* kFolds[] = {"reduce pass", "weft", "lt", "gather"};
  static constexpr const char* kCollectives[] = {"NCCL all-gather", "NCCL reduce-scatter", "NCCL all-reduce"};
  std::cout << fmt::format("{} {}x{}x{} (M x K x N, bf16) on {} ranks, predicted on {}:\n", o.gemm_op, o.m, o.k, o.n,
                           o.world, dev.device);
  std::cout << fmt::format("  baseline   {:10.1f} us (GEMM {:.1f} + {} {:.1f})\n", p.baseline_us, p.baseline_gemm_us,
                           kCollectives[static_cast<int>(in.op)], p.baseline_comm_us);
  std::cout << fmt::format("  decomposed {:10.1f} us ({} chunks{})\n", p.decomposed_us, p.chunks,
                           in.op == ops::GemmOp::kGemmRs && o.world > 1
                               ? fmt::format(", fold: {}", kFolds[static_cast<int>(fold)])
                               : std::string());
  if (p.fused_us > 0) std::cout << fmt::format("  fused      {:10.1f} us\n", p.fused_us);
  std::cout << fmt::format("auto: {}\n", ops::to_string(p.choice));
  return 0;
}

// GemvAllReduce's methods for --m tokens as its auto predicts them on GPUs (ops::predict_gemv_ar).
int run_gemv_op(const PlanOptions& o) {
  WEFT_REQUIRE(o.m > 0 && o.k > 0 && o.n > 0, "--op gemv_ar needs --m (tokens), --k and --n (the weight: N x K)");
  require_at_least("--world", o.world, 1);
  if (o.k % o.world != 0) throw UsageError(fmt::format("--k {} does not divide among {} ranks", o.k, o.world));
  checked_mul(checked_mul(o.n, o.k, fmt::format("--n x --k ({} x {})", o.n, o.k)), 2, "--n x --k x 2 bytes");
  checked_mul(checked_mul(o.m, o.n, fmt::format("--m x --n ({} x {})", o.m, o.n)), 2, "--m x --n x 2 bytes");
  const plan::DeviceConstants dev = constants(o);
  const ops::GemvAutoChoice a = ops::predict_gemv_ar(o.world, o.m, o.n, o.k, o.epilogue, dev);
  std::cout << fmt::format("gemv_ar M {} x K {} x N {} (bf16{}) on {} ranks, predicted on {}:\n", o.m, o.k, o.n,
                           o.epilogue ? ", + residual and RMSNorm" : "", o.world, dev.device);
  std::cout << fmt::format("  baseline   {:10.1f} us\n", a.predicted_baseline_us);
  if (o.world > 1) std::cout << fmt::format("  decomposed {:10.1f} us\n", a.predicted_decomposed_us);
  std::cout << fmt::format("  fused      {:10.1f} us\n", a.predicted_fused_us);
  std::cout << fmt::format("auto: {}\n", ops::to_string(a.method));
  return 0;
}

int run_plan(const PlanOptions& o) {
  if (o.gemm_op == "gemv_ar") return run_gemv_op(o);
  if (o.epilogue) throw UsageError("--epilogue: only with --op gemv_ar");
  if (!o.gemm_op.empty()) return run_gemm_op(o);
  validate(o, o.world, "--world");
  check_template_size(o, o.world, "--world");
  const plan::CommPlan p = build_plan(o, o.world, o.rows);
  check_plan_size(o, p);
  if (o.print) std::cout << plan::print_plan(p);
  plan::VerifyOptions vo;
  vo.workers_per_rank = o.workers;
  const auto v = plan::verify(p, vo);
  const size_t transfers = p.num_transfers();
  say(o, fmt::format("plan: {} ranks, {} transfers; verifier: {}\n", p.world, transfers, v.ok ? "ok" : "REJECTED"));
  if (!v.ok) {
    say(o, v.text());
    return 1;
  }
  const auto s = build_schedule(o, p);
  const auto sv = plan::verify_schedule(p, s, plan::ScheduleVerifyOptions{o.workers, 0, 32});
  if (!sv.ok) {
    say(o, "schedule: REJECTED\n" + sv.text());
    return 1;
  }
  std::string line = fmt::format("schedule: {} x {} tiles of {} rows, order '{}' (rank 0 first tiles:", s.tiles_m(),
                                 s.tiles_n(), s.tile_rows, o.order);
  for (size_t i = 0; i < std::min<size_t>(8, s.order[0].size()); ++i)
    line += fmt::format(" ({},{})", s.order[0][i].m, s.order[0][i].n);
  say(o, line + ")\n");
  const auto lowered = plan::lower(p, s);
  const auto dev = constants(o);
  plan::SimOptions so;
  so.gemm_k = o.gemm_k;
  so.comm_workers = o.workers;
  so.ctas = o.ctas;
  so.entry_barrier = o.entry_barrier;
  const auto pr = plan::simulate(p, s, lowered, dev, so);
  say(o, fmt::format("predicted on {}: {:.2f} us (communication ends {:.2f} us, tiles end {:.2f} us)\n", dev.device,
                     pr.total_us, pr.comm_us, pr.compute_us));
  if (!o.trace.empty()) {
    write_trace(o.trace, pr);
    say(o, fmt::format(kWroteTrace, o.trace));
  }
  return 0;
}

// A cluster of nodes x gpus: ranks on different nodes talk over the network engine.
int run_simulate(PlanOptions o) {
  require_at_least("--nodes", o.nodes, 1);
  require_at_least("--gpus", o.gpus, 1);
  require_at_least("--cols", o.cols, 1);
  require_at_least("--bytes", o.bytes, 0);
  require_rate("--link-gbps", o.link_gbps, /*zero_ok=*/true);  // 0: the constants file's
  require_rate("--net-gbps", o.net_gbps, /*zero_ok=*/false);
  const int64_t world64 = checked_mul(o.nodes, o.gpus, fmt::format("--nodes {} x --gpus {}", o.nodes, o.gpus));
  if (world64 > 1024)
    throw UsageError(fmt::format("--nodes {} x --gpus {} is a world of {}; the plan templates take 1..1024 ranks",
                                 o.nodes, o.gpus, world64));
  const int world = static_cast<int>(world64);
  if (o.bytes > 0) o.rows = std::max<int64_t>(1, o.bytes / checked_mul(o.cols, 2, "--cols x 2 bytes"));
  const int64_t rows = o.rows;
  validate(o, world, "--nodes x --gpus");
  check_template_size(o, world, "--nodes x --gpus");
  plan::CommPlan p = build_plan(o, world, rows);
  check_plan_size(o, p);
  int crossing = 0;
  for (auto& q : p.queues)
    for (auto& t : q)
      if (t.src.rank / o.gpus != t.dst.rank / o.gpus) {
        t.engine = plan::Engine::kNet;
        ++crossing;
      }
  plan::verify_or_throw(p);
  auto dev = constants(o);
  if (o.link_gbps > 0)
    for (auto& [e, g] : dev.link_gbps)
      if (e != plan::Engine::kNet) g = o.link_gbps;
  dev.link_gbps[plan::Engine::kNet] = o.net_gbps;
  const auto s = build_schedule(o, p);
  const auto pr =
      plan::simulate(p, s, plan::lower(p, s), dev, plan::SimOptions{o.gemm_k, o.workers, 0, o.ctas, o.entry_barrier});
  const double bytes = static_cast<double>(rows) * o.cols * 2;
  std::cout << fmt::format(
      "{} ({}) on {} node(s) x {} GPU(s), {} rows x {} cols bf16 per rank ({:.1f} MiB), {} of the transfers cross "
      "nodes at {} GB/s\npredicted: {:.2f} us\n",
      o.collective, o.algo, o.nodes, o.gpus, rows, o.cols, bytes / 1048576.0, crossing, o.net_gbps, pr.total_us);
  if (!o.trace.empty()) {
    write_trace(o.trace, pr);
    std::cout << fmt::format(kWroteTrace, o.trace);
  }
  return 0;
}

// `weft simulate --model dlrm`: the calibration table (the fitted model against the measured
// DLRM points), then the iteration on 1 ... 128 nodes (or --nodes) of --gpus GPUs.
int run_simulate_dlrm(const PlanOptions& o) {
  require_at_least("--gpus", o.gpus, 1);
  require_at_least("--batch", o.batch, 1);
  require_rate("--net-gbps", o.net_gbps, /*zero_ok=*/false);
  std::string path = o.calibration;
  if (path.empty())
    for (std::string p : {std::string("bench/constants/embedding_a2a-h200x2.json"),
                          std::string(WEFT_SOURCE_DIR) + "/bench/constants/embedding_a2a-h200x2.json"})
      if (std::ifstream(p).good()) {
        path = p;
        break;
      }
  if (path.empty()) throw UsageError("simulate --model dlrm: no calibration; pass --calibration FILE (a `weft bench "
                                     "embedding_a2a` JSON with DLRM points)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_input(path, "--calibration", kMaxInputBytes));
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(fmt::format("--calibration {}: not JSON ({})", path, e.what()));
  }
  std::map<int64_t, plan::DlrmMeasured> by_batch;
  const int world = j.value("world", 0);
  double copy = j.value("copy_gbps", 0.0);
  for (const auto& p : j.value("points", nlohmann::json::array())) {
    if (p.value("shape", "") != "dlrm") continue;
    plan::DlrmMeasured& m = by_batch[p.value("batch", int64_t{0})];
    m.world = world;
    m.batch = p.value("batch", int64_t{0});
    const std::string method = p.value("method", "");
    const double us = p.value("median_us", 0.0);
    if (method == "lookup") m.lookup_us = us;
    if (method == "all_to_all") m.all_to_all_us = us;
    if (method == "baseline") m.baseline_us = us;
    if (method == "fused") m.fused_us = us;
    if (method == "bwd_baseline") m.bwd_baseline_us = us;
    if (method == "bwd_fused") m.bwd_fused_us = us;
  }
  std::vector<plan::DlrmMeasured> points;
  for (const auto& [b, m] : by_batch) points.push_back(m);
  const plan::DeviceConstants dev = constants(o);
  const plan::DlrmCalibration cal = plan::fit_dlrm(points, copy, plan::link_gbps(dev, plan::Engine::kSm), path);
  std::cout << fmt::format(
      "calibration ({} GPUs, {}): lookups {:.1f} us + rows at {:.0f} GB/s; all-to-all {:.1f} us + bytes at {:.0f} "
      "GB/s; copies {:.0f} GB/s; fused's pushes cost the lookups {:.2f} x their link time\n",
      world, path, cal.lookup_us, cal.lookup_gbps, cal.a2a_us, cal.a2a_gbps, cal.copy_gbps, cal.push_cost);
  if (cal.acc_gbps > 0)
    std::cout << fmt::format("backward: the accumulation {:.1f} us + rows at {:.0f} GB/s (fitted on the baseline's "
                             "backward at the smallest and the largest batch)\n",
                             cal.acc_us, cal.acc_gbps);
  const bool bwd = std::all_of(points.begin(), points.end(), [](const plan::DlrmMeasured& m) {
    return m.bwd_baseline_us > 0 && m.bwd_fused_us > 0;
  });
  std::cout << fmt::format("{:>7} | {:>21} | {:>21} | {:>21} | {:>21}", "batch", "lookup us (pred, err)",
                           "all-to-all", "baseline", "fused");
  std::cout << (bwd ? fmt::format(" | {:>21} | {:>21}\n", "backward baseline", "backward fused") : "\n");
  double worst = 0;
  for (const plan::DlrmMeasured& m : points) {
    plan::DlrmModel md;
    md.batch = m.batch;
    const plan::DlrmMeasured pr = plan::predict_dlrm_node(cal, md, world);
    auto cell = [&](double meas, double pred) {
      const double err = (pred - meas) / meas;
      worst = std::max(worst, std::fabs(err));
      return fmt::format("{:7.1f} ({:7.1f} {:+4.0f}%)", meas, pred, 100 * err);
    };
    std::cout << fmt::format("{:>7} | {} | {} | {} | {}", m.batch, cell(m.lookup_us, pr.lookup_us),
                             cell(m.all_to_all_us, pr.all_to_all_us), cell(m.baseline_us, pr.baseline_us),
                             cell(m.fused_us, pr.fused_us));
    std::cout << (bwd ? fmt::format(" | {} | {}\n", cell(m.bwd_baseline_us, pr.bwd_baseline_us),
                                    cell(m.bwd_fused_us, pr.bwd_fused_us))
                      : "\n");
  }
  std::cout << fmt::format("largest error {:.0f}%\n\n", 100 * worst);
  plan::DlrmModel md;
  md.batch = o.batch;
  std::cout << fmt::format(
      "DLRM-DCNv2 training iteration, {} samples a GPU, {} GPUs a node, network {} GB/s a GPU; dense params {:.1f} M "
      "at half the GEMM rate of {}\n",
      o.batch, o.gpus, o.net_gbps, md.dense_params() / 1e6, dev.device);
  std::cout << fmt::format("{:>6} {:>6} {:>14} {:>14} {:>8}   {}\n", "nodes", "GPUs", "baseline us", "fused us", "gain",
                           "embedding fwd + bwd: baseline -> fused us");
  std::vector<int> nodes;
  if (o.nodes > 1)
    nodes = {o.nodes};
  else
    for (int n = 1; n <= 128; n *= 2) nodes.push_back(n);
  double last_gain = 0;
  for (int n : nodes) {
    const plan::DlrmPrediction p = plan::predict_dlrm(dev, cal, md, n, o.gpus, o.net_gbps);
    last_gain = 1 - p.fused_us / p.baseline_us;
    std::cout << fmt::format("{:>6} {:>6} {:>14.1f} {:>14.1f} {:>7.1f}%   {:.0f} + {:.0f} -> {:.0f} + {:.0f}\n", n,
                             n * o.gpus, p.baseline_us, p.fused_us, 100 * last_gain, p.steps[0].baseline_us,
                             p.steps[3].baseline_us, p.steps[0].fused_us, p.steps[3].fused_us);
  }
  std::cout << fmt::format("predicted gain of fused at {} node(s): {:.1f}% less iteration time\n", nodes.back(),
                           100 * last_gain);
  return 0;
}

void add_common(CLI::App* c, PlanOptions& o) {
  c->add_option("--collective", o.collective, "all_gather, reduce_scatter, all_reduce, all_to_all");
  c->add_option("--algo", o.algo,
                "direct, ring, bidir (all_gather); direct, ring, staged (reduce_scatter); one-shot, "
                "two-shot, ring (all_reduce)");
  c->add_option("--rows", o.rows, "rows per rank");
  c->add_option("--cols", o.cols, "columns (elements of 2 bytes)");
  c->add_option("--split", o.splits, "chunks per transfer");
  c->add_option("--workers", o.workers, "resident transfer workers per rank (0: unlimited)");
  c->add_option("--ctas", o.ctas, "CTAs the SM transfers run on, per rank (0: whole-GPU bandwidths)")
      ->check(CLI::NonNegativeNumber);
  c->add_flag("--entry-barrier", o.entry_barrier,
              "every rank waits for its peers' entry flags before it starts (a kernel that writes into "
              "its peers' outputs in place)");
  c->add_option("--gemm-n", o.gemm_n, "a GEMM over the output with this many columns (AG+GEMM)");
  c->add_option("--gemm-k", o.gemm_k, "the GEMM's depth");
  c->add_option("--tile", o.tile, "tile rows (and columns)");
  c->add_option("--order", o.order, "tile order: arrival, rotate, plain");
  c->add_option("--constants", o.constants, "device constants (JSON; default bench/constants/h200x2.json)");
  c->add_option("--trace", o.trace, "write the simulated timeline as Chrome-trace JSON");
}

}  // namespace

std::function<int()> add_plan_commands(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  auto* plan = app.add_subcommand("plan", "Build (or load) a plan, verify it, order its tiles, predict its time");
  add_common(plan, *o);
  plan->add_option("--world", o->world, "ranks");
  plan->add_option("--file", o->file, "a hand-written plan (docs/plan.md) instead of a template");
  plan->add_flag("--print", o->print, "print the plan in the text format");
  plan->add_option("--op", o->gemm_op,
                   "ag_gemm, gemm_rs, gemm_ar or gemv_ar: predict the op's methods as auto does (with --m, --k, "
                   "--n, --world; no plan is built)");
  plan->add_option("--m", o->m, "--op: global M");
  plan->add_option("--k", o->k, "--op: global K");
  plan->add_option("--n", o->n, "--op: global N");
  plan->add_option("--chunks", o->chunks, "--op: decomposed's chunk count (0: the model's best)");
  plan->add_flag("--epilogue", o->epilogue, "--op gemv_ar: with the residual add + RMSNorm epilogue");
  auto* sim = app.add_subcommand("simulate", "Predict a collective on a cluster of nodes x GPUs");
  add_common(sim, *o);
  sim->add_option("--nodes", o->nodes, "nodes");
  sim->add_option("--gpus", o->gpus, "GPUs per node");
  sim->add_option("--bytes", o->bytes, "bytes per rank (sets --rows from --cols)");
  sim->add_option("--link-gbps", o->link_gbps, "intra-node link GB/s (default: the constants file)");
  sim->add_option("--net-gbps", o->net_gbps, "inter-node GB/s per GPU");
  sim->add_option("--model", o->model,
                  "dlrm: a DLRM-DCNv2 training iteration, embedding + all-to-all by the baseline and fused, on 1 ... "
                  "128 nodes (or --nodes) of --gpus GPUs");
  sim->add_option("--calibration", o->calibration,
                  "--model dlrm: a `weft bench embedding_a2a` JSON with DLRM points (default "
                  "bench/constants/embedding_a2a-h200x2.json)");
  sim->add_option("--batch", o->batch, "--model dlrm: samples a GPU (default 4096)");
  return [plan, sim, o]() -> int {
    if (*plan) return run_plan(*o);
    if (*sim && !o->model.empty()) {
      if (o->model != "dlrm") throw UsageError(fmt::format("--model {}: the models are: dlrm", o->model));
      PlanOptions d = *o;
      if (sim->count("--gpus") == 0) d.gpus = 8;
      return run_simulate_dlrm(d);
    }
    if (*sim) return run_simulate(*o);
    return -1;
  };
}

}  // namespace weft::cli
