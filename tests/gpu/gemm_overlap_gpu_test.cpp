// GEMM + communication ops on the nccl backend (issue 6): every method against a CPU
// reference on small-integer data (exact with fp32 accumulation), on 1 GPU and on every GPU,
// both B layouts, bf16 and f16, odd shapes; calls captured in a CUDA graph and replayed with
// fresh inputs; traced calls; the fused method (when fused_available()) in every check.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gemm_overlap_check.hpp"
#include "gpu_harness.hpp"
#include "rank_harness.hpp"
#include "weft/core/cuda_check.hpp"
#include "weft/ops/gemm_overlap.hpp"
#include "ops/gemm_overlap/fused.hpp"
#include "weft/ops/trace.hpp"

using namespace weft;
using namespace weft::ops;
using namespace weft::testing;

namespace {

std::vector<RankResult> run_gpu(int n, const std::function<void()>& fn) {
  return run_gpu_ranks(n, fn, /*heap_mib=*/1024, /*deadline_ms=*/600000);
}

struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t n) : bytes(n) { WEFT_CUDA_CHECK(cudaMalloc(&p, n + 16)); }
  ~DevBuf() { cudaFree(p); }
};

struct Host {
  std::vector<uint16_t> a, b;
};

// Sparse B (see gemm_overlap_check.hpp): K up to 512 stays exact in bf16.
Host inputs(const GemmOverlap& op, int rank, int64_t e) {
  Host h;
  h.a.resize(static_cast<size_t>(op.a_rows() * op.a_cols()));
  h.b.resize(static_cast<size_t>(op.b_rows() * op.b_cols()));
  fill_overlap_inputs(op, rank, e, /*sparse=*/true, h.a.data(), h.b.data());
  return h;
}

void check(const GemmOverlap& op, const std::vector<uint16_t>& got, int rank, int world, int64_t e,
           const std::string& what) {
  check_overlap_output(op, got.data(), rank, world, e, /*sparse=*/true, what);
}

using Shape = OverlapShape;
GemmOverlapConfig config(const Shape& s, dev::DType t, BLayout l, int chunks) {
  return overlap_config(s, t, l, chunks);
}

// WEFT_TEST_PROGRESS=PATH: each rank appends the call it is about to make to PATH.<rank> (a
// run killed for hanging then shows where).
void progress(int rank, const std::string& what) {
  const char* path = std::getenv("WEFT_TEST_PROGRESS");
  if (!path) return;
  if (FILE* f = std::fopen(fmt::format("{}.{}", path, rank).c_str(), "a")) {
    std::fprintf(f, "%s\n", what.c_str());
    std::fclose(f);
  }
}

int run_all_methods(Backend& b, const GemmOverlapConfig& cfg, int calls, cudaStream_t s) {
  GemmOverlap op(b, cfg);
  const int rank = b.rank(), world = b.size();
  DevBuf a(static_cast<size_t>(op.a_rows() * op.a_cols()) * 2), w(static_cast<size_t>(op.b_rows() * op.b_cols()) * 2),
      c(static_cast<size_t>(op.c_rows() * op.c_cols()) * 2);
  std::vector<uint16_t> out(static_cast<size_t>(op.c_rows() * op.c_cols()));
  DevBuf g(cfg.op == GemmOp::kAgGemm ? static_cast<size_t>(cfg.m * op.a_cols()) * 2 : 16);
  std::vector<GemmMethod> methods{GemmMethod::kBaseline, GemmMethod::kDecomposed, GemmMethod::kAuto};
  const auto avail = op.available_methods();
  if (std::find(avail.begin(), avail.end(), GemmMethod::kFused) != avail.end()) methods.push_back(GemmMethod::kFused);
  int checks = 0;
  int64_t e = 0;
  for (GemmMethod m : methods)
    for (int call = 0; call < calls; ++call) {
      ++e;
      const Host h = inputs(op, rank, e);
      WEFT_CUDA_CHECK(cudaMemcpy(a.p, h.a.data(), h.a.size() * 2, cudaMemcpyHostToDevice));
      WEFT_CUDA_CHECK(cudaMemcpy(w.p, h.b.data(), h.b.size() * 2, cudaMemcpyHostToDevice));
      WEFT_CUDA_CHECK(cudaMemset(c.p, 0xFF, c.bytes));  // NaN
      WEFT_CUDA_CHECK(cudaDeviceSynchronize());
      const std::string what =
          fmt::format("{} {}x{}x{} {} {} {} world {} chunks {}", to_string(cfg.op), cfg.m, cfg.k, cfg.n, to_string(m),
                      dev::dtype_name(cfg.dtype), to_string(cfg.b_layout), world, op.chunks());
      progress(rank, what);
      // ag_gemm, every other call: the gathered A kept too (GemmRunOptions::gathered_a; K not
      // a multiple of 8: the baseline's, auto then runs the baseline).
      const bool padded = op.a_cols() % 8 != 0 && m != GemmMethod::kBaseline && m != GemmMethod::kAuto;
      const bool keep = cfg.op == GemmOp::kAgGemm && e % 2 == 0 && !padded;
      if (keep) WEFT_CUDA_CHECK(cudaMemset(g.p, 0xFF, g.bytes));
      op.run(a.p, w.p, c.p, {.method = m, .stream = s, .gathered_a = keep ? g.p : nullptr});
      WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
      b.synchronize();
      WEFT_CUDA_CHECK(cudaMemcpy(out.data(), c.p, c.bytes, cudaMemcpyDeviceToHost));
      check(op, out, rank, world, e, what);
      ++checks;
      if (keep) {
        std::vector<uint16_t> ga(static_cast<size_t>(cfg.m * op.a_cols()));
        WEFT_CUDA_CHECK(cudaMemcpy(ga.data(), g.p, g.bytes, cudaMemcpyDeviceToHost));
        for (int64_t r = 0; r < cfg.m; ++r)
          for (int64_t k = 0; k < op.a_cols(); ++k)
            WEFT_CHECK(ga[static_cast<size_t>(r * op.a_cols() + k)] ==
                           dev::to_bits16(weft::testing::overlap_a(r, k, e), cfg.dtype),
                       fmt::format("{}: gathered A row {} col {} is wrong", what, r, k));
        ++checks;
      }
    }
  return checks;
}

// Sets variables for one test (or one round of it) and restores what the caller had on
// destruction (e.g. the memcheck run's WEFT_GEMM_TUNE).
class ScopedEnv {
 public:
  ScopedEnv() = default;
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  void set(const char* k, const char* v) {
    const char* old = std::getenv(k);
    saved_.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
    setenv(k, v, 1);
  }
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it)
      if (it->second)
        setenv(it->first.c_str(), it->second->c_str(), 1);
      else
        unsetenv(it->first.c_str());
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

}  // namespace

class GemmOverlapGpu : public ::testing::TestWithParam<int> {};

namespace {
// Every method exact on n GPUs (0: all) at each shape of shapes(world), in the configurations
// given (dtype, B layout, chunks, calls); `what` names the run in the summary line.
struct RunConfig {
  dev::DType dtype;
  BLayout layout;
  int chunks, calls;
};
void every_method_exact(int n, std::vector<Shape> (*shapes)(int), const std::vector<RunConfig>& configs,
                        const char* what) {
  if (gpus() < 1 || n > gpus()) GTEST_SKIP() << "needs " << n << " GPU(s)";
  expect_all_ok(run_gpu(n, [&] {
    auto b = make_backend();
    const int w = b->size();
    cudaStream_t s;
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int checks = 0;
    for (const Shape& sh : shapes(w))
      for (const RunConfig& rc : configs)
        checks += run_all_methods(*b, config(sh, rc.dtype, rc.layout, rc.chunks), rc.calls, s);
    if (b->rank() == 0) std::printf("[gpu] %s: %d ranks, %d exact checks passed\n", what, w, checks);
    WEFT_CUDA_CHECK(cudaStreamDestroy(s));
  }));
}
}  // namespace

TEST_P(GemmOverlapGpu, EveryMethodIsExact) {
  // Odd shapes (rows per shard not a multiple of the chunks, N odd), then larger ones.
  every_method_exact(
      GetParam() == 0 ? gpus() : GetParam(),
      [](int w) {
        return std::vector<Shape>{{GemmOp::kAgGemm, 5 * w, 24, 13},     {GemmOp::kGemmRs, 5 * w, 16 * w, 13},
                                  {GemmOp::kGemmAr, 11, 8 * w, 7},      {GemmOp::kAgGemm, 384 * w, 256, 392},
                                  {GemmOp::kGemmRs, 384 * w, 256, 392}, {GemmOp::kGemmAr, 768, 256, 392}};
      },
      {{dev::DType::kBF16, BLayout::kNK, 2, 2}, {dev::DType::kBF16, BLayout::kKN, 3, 1},
       {dev::DType::kF16, BLayout::kNK, 4, 1}},
      "gemm_overlap");
}

INSTANTIATE_TEST_SUITE_P(Gpus, GemmOverlapGpu, ::testing::Values(1, 0));

// K per rank not a multiple of 8: the baseline on the operands as they are, decomposed, fused
// and auto on K padded to a multiple of 8 (the op's twin), every one exact.
TEST_P(GemmOverlapGpu, UnalignedKRunsPadded) {
  every_method_exact(
      GetParam() == 0 ? gpus() : GetParam(),
      [](int w) {
        return std::vector<Shape>{{GemmOp::kAgGemm, 6 * w, 28, 40},
                                  {GemmOp::kGemmRs, 8 * w, 12 * w, 24},
                                  {GemmOp::kGemmAr, 9, 20 * w, 16},
                                  {GemmOp::kGemmRs, 256 * w, 132 * w, 264},
                                  {GemmOp::kGemmAr, 320, 132 * w, 136}};
      },
      {{dev::DType::kBF16, BLayout::kNK, 2, 2}, {dev::DType::kF16, BLayout::kKN, 1, 1}}, "gemm_overlap unaligned K");
}

// The suite above runs the decomposed paths the small test shapes get by default: ag_gemm
// reads its own rows in place (shapes whose tiles straddle a rank's rows keep the copy), its
// GEMMs on the fastest of cublasGemmEx and cublasLt's candidates (timed); gemm_rs (small
// shapes) gathers the inputs on 2 ranks (RsFold::kGather: the peer's rows of A and its B, the
// block computed over all of K) and runs a reduce pass after its GEMMs on 1. This runs the
// same exact checks on the other paths: (1) gemm_rs folded into weft's GEMM epilogue (WEFT_RS_FOLD=1; rows not on
// 128-row blocks, pieces splitting blocks, N odd: the register epilogue); (2) every decomposed GEMM by cublasGemmEx,
// untimed (WEFT_GEMM_TUNE=0); (3) gemm_rs's cuBLASLt fold, D = A B + the peer's piece (WEFT_RS_FOLD=lt; 2 ranks, else
// the reduce pass); (4) gemm_rs's partial products reduced after the GEMMs (WEFT_RS_FOLD=0).
class GemmOverlapGpuOtherPaths : public ::testing::TestWithParam<int> {};

TEST_P(GemmOverlapGpuOtherPaths, EveryMethodIsExact) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  const int path = GetParam();
  ScopedEnv env;
  if (path == 1) {
    env.set("WEFT_RS_FOLD", "1");
  } else if (path == 2) {
    env.set("WEFT_GEMM_TUNE", "0");
  } else if (path == 3) {
    env.set("WEFT_RS_FOLD", "lt");
  } else {
    env.set("WEFT_RS_FOLD", "0");
  }
  expect_all_ok(run_gpu(gpus(), [path] {
    auto b = make_backend();
    const int w = b->size();
    cudaStream_t s;
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int checks = 0;
    for (const Shape& sh : {Shape{GemmOp::kAgGemm, 5 * w, 24, 13}, Shape{GemmOp::kAgGemm, 384 * w, 256, 392},
                            Shape{GemmOp::kGemmRs, 5 * w, 24 * w, 13}, Shape{GemmOp::kGemmRs, 384 * w, 64 * w, 392}}) {
      checks += run_all_methods(*b, config(sh, dev::DType::kBF16, BLayout::kNK, 2), 2, s);
      checks += run_all_methods(*b, config(sh, dev::DType::kBF16, BLayout::kKN, 1), 1, s);
      checks += run_all_methods(*b, config(sh, dev::DType::kF16, BLayout::kNK, 4), 1, s);
    }
    if (b->rank() == 0)
      std::printf("[gpu] %s: %d ranks, %d exact checks passed\n",
                  path == 1   ? "gemm_rs folded into weft's GEMM"
                  : path == 2 ? "decomposed GEMMs by cublasGemmEx, untimed"
                  : path == 3 ? "gemm_rs folded into cuBLASLt's epilogue (2 ranks)"
                              : "gemm_rs with a reduce pass",
                  w, checks);
    WEFT_CUDA_CHECK(cudaStreamDestroy(s));
  }));
}

INSTANTIATE_TEST_SUITE_P(Paths, GemmOverlapGpuOtherPaths, ::testing::Values(1, 2, 3, 4));

// Captured once, replayed many times with fresh inputs: the device-side epoch advances inside
// the graph (decomposed waits; gemm_rs's folded GEMM and the fused ag_gemm / gemm_rs read it as
// their wait scale, and their signals are copies of it), and every replay is exact: a wait
// satisfied by an earlier replay's signal would let a GEMM read the previous inputs. Run with
// gemm_rs's reduce pass, weft's fold, cuBLASLt's fold and the gathered inputs (2 ranks; else
// the reduce pass); the fused method where the op offers it.
TEST(GemmOverlapGpuGraph, ReplaysStayExact) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  for (const char* fold : {"0", "1", "lt", "gather"}) {
    ScopedEnv env;
    env.set("WEFT_RS_FOLD", fold);
    expect_all_ok(run_gpu(gpus(), [] {
      auto b = make_backend();
      const int w = b->size(), rank = b->rank();
      cudaStream_t s;
      WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      for (const Shape& sh : {Shape{GemmOp::kAgGemm, 256 * w, 128, 264}, Shape{GemmOp::kGemmRs, 256 * w, 128 * w, 264},
                              Shape{GemmOp::kGemmAr, 320, 64 * w, 136}})
        for (GemmMethod m : {GemmMethod::kBaseline, GemmMethod::kDecomposed, GemmMethod::kFused}) {
          GemmOverlap op(*b, config(sh, dev::DType::kBF16, BLayout::kNK, 2));
          const auto avail = op.available_methods();
          if (std::find(avail.begin(), avail.end(), m) == avail.end()) continue;
          DevBuf a(static_cast<size_t>(op.a_rows() * op.a_cols()) * 2),
              wt(static_cast<size_t>(op.b_rows() * op.b_cols()) * 2),
              c(static_cast<size_t>(op.c_rows() * op.c_cols()) * 2);
          auto load = [&](int64_t e) {
            const Host h = inputs(op, rank, e);
            WEFT_CUDA_CHECK(cudaMemcpy(a.p, h.a.data(), h.a.size() * 2, cudaMemcpyHostToDevice));
            WEFT_CUDA_CHECK(cudaMemcpy(wt.p, h.b.data(), h.b.size() * 2, cudaMemcpyHostToDevice));
            WEFT_CUDA_CHECK(cudaMemset(c.p, 0xFF, c.bytes));
            WEFT_CUDA_CHECK(cudaDeviceSynchronize());
          };
          load(0);
          op.run(a.p, wt.p, c.p, {.method = m, .stream = s});  // first call: outside the capture
          WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
          b->barrier();
          cudaGraph_t graph;
          cudaGraphExec_t exec;
          WEFT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
          op.run(a.p, wt.p, c.p, {.method = m, .stream = s});
          WEFT_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
          WEFT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
          std::vector<uint16_t> out(static_cast<size_t>(op.c_rows() * op.c_cols()));
          for (int64_t e = 1; e <= 10; ++e) {
            load(e);
            b->barrier();  // every rank's input is in place before anyone replays
            WEFT_CUDA_CHECK(cudaGraphLaunch(exec, s));
            WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
            b->synchronize();
            WEFT_CUDA_CHECK(cudaMemcpy(out.data(), c.p, c.bytes, cudaMemcpyDeviceToHost));
            check(op, out, rank, w, e, fmt::format("graph {} {}", to_string(sh.op), to_string(m)));
            b->barrier();  // nobody refills inputs a peer's replay may still read (baseline all-gather)
          }
          WEFT_CUDA_CHECK(cudaGraphExecDestroy(exec));
          WEFT_CUDA_CHECK(cudaGraphDestroy(graph));
        }
      WEFT_CUDA_CHECK(cudaStreamDestroy(s));
    }));
  }
}

// One op object, every M up to its maximum (issue 21): calls of several Ms -- the prepared
// ones on every method, an unprepared one (the baseline) -- captured into ONE CUDA graph from
// their first call (nothing eager before), back to back, each on its own output, then the
// graph replayed with fresh inputs: every output exact every replay. The Ms share the op's
// buffers, so a rank running ahead into the next M's call must still wait for its peers to
// finish the last (the epoch guard of every call). gemm_ar: M = 1, 7, 64, 4096.
TEST(GemmOverlapGpuGraph, OneObjectServesEveryMInOneGraph) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  expect_all_ok(run_gpu(gpus(), [] {
    auto b = make_backend();
    const int w = b->size(), rank = b->rank();
    cudaStream_t s;
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    struct Case {
      Shape shape;
      std::vector<int64_t> buckets, calls;
    };
    const std::vector<Case> cases = {
        {{GemmOp::kGemmAr, 4096, 64 * w, 136}, {1, 7, 64}, {1, 4096, 7, 64, 100}},
        {{GemmOp::kAgGemm, 256 * w, 128, 264}, {w, 64 * w}, {w, 256 * w, 64 * w, 8 * w}},
        {{GemmOp::kGemmRs, 256 * w, 128 * w, 264}, {w, 64 * w}, {64 * w, w, 256 * w, 8 * w}},
    };
    int checks = 0;
    for (const Case& cs : cases) {
      GemmOverlapConfig cfg = config(cs.shape, dev::DType::kBF16, BLayout::kNK, 2);
      cfg.m_buckets = cs.buckets;
      GemmOverlap op(*b, cfg);
      std::vector<GemmMethod> methods{GemmMethod::kBaseline, GemmMethod::kDecomposed, GemmMethod::kAuto};
      const auto avail = op.available_methods();
      if (std::find(avail.begin(), avail.end(), GemmMethod::kFused) != avail.end())
        methods.push_back(GemmMethod::kFused);
      const std::vector<int64_t> prepared = op.prepared_m();
      struct Call {
        int64_t m;
        GemmMethod method;
        std::unique_ptr<DevBuf> a, c;
      };
      std::vector<Call> calls;
      for (int64_t m : cs.calls)
        for (GemmMethod method : methods) {
          // An unprepared M: the baseline and auto (which picks it) only.
          if (std::find(prepared.begin(), prepared.end(), m) == prepared.end() && method != GemmMethod::kBaseline &&
              method != GemmMethod::kAuto)
            continue;
          calls.push_back({m, method, std::make_unique<DevBuf>(static_cast<size_t>(op.a_rows(m) * op.a_cols()) * 2),
                           std::make_unique<DevBuf>(static_cast<size_t>(op.c_rows(m) * op.c_cols()) * 2)});
        }
      DevBuf wt(static_cast<size_t>(op.b_rows() * op.b_cols()) * 2);
      auto load = [&](int64_t e) {
        for (Call& c : calls) {
          std::vector<uint16_t> a(static_cast<size_t>(op.a_rows(c.m) * op.a_cols()));
          std::vector<uint16_t> bb(static_cast<size_t>(op.b_rows() * op.b_cols()));
          fill_overlap_inputs(op, rank, e, /*sparse=*/true, a.data(), bb.data(), c.m);
          WEFT_CUDA_CHECK(cudaMemcpy(c.a->p, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
          WEFT_CUDA_CHECK(cudaMemcpy(wt.p, bb.data(), bb.size() * 2, cudaMemcpyHostToDevice));
          WEFT_CUDA_CHECK(cudaMemset(c.c->p, 0xFF, c.c->bytes));
        }
        WEFT_CUDA_CHECK(cudaDeviceSynchronize());
      };
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      WEFT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      for (Call& c : calls) op.run(c.a->p, wt.p, c.c->p, {.method = c.method, .m = c.m, .stream = s});
      WEFT_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
      WEFT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      for (int64_t e = 1; e <= 4; ++e) {
        load(e);
        b->barrier();
        WEFT_CUDA_CHECK(cudaGraphLaunch(exec, s));
        WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
        b->synchronize();
        for (Call& c : calls) {
          std::vector<uint16_t> out(static_cast<size_t>(op.c_rows(c.m) * op.c_cols()));
          WEFT_CUDA_CHECK(cudaMemcpy(out.data(), c.c->p, c.c->bytes, cudaMemcpyDeviceToHost));
          check_overlap_output(op, out.data(), rank, w, e, /*sparse=*/true,
                               fmt::format("graph {} M = {} of {} {} replay {}", to_string(cfg.op), c.m, cfg.m,
                                           to_string(c.method), e),
                               c.m);
          ++checks;
        }
        b->barrier();
      }
      WEFT_CUDA_CHECK(cudaGraphExecDestroy(exec));
      WEFT_CUDA_CHECK(cudaGraphDestroy(graph));
    }
    if (rank == 0) std::printf("[gpu] every M in one graph: %d ranks, %d exact outputs\n", w, checks);
    WEFT_CUDA_CHECK(cudaStreamDestroy(s));
  }));
}

// Calls enqueued back to back, nothing in between, each on its own inputs and output: a rank
// may run ahead into the next call while its peer still reads what the last one delivered
// (staging slots, gathered rows), so every guard between calls is exercised -- the copy-engine
// fold's epoch barrier, decomposed's waits (the reduce pass's, cuBLASLt's fold's, weft's fold's
// and the gathered inputs' guard flag). Every output exact.
TEST(GemmOverlapGpuGraph, BackToBackCallsStayExact) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  for (const char* fold : {"0", "weft", "lt", "gather"}) {
    ScopedEnv env;
    env.set("WEFT_RS_FOLD", fold);
    expect_all_ok(run_gpu(gpus(), [] {
      auto b = make_backend();
      const int w = b->size(), rank = b->rank();
      cudaStream_t s;
      WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      constexpr int kCalls = 4;
      int checks = 0;
      for (const Shape& sh : {Shape{GemmOp::kAgGemm, 256 * w, 128, 264}, Shape{GemmOp::kGemmRs, 512 * w, 128 * w, 520}})
        for (GemmMethod m : {GemmMethod::kDecomposed, GemmMethod::kFused}) {
          GemmOverlap op(*b, config(sh, dev::DType::kBF16, BLayout::kNK, 2));
          const auto avail = op.available_methods();
          if (std::find(avail.begin(), avail.end(), m) == avail.end()) continue;
          std::vector<std::unique_ptr<DevBuf>> as, ws, cs;
          for (int i = 0; i < kCalls; ++i) {
            const Host h = inputs(op, rank, 100 + i);
            as.push_back(std::make_unique<DevBuf>(h.a.size() * 2));
            ws.push_back(std::make_unique<DevBuf>(h.b.size() * 2));
            cs.push_back(std::make_unique<DevBuf>(static_cast<size_t>(op.c_rows() * op.c_cols()) * 2));
            WEFT_CUDA_CHECK(cudaMemcpy(as.back()->p, h.a.data(), h.a.size() * 2, cudaMemcpyHostToDevice));
            WEFT_CUDA_CHECK(cudaMemcpy(ws.back()->p, h.b.data(), h.b.size() * 2, cudaMemcpyHostToDevice));
            WEFT_CUDA_CHECK(cudaMemset(cs.back()->p, 0xFF, cs.back()->bytes));
          }
          WEFT_CUDA_CHECK(cudaDeviceSynchronize());
          b->barrier();
          for (int i = 0; i < kCalls; ++i) op.run(as[i]->p, ws[i]->p, cs[i]->p, {.method = m, .stream = s});
          WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
          b->synchronize();
          std::vector<uint16_t> out(static_cast<size_t>(op.c_rows() * op.c_cols()));
          for (int i = 0; i < kCalls; ++i) {
            WEFT_CUDA_CHECK(cudaMemcpy(out.data(), cs[i]->p, cs[i]->bytes, cudaMemcpyDeviceToHost));
            check(op, out, rank, w, 100 + i,
                  fmt::format("back to back {} {} call {}", to_string(sh.op), to_string(m), i));
            ++checks;
          }
          b->barrier();
        }
      if (rank == 0) std::printf("[gpu] back-to-back calls: %d ranks, %d exact outputs\n", w, checks);
      WEFT_CUDA_CHECK(cudaStreamDestroy(s));
    }));
  }
}

// A traced call of decomposed (and fused, when available): chunks on the copy engine, GEMMs
// on the compute stream, and a summary; an unavailable fused method refuses with an Error.
TEST(GemmOverlapGpuTrace, DecomposedCallIsTraced) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  expect_all_ok(run_gpu(gpus(), [] {
    auto b = make_backend();
    const int w = b->size();
    cudaStream_t s;
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (GemmOp o : {GemmOp::kAgGemm, GemmOp::kGemmRs, GemmOp::kGemmAr}) {
      const Shape sh{o, 1024 * w, 512 * w, 1024};
      GemmOverlap op(*b, config(sh, dev::DType::kBF16, BLayout::kNK, 4));
      DevBuf a(static_cast<size_t>(op.a_rows() * op.a_cols()) * 2),
          wt(static_cast<size_t>(op.b_rows() * op.b_cols()) * 2), c(static_cast<size_t>(op.c_rows() * op.c_cols()) * 2);
      WEFT_CUDA_CHECK(cudaMemset(a.p, 0, a.bytes));
      WEFT_CUDA_CHECK(cudaMemset(wt.p, 0, wt.bytes));
      op.run(a.p, wt.p, c.p, {.method = GemmMethod::kDecomposed, .stream = s});
      op.run(a.p, wt.p, c.p, {.method = GemmMethod::kDecomposed, .trace = true, .stream = s});
      int tiles = 0, chunks = 0;
      for (const auto& e : op.trace()) (e.kind == TraceKind::kTile ? tiles : chunks) += 1;
      WEFT_CHECK(tiles > 0 && (w == 1 || chunks > 0),
                 fmt::format("{}: {} tiles, {} chunks", to_string(o), tiles, chunks));
      const auto all = gather_trace(*b, op.trace());
      const auto sum = summarize_trace(to_chrome_trace(all));
      if (b->rank() == 0)
        std::printf("[gpu] %s decomposed trace:\n%s", to_string(o), format_trace_summary(sum).c_str());
      const auto avail = op.available_methods();
      if (std::find(avail.begin(), avail.end(), GemmMethod::kFused) != avail.end()) {
        op.run(a.p, wt.p, c.p, {.method = GemmMethod::kFused, .stream = s});
        op.run(a.p, wt.p, c.p, {.method = GemmMethod::kFused, .trace = true, .stream = s});
        const auto fall = gather_trace(*b, op.trace());
        WEFT_CHECK(!fall.empty(), fmt::format("{}: the fused call recorded no events", to_string(o)));
        if (b->rank() == 0)
          std::printf("[gpu] %s fused trace:\n%s", to_string(o),
                      format_trace_summary(summarize_trace(to_chrome_trace(fall))).c_str());
      } else {
        std::string msg;
        try {
          op.run(a.p, wt.p, c.p, {.method = GemmMethod::kFused, .stream = s});
        } catch (const Error& e) {
          msg = e.what();
        }
        WEFT_CHECK(!msg.empty(), "the fused method ran although the op does not offer it");
      }
    }
    WEFT_CUDA_CHECK(cudaStreamDestroy(s));
  }));
}

// gemm_rs (2 ranks) when the peer never comes, with the gathered inputs and with the reduce
// pass: their guards (the peer began this call) are stream memory operations, whose deadline is
// a kernel beside them (memop_guard) -- the surviving rank's call ends in a TimeoutError naming
// the missing rank within the deadline, not a hang, also where device work runs serialised
// (compute-sanitizer: tools/gpu/fault_memcheck.sh). gemm_ar: its sums wait for the peer's tiles
// in the summing kernel.
namespace {
void expect_missing_peer_named(const char* fold, GemmOp o = GemmOp::kGemmRs) {
  ScopedEnv env;
  env.set("WEFT_RS_FOLD", fold);
  const int victim = 1;
  const int64_t timeout_ms = 3000;
  const auto t0 = std::chrono::steady_clock::now();
  const auto res = run_gpu_ranks(
      2,
      [victim, o] {
        auto b = make_backend();
        cudaStream_t s;
        WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        GemmOverlap op(*b, config(Shape{o, 256, 256, 264}, dev::DType::kBF16, BLayout::kNK, 1));
        DevBuf a(static_cast<size_t>(op.a_rows() * op.a_cols()) * 2),
            wt(static_cast<size_t>(op.b_rows() * op.b_cols()) * 2),
            c(static_cast<size_t>(op.c_rows() * op.c_cols()) * 2);
        op.run(a.p, wt.p, c.p, {.method = GemmMethod::kDecomposed, .stream = s});  // both ranks
        b->synchronize();
        b->barrier();
        if (b->rank() == victim) _exit(0);
        op.run(a.p, wt.p, c.p, {.method = GemmMethod::kDecomposed, .stream = s});  // the peer is gone
        b->synchronize();
      },
      /*heap_mib=*/256, /*deadline_ms=*/300000, timeout_ms);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[gpu] fault test, %s, WEFT_RS_FOLD=%s: run ended after %.1f s; wait deadline %.1f s\n", to_string(o),
              fold, secs, timeout_ms / 1e3);
  for (const auto& r : res) {
    if (r.rank == victim) continue;
    EXPECT_EQ(r.exit_code, 1) << "rank " << r.rank << (r.killed_by_launcher ? " hung" : "");
    EXPECT_NE(r.message.find("rank " + std::to_string(victim) + " did not arrive"), std::string::npos) << r.message;
  }
}
}  // namespace

TEST(GemmOverlapGpuFaults, GatheredInputsNameARankThatNeverComes) {
  if (gpus() < 2) GTEST_SKIP() << "needs 2 GPUs";
  expect_missing_peer_named("gather");
}

TEST(GemmOverlapGpuFaults, ReducePassNamesARankThatNeverComes) {
  if (gpus() < 2) GTEST_SKIP() << "needs 2 GPUs";
  expect_missing_peer_named("0");
}

TEST(GemmOverlapGpuFaults, GemmArSumNamesARankThatNeverComes) {
  if (gpus() < 2) GTEST_SKIP() << "needs 2 GPUs";
  expect_missing_peer_named("0", GemmOp::kGemmAr);
}
