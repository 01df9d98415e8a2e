// weft: the command-line frontend. Commands that need ranks launch themselves (one
// process per local GPU, or WEFT_HOST_RANKS host ranks) unless already inside a launcher.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli_util.hpp"
#include "plan_cmd.hpp"
#include "weft/bench/collectives_bench.hpp"
#include "weft/bench/devapi_bench.hpp"
#include "weft/bench/gemm_bench.hpp"
#include "weft/bench/gemm_overlap_bench.hpp"
#include "weft/bench/gemv_ar_bench.hpp"
#include "weft/bench/embedding_bench.hpp"
#include "weft/bench/moe_bench.hpp"
#include "weft/bench/shape.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/trace.hpp"
#include "weft/runtime/backend.hpp"
#include "weft/runtime/launch.hpp"
#include "weft/version.hpp"

namespace {

using namespace weft;

std::string self_exe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("weft") : p.string();
}

// Re-runs this command as N ranks when not inside a launcher; returns the exit code, or -1
// when the caller already is a rank and should do the work itself.
int relaunch_as_ranks(int argc, char** argv) {
  EnvMap env = current_env();
  if (inside_launcher(env)) return -1;
  const int gpus = count_gpus_forked();
  const BackendKind kind = resolve_backend(env, gpus);
  const int n = kind == BackendKind::kNccl ? gpus : static_cast<int>(tunable_value(tunables::kHostRanks, env));
  WEFT_REQUIRE(n >= 1, "no ranks to launch");
  std::vector<std::string> args{self_exe()};
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  LaunchOptions opt;
  opt.nranks = n;
  opt.extra_env["WEFT_BACKEND"] = to_string(kind);
  std::cerr << fmt::format("weft: launching {} rank(s) on the {} backend\n", n, to_string(kind));
  return launch_exit_code(launch_exec(args, opt));
}

// The most ranks `weft launch` starts on one node (WEFT_HOST_RANKS's bound too).
constexpr int kMaxLaunchRanks = static_cast<int>(tunables::kHostRanks.max_value);

// The largest trace `weft trace` reads (a traced bench call is a few MiB).
constexpr size_t kMaxTraceBytes = size_t{256} << 20;

// Printed above every table the host backend measures: its times are CPU times.
constexpr const char* kCpuFigures =
    "host backend: CPU figures (wall clock of ranks sharing this machine's cores; they swing between runs and say "
    "nothing about GPUs)\n";

std::string utc_stamp(const char* f) {
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, f, std::gmtime(&t));
  return buf;
}

// The tunables registry as a Markdown table (docs/tunables.md is this output).
int cmd_tunables() {
  std::cout << "| variable | default | accepts | stability | what it does |\n|---|---|---|---|---|\n";
  for (const TunableInfo& t : all_tunables()) {
    std::string accepts = t.accepts;
    for (size_t i = 0; (i = accepts.find('|', i)) != std::string::npos; i += 2) accepts.replace(i, 1, "\\|");
    std::string doc = t.doc;
    for (size_t i = 0; (i = doc.find('|', i)) != std::string::npos; i += 2) doc.replace(i, 1, "\\|");
    std::cout << fmt::format("| `{}` | {} | {} | {} | {} |\n", t.env, t.default_value.empty() ? "(empty)" : t.default_value,
                             accepts, t.stability == Stability::kStable ? "stable" : "experimental", doc);
  }
  return 0;
}

int cmd_info() {
  EnvMap env = current_env();
  World w = world_from_env(env);
  const int gpus = inside_launcher(env) ? count_gpus() : count_gpus_forked();
  std::cout << fmt::format("weft {} (commit {})\n", kVersion, WEFT_GIT_COMMIT);
#ifdef WEFT_HAVE_CUDA
  std::cout << "built with CUDA: yes (nccl backend available)\n";
#else
  std::cout << "built with CUDA: no (host backend only)\n";
#endif
  std::cout << fmt::format("GPUs visible: {}\n", gpus);
  std::cout << fmt::format("backend: {}\n", to_string(resolve_backend(env, gpus)));
  std::cout << fmt::format("world: rank {} of {} (local {} of {}), from {}\n", w.rank, w.size, w.local_rank,
                           w.local_size, w.source);
  std::cout << fmt::format("WEFT_TIMEOUT_MS: {}\n", tunable_value(tunables::kTimeoutMs, env));
  return 0;
}

void write_json(nlohmann::json j, const std::string& out_dir, const std::string& name, bool quick) {
  j["date"] = utc_stamp("%Y-%m-%dT%H:%M:%SZ");
  j["commit"] = WEFT_GIT_COMMIT;
  j["quick"] = quick;
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw Error(fmt::format("cannot create the results directory '{}': {}", out_dir, ec.message()));
  std::string path = fmt::format("{}/{}-{}.json", out_dir, name, utc_stamp("%Y%m%d-%H%M%S"));
  cli::write_file(path, j.dump(2) + "\n");
  std::cout << "wrote " << path << "\n";
}

// `weft bench gemm`: one GPU (or the CPU tile reference), no ranks.
int cmd_bench_gemm(bool quick, const std::string& out_dir, const std::vector<std::string>& shapes) {
  bench::GemmBenchOptions opt;
  opt.quick = quick;
  opt.shapes = shapes;
  const auto t0 = std::chrono::steady_clock::now();
  opt.progress = [t0](const std::string& s) {
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cerr << fmt::format("[weft bench {:7.1f}s] {}\n", secs, s);
  };
  auto r = bench::bench_gemm(opt);
  write_json(bench::to_json(r), out_dir, r.points.empty() || r.points[0].impl == "cpu" ? "gemm-cpu" : "gemm-gpu",
             quick);
  std::cout << bench::to_table(r);
  return 0;
}

// `weft bench ag_gemm | gemm_rs | gemm_ar` (docs/gemm_overlap.md): runs as ranks.
bool is_overlap_bench(const std::string& what) { return what == "ag_gemm" || what == "gemm_rs" || what == "gemm_ar"; }

int cmd_bench_overlap(const std::string& what, bool quick, const std::string& out_dir,
                      const std::vector<std::string>& shapes, int chunks, const std::string& trace_dir, bool tune,
                      const std::string& data, bool sequential, bool eager, int random, uint64_t seed) {
  if (!env_var(tunables::kGpuHeapMiB.env)) setenv(tunables::kGpuHeapMiB.env, "8192", 1);
  auto b = make_backend();
  bench::OverlapBenchOptions opt;
  opt.op = what;
  opt.quick = quick;
  opt.shapes = shapes;
  opt.chunks = chunks;
  opt.trace_dir = trace_dir;
  opt.tune = tune;
  opt.data = data;
  opt.sequential = sequential;
  opt.eager = eager;
  opt.random = random;
  opt.seed = seed;
  const auto t0 = std::chrono::steady_clock::now();
  if (b->rank() == 0)
    opt.progress = [t0](const std::string& s) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::cerr << fmt::format("[weft bench {:7.1f}s] {}\n", secs, s);
    };
  auto r = bench::bench_gemm_overlap(*b, opt);
  if (b->rank() == 0) {
    write_json(bench::to_json(r), out_dir, fmt::format("{}-{}-{}r", what, r.backend, r.world), quick);
    if (b->kind() == BackendKind::kHost) std::cout << kCpuFigures;
    std::cout << bench::to_table(r);
  }
  // A method whose output disagrees with the baseline's fails the command (after the table).
  for (const auto& p : r.points)
    if (p.rel_err > p.tolerance) {
      if (b->rank() == 0)
        std::cerr << fmt::format("weft bench {}: {} {}x{}x{} is WRONG: relative error {:.3g} against the baseline\n",
                                 what, p.method, p.m, p.k, p.n, p.rel_err);
      return 3;
    }
  return 0;
}

// `weft bench gemv_ar` (docs/gemv_ar.md, "Benchmark"): runs as ranks. A checked column whose
// output disagrees with its reference fails the command (status 1, after the table).
int cmd_bench_gemv(bool quick, const std::string& out_dir, const std::vector<std::string>& shapes,
                   const std::vector<int64_t>& ms, bool tune) {
  if (!env_var(tunables::kGpuHeapMiB.env)) setenv(tunables::kGpuHeapMiB.env, "8192", 1);
  auto b = make_backend();
  bench::GemvBenchOptions opt;
  opt.quick = quick;
  opt.shapes = shapes;
  opt.ms = ms;
  opt.tune = tune;
  const auto t0 = std::chrono::steady_clock::now();
  if (b->rank() == 0)
    opt.progress = [t0](const std::string& s) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::cerr << fmt::format("[weft bench {:7.1f}s] {}\n", secs, s);
    };
  auto r = bench::bench_gemv_ar(*b, opt);
  if (b->rank() == 0) {
    write_json(bench::to_json(r), out_dir, fmt::format("gemv_ar-{}-{}r", r.backend, r.world), quick);
    if (b->kind() == BackendKind::kHost) std::cout << kCpuFigures;
    std::cout << bench::to_table(r);
  }
  for (const auto& p : r.points)
    if (p.rel_err > p.tolerance) {
      if (b->rank() == 0)
        std::cerr << fmt::format("weft bench gemv_ar: {} at K {} N {} M {} is WRONG: relative error {:.3g} against its "
                                 "reference\n",
                                 p.method, p.k, p.n, p.m, p.rel_err);
      return 1;
    }
  return 0;
}

// `weft bench moe` (docs/moe.md, "Measured"): runs as ranks.
int cmd_bench_moe(bool quick, const std::string& out_dir, const std::vector<std::string>& shapes,
                  const std::vector<int64_t>& tokens, const std::vector<std::string>& parts) {
  if (!env_var(tunables::kGpuHeapMiB.env)) setenv(tunables::kGpuHeapMiB.env, "8192", 1);
  auto b = make_backend();
  bench::MoeBenchOptions opt;
  opt.quick = quick;
  opt.shapes = shapes;
  opt.tokens = tokens;
  if (!parts.empty()) {  // validated: exchange, layer, experts
    auto has = [&](const char* p) { return std::find(parts.begin(), parts.end(), p) != parts.end(); };
    opt.exchange = has("exchange");
    opt.layer = has("layer");
    opt.experts = has("experts");
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (b->rank() == 0)
    opt.progress = [t0](const std::string& s) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::cerr << fmt::format("[weft bench {:7.1f}s] {}\n", secs, s);
    };
  auto r = bench::bench_moe(*b, opt);
  if (b->rank() == 0) {
    write_json(bench::to_json(r), out_dir, fmt::format("moe-{}-{}r", r.backend, r.world), quick);
    if (b->kind() == BackendKind::kHost) std::cout << kCpuFigures;
    std::cout << bench::to_table(r);
  }
  return 0;
}

// `weft bench embedding_a2a` (docs/embedding_a2a.md, "Measured"): runs as ranks.
int cmd_bench_embedding(bool quick, const std::string& out_dir, const std::vector<std::string>& shapes,
                        const std::vector<int64_t>& batches) {
  if (!env_var(tunables::kGpuHeapMiB.env)) setenv(tunables::kGpuHeapMiB.env, "8192", 1);
  auto b = make_backend();
  bench::EmbeddingBenchOptions opt;
  opt.quick = quick;
  opt.shapes = shapes;
  opt.batches = batches;
  const auto t0 = std::chrono::steady_clock::now();
  if (b->rank() == 0)
    opt.progress = [t0](const std::string& s) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::cerr << fmt::format("[weft bench {:7.1f}s] {}\n", secs, s);
    };
  auto r = bench::bench_embedding(*b, opt);
  if (b->rank() == 0) {
    write_json(bench::to_json(r), out_dir, fmt::format("embedding_a2a-{}-{}r", r.backend, r.world), quick);
    if (b->kind() == BackendKind::kHost) std::cout << kCpuFigures;
    std::cout << bench::to_table(r);
  }
  return 0;
}

// `weft trace FILE.json [--png OUT.png]`: per rank communication and computation time and
// the fraction of communication hidden behind computation.
int cmd_trace(const std::string& file, const std::string& png) {
  const std::string text = cli::read_input(file, "trace", kMaxTraceBytes);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw InvalidArgument(fmt::format("trace '{}' is not JSON: {}", file, cli::error_text(e)));
  }
  std::vector<ops::RankTraceSummary> summary;
  try {
    summary = ops::summarize_trace(text);
  } catch (const nlohmann::json::exception& e) {
    // JSON, but not a Chrome trace (an event's field of another type, an array of numbers).
    throw InvalidArgument(fmt::format("trace '{}' is not a Chrome trace: {}", file, cli::error_text(e)));
  }
  if (j.is_object() && j.contains("weft")) std::cout << "run: " << j["weft"].dump() << "\n";
  std::cout << ops::format_trace_summary(summary);
  if (!png.empty()) {
    std::string script = "tools/plot_timeline.py";  // a checkout here, else the one weft was built from
    if (!std::filesystem::exists(script)) script = std::string(WEFT_SOURCE_DIR) + "/tools/plot_timeline.py";
    // An argument vector, no shell: the file names reach the script as they are.
    if (cli::run_program({"python3", "-c", "import matplotlib"}, /*quiet=*/true) != 0)
      throw InvalidArgument(
          "trace --png needs matplotlib, which python3 cannot import: install it with `python3 -m pip install "
          "matplotlib` (or the python3-matplotlib package)");
    const int rc = cli::run_program({"python3", script, file, png});
    if (rc != 0) throw Error(fmt::format("drawing the PNG failed: python3 {} exited with status {}", script, rc));
  }
  return 0;
}

// what: devapi, collectives or all.
int cmd_bench(const std::string& what, bool quick, const std::string& out_dir, const std::vector<std::string>& only) {
  WEFT_REQUIRE(what == "all" || what == "devapi" || what == "collectives",
               fmt::format("weft bench {}: expected devapi, collectives or all", what));
  // The collectives keep per-shape staging up to 256 MiB x world: give them room unless
  // the user chose a heap size.
  if (what != "devapi" && !env_var(tunables::kGpuHeapMiB.env)) setenv(tunables::kGpuHeapMiB.env, "8192", 1);
  auto b = make_backend();
  std::function<void(const std::string&)> progress;
  const auto t0 = std::chrono::steady_clock::now();
  if (b->rank() == 0)
    progress = [t0](const std::string& s) {
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::cerr << fmt::format("[weft bench {:7.1f}s] {}\n", secs, s);
    };
  if (what == "all" || what == "devapi") {
    bench::DevapiBenchOptions opt;
    opt.quick = quick;
    opt.progress = progress;
    auto res = bench::bench_devapi(*b, opt);
    if (b->rank() == 0) {
      nlohmann::json j = bench::to_json(res);
      j["bench"] = "devapi";
      write_json(j, out_dir, fmt::format("devapi-{}-{}r", res.backend, res.world), quick);
      if (b->kind() == BackendKind::kHost) std::cout << kCpuFigures;
      std::cout << bench::to_table(res);
    }
  }
  if (what == "all" || what == "collectives") {
    bench::CollBenchOptions opt;
    opt.quick = quick;
    opt.colls = only;
    opt.progress = progress;
    auto pts = bench::bench_collectives(*b, opt);
    if (b->rank() == 0) {
      nlohmann::json j;
      j["bench"] = "collectives";
      j["device"] = b->device_name();
      j["backend"] = to_string(b->kind());
      j["world"] = b->size();
      j["dtype"] = "bf16";
      j["timing"] = b->kind() == BackendKind::kNccl
                        ? "CUDA graphs of 20/5/2 calls (<=1 MiB/<=16 MiB/larger), median of "
                          "replays, GPUs lined up by a device barrier before each replay"
                        : "host backend: eager calls, wall clock (CPU numbers)";
      j["points"] = bench::to_json(pts);
      write_json(j, out_dir, fmt::format("collectives-{}-{}r", to_string(b->kind()), b->size()), quick);
      if (b->kind() == BackendKind::kHost) std::cout << kCpuFigures;
      std::cout << bench::to_table(pts);
    }
  }
  return 0;
}

// Where `weft bench` writes its JSON without --out: a user location outside any source tree
// ($XDG_DATA_HOME/weft/results, else ~/.local/share/weft/results); empty when neither
// variable is set.
std::string default_results_dir() {
  if (const auto x = env_var("XDG_DATA_HOME"); x && !x->empty() && x->front() == '/') return *x + "/weft/results";
  if (const auto h = env_var("HOME"); h && !h->empty()) return *h + "/.local/share/weft/results";
  return {};
}

bool is_bench_name(const std::string& s) {
  return s == "all" || s == "devapi" || s == "collectives" || s == "gemm" || s == "gemv_ar" || s == "moe" ||
         s == "embedding_a2a" || is_overlap_bench(s);
}

// The bench arguments that would fail (or be ignored) only after the ranks have started.
void validate_bench(const std::string& what, const std::vector<std::string>& shapes,
                    const std::vector<std::string>& parts, int chunks, const std::vector<int64_t>& ms) {
  if (!is_bench_name(what))
    throw cli::UsageError(fmt::format(
        "bench {}: unknown benchmark; expected devapi, collectives, gemm, ag_gemm, gemm_rs, gemm_ar, gemv_ar, moe, "
        "embedding_a2a or all",
        what));
  if (chunks < 0) throw cli::UsageError(fmt::format("--chunks must be 0 (auto) or more, not {}", chunks));
  if (!ms.empty() && what != "gemv_ar" && what != "moe" && what != "embedding_a2a")
    throw cli::UsageError(fmt::format("--ms applies to gemv_ar, moe and embedding_a2a, not to bench '{}'", what));
  if (!parts.empty() && what != "moe")
    throw cli::UsageError(fmt::format("--parts applies to moe, not to bench '{}'", what));
  for (const auto& p : parts)
    if (p != "exchange" && p != "layer" && p != "experts")
      throw cli::UsageError(fmt::format("bench moe --parts: unknown part '{}' (exchange, layer, experts)", p));
  if (what == "embedding_a2a") {  // shapes by name, --ms: samples per GPU
    for (const auto& s : shapes)
      if (s != "dlrm" && s != "sweep")
        throw cli::UsageError(fmt::format("bench embedding_a2a: unknown shape '{}' (dlrm, sweep)", s));
    for (int64_t m : ms)
      if (m < 1) throw cli::UsageError(fmt::format("--ms: {} samples per GPU", m));
    return;
  }
  if (what == "moe") {  // shapes by name, --ms: tokens per rank
    for (const auto& s : shapes)
      if (s != "mixtral" && s != "qwen3-30b-a3b" && s != "deepseek-v3-like")
        throw cli::UsageError(
            fmt::format("bench moe: unknown shape '{}' (mixtral, qwen3-30b-a3b, deepseek-v3-like)", s));
    for (int64_t m : ms)
      if (m < 0) throw cli::UsageError(fmt::format("--ms: {} tokens", m));
    return;
  }
  if (what == "gemv_ar") {
    // Shapes K:N (K the full depth); M from --ms.
    for (const auto& s : shapes) {
      try {
        bench::parse_gemv_shape(s);
      } catch (const InvalidArgument& e) {
        throw cli::UsageError(cli::error_text(e));
      }
    }
    for (int64_t m : ms)
      if (m < 1 || m > 128) throw cli::UsageError(fmt::format("--ms: M = {} outside 1 ... 128", m));
    return;
  }
  if (!shapes.empty() && what != "gemm" && !is_overlap_bench(what)) {
    // `--shapes A B` takes every word after it: `--shapes 64x64x64 gemm` would run `all`.
    for (const auto& s : shapes)
      if (is_bench_name(s))
        throw cli::UsageError(fmt::format("--shapes '{}': that is a benchmark, not a shape MxKxN; name the benchmark "
                                          "first (weft bench {} --shapes ...)",
                                          s, s));
    throw cli::UsageError(
        fmt::format("--shapes applies to gemm, ag_gemm, gemm_rs, gemm_ar and gemv_ar, not to bench '{}'", what));
  }
  const auto phys = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  for (const auto& s : shapes) {
    const bench::GemmShape d = bench::parse_gemm_shape(s);
    if (const int64_t bytes = bench::operand_bytes(d); phys > 0 && bytes > phys)
      throw cli::UsageError(fmt::format("shape '{}': its operands take {:.1f} GiB, more than this machine's {:.1f} GiB "
                                        "of memory",
                                        s, static_cast<double>(bytes) / (1 << 30), static_cast<double>(phys) / (1 << 30)));
  }
}

// The command's final error; returns `code`. A rank of `weft launch` hands it to the launcher,
// which prints each distinct error once with the ranks that reported it (not once per rank).
int report_error(const char* kind, const std::string& message, int code) {
  // One write: lines of ranks sharing a terminal do not interleave.
  if (!report_error_to_launcher(message)) std::cerr << std::string("weft: ") + kind + message + "\n" << std::flush;
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weft: multi-GPU layers that overlap communication with computation, tile by tile"};
  app.require_subcommand(1);
  app.set_version_flag("--version", fmt::format("weft {} (commit {})", kVersion, WEFT_GIT_COMMIT),
                       "print weft's version and exit");

  auto* info = app.add_subcommand("info", "What weft sees: build, GPUs, backend, world");
  bool list_tunables = false;
  info->add_flag("--tunables", list_tunables, "list every tunable (variable, default, accepted values) as Markdown");

  auto* launch = app.add_subcommand("launch", "Run a command as N ranks on this node: weft launch -n N -- cmd ...");
  int nranks = 1;
  std::vector<std::string> command;
  launch->add_option("-n,--nranks", nranks, "ranks to start (one per local GPU, or host ranks)")->required();
  launch->add_option("command", command, "the command each rank runs (after --)");

  auto* bench = app.add_subcommand("bench", "Benchmarks; writes JSON to --out and prints a table");
  std::string what = "all";
  std::vector<std::string> only;
  bench->add_option("what", what,
                    "devapi, collectives, gemm, ag_gemm, gemm_rs, gemm_ar, gemv_ar, moe, embedding_a2a, or all "
                    "(default: devapi and collectives)");
  bench->add_option("--only", only, "collectives to run (all_reduce, all_gather, reduce_scatter, all_to_all)")
      ->delimiter(',');
  bool quick = false;
  std::string out_dir;
  bench->add_flag("--quick", quick, "small sizes, few repetitions");
  bench->add_option("--out", out_dir,
                    "directory for the JSON results (default: $XDG_DATA_HOME/weft/results, else "
                    "~/.local/share/weft/results)");
  std::vector<std::string> shapes;
  bench
      ->add_option("--shapes", shapes,
                   "gemm, ag_gemm, gemm_rs, gemm_ar: shapes MxKxN (default: docs/anchors.md's); gemv_ar: K:N (K the "
                   "full depth; default 4096:4096,14336:4096,8192:8192,28672:8192); moe: mixtral, qwen3-30b-a3b, "
                   "deepseek-v3-like (default: all); embedding_a2a: dlrm, sweep (default: both)")
      ->delimiter(',');
  std::vector<int64_t> ms;
  bench
      ->add_option("--ms", ms,
                   "gemv_ar: tokens per call, 1 ... 128 (default 1,8,16,64,128); moe: tokens per rank (default "
                   "128,4096); embedding_a2a: samples per GPU (default dlrm 2048,4096,16384,65536, sweep 4096)")
      ->delimiter(',');
  std::vector<std::string> parts;
  bench->add_option("--parts", parts, "moe: exchange, layer, experts (default: all)")->delimiter(',');
  int chunks = 0;
  std::string trace_dir;
  bool tune = false;
  bench->add_option("--chunks", chunks, "ag_gemm/gemm_rs/gemm_ar: chunks per shard for decomposed (0: auto)");
  bench->add_option("--trace-dir", trace_dir, "ag_gemm/gemm_rs/gemm_ar: write one traced call per method here");
  bench->add_flag("--tune", tune,
                  "ag_gemm/gemm_rs/gemm_ar: time decomposed at 1, 2, 3, 4 and 6 chunks too; store the fastest method "
                  "(and chunk count) in the tuning cache; gemv_ar: store each (shape, M)'s fastest method there");
  std::string data = "random";
  bench
      ->add_option("--data", data,
                   "ag_gemm/gemm_rs/gemm_ar: inputs, random (uniform in [-1,1), default) or ints (small integers)")
      ->check(CLI::IsMember({"random", "ints"}));
  bool sequential = false;
  bench->add_flag("--sequential", sequential,
                  "ag_gemm/gemm_rs/gemm_ar: time each column's replays back to back (default: interleaved rounds)");
  bool eager = false;
  bench->add_flag("--eager", eager,
                  "ag_gemm/gemm_rs/gemm_ar: time eager calls instead of CUDA-graph replays (GPU; same rounds)");
  int random = 0;
  uint64_t seed = 1;
  bench->add_option("--random", random,
                    "ag_gemm/gemm_rs/gemm_ar: also N seeded random shapes (M, K, N multiples of 16 in 256 ... 8192 "
                    "on GPUs; without --shapes, only those); the table then sums up auto against the baseline");
  bench->add_option("--seed", seed, "ag_gemm/gemm_rs/gemm_ar: --random's seed (default 1)");

  auto* trace = app.add_subcommand("trace", "Summarise a Chrome-trace JSON: comm, compute, communication hidden");
  std::string trace_file, trace_png;
  trace->add_option("file", trace_file, "trace JSON (weft bench --trace-dir, weft plan --trace)")->required();
  trace->add_option("--png", trace_png, "also draw the timeline (tools/plot_timeline.py)");

  auto run_plan_commands = weft::cli::add_plan_commands(app);

  // An unknown command: name it and list the commands (CLI11 alone says "A subcommand is
  // required").
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const CLI::App* c : app.get_subcommands([](CLI::App*) { return true; })) {
      names += (names.empty() ? "" : ", ") + c->get_name();
      known = known || c->get_name() == argv[1];
    }
    if (!known) {
      std::cerr << fmt::format("weft: unknown command '{}'; the commands are {} (weft --help)\n", argv[1], names);
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;  // --help and --version succeed; every other parse error is a usage error
  }

  try {
    if (*bench) {
      validate_bench(what, shapes, parts, chunks, ms);
      if (random < 0 || random > 1000)
        throw cli::UsageError(fmt::format("--random {}: expected 0 ... 1000 shapes", random));
      if (random > 0 && !is_overlap_bench(what))
        throw cli::UsageError(fmt::format("--random: ag_gemm, gemm_rs and gemm_ar take it, not '{}'", what));
      if (out_dir.empty()) out_dir = default_results_dir();
      if (out_dir.empty()) throw cli::UsageError("weft bench: neither XDG_DATA_HOME nor HOME is set: give --out DIR");
    }
    if (*info) return list_tunables ? cmd_tunables() : cmd_info();
    if (int rc = run_plan_commands(); rc >= 0) return rc;
    if (*launch) {
      // One process per rank on this node: beyond the bound a typo (-n 2147483647) would fork
      // until the process limit, or allocate the ranks' table until bad_alloc.
      if (nranks < 1 || nranks > kMaxLaunchRanks)
        throw cli::UsageError(
            fmt::format("launch -n {}: weft launch starts 1 to {} ranks on this node", nranks, kMaxLaunchRanks));
      LaunchOptions opt;
      opt.nranks = nranks;
      return launch_exit_code(launch_exec(command, opt));
    }
    if (*bench && what == "gemm") return cmd_bench_gemm(quick, out_dir, shapes);
    if (*trace) return cmd_trace(trace_file, trace_png);
    if (*bench && what == "gemv_ar") {
      int rc = relaunch_as_ranks(argc, argv);
      return rc >= 0 ? rc : cmd_bench_gemv(quick, out_dir, shapes, ms, tune);
    }
    if (*bench && what == "embedding_a2a") {
      int rc = relaunch_as_ranks(argc, argv);
      return rc >= 0 ? rc : cmd_bench_embedding(quick, out_dir, shapes, ms);
    }
    if (*bench && what == "moe") {
      int rc = relaunch_as_ranks(argc, argv);
      return rc >= 0 ? rc : cmd_bench_moe(quick, out_dir, shapes, ms, parts);
    }
    if (*bench && is_overlap_bench(what)) {
      int rc = relaunch_as_ranks(argc, argv);
      return rc >= 0
                 ? rc
                 : cmd_bench_overlap(what, quick, out_dir, shapes, chunks, trace_dir, tune, data, sequential, eager,
                                     random, seed);
    }
    if (*bench) {
      int rc = relaunch_as_ranks(argc, argv);
      return rc >= 0 ? rc : cmd_bench(what, quick, out_dir, only);
    }
  } catch (const TimeoutError& e) {
    return report_error("timeout: ", cli::error_text(e), 3);
  } catch (const cli::UsageError& e) {
    return report_error("", cli::error_text(e), 2);
  } catch (const InvalidArgument& e) {
    // The user's mistake: the message alone, without the file:line it was detected at.
    return report_error("error: ", cli::error_text(e), 1);
  } catch (const std::exception& e) {
    return report_error("error: ", cli::error_text(e, /*location=*/true), 1);
  }
  return 0;
}
