// The MoE exchange on GPUs (ops::MoeDispatchCombine; docs/moe.md, "GPU path"): the same exact
// checks as the host test (tests/common/moe_check.hpp) on 1 and all GPUs, both methods, mixed
// and skewed routing, top-k 1, 2 and 8, T = 0 and 1 among the calls; decomposed captured into a
// CUDA graph and replayed; an invalid id found on the device and named.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpu_harness.hpp"
#include "moe_check.hpp"
#include "rank_harness.hpp"
#include "weft/core/cuda_check.hpp"

using namespace weft;
using namespace weft::ops;
using namespace weft::testing;
using namespace weft::testing::moe;

namespace {

std::vector<RankResult> run_gpu(int n, const std::function<void()>& fn) {
  return run_gpu_ranks(n, fn, /*heap_mib=*/512, /*deadline_ms=*/300000);
}

}  // namespace

class MoeGpu : public ::testing::TestWithParam<int> {};

TEST_P(MoeGpu, DispatchAndCombineAreExact) {
  const int n = GetParam() == 0 ? gpus() : GetParam();
  if (gpus() < 1 || n > gpus()) GTEST_SKIP() << "needs " << n << " GPU(s)";
  expect_all_ok(run_gpu(n, [] {
    // Direct combines of rows in every rank's symmetric heap pull them (the in-place experts of
    // odd calls, the identity experts reading recv()); the others push.
    auto b = make_backend();
    const int world = b->size();
    cudaStream_t s;
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    struct Shape {
      int64_t L, k, H;
    };
    int checks = 0;
    for (const Shape& sh : std::vector<Shape>{{1, 1, 16}, {2, 2, 64}, {8, 8, 16}, {3, 1, 1024}})
      for (dev::DType t : {dev::DType::kBF16, dev::DType::kF32})
        for (bool blocks : {false, true})        // recv rank-major, or in expert blocks (direct only)
          for (const char* once : {"0", "2"}) {  // direct's rows: a row per pair, or once a peer (staged)
            setenv("WEFT_MOE_DISPATCH_ONCE", once, 1);
            MoeConfig cfg;
            cfg.hidden = sh.H;
            cfg.experts = sh.L * world;
            cfg.top_k = sh.k;
            cfg.max_tokens = 40;
            cfg.dtype = t;
            cfg.expert_blocks = blocks;
            MoeDispatchCombine op(*b, cfg);
            DevMem mem(s);
            Routing w;
            w.world = world;
            w.E = cfg.experts;
            w.k = sh.k;
            w.H = sh.H;
            for (Route route : {Route::kMixed, Route::kSkewed})
              for (int64_t e : {0, 1, 2, 40})  // T = (3 rank + e) % 41: 0, 1, 2, 40 on rank 0
                for (MoeMethod m : {MoeMethod::kBaseline, MoeMethod::kDecomposed, MoeMethod::kDirect}) {
                  if ((blocks || *once == '2') && m != MoeMethod::kDirect) continue;
                  w.route = route;
                  w.e = e;
                  run_and_check(*b, op, w, cfg.max_tokens, m, t,
                                fmt::format("gpu world {} E {} top-{} H {} {} {} call {} {}{}{}", world, w.E, w.k, w.H,
                                            route == Route::kSkewed ? "skewed" : "mixed", dev::dtype_name(t), e,
                                            to_string(m), blocks ? " blocks" : "", *once == '2' ? " once" : ""),
                                mem);
                  ++checks;
                }
          }
    if (b->rank() == 0) std::printf("[gpu] moe: %d ranks, %d checks passed\n", world, checks);
    WEFT_CUDA_CHECK(cudaStreamDestroy(s));
  }));
}

INSTANTIATE_TEST_SUITE_P(Gpus, MoeGpu, ::testing::Values(1, 0));

// Rows of a real model (hidden 4096, bf16): megabytes to each peer, the size at which NCCL's
// point-to-point into the heap's window hung; every method must move them exactly.
TEST(MoeGpuLarge, ModelSizedRowsAreExact) {
  const int n = gpus();
  if (n < 1) GTEST_SKIP() << "needs a GPU";
  expect_all_ok(run_gpu(n, [] {
    // Direct combines of rows in every rank's symmetric heap pull them (the in-place experts of
    // odd calls, the identity experts reading recv()); the others push.
    auto b = make_backend();
    const int world = b->size();
    cudaStream_t s;
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int checks = 0;
    // Hidden 4096 top-2, and hidden 1024 top-8 (4096 pairs: direct's routing in slices, with its
    // barrier of the grid, rather than whole in every CTA).
    struct Shape {
      int64_t H, L, k;
    };
    for (const Shape& sh : std::vector<Shape>{{4096, 2, 2}, {1024, 8, 8}})
      for (const char* once : {"0", "2"}) {  // direct's rows: a row per pair, or once a peer (staged)
        setenv("WEFT_MOE_DISPATCH_ONCE", once, 1);
        MoeConfig cfg;
        cfg.hidden = sh.H;
        cfg.experts = sh.L * world;
        cfg.top_k = sh.k;
        cfg.max_tokens = 512;
        cfg.dtype = dev::DType::kBF16;
        MoeDispatchCombine op(*b, cfg);
        DevMem mem(s);
        Routing w;
        w.world = world;
        w.E = cfg.experts;
        w.k = cfg.top_k;
        w.H = cfg.hidden;
        w.route = Route::kMixed;
        for (int64_t e :
             {512, 301})  // rank 0: 512 then 301 tokens (odd: experts in place, pulled); the others (3 rank + e) % 513
          for (MoeMethod m : {MoeMethod::kBaseline, MoeMethod::kDecomposed, MoeMethod::kDirect}) {
            if (*once == '2' && m != MoeMethod::kDirect) continue;
            w.e = e;
            run_and_check(*b, op, w, cfg.max_tokens, m, cfg.dtype,
                          fmt::format("gpu world {} H {} top-{} call {} {}{}", world, sh.H, sh.k, e, to_string(m),
                                      *once == '2' ? " once" : ""),
                          mem);
            ++checks;
          }
      }
    if (b->rank() == 0) std::printf("[gpu] moe large rows: %d ranks, %d checks passed\n", world, checks);
    WEFT_CUDA_CHECK(cudaStreamDestroy(s));
  }));
}

// An id outside the experts, or repeated within a token, is left out on the device and named
// when the dispatch is checked (outside a capture); the op goes on.
TEST(MoeGpuErrors, InvalidIdsAreNamed) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  expect_all_ok(run_gpu(1, [] {
    auto b = make_backend();
    MoeConfig cfg;
    cfg.hidden = 16;
    cfg.experts = 4;
    cfg.top_k = 2;
    cfg.max_tokens = 3;
    MoeDispatchCombine op(*b, cfg);
    DevMem mem(nullptr);
    void* x = mem.alloc(3 * 16 * 2);
    auto* ids = static_cast<int32_t*>(mem.alloc(6 * 4));
    const std::vector<int32_t> bad = {0, 1, 2, 7, 1, 2};
    mem.to(ids, bad.data(), 24);
    expect_message([&] { op.dispatch(x, ids, {.tokens = 3}); },
                   "moe: ids[1][1] = 7 is not an expert of 0 ... 3 or repeats one of its token's");
    const std::vector<int32_t> twice = {0, 1, 3, 3, 1, 2};
    mem.to(ids, twice.data(), 24);
    expect_message([&] { op.dispatch(x, ids, {.tokens = 3}); }, "moe: ids[1][1] = 3");
    const std::vector<int32_t> good = {0, 1, 3, 2, 1, 2};
    mem.to(ids, good.data(), 24);
    op.dispatch(x, ids, {.tokens = 3});
    WEFT_CHECK(op.recv_rows() == 6, "every pair of the good call arrives");
  }));
}

// direct: a routing over some rank's capacity is refused on every rank alike (every rank's
// kernel sees the same counts), nothing moves, no rank waits or traps, and the op goes on.
TEST(MoeGpuErrors, DirectOverflowIsRefusedOnEveryRank) {
  if (gpus() < 2) GTEST_SKIP() << "needs 2 GPUs";
  expect_all_ok(run_gpu(2, [] {
    setenv("WEFT_MOE_DISPATCH_ONCE", "2", 1);  // the peers' rows staged before the verdict: still nothing placed
    auto b = make_backend();
    cudaStream_t s;
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    MoeConfig cfg;
    cfg.hidden = 8;
    cfg.experts = 2;
    cfg.top_k = 1;
    cfg.max_tokens = 4;
    cfg.recv_capacity = 5;
    MoeDispatchCombine op(*b, cfg);
    DevMem mem(s);
    void* x = mem.alloc(4 * 8 * 2);
    auto* ids = static_cast<int32_t*>(mem.alloc(4 * 4));
    const std::vector<int32_t> zero(4, 0);  // every token to expert 0: rank 0 would get 8 rows
    mem.to(ids, zero.data(), 16);
    expect_message([&] { op.dispatch(x, ids, {.method = MoeMethod::kDirect, .tokens = 4, .stream = s}); },
                   "moe: dispatch refused: rank 0 would receive 8 rows, more than its recv_capacity 5");
    Routing w;
    w.world = 2;
    w.E = 2;
    w.k = 1;
    w.H = 8;
    w.route = Route::kMixed;
    w.e = 0;  // 0 and 3 tokens: 3 rows at most on a rank
    run_and_check(*b, op, w, 4, MoeMethod::kDirect, dev::DType::kBF16, "direct after the refusal", mem);
    WEFT_CUDA_CHECK(cudaStreamDestroy(s));
  }));
}

// decomposed and direct, each captured into one CUDA graph (dispatch and combine), replayed with
// new inputs.
TEST(MoeGpuGraph, CapturedDispatchAndCombineReplay) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  expect_all_ok(run_gpu(gpus(), [] {
    // Direct combines of rows in every rank's symmetric heap pull them (the in-place experts of
    // odd calls, the identity experts reading recv()); the others push.
    setenv("WEFT_MOE_DISPATCH_ONCE", "2", 1);  // direct's rows once a peer, staged (replays reuse the stage)
    auto b = make_backend();
    const int world = b->size(), r = b->rank();
    cudaStream_t s;
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    MoeConfig cfg;
    cfg.hidden = 32;
    cfg.experts = 2 * world;
    cfg.top_k = 2;
    cfg.max_tokens = 8;
    MoeDispatchCombine op(*b, cfg);
    DevMem mem(s);
    const int64_t T = 8, H = 32, k = 2;
    void* x = mem.alloc(T * H * 2);
    auto* ids = static_cast<int32_t*>(mem.alloc(T * k * 4));
    auto* wt = static_cast<float*>(mem.alloc(T * k * 4));
    void* y = mem.alloc(T * H * 2);
    // This rank's inputs of call e (the routing of moe_check.hpp) into x, ids, wt.
    Routing w;
    w.world = world;
    w.E = cfg.experts;
    w.k = k;
    w.H = H;
    auto load = [&](int64_t e) {
      w.e = e;
      const CallInputs in = inputs_of(w, r, T, dev::DType::kBF16);
      mem.to(x, in.x.p(), T * H * 2);
      mem.to(ids, in.ids.data(), T * k * 4);
      mem.to(wt, in.wt.data(), T * k * 4);
    };
    for (MoeMethod m : {MoeMethod::kDecomposed, MoeMethod::kDirect}) {
      // Identity experts: combine reads recv itself; y = x * (sum of the weights).
      const MoeRunOptions o{.method = m, .tokens = T, .stream = s};
      load(100);
      op.dispatch(x, ids, o);  // the collectives' first calls, outside the capture
      op.combine(op.recv(), wt, y, o);
      WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      WEFT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      op.dispatch(x, ids, o);
      op.combine(op.recv(), wt, y, o);
      WEFT_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
      WEFT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      for (int replay = 0; replay < 3; ++replay) {
        load(replay);
        b->barrier();
        WEFT_CUDA_CHECK(cudaGraphLaunch(exec, s));
        Rows yh(T, H, dev::DType::kBF16);
        mem.from(yh.p(), y, T * H * 2);
        for (int64_t i = 0; i < T; ++i)
          for (int64_t h = 0; h < H; ++h) {
            const float want = w.x(r, i, h) * (w.w(r, i, 0) + w.w(r, i, 1));
            WEFT_CHECK(get(yh.p(), i * H + h, dev::DType::kBF16) == want,
                       fmt::format("{} replay {}: y[{}][{}] = {}, expected {}", to_string(m), replay, i, h,
                                   get(yh.p(), i * H + h, dev::DType::kBF16), want));
          }
        b->barrier();
      }
      WEFT_CUDA_CHECK(cudaGraphExecDestroy(exec));
      WEFT_CUDA_CHECK(cudaGraphDestroy(graph));
    }
    WEFT_CUDA_CHECK(cudaStreamDestroy(s));
  }));
}

// The layer (dispatch, the experts' SwiGLU FFNs, combine) within bf16 tolerance of the per-token
// reference, both methods, on 1 and all GPUs: expert blocks partly filled, experts that receive
// nothing (skewed routing), T changing (0 among them); then the decomposed forward captured in a
// CUDA graph and replayed on new inputs, bitwise equal to an eager forward on them.
class MoeLayerGpu : public ::testing::TestWithParam<int> {};

TEST_P(MoeLayerGpu, ForwardIsCloseToTheReferenceAndCapturable) {
  const int n = GetParam() == 0 ? gpus() : GetParam();
  if (gpus() < 1 || n > gpus()) GTEST_SKIP() << "needs " << n << " GPU(s)";
  expect_all_ok(run_gpu(n, [] {
    auto b = make_backend();
    const int world = b->size(), r = b->rank();
    cudaStream_t s;
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    struct Shape {
      int64_t L, k, H, F;
    };
    int checks = 0;
    for (const Shape& sh : std::vector<Shape>{{2, 2, 256, 136}, {4, 4, 64, 512}}) {
      ops::MoeLayerConfig cfg;
      cfg.moe.hidden = sh.H;
      cfg.moe.experts = sh.L * world;
      cfg.moe.top_k = sh.k;
      cfg.moe.max_tokens = 300;
      cfg.ffn = sh.F;
      ops::MoeLayer layer(*b, cfg);
      DevMem mem(s);
      Routing w;
      w.world = world;
      w.E = cfg.moe.experts;
      w.k = sh.k;
      w.H = sh.H;
      for (Route route : {Route::kMixed, Route::kSkewed})
        for (int64_t e : {0, 1, 300})
          for (ops::MoeLayerMethod m :
               {ops::MoeLayerMethod::kBaseline, ops::MoeLayerMethod::kDecomposed, ops::MoeLayerMethod::kFused}) {
            w.route = route;
            w.e = e;
            run_and_check_layer(*b, layer, w, cfg.moe.max_tokens, m, dev::DType::kBF16, sh.F,
                                fmt::format("gpu layer world {} E {} top-{} H {} F {} {} call {} {}", world, w.E, w.k,
                                            w.H, sh.F, route == Route::kSkewed ? "skewed" : "mixed", e, to_string(m)),
                                mem, true, 2e-2f);
            ++checks;
          }
      // Captured: inputs of call e loaded into fixed buffers, T = max_tokens.
      const int64_t T = cfg.moe.max_tokens, H = sh.H, k = sh.k, L = sh.L, F = sh.F;
      void* x = mem.alloc(T * H * 2);
      auto* ids = static_cast<int32_t*>(mem.alloc(T * k * 4));
      auto* wt = static_cast<float*>(mem.alloc(T * k * 4));
      void* wu = mem.alloc(L * 2 * F * H * 2);
      void* wd = mem.alloc(L * H * F * 2);
      void* y = mem.alloc(T * H * 2);
      void* y_eager = mem.alloc(T * H * 2);
      Rows wuh(L * 2 * F, H, dev::DType::kBF16), wdh(L * H, F, dev::DType::kBF16);
      for (int64_t l = 0; l < L; ++l) {
        for (int64_t j = 0; j < 2 * F; ++j)
          for (int64_t h = 0; h < H; ++h)
            put(wuh.p(), (l * 2 * F + j) * H + h, w_up(r * L + l, j, h), dev::DType::kBF16);
        for (int64_t i = 0; i < H; ++i)
          for (int64_t j = 0; j < F; ++j) put(wdh.p(), (l * H + i) * F + j, w_down(r * L + l, i, j), dev::DType::kBF16);
      }
      mem.to(wu, wuh.p(), L * 2 * F * H * 2);
      mem.to(wd, wdh.p(), L * H * F * 2);
      w.route = Route::kMixed;
      auto load = [&](int64_t e) {
        w.e = e;
        const CallInputs in = inputs_of(w, r, T, dev::DType::kBF16);
        mem.to(x, in.x.p(), T * H * 2);
        mem.to(ids, in.ids.data(), T * k * 4);
        mem.to(wt, in.wt.data(), T * k * 4);
      };
      // Each capturable method in a graph, replayed on new inputs: bitwise equal to decomposed
      // eagerly (fused differs from it only in who stores combine's rows).
      const ops::MoeLayerRunOptions eager{.method = ops::MoeLayerMethod::kDecomposed, .tokens = T, .stream = s};
      for (ops::MoeLayerMethod cm : {ops::MoeLayerMethod::kDecomposed, ops::MoeLayerMethod::kFused}) {
        const ops::MoeLayerRunOptions o{.method = cm, .tokens = T, .stream = s};
        load(7);
        layer.forward(x, ids, wt, wu, wd, y, o);
        WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        WEFT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        layer.forward(x, ids, wt, wu, wd, y, o);
        WEFT_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
        WEFT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        for (int replay = 0; replay < 2; ++replay) {
          load(11 + replay);
          b->barrier();
          WEFT_CUDA_CHECK(cudaGraphLaunch(exec, s));
          WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
          b->barrier();
          layer.forward(x, ids, wt, wu, wd, y_eager, eager);
          std::vector<uint16_t> got(static_cast<size_t>(T * H)), want(got.size());
          mem.from(got.data(), y, got.size() * 2);
          mem.from(want.data(), y_eager, want.size() * 2);
          for (size_t i = 0; i < got.size(); ++i)
            WEFT_CHECK(got[i] == want[i], fmt::format("layer {} replay {}: y element {} is {:#06x}, decomposed eagerly "
                                                      "{:#06x}",
                                                      to_string(cm), replay, i, got[i], want[i]));
          ++checks;
          b->barrier();
        }
        WEFT_CUDA_CHECK(cudaGraphExecDestroy(exec));
        WEFT_CUDA_CHECK(cudaGraphDestroy(graph));
      }
    }
    if (r == 0) std::printf("[gpu] moe layer: %d ranks, %d checks passed\n", world, checks);
    WEFT_CUDA_CHECK(cudaStreamDestroy(s));
  }));
}

INSTANTIATE_TEST_SUITE_P(Gpus, MoeLayerGpu, ::testing::Values(1, 0));
