// The MoE layer (include/weft/ops/moe.hpp, MoeLayer; docs/moe.md "Layer"): the token exchange
// (MoeDispatchCombine), each local expert's FFN between dispatch and combine, by method.
// Host backend: the experts as CPU GEMMs on recv's layout, chunk by chunk. GPUs: decomposed and
// fused -- dispatch straight into each expert's 128-row blocks, weft's grouped GEMMs on them in
// place (SiLU * up in the first's epilogue); fused's down projection stores each row at its
// token's rank (combine_delivered). baseline -- the rank-major rows regrouped into blocks
// (kernels::moe_expert_layout / moe_permute), a cuBLAS call per expert (the counts read by the
// host), SiLU * up, back to recv's layout.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "../common/op_base.hpp"
#include "../common/rows.hpp"
#include "weft/core/error.hpp"
#include "weft/device/dtype.hpp"
#include "weft/kernels/moe_kernels.hpp"
#include "weft/ops/gemm.hpp"
#include "weft/ops/moe.hpp"

#ifdef WEFT_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "weft/core/cuda_check.hpp"
#include "weft/kernels/gemm.hpp"
#endif

namespace weft::ops {

namespace {

void validate_layer(const MoeLayerConfig& c, bool gpu) {
  WEFT_REQUIRE(c.ffn >= 8 && c.ffn % 8 == 0,
               fmt::format("moe_layer: ffn must be a positive multiple of 8, got {}", c.ffn));
  WEFT_REQUIRE(!gpu || c.moe.dtype == dev::DType::kBF16 || c.moe.dtype == dev::DType::kF16,
               fmt::format("moe_layer: the GPU GEMMs take bf16 or f16, not {}", dev::dtype_name(c.moe.dtype)));
}

// SiLU(g) * u in fp32, the same expression on the host as in kernels::moe_swiglu.
inline float silu_mul(float g, float u) { return g / (1.f + std::exp(-g)) * u; }

}  // namespace

struct MoeLayer::Impl {
  Impl(Backend& backend, const MoeLayerConfig& c) : b(backend), cfg(c), op(backend, "moe_layer"), ex(backend, c.moe) {}
  Backend& b;
  MoeLayerConfig cfg;
  detail::OpBase op;
  MoeDispatchCombine ex;  // rank-major (baseline; the host backend's both methods)
  // GPUs, decomposed: the exchange in expert blocks (MoeConfig::expert_blocks): the grouped GEMM
  // reads dispatch's rows in place and combine takes the down projection's output as it is.
  std::unique_ptr<MoeDispatchCombine> blocks;
  bool gpu = false;
  int64_t local = 0, capacity = 0, tiles = 0;
  size_t eb = 2;
  std::vector<std::string> agreed;
  // Host backend: the experts' outputs in recv's layout, and the FFN's scratch.
  std::vector<unsigned char> h_out;
#ifdef WEFT_HAVE_CUDA
  // GPUs, in one allocation: the experts' layout (group_of, seg), the expert-major rows (xs),
  // the first GEMM's output (h), SiLU * up (act), the second GEMM's output (o), the outputs in
  // recv's layout (eo).
  void* mem = nullptr;
  int32_t* group_of = nullptr;
  int64_t* seg = nullptr;
  unsigned char *xs = nullptr, *h = nullptr, *act = nullptr, *o = nullptr, *eo = nullptr;
  cublasHandle_t blas = nullptr;
  ~Impl() {
    if (blas) cublasDestroy(blas);
    if (mem) cudaFree(mem);
  }
#endif
  MoeLayerMethod resolve(MoeLayerMethod m) const {
    // fused measured faster than decomposed on every shape and token count, 2 and 4 H100s
    // (docs/moe.md, "Fused"); the host backend computes every method alike.
    return m == MoeLayerMethod::kAuto ? (gpu ? MoeLayerMethod::kFused : MoeLayerMethod::kDecomposed) : m;
  }
  MoeMethod exchange_method(MoeLayerMethod m) const {
    return m == MoeLayerMethod::kBaseline ? MoeMethod::kBaseline : MoeMethod::kDirect;
  }
};

MoeLayer::MoeLayer(Backend& backend, const MoeLayerConfig& config) {
  validate_layer(config, backend.kind() != BackendKind::kHost);
  impl_ = std::make_unique<Impl>(backend, config);
  Impl& I = *impl_;
  I.op.agree("the ffn", std::to_string(config.ffn));
  I.gpu = backend.kind() != BackendKind::kHost;
  I.local = I.ex.local_experts();
  I.capacity = I.ex.recv_capacity();
  I.eb = dev::dtype_size(config.moe.dtype);
  // Whole 128-row blocks per expert: at most capacity + local * 127 rows.
  const int64_t padded = I.capacity + I.local * (kernels::kMoeBlockRows - 1);
  I.tiles = (padded + kernels::kMoeBlockRows - 1) / kernels::kMoeBlockRows;
  if (I.gpu) {  // as many rows as the rank-major exchange's, with room for the blocks' padding
    MoeConfig bc = config.moe;
    bc.expert_blocks = true;
    bc.recv_capacity = I.tiles * kernels::kMoeBlockRows;  // recv_groups(): I.tiles blocks
    I.blocks = std::make_unique<MoeDispatchCombine>(backend, bc);
  }
  if (!I.gpu) {
    I.h_out.assign(static_cast<size_t>(std::max<int64_t>(1, I.capacity) * config.moe.hidden) * I.eb, 0);
    return;
  }
#ifdef WEFT_HAVE_CUDA
  const uint64_t H = static_cast<uint64_t>(config.moe.hidden), F = static_cast<uint64_t>(config.ffn);
  const uint64_t rows = static_cast<uint64_t>(std::max<int64_t>(1, I.tiles)) * kernels::kMoeBlockRows;
  auto up = [](uint64_t n) { return (n + 255) / 256 * 256; };
  const uint64_t sizes[] = {up(static_cast<uint64_t>(std::max<int64_t>(1, I.tiles)) * 4),
                            up(static_cast<uint64_t>(config.moe.experts) * 16),
                            up(rows * H * I.eb),
                            up(rows * 2 * F * I.eb),
                            up(rows * F * I.eb),
                            up(rows * H * I.eb),
                            up(static_cast<uint64_t>(std::max<int64_t>(1, I.capacity)) * H * I.eb)};
  uint64_t total = 0;
  for (uint64_t s : sizes) total += s;
  WEFT_CUDA_CHECK(cudaMalloc(&I.mem, total));
  WEFT_CUDA_CHECK(cudaMemset(I.mem, 0, total));
  unsigned char* at = static_cast<unsigned char*>(I.mem);
  unsigned char* parts[7];
  for (int i = 0; i < 7; ++i) {
    parts[i] = at;
    at += sizes[i];
  }
  I.group_of = reinterpret_cast<int32_t*>(parts[0]);
  I.seg = reinterpret_cast<int64_t*>(parts[1]);
  I.xs = parts[2];
  I.h = parts[3];
  I.act = parts[4];
  I.o = parts[5];
  I.eo = parts[6];
  WEFT_CUDA_CHECK(kernels::gemm_preload());
  WEFT_CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

MoeLayer::~MoeLayer() = default;
const MoeLayerConfig& MoeLayer::config() const { return impl_->cfg; }
MoeDispatchCombine& MoeLayer::exchange() { return impl_->ex; }

#ifdef WEFT_HAVE_CUDA
namespace {

kernels::GemmArgs grouped(const MoeLayer::Impl& I, const int32_t* group_of, const void* a, const void* w, void* c,
                          int64_t n, int64_t k) {
  kernels::GemmArgs g;
  g.m = static_cast<int>(I.tiles * kernels::kMoeBlockRows);
  g.n = static_cast<int>(n);
  g.k = static_cast<int>(k);
  g.type = I.cfg.moe.dtype == dev::DType::kBF16 ? kernels::GemmType::kBF16 : kernels::GemmType::kF16;
  g.a = a;
  g.lda = k;
  g.b = w;
  g.ldb = k;
  g.c[0] = c;
  g.ldc = n;
  g.group_of = group_of;
  g.groups = static_cast<int>(I.local);
  return g;
}

// Baseline's GEMM of local expert l: C rows [r0, r0 + rows) = A rows x W_l^T (cuBLAS, fp32 accumulation).
void cublas_expert(MoeLayer::Impl& I, const unsigned char* a, const unsigned char* w, unsigned char* c, int64_t r0,
                   int64_t rows, int64_t n, int64_t k, int64_t l, cudaStream_t s) {
  if (!I.blas) WEFT_CUBLAS_CHECK(cublasCreate(&I.blas));
  WEFT_CUBLAS_CHECK(cublasSetStream(I.blas, s));
  const cudaDataType_t t = I.cfg.moe.dtype == dev::DType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
  const float alpha = 1.f, beta = 0.f;
  WEFT_CUBLAS_CHECK(cublasGemmEx(I.blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(rows),
                                 static_cast<int>(k), &alpha, w + static_cast<size_t>(l * n * k) * I.eb, t,
                                 static_cast<int>(k), a + static_cast<size_t>(r0 * k) * I.eb, t, static_cast<int>(k),
                                 &beta, c + static_cast<size_t>(r0 * n) * I.eb, t, static_cast<int>(n),
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// decomposed: the grouped GEMMs on the blocks exchange's recv in place (its blocks' experts read
// on the device), SiLU * up in the gate/up GEMM's epilogue; the down projection's output, in the
// same blocks, is what its combine takes.
// fused: the down projection's rows go from its epilogue straight to their places in their
// tokens' ranks' return buffers (recv_destinations(): padding rows nowhere).
void gpu_decomposed_experts(MoeLayer::Impl& I, const void* w_up, const void* w_down, bool fused, cudaStream_t s) {
  const int64_t H = I.cfg.moe.hidden, F = I.cfg.ffn;
  const int32_t* groups = I.blocks->recv_groups();
  kernels::GemmArgs up = grouped(I, groups, I.blocks->recv(), w_up, I.act, F, H);
  up.swiglu = true;  // silu(gate) * up in the epilogue: no h, no pass over it
  gemm_gpu(up, {}, s);
  kernels::GemmArgs down = grouped(I, groups, I.act, w_down, I.o, H, F);
  if (fused) {
    down.c[0] = nullptr;
    down.row_dst = I.blocks->recv_destinations();
  }
  gemm_gpu(down, {}, s);
}

// baseline: the rank-major rows regrouped expert-major (the PyTorch path's permute), a cuBLAS
// GEMM per expert with the counts read by the host, back to recv's layout.
void gpu_baseline_experts(MoeLayer::Impl& I, const void* w_up, const void* w_down, cudaStream_t s) {
  const int64_t H = I.cfg.moe.hidden, F = I.cfg.ffn, W = I.b.size(), L = I.local;
  const int64_t* chunks = I.ex.recv_counts();
  kernels::MoeLayoutArgs la;
  la.chunks = chunks;
  la.world = static_cast<int>(W);
  la.local = static_cast<int>(L);
  la.tiles = static_cast<int>(I.tiles);
  la.group_of = I.group_of;
  la.seg = I.seg;
  WEFT_CUDA_CHECK(kernels::moe_expert_layout(la, s));
  const size_t row = static_cast<size_t>(H) * I.eb;
  WEFT_CUDA_CHECK(
      kernels::moe_permute(I.ex.recv(), I.xs, I.seg, chunks, static_cast<int>(W * L), I.capacity, row, true, s));
  {
    // The counts by the host (the baseline's exchange read them already), a cuBLAS call per expert.
    std::vector<int64_t> c(static_cast<size_t>(W * L));
    WEFT_CUDA_CHECK(cudaMemcpyAsync(c.data(), chunks, c.size() * 8, cudaMemcpyDeviceToHost, s));
    WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
    int64_t r0 = 0;
    std::vector<std::pair<int64_t, int64_t>> blocks;  // (first row, rows) of each expert
    for (int64_t l = 0; l < L; ++l) {
      int64_t rows = 0;
      for (int64_t q = 0; q < W; ++q) rows += c[static_cast<size_t>(q * L + l)];
      blocks.emplace_back(r0, rows);
      r0 += (rows + kernels::kMoeBlockRows - 1) / kernels::kMoeBlockRows * kernels::kMoeBlockRows;
    }
    const auto* wu = static_cast<const unsigned char*>(w_up);
    const auto* wd = static_cast<const unsigned char*>(w_down);
    for (int64_t l = 0; l < L; ++l)
      if (blocks[l].second > 0) cublas_expert(I, I.xs, wu, I.h, blocks[l].first, blocks[l].second, 2 * F, H, l, s);
    WEFT_CUDA_CHECK(kernels::moe_swiglu(I.h, I.act, I.group_of, static_cast<int>(I.tiles), static_cast<int>(F),
                                        I.cfg.moe.dtype, s));
    for (int64_t l = 0; l < L; ++l)
      if (blocks[l].second > 0) cublas_expert(I, I.act, wd, I.o, blocks[l].first, blocks[l].second, H, F, l, s);
  }
  WEFT_CUDA_CHECK(kernels::moe_permute(I.o, I.eo, I.seg, chunks, static_cast<int>(W * L), I.capacity, row, false, s));
}

}  // namespace
#endif

void MoeLayer::forward(const void* x, const int32_t* ids, const float* weights, const void* w_up, const void* w_down,
                       void* y, const MoeLayerRunOptions& opt) {
  Impl& I = *impl_;
  I.op.guarded([&] {
    const MoeLayerMethod m = I.resolve(opt.method);
    // The weights' checks, agreed across ranks on the host backend (a rank that threw alone
    // would leave the others in the exchange); on GPUs each rank's own (as dispatch's).
    std::string bad;
    std::exception_ptr error;
    try {
      I.op.check_ptr(w_up, 16, "w_up");
      I.op.check_ptr(w_down, 16, "w_down");
    } catch (const InvalidArgument& e) {
      bad = e.message();
      error = std::current_exception();
    }
    if (!I.gpu) I.op.agree("whether the layer's weights are valid", bad.empty() ? std::string("valid") : bad);
    if (error) std::rethrow_exception(error);
    const std::string what = fmt::format("forward {}", to_string(m));
    if (std::find(I.agreed.begin(), I.agreed.end(), what) == I.agreed.end()) {
      I.op.agree("the layer's method", what);
      I.agreed.push_back(what);
    }
    const MoeRunOptions eo{.method = I.exchange_method(m), .tokens = opt.tokens, .stream = opt.stream};
#ifdef WEFT_HAVE_CUDA
    if (I.gpu) {
      const cudaStream_t s = static_cast<cudaStream_t>(opt.stream);
      if (m == MoeLayerMethod::kDecomposed || m == MoeLayerMethod::kFused) {
        const bool fused = m == MoeLayerMethod::kFused;
        I.blocks->dispatch(x, ids, eo);
        gpu_decomposed_experts(I, w_up, w_down, fused, s);
        if (fused)
          I.blocks->combine_delivered(weights, y, eo);
        else
          I.blocks->combine(I.o, weights, y, eo);
      } else {
        I.ex.dispatch(x, ids, eo);
        gpu_baseline_experts(I, w_up, w_down, s);
        I.ex.combine(I.eo, weights, y, eo);
      }
      return;
    }
#endif
    I.ex.dispatch(x, ids, eo);
    // Host: each chunk's rows (source s, local expert l) through expert l's FFN, in place in
    // recv's layout.
    const int64_t H = I.cfg.moe.hidden, F = I.cfg.ffn, W = I.b.size(), L = I.local;
    const dev::DType t = I.cfg.moe.dtype;
    const int64_t* chunks = I.ex.recv_counts();
    const auto* recv = static_cast<const unsigned char*>(I.ex.recv());
    const auto* wu = static_cast<const unsigned char*>(w_up);
    const auto* wd = static_cast<const unsigned char*>(w_down);
    int64_t r0 = 0;
    std::vector<unsigned char> h, act;
    for (int64_t q = 0; q < W; ++q)
      for (int64_t l = 0; l < L; ++l) {
        const int64_t rows = chunks[q * L + l];
        if (rows == 0) continue;
        h.assign(static_cast<size_t>(rows * 2 * F) * I.eb, 0);
        act.assign(static_cast<size_t>(rows * F) * I.eb, 0);
        gemm_cpu(CpuGemm{t, t, false, recv + static_cast<size_t>(r0 * H) * I.eb, H,
                         wu + static_cast<size_t>(l * 2 * F * H) * I.eb, H, h.data(), 2 * F, H},
                 rows, 2 * F);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < F; ++j)
            moe_rows::store(
                act.data(), r * F + j,
                silu_mul(moe_rows::load(h.data(), r * 2 * F + j, t), moe_rows::load(h.data(), r * 2 * F + F + j, t)),
                t);
        gemm_cpu(CpuGemm{t, t, false, act.data(), F, wd + static_cast<size_t>(l * H * F) * I.eb, F,
                         I.h_out.data() + static_cast<size_t>(r0 * H) * I.eb, H, F},
                 rows, H);
        r0 += rows;
      }
    I.ex.combine(I.h_out.data(), weights, y, eo);
  });
}

}  // namespace weft::ops
