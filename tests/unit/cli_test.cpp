// The CLI end to end: weft launch, its errors, and weft bench on the host backend.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>
#include <string>

namespace {

struct Run {
  int status;
  std::string out;
};

Run run(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), p)) out += buf.data();
  int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

const std::string kWeft = WEFT_CLI_PATH;
// `weft plan`'s device constants named explicitly, whatever the working directory.
const std::string kConstants = std::string(" --constants ") + WEFT_SOURCE_TREE + "/bench/constants/h200x2.json";

// The word after `label` in `out` ("  baseline   102.7 us" -> "102.7"); empty when absent.
std::string word_after(const std::string& out, const std::string& label) {
  const size_t at = out.find(label);
  std::string w;
  if (at != std::string::npos) std::istringstream(out.substr(at + label.size())) >> w;
  return w;
}

}  // namespace

TEST(Cli, LaunchRunsEveryRankWithItsEnvironment) {
  auto r = run(kWeft + " launch -n 3 -- sh -c 'echo rank=$WEFT_RANK of $WEFT_WORLD_SIZE'");
  EXPECT_EQ(r.status, 0) << r.out;
  for (int i = 0; i < 3; ++i) EXPECT_NE(r.out.find("rank=" + std::to_string(i) + " of 3"), std::string::npos) << r.out;
}

TEST(Cli, LaunchReportsTheFailingRankAndItsStatus) {
  auto r = run(kWeft + " launch -n 2 -- sh -c 'exit $((WEFT_RANK * 7))'");
  EXPECT_EQ(r.status, 7) << r.out;
  EXPECT_NE(r.out.find("rank 1 exited with status 7"), std::string::npos) << r.out;
}

TEST(Cli, LaunchKillsRanksThatOutliveAFailedPeer) {
  auto r = run("WEFT_TIMEOUT_MS=200 " + kWeft + " launch -n 2 -- sh -c '[ $WEFT_RANK = 0 ] && exit 3; sleep 60'");
  EXPECT_EQ(r.status, 3) << r.out;
  EXPECT_NE(r.out.find("rank 1 was still running"), std::string::npos) << r.out;
}

TEST(Cli, LaunchWithoutCommandIsAnError) {
  auto r = run(kWeft + " launch -n 2");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("no command given"), std::string::npos) << r.out;
}

TEST(Cli, BenchOnTheHostBackendWritesJson) {
  char dir[] = "/tmp/weft-cli-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  auto r = run("WEFT_BACKEND=host WEFT_HOST_RANKS=2 " + kWeft + " bench --quick --out " + dir);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("push"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("one-way signal latency"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("all_reduce"), std::string::npos) << r.out;  // the collectives table
  auto ls = run(std::string("ls ") + dir);
  EXPECT_NE(ls.out.find(".json"), std::string::npos) << ls.out;
  run(std::string("rm -rf ") + dir);
}

// `weft bench gemv_ar --quick` on two host ranks: every column ran and was checked, the table,
// and the JSON with every column's point and the measured bandwidth.
TEST(Cli, BenchGemvArOnTwoHostRanks) {
  char dir[] = "/tmp/weft-cli-gemv-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  auto r = run("WEFT_BACKEND=host WEFT_HOST_RANKS=2 " + kWeft + " bench gemv_ar --quick --out " + dir);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("gemv_ar on"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 ranks"), std::string::npos) << r.out;
  // --quick on 2 host ranks: K = 16 x 2, N = 32, M 1 and 3.
  EXPECT_NE(r.out.find("32x32x1 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("32x32x3 "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("WRONG"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("note:"), std::string::npos) << r.out;  // every column ran on the host backend
  auto js = run(std::string("cat ") + dir + "/gemv_ar-host-2r-*.json");
  ASSERT_EQ(js.status, 0) << js.out;
  const auto j = nlohmann::json::parse(js.out);
  EXPECT_EQ(j["bench"], "gemv_ar");
  EXPECT_EQ(j["world"], 2);
  EXPECT_GT(j["hbm_gbps"].get<double>(), 0);
  EXPECT_FALSE(j["bandwidth_method"].get<std::string>().empty());
  std::map<std::string, int> seen;
  for (const auto& p : j["points"]) {
    const std::string m = p["method"];
    ++seen[m];
    EXPECT_GT(p["median_us"].get<double>(), 0) << p.dump();
    // The methods and weft's GEMV and fused epilogue are checked (and agree); the rest are not.
    const bool checked = m == "decomposed" || m == "fused" || m == "auto" || m == "gemv_weft" || m == "fused_rmsnorm";
    const double err = p["rel_err_vs_reference"];
    if (checked) {
      EXPECT_GE(err, 0) << p.dump();
      EXPECT_LE(err, j["tolerance_vs_reference"].get<double>()) << p.dump();
    } else {
      EXPECT_EQ(err, -1) << p.dump();
    }
  }
  for (const char* m : {"baseline", "gemv_cublas", "gemv_weft", "ar_nccl", "ar_weft", "decomposed", "fused", "auto",
                        "fused_rmsnorm", "unfused_rmsnorm", "roofline"})
    EXPECT_EQ(seen[m], 2) << m;  // one point per M
  run(std::string("rm -rf ") + dir);
}

// `weft bench moe --quick` on two host ranks: every method and part ran (the layer's too), the
// table, the JSON;
// an unknown shape is refused before the ranks start.
TEST(Cli, BenchMoeOnTwoHostRanks) {
  char dir[] = "/tmp/weft-cli-moe-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  auto r = run("WEFT_BACKEND=host WEFT_HOST_RANKS=2 " + kWeft + " bench moe --quick --out " + dir);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("weft bench moe on"), std::string::npos) << r.out;
  auto js = run(std::string("cat ") + dir + "/moe-host-2r-*.json");
  ASSERT_EQ(js.status, 0) << js.out;
  const auto j = nlohmann::json::parse(js.out);
  EXPECT_EQ(j["bench"], "moe");
  EXPECT_EQ(j["world"], 2);
  std::map<std::string, int> seen;
  for (const auto& p : j["points"]) {
    ++seen[p["method"].get<std::string>() + " " + p["part"].get<std::string>()];
    EXPECT_GT(p["median_us"].get<double>(), 0) << p.dump();
  }
  for (const char* m : {"baseline", "decomposed", "direct"})
    for (const char* part : {"dispatch", "combine", "both"}) EXPECT_EQ(seen[std::string(m) + " " + part], 1) << m << part;
  for (const char* m : {"baseline", "decomposed"}) EXPECT_EQ(seen[std::string(m) + " layer"], 1) << m << " layer";
  EXPECT_NE(r.out.find("layer"), std::string::npos) << r.out;
  run(std::string("rm -rf ") + dir);
  r = run(kWeft + " bench moe --shapes llama --out /tmp");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("unknown shape 'llama'"), std::string::npos) << r.out;
}

TEST(Cli, BenchGemvArRefusesBadShapesAndMs) {
  auto r = run(kWeft + " bench gemv_ar --shapes 8192x8192 --out /tmp");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("K:N"), std::string::npos) << r.out;
  r = run(kWeft + " bench gemv_ar --ms 1,129 --out /tmp");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("129"), std::string::npos) << r.out;
  r = run(kWeft + " bench gemm_ar --ms 8 --out /tmp");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--ms applies to gemv_ar"), std::string::npos) << r.out;
  r = run(kWeft + " bench moe --parts exchange,lyaer --out /tmp");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("unknown part 'lyaer'"), std::string::npos) << r.out;
  r = run(kWeft + " bench gemm --parts layer --out /tmp");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--parts applies to moe"), std::string::npos) << r.out;
}

TEST(Cli, InfoReportsTheBackend) {
  auto r = run("WEFT_BACKEND=host " + kWeft + " info");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("backend: host"), std::string::npos) << r.out;
}

TEST(Cli, PlanVerifiesOrdersAndPredicts) {
  auto r = run(kWeft + " plan --collective all_gather --algo ring --world 4 --rows 256 --cols 512 --split 2 "
                       "--gemm-n 512 --gemm-k 1024 --tile 64");
  EXPECT_EQ(r.status, 0) << r.out;
  // A ring: per rank one local copy and three forwards, each split in two.
  EXPECT_NE(r.out.find("plan: 4 ranks, 32 transfers; verifier: ok"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("predicted on"), std::string::npos) << r.out;
}

TEST(Cli, PlanFromAFileWithAMissingChunkIsRejected) {
  char dir[] = "/tmp/weft-plan-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string f = std::string(dir) + "/ag.plan";
  // Print a valid plan, drop rank 1's push to rank 0, and load it back.
  auto w = run(kWeft + " plan --collective all_gather --world 2 --rows 4 --cols 8 --print | grep -v '^on 1 chunk 3 push' "
                       "| grep -E '^(#|plan |world|tensor|signal|on )' > " + f);
  ASSERT_EQ(w.status, 0) << w.out;
  auto r = run(kWeft + " plan --file " + f);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("verifier: REJECTED"), std::string::npos) << r.out;
  run(std::string("rm -rf ") + dir);
}

// `weft plan --op`: the GEMM op's methods as auto predicts them (ops::predict_overlap, the same
// model and constants as the plan simulation); the choices are GemmOverlapModel's pinned ones.
TEST(Cli, PlanPredictsAGemmOpAsAutoDoes) {
  const std::string& c = kConstants;
  auto r = run(kWeft + " plan --op gemm_rs --m 2048 --k 4096 --n 4096 --world 8" + c);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("gemm_rs 2048x4096x4096 (M x K x N, bf16) on 8 ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("auto: baseline"), std::string::npos) << r.out;
  r = run(kWeft + " plan --op gemm_rs --m 8192 --k 14336 --n 8192 --world 2" + c);
  EXPECT_NE(r.out.find("(1 chunks, fold: gather)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("auto: decomposed"), std::string::npos) << r.out;
  r = run(kWeft + " plan --op ag_gemm --m 4096 --k 8192 --n 8192 --world 2 --chunks 4" + c);
  EXPECT_NE(r.out.find("(4 chunks)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fused"), std::string::npos) << r.out;
  EXPECT_NE(run(kWeft + " plan --op ag_gemm --world 2").status, 0);  // no shape
  // The baseline's line names its two calls.
  r = run(kWeft + " plan --op gemm_ar --m 4096 --k 8192 --n 8192 --world 4" + c);
  EXPECT_NE(r.out.find("(GEMM "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" + NCCL all-reduce "), std::string::npos) << r.out;
  EXPECT_EQ(run(kWeft + " plan --op gemm_rs --m 64 --k 64 --n 64 --epilogue" + c).status, 2);  // gemv_ar's option
}

// `weft plan --op gemv_ar`: GemvAllReduce's auto on GPUs (ops::predict_gemv_ar). The model test
// pins the rules these rest on: fused at decode sizes (M <= kGemvSmallM), never above.
TEST(Cli, PlanPredictsGemvArAsAutoDoes) {
  const std::string& c = kConstants;
  auto r = run(kWeft + " plan --op gemv_ar --m 1 --k 8192 --n 8192 --world 4" + c);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("gemv_ar M 1 x K 8192 x N 8192 (bf16) on 4 ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("auto: fused"), std::string::npos) << r.out;
  r = run(kWeft + " plan --op gemv_ar --m 128 --k 8192 --n 8192 --world 4 --epilogue" + c);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("+ residual and RMSNorm"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("decomposed"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("auto: fused"), std::string::npos) << r.out;
  r = run(kWeft + " plan --op gemv_ar --m 1 --k 8190 --n 8192 --world 4" + c);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--k 8190 does not divide among 4 ranks"), std::string::npos) << r.out;
  EXPECT_NE(run(kWeft + " plan --op gemv_ar --k 8192 --n 8192 --world 4" + c).status, 0);  // no --m
}

// tools/model_check.py computes no time: every prediction is the CLI's, set beside the measured
// column with the ratio, and `auto now` is the CLI's choice with that method's measured time.
TEST(Cli, ModelCheckSetsTheModelBesideMeasuredRuns) {
  char dir[] = "/tmp/weft-model-check-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string& c = kConstants;
  const auto p = run(kWeft + " plan --op gemm_rs --m 2048 --k 4096 --n 4096 --world 2" + c);
  const std::string b = word_after(p.out, "  baseline "), d = word_after(p.out, "  decomposed ");
  ASSERT_FALSE(b.empty() || d.empty()) << p.out;
  ASSERT_NE(p.out.find(" us (1 chunks"), std::string::npos) << p.out;
  ASSERT_NE(p.out.find("auto: decomposed"), std::string::npos) << p.out;
  const double base = std::stod(b), dec = std::stod(d);
  nlohmann::json j = {{"bench", "gemm_rs"}, {"world", 2}, {"device", "test"}, {"date", "today"}};
  auto point = [](const char* method, double us, int chunks) {
    return nlohmann::json{{"m", 2048}, {"k", 4096}, {"n", 4096}, {"method", method}, {"median_us", us}, {"chunks", chunks}};
  };
  j["points"] = {point("baseline", 2 * base, 0), point("decomposed", dec, 1)};
  const std::string file = std::string(dir) + "/gemm_rs.json";
  std::ofstream(file) << j.dump();
  const std::string tool = std::string("python3 ") + WEFT_SOURCE_TREE + "/tools/model_check.py " + kWeft + " ";
  auto r = run(tool + file + c);
  EXPECT_EQ(r.status, 0) << r.out;
  char cell[64];
  std::snprintf(cell, sizeof cell, "%.1f / %.1f (0.50)", 2 * base, base);
  EXPECT_NE(r.out.find(cell), std::string::npos) << cell << "\n" << r.out;
  std::snprintf(cell, sizeof cell, "%.1f / %.1f (1.00) (1)", dec, dec);
  EXPECT_NE(r.out.find(cell), std::string::npos) << cell << "\n" << r.out;
  EXPECT_NE(r.out.find("| decomposed, fold reduce pass | "), std::string::npos) << r.out;  // auto now, measured
  std::snprintf(cell, sizeof cell, "geometric mean %.3f", dec / (2 * base));
  EXPECT_NE(r.out.find(cell), std::string::npos) << cell << "\n" << r.out;
  // The same shapes predicted on 8 ranks: the CLI's 8-rank baseline.
  const auto p8 = run(kWeft + " plan --op gemm_rs --m 2048 --k 4096 --n 4096 --world 8" + c);
  const std::string b8 = word_after(p8.out, "  baseline ");
  ASSERT_FALSE(b8.empty()) << p8.out;
  r = run(tool + "--predict-world 8 " + file + c);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("### gemm_rs on 8 ranks, predicted"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| " + b8 + " |"), std::string::npos) << r.out;
  // A file of a bench it does not model is refused, naming the file and the bench.
  std::ofstream(std::string(dir) + "/other.json") << R"({"bench": "moe", "world": 2, "points": []})";
  r = run(tool + dir + "/other.json" + c);
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("other.json: bench 'moe'"), std::string::npos) << r.out;
  run(std::string("rm -rf ") + dir);
}

// tools/predictions.sh: every modelled op's predictions for W GPUs in one Markdown file.
TEST(Cli, PredictionsCoverEveryModelledOp) {
  const std::string sh = std::string("bash ") + WEFT_SOURCE_TREE + "/tools/predictions.sh " + kWeft;
  auto r = run(sh + " 8");
  EXPECT_EQ(r.status, 0) << r.out;
  for (const char* want : {"# Cost-model predictions for 8 GPUs of one node", "| 8 KiB |", "### ag_gemm on 8 ranks",
                           "### gemm_rs on 8 ranks", "### gemm_ar on 8 ranks", "### gemv_ar on 8 ranks",
                           "DLRM-DCNv2 training iteration", "## Mixture-of-experts"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out.substr(0, 2000);
  EXPECT_EQ(run(sh + " 0").status, 2);
}

TEST(Cli, SimulatePredictsALargerCluster) {
  auto r = run(kWeft + " simulate --collective all_reduce --algo ring --nodes 4 --gpus 8 --bytes 16777216");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("on 4 node(s) x 8 GPU(s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("predicted:"), std::string::npos) << r.out;
}
