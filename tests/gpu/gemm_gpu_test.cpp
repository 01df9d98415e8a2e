// weft's GEMM on one GPU: exact on small-integer data against the CPU tile reference (both
// kernels, both dtypes, both B layouts, shapes that are not multiples of the tile), close to
// it on random data, every hook (tile order, destinations with row offsets, reduce-add,
// notify counts, waits on data that arrives after the launch), and argument errors.
// Each test runs in a forked child (the other GPU tests fork ranks: no CUDA in the parent).
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "gemm_gpu_kernels.hpp"
#include "gpu_harness.hpp"
#include "rank_harness.hpp"
#include "weft/core/cuda_check.hpp"
#include "weft/core/error.hpp"
#include "weft/kernels/gemm.hpp"
#include "weft/kernels/moe_kernels.hpp"
#include "weft/kernels/runtime_kernels.hpp"
#include "weft/ops/gemm.hpp"
#include "weft/runtime/backend.hpp"
#include "weft/runtime/launch.hpp"

using namespace weft;
using namespace weft::testing;

namespace {

void in_child(const std::function<void()>& fn) {
  LaunchOptions opt;
  opt.nranks = 1;
  opt.grace_ms = 30000;
  opt.deadline_ms = 300000;
  opt.quiet = true;
  expect_all_ok(run_ranks(fn, opt));
}

template <class T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) {
    WEFT_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)));
    WEFT_CUDA_CHECK(cudaMemset(p, 0, std::max<size_t>(count, 1) * sizeof(T)));
  }
  ~DevBuf() { cudaFree(p); }
  void put(const std::vector<T>& h) { WEFT_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice)); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    WEFT_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

uint16_t enc(dev::DType t, float x) { return dev::to_bits16(x, t); }
float dec(dev::DType t, uint16_t x) { return dev::from_bits16(x, t); }

std::vector<uint16_t> fill(dev::DType t, size_t n, uint32_t seed, bool integers, int range = 2) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<uint16_t> v(n);
  for (auto& x : v)
    x = enc(t, integers ? static_cast<float>(static_cast<int>(rng() % (2 * range + 1)) - range) : u(rng));
  return v;
}

// A wait table (GemmHooks::wait_begin / idx / val / peer) in device memory.
struct WaitTables {
  DevBuf<int32_t> begin, idx, peer;
  DevBuf<uint64_t> val;
  WaitTables(const std::vector<int32_t>& b, const std::vector<int32_t>& i, const std::vector<uint64_t>& v,
             const std::vector<int32_t>& from)
      : begin(b.size()), idx(i.size()), peer(from.size()), val(v.size()) {
    begin.put(b);
    idx.put(i);
    val.put(v);
    peer.put(from);
  }
  void set(kernels::GemmHooks& h) const {
    h.wait_begin = begin.p;
    h.wait_idx = idx.p;
    h.wait_val = val.p;
    h.wait_peer = peer.p;
  }
};

// A one-rank context whose heap is `heap` (signals at offset 0), 10 s deadline.
dev::DeviceCtx one_gpu_ctx(const DevBuf<uint64_t>& heap) {
  dev::DeviceCtx ctx{};
  ctx.rank = 0;
  ctx.world = 1;
  ctx.heap_bytes = heap.n * 8;
  ctx.timeout_ns = 10'000'000'000ull;
  ctx.peer_base[0] = reinterpret_cast<char*>(heap.p);
  return ctx;
}

struct Case {
  int m, n, k;
};

kernels::GemmArgs args_for(dev::DType t, bool kn, const Case& c, const void* a, const void* b, void* out) {
  kernels::GemmArgs g;
  g.m = c.m;
  g.n = c.n;
  g.k = c.k;
  g.type = t == dev::DType::kBF16 ? kernels::GemmType::kBF16 : kernels::GemmType::kF16;
  g.b_layout = kn ? kernels::GemmBLayout::kKN : kernels::GemmBLayout::kNK;
  g.a = a;
  g.lda = c.k;
  g.b = b;
  g.ldb = kn ? c.n : c.k;
  g.c[0] = out;
  g.ldc = c.n;
  return g;
}

// The kernels the tests sweep: 0 sm90 CTA pairs, 1 sm90 single CTAs, 2 portable (the caller
// passes force_portable), 3 sm90 with 8 stages of K 32.
void use_kernel(kernels::GemmArgs& g, int kernel) {
  g.cluster_m = kernel == 0 ? 2 : 1;
  g.k_block = kernel == 3 ? 32 : 0;
}

std::vector<uint16_t> reference(dev::DType t, bool kn, const Case& c, const std::vector<uint16_t>& a,
                                const std::vector<uint16_t>& b, const std::vector<uint16_t>* prefill = nullptr) {
  std::vector<uint16_t> out = prefill ? *prefill : std::vector<uint16_t>(static_cast<size_t>(c.m) * c.n);
  ops::CpuGemm g{t, t, kn, a.data(), c.k, b.data(), kn ? c.n : c.k, out.data(), c.n, c.k, prefill != nullptr};
  ops::gemm_cpu(g, c.m, c.n);
  return out;
}

void expect_equal(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, const std::string& what) {
  WEFT_REQUIRE(got.size() == want.size(), what + ": size");
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i])
      throw Error(
          fmt::format("{}: element {} is {:#06x}, expected {:#06x} (and maybe more)", what, i, got[i], want[i]));
}

}  // namespace

TEST(GemmGpu, ExactOnSmallIntegersForEveryKernelTypeLayoutAndShape) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  in_child([] {
    const std::vector<Case> cases = {{128, 256, 64}, {1, 8, 8},       {300, 520, 136},
                                     {129, 257, 72}, {200, 600, 512}, {513, 264, 1000}};
    int checks = 0;
    for (int kernel : {0, 1, 2, 3})  // sm90 CTA pairs, sm90 single CTAs, portable, sm90 8 stages of K 32
      for (dev::DType t : {dev::DType::kBF16, dev::DType::kF16})
        for (bool kn : {false, true})
          for (const auto& c : cases) {
            const bool portable = kernel == 2;
            const auto ha = fill(t, static_cast<size_t>(c.m) * c.k, 1, true);
            const auto hb = fill(t, static_cast<size_t>(c.n) * c.k, 2, true);
            DevBuf<uint16_t> a(ha.size()), b(hb.size()), out(static_cast<size_t>(c.m) * c.n);
            a.put(ha);
            b.put(hb);
            auto g = args_for(t, kn, c, a.p, b.p, out.p);
            use_kernel(g, kernel);
            ops::gemm_gpu(g, {}, nullptr, portable);
            WEFT_CUDA_CHECK(cudaDeviceSynchronize());
            expect_equal(out.get(), reference(t, kn, c, ha, hb),
                         fmt::format("{} {} {} M={} N={} K={}",
                                     kernel == 0   ? "sm90 pairs"
                                     : kernel == 1 ? "sm90"
                                     : kernel == 2 ? "portable"
                                                   : "sm90 k32",
                                     dev::dtype_name(t), kn ? "kn" : "nk", c.m, c.n, c.k));
            ++checks;
          }
    std::printf("[gpu] gemm: %d exact checks passed (sm90 kernel: %s)\n", checks,
                kernels::gemm_sm90_available() ? "yes" : "no");
  });
}

// Epilogue sources (GemmArgs::src): C = A*B + s0 + s1, added in fp32 and rounded once, for
// every kernel, both types, TMA-stored C (N % 8 == 0) and the register epilogue (N odd, or a
// source off 16 bytes), sources with a longer row stride than C.
TEST(GemmGpu, EpilogueSourcesAreAddedBeforeTheRounding) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  in_child([] {
    const std::vector<Case> cases = {{128, 256, 64}, {300, 520, 136}, {129, 257, 72}, {513, 264, 1000}};
    int checks = 0;
    for (int kernel : {0, 1, 2, 3})  // sm90 CTA pairs, sm90 single CTAs, portable, sm90 K 32
      for (dev::DType t : {dev::DType::kBF16, dev::DType::kF16})
        for (const auto& c : cases)
          for (int offset : {0, 1}) {  // elements: 1 moves the second source off 16 bytes
            const bool portable = kernel == 2;
            const int64_t ld = c.n + 8;
            const auto ha = fill(t, static_cast<size_t>(c.m) * c.k, 21, true);
            const auto hb = fill(t, static_cast<size_t>(c.n) * c.k, 22, true);
            const auto s0 = fill(t, static_cast<size_t>(c.m) * ld, 23, true, 50);
            const auto s1 = fill(t, static_cast<size_t>(c.m) * ld + 1, 24, true, 50);
            DevBuf<uint16_t> a(ha.size()), b(hb.size()), out(static_cast<size_t>(c.m) * c.n), d0(s0.size()),
                d1(s1.size());
            a.put(ha);
            b.put(hb);
            d0.put(s0);
            d1.put(s1);
            auto g = args_for(t, false, c, a.p, b.p, out.p);
            use_kernel(g, kernel);
            g.src[0] = d0.p;
            g.src[1] = d1.p + offset;
            g.num_src = 2;
            g.ld_src = ld;
            ops::gemm_gpu(g, {}, nullptr, portable);
            WEFT_CUDA_CHECK(cudaDeviceSynchronize());
            std::vector<uint16_t> pre(static_cast<size_t>(c.m) * c.n);
            for (int r = 0; r < c.m; ++r)
              for (int j = 0; j < c.n; ++j)
                pre[static_cast<size_t>(r) * c.n + j] =
                    enc(t, dec(t, s0[static_cast<size_t>(r * ld + j)]) +
                               dec(t, s1[static_cast<size_t>(r * ld + j + offset)]));
            expect_equal(out.get(), reference(t, false, c, ha, hb, &pre),
                         fmt::format("sources: kernel {} {} M={} N={} K={} offset {}", kernel, dev::dtype_name(t), c.m,
                                     c.n, c.k, offset));
            ++checks;
          }
    std::printf("[gpu] gemm epilogue sources: %d exact checks passed\n", checks);
  });
}

// Rows of A from a second pointer (GemmArgs::a2: a rank's own rows in place): the main A
// holds NaNs there, so reading the wrong one shows; every kernel, both layouts.
TEST(GemmGpu, RowsFromASecondPointer) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  in_child([] {
    struct Split {
      Case c;
      int64_t row0, rows;
    };
    const std::vector<Split> splits = {
        {{300, 520, 136}, 128, 172}, {{513, 264, 1000}, 256, 128}, {{256, 256, 64}, 0, 128}};
    int checks = 0;
    for (int kernel : {0, 1, 2, 3})
      for (bool kn : {false, true})
        for (const auto& sp : splits) {
          const Case& c = sp.c;
          const dev::DType t = dev::DType::kBF16;
          const auto ha = fill(t, static_cast<size_t>(c.m) * c.k, 31, true);
          const auto hb = fill(t, static_cast<size_t>(c.n) * c.k, 32, true);
          std::vector<uint16_t> main_a = ha;
          std::fill(main_a.begin() + sp.row0 * c.k, main_a.begin() + (sp.row0 + sp.rows) * c.k, uint16_t{0x7FC0});
          std::vector<uint16_t> own(ha.begin() + sp.row0 * c.k, ha.begin() + (sp.row0 + sp.rows) * c.k);
          DevBuf<uint16_t> a(ha.size()), a2(own.size()), b(hb.size()), out(static_cast<size_t>(c.m) * c.n);
          a.put(main_a);
          a2.put(own);
          b.put(hb);
          auto g = args_for(t, kn, c, a.p, b.p, out.p);
          use_kernel(g, kernel);
          g.a2 = a2.p;
          g.a2_row0 = sp.row0;
          g.a2_rows = sp.rows;
          ops::gemm_gpu(g, {}, nullptr, kernel == 2);
          WEFT_CUDA_CHECK(cudaDeviceSynchronize());
          expect_equal(out.get(), reference(t, kn, c, ha, hb),
                       fmt::format("a2: kernel {} {} M={} rows [{},{})", kernel, kn ? "kn" : "nk", c.m, sp.row0,
                                   sp.row0 + sp.rows));
          ++checks;
        }
    std::printf("[gpu] gemm rows from a second pointer: %d exact checks passed\n", checks);
  });
}

TEST(GemmGpu, RandomDataCloseToReference) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  in_child([] {
    const Case c{640, 768, 1024};
    for (int kb : {64, 32})
      for (dev::DType t : {dev::DType::kBF16, dev::DType::kF16})
        for (bool kn : {false, true}) {
          const auto ha = fill(t, static_cast<size_t>(c.m) * c.k, 3, false);
          const auto hb = fill(t, static_cast<size_t>(c.n) * c.k, 4, false);
          DevBuf<uint16_t> a(ha.size()), b(hb.size()), out(static_cast<size_t>(c.m) * c.n);
          a.put(ha);
          b.put(hb);
          auto g = args_for(t, kn, c, a.p, b.p, out.p);
          g.k_block = kb;
          ops::gemm_gpu(g);
          WEFT_CUDA_CHECK(cudaDeviceSynchronize());
          const auto got = out.get(), want = reference(t, kn, c, ha, hb);
          double scale = 0, worst = 0;
          for (auto x : want) scale = std::max(scale, std::fabs(static_cast<double>(dec(t, x))));
          for (size_t i = 0; i < got.size(); ++i) {
            const double g = dec(t, got[i]), w = dec(t, want[i]);
            WEFT_REQUIRE(!std::isnan(g), fmt::format("NaN at {}", i));
            worst = std::max(worst, std::fabs(g - w) / std::max(std::fabs(w), 0.05 * scale));
          }
          WEFT_REQUIRE(worst < 1e-2,
                       fmt::format("{} {}: max relative error {:.3e}", dev::dtype_name(t), kn ? "kn" : "nk", worst));
          std::printf("[gpu] gemm random %s %s k%d: max relative error %.2e\n", dev::dtype_name(t), kn ? "kn" : "nk",
                      kb, worst);
        }
  });
}

// Programmatic dependent launch: a GEMM that reads the previous GEMM's output, enqueued right
// behind it (its launch and set-up may overlap the first's last tiles), reads the finished
// output -- bitwise the same result as the second GEMM run alone after a synchronisation, and
// no NaN from the poisoned buffer the first GEMM overwrites. Several rounds, a few tiles per CTA
// in the first GEMM, both kernels (pairs, single CTAs).
TEST(GemmGpu, ChainedGemmsReadTheFinishedOutput) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  in_child([] {
    const dev::DType t = dev::DType::kBF16;
    const Case c1{4096, 2048, 1024};  // 32 x 8 tiles: about two per CTA
    const Case c2{4096, 512, 2048};   // A2 = C1 (4096 x 2048)
    const auto ha = fill(t, static_cast<size_t>(c1.m) * c1.k, 41, false);
    const auto hb1 = fill(t, static_cast<size_t>(c1.n) * c1.k, 42, false);
    const auto hb2 = fill(t, static_cast<size_t>(c2.n) * c2.k, 43, false);
    DevBuf<uint16_t> a(ha.size()), b1(hb1.size()), b2(hb2.size()), c1buf(static_cast<size_t>(c1.m) * c1.n),
        out(static_cast<size_t>(c2.m) * c2.n), alone(static_cast<size_t>(c2.m) * c2.n);
    a.put(ha);
    b1.put(hb1);
    b2.put(hb2);
    cudaStream_t s;
    WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int kernel : {0, 1})
      for (int round = 0; round < 3; ++round) {
        auto g1 = args_for(t, false, c1, a.p, b1.p, c1buf.p);
        auto g2 = args_for(t, false, c2, c1buf.p, b2.p, out.p);
        use_kernel(g1, kernel);
        use_kernel(g2, kernel);
        WEFT_CUDA_CHECK(cudaMemset(c1buf.p, 0xFF, c1buf.n * 2));  // NaNs until the first GEMM writes
        WEFT_CUDA_CHECK(cudaMemset(out.p, 0, out.n * 2));
        WEFT_CUDA_CHECK(cudaDeviceSynchronize());
        ops::gemm_gpu(g1, {}, s);
        ops::gemm_gpu(g2, {}, s);  // right behind it on the same stream
        WEFT_CUDA_CHECK(cudaDeviceSynchronize());
        auto g3 = args_for(t, false, c2, c1buf.p, b2.p, alone.p);
        use_kernel(g3, kernel);
        ops::gemm_gpu(g3, {}, s);
        WEFT_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = out.get();
        for (size_t i = 0; i < got.size(); ++i)
          WEFT_REQUIRE(!std::isnan(dec(t, got[i])), fmt::format("kernel {} round {}: NaN at {}", kernel, round, i));
        expect_equal(got, alone.get(), fmt::format("kernel {} round {}: chained GEMM", kernel, round));
      }
    cudaStreamDestroy(s);
    std::printf("[gpu] chained GEMMs (programmatic dependent launch unless WEFT_PDL=0): bitwise as alone\n");
  });
}

// Tile order from a table, two destinations splitting the rows, reduce-add into a prefilled
// C, and notify counters: every hook the fused operators use, on one GPU.
TEST(GemmGpu, HooksOrderDestinationsReduceAddAndNotify) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  in_child([] {
    const dev::DType t = dev::DType::kBF16;
    const Case c{520, 600, 136};
    const int tm = kernels::gemm_tiles_m(c.m), tn = kernels::gemm_tiles_n(c.n);
    // Values in {-1, 0, 1}: |A*B| <= K = 136, so the tile's bf16 rounding is exact and a
    // reduce-add of it equals the reference's single rounding.
    const auto ha = fill(t, static_cast<size_t>(c.m) * c.k, 5, true, 1);
    const auto hb = fill(t, static_cast<size_t>(c.n) * c.k, 6, true, 1);
    DevBuf<uint16_t> a(ha.size()), b(hb.size());
    a.put(ha);
    b.put(hb);
    for (int cluster : {1, 2}) {
      // Positions: a shuffled order; with CTA pairs, shuffled pairs of tiles of one N-block
      // (odd tiles_m: one phantom M-block per N-block).
      std::mt19937 rng(7);
      std::vector<int32_t> order;
      if (cluster == 1) {
        order.resize(tm * tn);
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
      } else {
        std::vector<std::pair<int32_t, int32_t>> pairs;
        for (int nb = 0; nb < tn; ++nb) {
          std::vector<int32_t> mbs(tm + (tm % 2));
          std::iota(mbs.begin(), mbs.end(), 0);  // tm itself is the phantom when tm is odd
          std::shuffle(mbs.begin(), mbs.end(), rng);
          for (size_t i = 0; i < mbs.size(); i += 2) pairs.push_back({mbs[i] * tn + nb, mbs[i + 1] * tn + nb});
        }
        std::shuffle(pairs.begin(), pairs.end(), rng);
        for (auto [x, y] : pairs) {
          order.push_back(x);
          order.push_back(y);
        }
      }
      const int positions = kernels::gemm_positions(c.m, c.n, cluster);
      WEFT_REQUIRE(static_cast<int>(order.size()) == positions, "test: table length");
      std::vector<int32_t> notify_idx(positions), notify_rank(positions, 0);
      std::vector<int8_t> dest(positions);
      const int split_row = 256;  // destination 0: rows [0, 256), destination 1: rows [256, M)
      for (int p = 0; p < positions; ++p) {
        const int mb = order[p] / tn;
        dest[p] = static_cast<int8_t>(mb * kernels::kGemmTileM >= split_row ? 1 : 0);
        notify_idx[p] =
            mb == 1 ? -1 : std::min(mb, tm);  // the phantom's counter (index tm) must stay 0; M-block 1 counts nothing
      }
      DevBuf<int32_t> d_order(positions), d_nidx(positions), d_nrank(positions);
      DevBuf<int8_t> d_dest(positions);
      d_order.put(order);
      d_nidx.put(notify_idx);
      d_nrank.put(notify_rank);
      d_dest.put(dest);
      DevBuf<uint64_t> heap(64);
      kernels::GemmHooks h;
      h.ctx = one_gpu_ctx(heap);
      h.order = d_order.p;
      h.dest = d_dest.p;
      h.notify_idx = d_nidx.p;
      h.notify_rank = d_nrank.p;
      h.notify_off = 0;
      // Counts given at once, deferred to 2 k-blocks before the next tile's end, deferred to its
      // k-block 1 (GemmHooks::notify_flush_kb); K = 136 is 3 k-blocks.
      for (int nmode : {0, 1, 2})
        for (bool reduce : {false, true}) {
          h.notify_deferred = nmode > 0;
          h.notify_flush_kb = nmode == 2 ? 1 : 0;
          // Prefill (reduce-add adds to it): small integers.
          const auto pre0 = fill(t, static_cast<size_t>(split_row) * c.n, 8, true);
          const auto pre1 = fill(t, static_cast<size_t>(c.m - split_row) * c.n, 9, true);
          DevBuf<uint16_t> c0(pre0.size()), c1(pre1.size());
          c0.put(pre0);
          c1.put(pre1);
          WEFT_CUDA_CHECK(cudaMemset(heap.p, 0, 64 * 8));
          auto g = args_for(t, false, c, a.p, b.p, c0.p);
          g.c[1] = c1.p;
          g.num_dests = 2;
          g.c_row0[1] = split_row;
          g.c_rows[0] = split_row;
          g.out = reduce ? kernels::GemmOut::kReduceAdd : kernels::GemmOut::kStore;
          g.cluster_m = cluster;
          ops::gemm_gpu(g, h);
          WEFT_CUDA_CHECK(cudaDeviceSynchronize());
          std::vector<uint16_t> pre(pre0);
          pre.insert(pre.end(), pre1.begin(), pre1.end());
          const auto want = reference(t, false, c, ha, hb, reduce ? &pre : nullptr);
          auto got = c0.get();
          const auto got1 = c1.get();
          got.insert(got.end(), got1.begin(), got1.end());
          expect_equal(got, want, reduce ? "reduce-add into two destinations" : "store into two destinations");
          const auto counters = heap.get();
          WEFT_REQUIRE(counters[tm] == 0, "the phantom tile notified");
          for (int mb = 0; mb < tm; ++mb) {
            const uint64_t want_count = mb == 1 ? 0 : static_cast<uint64_t>(kernels::kGemmNotifyPerTile * tn);
            WEFT_REQUIRE(counters[mb] == want_count,
                         fmt::format("notify mode {}: counter of M-block {} is {}, expected {}", nmode, mb,
                                     counters[mb], want_count));
          }
        }
    }
    std::printf(
        "[gpu] gemm hooks: shuffled order, 2 destinations, store and reduce-add, notify counts exact (at once, "
        "deferred, deferred to k-block 1)\n");
  });
}

// A's rows arrive after the launch (copy engine on another stream, after a 2 ms sleep),
// each M-block's signal set only after its rows landed: the GEMM must wait for them.
// mode 0: a wait per position (tables indexed by position); mode 1: the tables indexed by
// M-block (wait_per_mblock) with the threshold's scale read from device memory (3).
TEST(GemmGpu, WaitsForRowsThatArriveAfterTheLaunch) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  for (int mode : {0, 1})
    in_child([mode] {
      const dev::DType t = dev::DType::kBF16;
      const Case c{640, 512, 256};  // 5 x 2 tiles: few CTAs, SMs stay free for the other stream
      const int tm = kernels::gemm_tiles_m(c.m), tn = kernels::gemm_tiles_n(c.n), tiles = tm * tn;
      const auto ha = fill(t, static_cast<size_t>(c.m) * c.k, 10, true);
      const auto hb = fill(t, static_cast<size_t>(c.n) * c.k, 11, true);
      DevBuf<uint16_t> a(ha.size()), b(hb.size()), out(static_cast<size_t>(c.m) * c.n), staged(ha.size());
      b.put(hb);
      staged.put(ha);
      WEFT_CUDA_CHECK(cudaMemset(a.p, 0xFF, ha.size() * 2));  // NaNs until the rows land
      const int entries = mode == 0 ? tiles : tm;
      std::vector<int32_t> widx(entries), wpeer(entries, 0), wbegin(entries + 1);
      std::vector<uint64_t> wval(entries, 1);
      for (int p = 0; p < entries; ++p)
        widx[p] = mode == 0 ? p / tn : p;          // closed-form order: M-block = p / tn (group_m 1)
      std::iota(wbegin.begin(), wbegin.end(), 0);  // one wait per position (M-block)
      const WaitTables waits(wbegin, widx, wval, wpeer);
      DevBuf<uint64_t> heap(64), d_trace(3 * tiles), d_cta(4 * 1024);
      WEFT_CUDA_CHECK(cudaMemset(d_cta.p, 0, 4 * 1024 * sizeof(uint64_t)));
      const uint64_t want = mode == 0 ? 1 : 3;  // the signal value that releases a block
      if (mode == 1)
        heap.put([tm] {
          std::vector<uint64_t> h(64, 0);
          std::fill(h.begin(), h.begin() + tm, 2);  // below 1 x 3: a kernel ignoring the scale reads NaNs
          h[62] = 3;
          return h;
        }());
      kernels::GemmHooks h;
      h.ctx = one_gpu_ctx(heap);
      waits.set(h);
      h.trace = d_trace.p;
      h.trace_cta = d_cta.p;
      h.wait_off = 0;
      h.wait_per_mblock = mode == 1;
      if (mode == 1) h.wait_scale_dev = heap.p + 62;
      cudaStream_t s1, s2;
      WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
      WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
      auto g = args_for(t, false, c, a.p, b.p, out.p);
      g.group_m = 1;
      g.cluster_m = 1;
      // Load the other stream's kernels before the GEMM spins: with lazy module loading, a
      // first launch while a kernel waits on it would wait for that kernel (a deadlock).
      WEFT_CUDA_CHECK(kernels::device_sleep(0, s2));
      WEFT_CUDA_CHECK(set_signals(heap.p + 63, 1, 0, s2));
      WEFT_CUDA_CHECK(cudaDeviceSynchronize());
      ops::gemm_gpu(g, h, s1);
      WEFT_CUDA_CHECK(kernels::device_sleep(2'000'000, s2));
      const size_t block_bytes = static_cast<size_t>(kernels::kGemmTileM) * c.k * 2;
      for (int mb = tm - 1; mb >= 0; --mb) {  // last block first: out of order on purpose
        const size_t off = mb * block_bytes, bytes = std::min(block_bytes, ha.size() * 2 - off);
        WEFT_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<char*>(a.p) + off, reinterpret_cast<char*>(staged.p) + off,
                                        bytes, cudaMemcpyDeviceToDevice, s2));
        WEFT_CUDA_CHECK(set_signals(heap.p + mb, 1, want, s2));
      }
      WEFT_CUDA_CHECK(cudaDeviceSynchronize());
      expect_equal(out.get(), reference(t, false, c, ha, hb), "GEMM waiting for late rows");
      // Every tile was traced, and none started before its rows could have landed (2 ms).
      const auto tr = d_trace.get();
      uint64_t t_min = ~0ull, t_max = 0;
      for (int p = 0; p < tiles; ++p) {
        WEFT_REQUIRE(tr[3 * p] > 0 && tr[3 * p + 1] >= tr[3 * p], fmt::format("trace of position {} missing", p));
        t_min = std::min(t_min, tr[3 * p]);
        t_max = std::max(t_max, tr[3 * p + 1]);
      }
      std::printf("[gpu] gemm waits: traced tiles span %.1f us\n", (t_max - t_min) / 1e3);
      // Per-CTA stamps (sm_90a kernel): every launched CTA stamped entry <= barrier set-up <=
      // first TMA issued (after the waits: the rows landed >= 1 ms later) <= first stage arrived.
      if (kernels::gemm_sm90_available()) {
        int ctas = 0, cluster = 0;
        kernels::gemm_last_launch(&ctas, &cluster);
        const auto tc = d_cta.get();
        for (int i = 0; i < 1024; ++i) {
          const uint64_t* x = &tc[4 * static_cast<size_t>(i)];
          if (i >= ctas) {
            WEFT_REQUIRE(x[0] == 0, fmt::format("CTA stamps past the grid ({} CTAs): {}", ctas, i));
            continue;
          }
          WEFT_REQUIRE(x[0] > 0 && x[0] <= x[1] && x[1] <= x[2] && x[2] <= x[3],
                       fmt::format("CTA {} stamps out of order: {} {} {} {}", i, x[0], x[1], x[2], x[3]));
          WEFT_REQUIRE(x[2] - x[0] >= 1'000'000, fmt::format("CTA {} issued its first load {} ns after entry: before "
                                                             "its rows landed",
                                                             i, x[2] - x[0]));
        }
      }
      cudaStreamDestroy(s1);
      cudaStreamDestroy(s2);
      std::printf("[gpu] gemm waits (%s): rows landing 2 ms after launch, out of order: exact\n",
                  mode == 0 ? "per position" : "per M-block, device scale");
    });
}

// The gemm_rs fold's pattern: sources that land after the launch, guarded by waits at the
// epilogue (GemmHooks::wait_at_epilogue: A and B are ready, the main loop runs first), on
// rows [128, 640) only (GemmArgs::src_row0): the source is NaN until each M-block's rows are
// copied in (2 ms after the launch, last block first) and its signal set. Rows 0..127 take no
// source (reading it would give NaN). Every kernel (pairs, single CTAs, portable, K 32).
TEST(GemmGpu, SourcesThatArriveAfterTheLaunchAreWaitedForAtTheEpilogue) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  for (int kernel : {0, 1, 2, 3})
    in_child([kernel] {
      const dev::DType t = dev::DType::kBF16;
      const Case c{640, 512, 512};  // 5 x 2 tiles, 8 k-blocks: the waits come after k-block 4
      const int tm = kernels::gemm_tiles_m(c.m);
      const int src_row0 = 128, src_rows = c.m - src_row0;
      const auto ha = fill(t, static_cast<size_t>(c.m) * c.k, 31, true);
      const auto hb = fill(t, static_cast<size_t>(c.n) * c.k, 32, true);
      const auto hs = fill(t, static_cast<size_t>(src_rows) * c.n, 33, true, 50);
      DevBuf<uint16_t> a(ha.size()), b(hb.size()), out(static_cast<size_t>(c.m) * c.n), src(hs.size()),
          staged(hs.size());
      a.put(ha);
      b.put(hb);
      staged.put(hs);
      WEFT_CUDA_CHECK(cudaMemset(src.p, 0xFF, hs.size() * 2));  // NaNs until the rows land
      // Waits per M-block: block 0 none, block mb >= 1 its signal mb.
      std::vector<int32_t> widx, wpeer, wbegin{0, 0};
      std::vector<uint64_t> wval;
      for (int mb = 1; mb < tm; ++mb) {
        widx.push_back(mb);
        wpeer.push_back(0);
        wval.push_back(1);
        wbegin.push_back(static_cast<int32_t>(widx.size()));
      }
      const WaitTables waits(wbegin, widx, wval, wpeer);
      DevBuf<uint64_t> heap(64);  // zeroed
      kernels::GemmHooks h;
      h.ctx = one_gpu_ctx(heap);
      waits.set(h);
      h.wait_per_mblock = true;
      h.wait_at_epilogue = true;
      cudaStream_t s1, s2;
      WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
      WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
      auto g = args_for(t, false, c, a.p, b.p, out.p);
      use_kernel(g, kernel);
      g.src[0] = src.p;
      g.num_src = 1;
      g.ld_src = c.n;
      g.src_row0 = src_row0;
      g.src_rows = src_rows;
      WEFT_CUDA_CHECK(kernels::device_sleep(0, s2));  // loaded before the GEMM spins (see above)
      WEFT_CUDA_CHECK(set_signals(heap.p + 63, 1, 0, s2));
      WEFT_CUDA_CHECK(cudaDeviceSynchronize());
      ops::gemm_gpu(g, h, s1, kernel == 2);
      WEFT_CUDA_CHECK(kernels::device_sleep(2'000'000, s2));
      const size_t block_bytes = static_cast<size_t>(kernels::kGemmTileM) * c.n * 2;
      for (int mb = tm - 1; mb >= 1; --mb) {  // last block first
        const size_t off = (mb - 1) * block_bytes;
        WEFT_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<char*>(src.p) + off, reinterpret_cast<char*>(staged.p) + off,
                                        block_bytes, cudaMemcpyDeviceToDevice, s2));
        WEFT_CUDA_CHECK(set_signals(heap.p + mb, 1, 1, s2));
      }
      WEFT_CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<uint16_t> pre(static_cast<size_t>(c.m) * c.n, enc(t, 0.f));
      std::copy(hs.begin(), hs.end(), pre.begin() + static_cast<size_t>(src_row0) * c.n);
      expect_equal(out.get(), reference(t, false, c, ha, hb, &pre),
                   fmt::format("sources landing late, waits at the epilogue, kernel {}", kernel));
      cudaStreamDestroy(s1);
      cudaStreamDestroy(s2);
      std::printf("[gpu] gemm sources after the launch, waits at the epilogue, kernel %d: exact\n", kernel);
    });
}

// Grouped GEMM (GemmArgs::group_of): each group's rows in whole M-blocks multiply by that
// group's W_g (stacked [groups * N, K]); N not a multiple of the tile (a tile's B rows run into
// the next group's, its columns past N are never stored), empty groups, a group of one row, of
// exactly one block and of one block and a row, and M-blocks marked -1 (loaded, computed and
// stored nothing: C keeps its sentinel), for every kernel (CTA pairs: pairs within a group,
// pairs across two groups, a skipped block beside a running one, the phantom of an odd count).
// Exact against the CPU reference per group.
TEST(GemmGpu, GroupedRowsMultiplyTheirGroupsMatrix) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  in_child([] {
    const std::vector<int> counts = {0, 1, 127, 128, 129, 300, 0, 5};
    const int G = static_cast<int>(counts.size()), n = 264, k = 136;
    std::vector<int> start(G);  // each group's first row (a multiple of 128)
    std::vector<int32_t> group_of;
    for (int g = 0; g < G; ++g) {
      start[g] = static_cast<int>(group_of.size()) * kernels::kGemmTileM;
      for (int b = 0; b < (counts[g] + kernels::kGemmTileM - 1) / kernels::kGemmTileM; ++b) group_of.push_back(g);
    }
    group_of.push_back(-1);  // capacity past the last group: skipped
    group_of.push_back(-1);
    const int m = static_cast<int>(group_of.size()) * kernels::kGemmTileM;
    int checks = 0;
    for (dev::DType t : {dev::DType::kBF16, dev::DType::kF16}) {
      const auto ha = fill(t, static_cast<size_t>(m) * k, 3, true);
      const auto hb = fill(t, static_cast<size_t>(G) * n * k, 4, true);
      const uint16_t sentinel = 0x7777;
      DevBuf<uint16_t> a(ha.size()), b(hb.size()), out(static_cast<size_t>(m) * n);
      DevBuf<int32_t> groups(group_of.size());
      a.put(ha);
      b.put(hb);
      groups.put(group_of);
      for (int kernel : {0, 1, 2, 3}) {  // CTA pairs: pairs of one group (multicast) and of two
        out.put(std::vector<uint16_t>(out.n, sentinel));
        auto g = args_for(t, false, Case{m, n, k}, a.p, b.p, out.p);
        use_kernel(g, kernel);
        g.group_of = groups.p;
        g.groups = G;
        ops::gemm_gpu(g, {}, nullptr, kernel == 2);
        WEFT_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = out.get();
        for (int grp = 0; grp < G; ++grp) {
          if (counts[grp] == 0) continue;
          const Case c{counts[grp], n, k};
          const std::vector<uint16_t> ag(ha.begin() + static_cast<size_t>(start[grp]) * k,
                                         ha.begin() + static_cast<size_t>(start[grp] + counts[grp]) * k);
          const std::vector<uint16_t> bg(hb.begin() + static_cast<size_t>(grp) * n * k,
                                         hb.begin() + static_cast<size_t>(grp + 1) * n * k);
          const std::vector<uint16_t> want = reference(t, false, c, ag, bg);
          const std::vector<uint16_t> have(got.begin() + static_cast<size_t>(start[grp]) * n,
                                           got.begin() + static_cast<size_t>(start[grp] + counts[grp]) * n);
          expect_equal(
              have, want,
              fmt::format("grouped kernel {} {} group {} ({} rows)", kernel, dev::dtype_name(t), grp, counts[grp]));
          ++checks;
        }
        for (size_t i = static_cast<size_t>(m - 2 * kernels::kGemmTileM) * n; i < got.size(); ++i)
          WEFT_REQUIRE(got[i] == sentinel,
                       fmt::format("grouped kernel {}: skipped M-block element {} written", kernel, i));
      }
    }
    // B[K,N] is refused with the reason.
    DevBuf<uint16_t> a(1024), b(1024), c(1024);
    DevBuf<int32_t> groups(1);
    auto g = args_for(dev::DType::kBF16, true, Case{16, 16, 16}, a.p, b.p, c.p);
    g.group_of = groups.p;
    g.groups = 1;
    bool refused = false;
    try {
      ops::gemm_gpu(g);
    } catch (const InvalidArgument& e) {
      refused = std::string(e.what()).find("kNK") != std::string::npos;
    }
    WEFT_REQUIRE(refused, "a grouped GEMM with B[K,N] was not refused");
    std::printf("[gpu] grouped gemm: %d exact group checks passed\n", checks);
  });
}

// SwiGLU in the epilogue (GemmArgs::swiglu), grouped: C = silu(A W_g^T) * (A W_u^T) from B's
// 2n rows a group, bitwise equal to the unfused path -- the same kernel's plain grouped GEMM
// into h [m, 2n], then kernels::moe_swiglu -- for every kernel, n not a multiple of the tile.
TEST(GemmGpu, SwigluEpilogueEqualsTheUnfusedPath) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  in_child([] {
    const std::vector<int> counts = {0, 1, 127, 128, 129, 300, 5};
    const int G = static_cast<int>(counts.size()), n = 136, k = 136;
    std::vector<int32_t> group_of;
    for (int g = 0; g < G; ++g)
      for (int b = 0; b < (counts[g] + kernels::kGemmTileM - 1) / kernels::kGemmTileM; ++b) group_of.push_back(g);
    group_of.push_back(-1);
    const int m = static_cast<int>(group_of.size()) * kernels::kGemmTileM;
    const dev::DType t = dev::DType::kBF16;
    std::vector<uint16_t> ha = fill(t, static_cast<size_t>(m) * k, 5, false), hb(static_cast<size_t>(G) * 2 * n * k);
    {
      const auto r = fill(t, hb.size(), 6, false);
      for (size_t i = 0; i < hb.size(); ++i) hb[i] = enc(t, dec(t, r[i]) / 4.f);  // moderate products
    }
    DevBuf<uint16_t> a(ha.size()), b(hb.size()), h(static_cast<size_t>(m) * 2 * n), want(static_cast<size_t>(m) * n),
        got(static_cast<size_t>(m) * n);
    DevBuf<int32_t> groups(group_of.size());
    a.put(ha);
    b.put(hb);
    groups.put(group_of);
    int checks = 0;
    for (int kernel : {0, 1, 2, 3}) {
      auto plain = args_for(t, false, Case{m, 2 * n, k}, a.p, b.p, h.p);
      use_kernel(plain, kernel);
      plain.group_of = groups.p;
      plain.groups = G;
      ops::gemm_gpu(plain, {}, nullptr, kernel == 2);
      WEFT_CUDA_CHECK(kernels::moe_swiglu(h.p, want.p, groups.p, static_cast<int>(group_of.size()), n, t, nullptr));
      auto fused = args_for(t, false, Case{m, n, k}, a.p, b.p, got.p);
      use_kernel(fused, kernel);
      fused.group_of = groups.p;
      fused.groups = G;
      fused.swiglu = true;
      ops::gemm_gpu(fused, {}, nullptr, kernel == 2);
      WEFT_CUDA_CHECK(cudaDeviceSynchronize());
      const auto w = want.get(), o = got.get();
      int row = 0;
      for (int g = 0; g < G; ++g) {
        for (int r = row; r < row + counts[g]; ++r)
          for (int c = 0; c < n; ++c) {
            const size_t i = static_cast<size_t>(r) * n + c;
            WEFT_REQUIRE(o[i] == w[i], fmt::format("swiglu kernel {} group {} row {} col {}: {:#06x}, unfused {:#06x}",
                                                   kernel, g, r - row, c, o[i], w[i]));
          }
        row += (counts[g] + kernels::kGemmTileM - 1) / kernels::kGemmTileM * kernels::kGemmTileM;
        ++checks;
      }
    }
    std::printf("[gpu] swiglu epilogue: %d group checks equal to the unfused path\n", checks);
  });
}

// Rows scattered (GemmArgs::row_dst), grouped: each row of C at its own address -- here a
// permutation of the rows into another buffer, every third row nowhere -- bitwise equal to the
// same GEMM stored whole, for every kernel, n not a multiple of the tile; the rows sent nowhere
// and the skipped M-blocks leave the destination untouched.
TEST(GemmGpu, RowDestinationsScatterTheRows) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  in_child([] {
    const std::vector<int> counts = {1, 129, 0, 300, 5};
    const int G = static_cast<int>(counts.size()), n = 264, k = 136;
    std::vector<int32_t> group_of;
    for (int g = 0; g < G; ++g)
      for (int b = 0; b < (counts[g] + kernels::kGemmTileM - 1) / kernels::kGemmTileM; ++b) group_of.push_back(g);
    group_of.push_back(-1);
    const int m = static_cast<int>(group_of.size()) * kernels::kGemmTileM;
    const dev::DType t = dev::DType::kBF16;
    const auto ha = fill(t, static_cast<size_t>(m) * k, 7, true);
    const auto hb = fill(t, static_cast<size_t>(G) * n * k, 8, true);
    const uint16_t sentinel = 0x7777;
    DevBuf<uint16_t> a(ha.size()), b(hb.size()), whole(static_cast<size_t>(m) * n), out(static_cast<size_t>(m) * n);
    DevBuf<int32_t> groups(group_of.size());
    DevBuf<uint64_t> dst(static_cast<size_t>(m));
    a.put(ha);
    b.put(hb);
    groups.put(group_of);
    std::vector<int> to(static_cast<size_t>(m));  // row r's row in out, -1: nowhere
    std::vector<uint64_t> hd(static_cast<size_t>(m), 0);
    for (int r = 0; r < m; ++r) {
      to[r] = r % 3 == 2 ? -1 : (r * 37 + 11) % m;  // 37 is prime to m (a multiple of 128): a permutation
      if (to[r] >= 0) hd[r] = reinterpret_cast<uint64_t>(out.p + static_cast<size_t>(to[r]) * n);
    }
    dst.put(hd);
    int checks = 0;
    for (int kernel : {0, 1, 2, 3}) {
      auto plain = args_for(t, false, Case{m, n, k}, a.p, b.p, whole.p);
      use_kernel(plain, kernel);
      plain.group_of = groups.p;
      plain.groups = G;
      ops::gemm_gpu(plain, {}, nullptr, kernel == 2);
      out.put(std::vector<uint16_t>(out.n, sentinel));
      auto scattered = plain;
      scattered.c[0] = nullptr;
      scattered.ldc = 0;
      scattered.row_dst = dst.p;
      ops::gemm_gpu(scattered, {}, nullptr, kernel == 2);
      WEFT_CUDA_CHECK(cudaDeviceSynchronize());
      const auto w = whole.get(), o = out.get();
      std::vector<char> written(static_cast<size_t>(m), 0);
      for (int r = 0; r < m; ++r) {
        const int32_t grp = group_of[static_cast<size_t>(r / kernels::kGemmTileM)];
        if (to[r] < 0 || grp < 0) continue;
        written[static_cast<size_t>(to[r])] = 1;
        for (int c = 0; c < n; ++c) {
          const uint16_t have = o[static_cast<size_t>(to[r]) * n + c], want = w[static_cast<size_t>(r) * n + c];
          WEFT_REQUIRE(have == want, fmt::format("row_dst kernel {} row {} col {}: {:#06x}, stored whole {:#06x}",
                                                 kernel, r, c, have, want));
        }
        ++checks;
      }
      for (int r = 0; r < m; ++r)
        if (!written[static_cast<size_t>(r)])
          for (int c = 0; c < n; ++c)
            WEFT_REQUIRE(
                o[static_cast<size_t>(r) * n + c] == sentinel,
                fmt::format("row_dst kernel {}: row {} of the destination written, no row goes there", kernel, r));
    }
    // With sources it is refused with the reason.
    auto g = args_for(t, false, Case{m, n, k}, a.p, b.p, whole.p);
    g.row_dst = dst.p;
    g.src[0] = whole.p;
    g.num_src = 1;
    g.ld_src = n;
    bool refused = false;
    try {
      ops::gemm_gpu(g);
    } catch (const InvalidArgument& e) {
      refused = std::string(e.what()).find("row_dst") != std::string::npos;
    }
    WEFT_REQUIRE(refused, "row_dst with sources was not refused");
    std::printf("[gpu] row_dst: %d rows equal to the GEMM stored whole\n", checks);
  });
}

TEST(GemmGpu, BadArgumentsAreRefusedWithTheReason) {
  if (gpus() < 1) GTEST_SKIP() << "needs a GPU";
  in_child([] {
    DevBuf<uint16_t> a(1024), b(1024), c(1024);
    auto base = args_for(dev::DType::kBF16, false, Case{16, 16, 16}, a.p, b.p, c.p);
    auto expect_refused = [&](kernels::GemmArgs g, const std::string& needle) {
      try {
        ops::gemm_gpu(g);
      } catch (const InvalidArgument& e) {
        WEFT_REQUIRE(std::string(e.what()).find(needle) != std::string::npos,
                     fmt::format("message '{}' lacks '{}'", e.what(), needle));
        return;
      }
      throw Error("not refused: " + needle);
    };
    auto g = base;
    g.k = 12;
    g.lda = 16;
    g.ldb = 16;
    expect_refused(g, "multiple of 8");
    g = base;
    g.a = nullptr;
    expect_refused(g, "non-null");
    g = base;
    g.ldc = 8;
    expect_refused(g, "leading dimension");
    g = base;
    g.num_dests = 9;
    expect_refused(g, "num_dests");
    g = base;
    g.num_src = 8;
    expect_refused(g, "num_src");
    g = base;
    g.a2 = a.p;
    g.a2_row0 = 8;
    g.a2_rows = 8;
    expect_refused(g, "128-row block");
    g = base;
    g.a2_rows = 32;
    expect_refused(g, "outside A");
    g = base;
    g.src[0] = c.p;
    g.num_src = 1;
    g.ld_src = 16;
    g.src_row0 = 8;
    expect_refused(g, "sources' rows must start");
    g.src_row0 = 0;
    g.src_rows = 32;
    expect_refused(g, "sources' rows are outside");
  });
}
