// Embedding-bag lookups + all-to-all on GPUs (ops::EmbeddingA2A; docs/embedding_a2a.md, "GPU
// path"): the host test's exact checks (tests/common/embedding_check.hpp) on 1 and all GPUs for
// every method, dtype, pooling, with and without per-sample weights, tables of dims from 8 to
// 1008; tables of values whose sums round, bitwise alike across methods; the three methods
// captured into one CUDA graph and replayed with new indices; an index outside its table and
// decreasing offsets found on the device and named.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "embedding_check.hpp"
#include "gpu_harness.hpp"
#include "op_mem.hpp"
#include "rank_harness.hpp"
#include "weft/core/cuda_check.hpp"

using namespace weft;
using namespace weft::ops;
using namespace weft::testing;
using namespace weft::testing::embedding;

namespace {

std::vector<RankResult> run_gpu(int n, const std::function<void()>& fn) {
  return run_gpu_ranks(n, fn, /*heap_mib=*/512, /*deadline_ms=*/300000);
}

constexpr EmbeddingA2AMethod kMethods[] = {EmbeddingA2AMethod::kBaseline, EmbeddingA2AMethod::kDecomposed,
                                           EmbeddingA2AMethod::kFused, EmbeddingA2AMethod::kAuto};

}  // namespace

class EmbeddingA2AGpu : public ::testing::TestWithParam<int> {};

TEST_P(EmbeddingA2AGpu, ForwardIsExact) {
  const int n = GetParam() == 0 ? gpus() : GetParam();
  if (gpus() < 1 || n > gpus()) GTEST_SKIP() << "needs " << n << " GPU(s)";
  expect_all_ok(run_gpu(n, [] {
    auto b = make_backend();
    const int world = b->size();
    cudaStream_t s;
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int checks = 0;
    for (int64_t dim_base : {8, 336})
      for (int64_t batch : {3, 1, 300})
        for (dev::DType wt : {dev::DType::kF32, dev::DType::kBF16, dev::DType::kF16})
          for (dev::DType ot : {dev::DType::kF32, dev::DType::kBF16})
            for (EmbeddingPooling pool : {EmbeddingPooling::kSum, EmbeddingPooling::kMean})
              for (bool weighted : {false, true}) {
                if (batch == 300 && (dim_base > 8 || wt == dev::DType::kF16)) continue;
                for (EmbeddingA2AMethod m : kMethods) {
                  DevMem mem(s);
                  run_and_check(*b, Model(world, batch, dim_base), wt, ot, pool, weighted,
                                fmt::format("gpu world {} dims {}x batch {} weights {} out {} {}{} {}", world, dim_base,
                                            batch, dev::dtype_name(wt), dev::dtype_name(ot),
                                            pool == EmbeddingPooling::kSum ? "sum" : "mean",
                                            weighted ? " weighted" : "", to_string(m)),
                                mem, m);
                  ++checks;
                }
              }
    if (b->rank() == 0) std::printf("[gpu] embedding_a2a: %d ranks, %d checks passed\n", world, checks);
    WEFT_CUDA_CHECK(cudaStreamDestroy(s));
  }));
}

// Values whose sums round: every method sums in the same order, so their outputs are the same
// bits (and the reference's, which sums in that order too).
TEST_P(EmbeddingA2AGpu, MethodsAreBitwiseAlike) {
  const int n = GetParam() == 0 ? gpus() : GetParam();
  if (gpus() < 1 || n > gpus()) GTEST_SKIP() << "needs " << n << " GPU(s)";
  expect_all_ok(run_gpu(n, [] {
    auto b = make_backend();
    cudaStream_t s;
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (EmbeddingPooling pool : {EmbeddingPooling::kSum, EmbeddingPooling::kMean}) {
      std::vector<unsigned char> first;
      for (EmbeddingA2AMethod m : kMethods) {
        DevMem mem(s);
        const std::vector<unsigned char> out =
            run_and_check(*b, Model(b->size(), 200, 64, /*fraction=*/true), dev::DType::kF32, dev::DType::kF32, pool,
                          true, fmt::format("fractions {}", to_string(m)), mem, m);
        if (first.empty()) first = out;
        WEFT_CHECK(out == first, fmt::format("method {}'s output differs from the baseline's", to_string(m)));
      }
    }
    WEFT_CUDA_CHECK(cudaStreamDestroy(s));
  }));
}

// The backward into every sink by every method: the host test's exact checks (the transpose in
// the op's order; SGD's and Adagrad's steps).
TEST_P(EmbeddingA2AGpu, BackwardIsExact) {
  const int n = GetParam() == 0 ? gpus() : GetParam();
  if (gpus() < 1 || n > gpus()) GTEST_SKIP() << "needs " << n << " GPU(s)";
  expect_all_ok(run_gpu(n, [] {
    auto b = make_backend();
    const int world = b->size();
    cudaStream_t s;
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int checks = 0;
    for (EmbeddingGradKind kind :
         {EmbeddingGradKind::kDense, EmbeddingGradKind::kSparse, EmbeddingGradKind::kSgd, EmbeddingGradKind::kAdagrad})
      for (int64_t dim_base : {8, 336})
        for (int64_t batch : {3, 300})
          for (dev::DType wt : {dev::DType::kF32, dev::DType::kBF16})
            for (dev::DType ot : {dev::DType::kF32, dev::DType::kBF16})
              for (EmbeddingPooling pool : {EmbeddingPooling::kSum, EmbeddingPooling::kMean}) {
                if (batch == 300 && dim_base > 8) continue;
                const bool weighted = checks % 2 == 1;
                for (EmbeddingA2AMethod m : kMethods) {
                  DevMem mem(s);
                  run_and_check_backward(
                      *b, Model(world, batch, dim_base), wt, ot, pool, weighted,
                      fmt::format("gpu backward world {} dims {}x batch {} weights {} grads {} {}{} {}", world,
                                  dim_base, batch, dev::dtype_name(wt), dev::dtype_name(ot),
                                  pool == EmbeddingPooling::kSum ? "sum" : "mean", weighted ? " weighted" : "",
                                  to_string(m)),
                      mem, m, kind);
                  ++checks;
                }
              }
    if (b->rank() == 0) std::printf("[gpu] embedding_a2a backward: %d ranks, %d checks passed\n", world, checks);
    WEFT_CUDA_CHECK(cudaStreamDestroy(s));
  }));
}

INSTANTIATE_TEST_SUITE_P(Gpus, EmbeddingA2AGpu, ::testing::Values(1, 0));

// Every method captured into a CUDA graph, replayed with new indices written into the same
// buffers: each replay's output is the pooled rows of the indices it found.
TEST(EmbeddingA2AGpuGraph, CapturedForwardReplays) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  expect_all_ok(run_gpu(gpus(), [] {
    auto b = make_backend();
    const int W = b->size(), r = b->rank();
    cudaStream_t s;
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    // One table of 64 x 16 a rank, row i all (rank * 1000 + i); bag g of the global batch holds
    // the single index (g + call) % 64.
    const int64_t B = 40, rows = 64, D = 16;
    EmbeddingA2AConfig cfg;
    cfg.tables = {{rows, D}};
    cfg.batch = B;
    EmbeddingA2A op(*b, cfg);
    DevMem mem(s);
    std::vector<float> w(static_cast<size_t>(rows * D));
    for (int64_t i = 0; i < rows * D; ++i) w[static_cast<size_t>(i)] = static_cast<float>(r * 1000 + i / D);
    std::vector<int64_t> offs(static_cast<size_t>(W * B + 1));
    for (int64_t g = 0; g <= W * B; ++g) offs[static_cast<size_t>(g)] = g;
    void* dw = mem.alloc(w.size() * 4);
    void* doffs = mem.alloc(offs.size() * 8);
    auto* didx = static_cast<int64_t*>(mem.alloc(static_cast<size_t>(W * B) * 8));
    void* dout = mem.alloc(static_cast<size_t>(B * W * D) * 4);
    mem.to(dw, w.data(), w.size() * 4);
    mem.to(doffs, offs.data(), offs.size() * 8);
    EmbeddingBagInput in{dw, static_cast<const int64_t*>(doffs), didx, nullptr};
    auto set_call = [&](int call) {
      std::vector<int64_t> idx(static_cast<size_t>(W * B));
      for (int64_t g = 0; g < W * B; ++g) idx[static_cast<size_t>(g)] = (g + call) % rows;
      mem.to(didx, idx.data(), idx.size() * 8);
    };
    for (EmbeddingA2AMethod m : kMethods) {
      EmbeddingA2ARunOptions opt;
      opt.method = m;
      opt.stream = s;
      set_call(0);
      op.forward(&in, dout, opt);  // the first call outside the capture
      cudaGraph_t graph;
      WEFT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      op.forward(&in, dout, opt);
      WEFT_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
      cudaGraphExec_t exec;
      WEFT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      for (int call = 1; call <= 5; ++call) {
        set_call(call);
        WEFT_CUDA_CHECK(cudaGraphLaunch(exec, s));
        std::vector<float> out(static_cast<size_t>(B * W * D));
        mem.from(out.data(), dout, out.size() * 4);
        for (int64_t bb = 0; bb < B; ++bb)
          for (int q = 0; q < W; ++q) {
            const float want = static_cast<float>(q * 1000 + (r * B + bb + call) % rows);
            for (int64_t j = 0; j < D; ++j) {
              const float got = out[static_cast<size_t>(bb * W * D + q * D + j)];
              WEFT_CHECK(got == want, fmt::format("{} replay {}: sample {} table {} column {}: {}, expected {}",
                                                  to_string(m), call, bb, q, j, got, want));
            }
          }
      }
      WEFT_CUDA_CHECK(cudaGraphExecDestroy(exec));
      WEFT_CUDA_CHECK(cudaGraphDestroy(graph));
    }
    // The backward (dense) captured the same way: grad_out of rank q's sample b is q * 100 + b +
    // call in every column, so row x's gradient is the sum of that over the bags indexing x.
    auto* dgo = static_cast<float*>(mem.alloc(static_cast<size_t>(B * W * D) * 4));
    auto* dgw = static_cast<float*>(mem.alloc(static_cast<size_t>(rows * D) * 4));
    auto set_grad = [&](int call) {
      std::vector<float> go(static_cast<size_t>(B * W * D));
      for (int64_t bb = 0; bb < B; ++bb)
        for (int64_t c = 0; c < W * D; ++c)
          go[static_cast<size_t>(bb * W * D + c)] = static_cast<float>(r * 100 + bb + call);
      mem.to(dgo, go.data(), go.size() * 4);
    };
    in.num_indices = W * B;
    for (EmbeddingA2AMethod m : kMethods) {
      EmbeddingBackwardOptions opt;
      opt.method = m;
      opt.stream = s;
      EmbeddingTableGrad sink;
      sink.dense = dgw;
      set_call(0);
      set_grad(0);
      op.backward(&in, dgo, &sink, opt);  // the first call outside the capture sizes the work space
      cudaGraph_t graph;
      WEFT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      op.backward(&in, dgo, &sink, opt);
      WEFT_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
      cudaGraphExec_t exec;
      WEFT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      for (int call = 1; call <= 5; ++call) {
        set_call(call);
        set_grad(call);
        WEFT_CUDA_CHECK(cudaGraphLaunch(exec, s));
        std::vector<float> got(static_cast<size_t>(rows * D)), want(static_cast<size_t>(rows), 0.f);
        mem.from(got.data(), dgw, got.size() * 4);
        for (int64_t g = 0; g < W * B; ++g)
          want[static_cast<size_t>((g + call) % rows)] += static_cast<float>((g / B) * 100 + g % B + call);
        for (int64_t x = 0; x < rows; ++x)
          for (int64_t j = 0; j < D; ++j)
            WEFT_CHECK(got[static_cast<size_t>(x * D + j)] == want[static_cast<size_t>(x)],
                       fmt::format("backward {} replay {}: row {} column {}: {}, expected {}", to_string(m), call, x, j,
                                   got[static_cast<size_t>(x * D + j)], want[static_cast<size_t>(x)]));
      }
      WEFT_CUDA_CHECK(cudaGraphExecDestroy(exec));
      WEFT_CUDA_CHECK(cudaGraphDestroy(graph));
    }
    WEFT_CUDA_CHECK(cudaStreamDestroy(s));
  }));
}

// An index outside its table, or offsets that decrease, found on the device: the index is left
// out (never read) and forward throws on the rank that passed it, naming table and position;
// its peers' calls complete, and the op goes on.
TEST(EmbeddingA2AGpuErrors, BadIndicesAreNamed) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  expect_all_ok(run_gpu(gpus(), [] {
    auto b = make_backend();
    const int W = b->size(), r = b->rank();
    cudaStream_t s;
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int64_t B = 4, rows = 10, D = 8;
    EmbeddingA2AConfig cfg;
    cfg.tables = {{rows, D}, {rows, D}};
    cfg.batch = B;
    EmbeddingA2A op(*b, cfg);
    DevMem mem(s);
    std::vector<float> w(static_cast<size_t>(rows * D), 1.f);
    void* dw = mem.alloc(w.size() * 4);
    mem.to(dw, w.data(), w.size() * 4);
    std::vector<int64_t> offs(static_cast<size_t>(W * B + 1)), idx(static_cast<size_t>(W * B), 3);
    for (int64_t g = 0; g <= W * B; ++g) offs[static_cast<size_t>(g)] = g;
    auto* doffs = static_cast<int64_t*>(mem.alloc(offs.size() * 8));
    auto* didx = static_cast<int64_t*>(mem.alloc(idx.size() * 8));
    void* dout = mem.alloc(static_cast<size_t>(B * 2 * W * D) * 4);
    mem.to(doffs, offs.data(), offs.size() * 8);
    for (EmbeddingA2AMethod m : kMethods) {
      EmbeddingA2ARunOptions opt;
      opt.method = m;
      opt.stream = s;
      std::vector<int64_t> bad = idx;
      if (r == 0) bad[1] = rows;  // table 1 only (W * B >= 4 indices)
      mem.to(didx, idx.data(), idx.size() * 8);
      auto* dbad = static_cast<int64_t*>(mem.alloc(bad.size() * 8));
      mem.to(dbad, bad.data(), bad.size() * 8);
      EmbeddingBagInput in[2] = {{dw, doffs, didx, nullptr}, {dw, doffs, dbad, nullptr}};
      if (r == 0)
        expect_message(
            [&] { op.forward(in, dout, opt); },
            fmt::format("embedding_a2a: table 1 (global 1): indices[1] = {} is outside 0 ... {}", rows, rows - 1));
      else
        op.forward(in, dout, opt);
      in[1].indices = didx;  // the op goes on (the flag was reset)
      op.forward(in, dout, opt);
      std::vector<float> out(static_cast<size_t>(B * 2 * W * D));
      mem.from(out.data(), dout, out.size() * 4);
      for (float f : out) WEFT_CHECK(f == 1.f, fmt::format("{}: a good call after a bad one: {}", to_string(m), f));
    }
    // Offsets that decrease.
    std::vector<int64_t> down = offs;
    if (r == 0) down[2] = 0;  // bag 1: 1 ... 0
    auto* ddown = static_cast<int64_t*>(mem.alloc(down.size() * 8));
    mem.to(ddown, down.data(), down.size() * 8);
    mem.to(didx, idx.data(), idx.size() * 8);
    EmbeddingBagInput in[2] = {{dw, ddown, didx, nullptr}, {dw, doffs, didx, nullptr}};
    EmbeddingA2ARunOptions opt;
    opt.stream = s;
    if (r == 0)
      expect_message([&] { op.forward(in, dout, opt); },
                     "embedding_a2a: table 0 (global 0): offsets decrease at bag 1");
    else
      op.forward(in, dout, opt);
    // The backward: without num_indices refused on every rank; a bad index named, its peers'
    // calls complete.
    auto* dgo = static_cast<float*>(mem.alloc(static_cast<size_t>(B * 2 * W * D) * 4));
    auto* dgw = static_cast<float*>(mem.alloc(static_cast<size_t>(2 * rows * D) * 4));
    EmbeddingTableGrad sinks[2];
    sinks[0].dense = dgw;
    sinks[1].dense = dgw + rows * D;
    EmbeddingBackwardOptions bopt;
    bopt.stream = s;
    in[0].offsets = doffs;
    in[0].num_indices = W * B;
    if (r != 0) in[1].num_indices = W * B;  // rank 0 leaves it out: every rank refuses the call
    expect_message([&] { op.backward(in, dgo, sinks, bopt); },
                   "table 1 (global 1): backward on GPUs needs num_indices");
    in[1].num_indices = W * B;
    std::vector<int64_t> bad = idx;
    if (r == 0) bad[2] = -1;
    auto* dbad = static_cast<int64_t*>(mem.alloc(bad.size() * 8));
    mem.to(dbad, bad.data(), bad.size() * 8);
    in[0].indices = dbad;
    if (r == 0)
      expect_message([&] { op.backward(in, dgo, sinks, bopt); },
                     "embedding_a2a: table 0 (global 0): indices[2] = -1 is outside 0 ... 9");
    else
      op.backward(in, dgo, sinks, bopt);
    WEFT_CUDA_CHECK(cudaStreamDestroy(s));
  }));
}
