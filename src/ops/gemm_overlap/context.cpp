// The context the GEMM + communication op's methods share (gemm_overlap_impl.hpp): its GPU
// set-up and the stream-level helpers several methods call.
#include <fmt/format.h>

#include "gemm_overlap_impl.hpp"

#ifdef WEFT_HAVE_CUDA
#include <cstdio>

#include "weft/core/error.hpp"
#include "weft/kernels/runtime_kernels.hpp"
#endif

namespace weft::ops::detail {

GemmOpContext::~GemmOpContext() {
#ifdef WEFT_HAVE_CUDA
  for (auto& e : timed) {
    cudaEventDestroy(e.start);
    cudaEventDestroy(e.end);
  }
  if (ev_base) cudaEventDestroy(ev_base);
#endif
}

#ifdef WEFT_HAVE_CUDA
GemmShared::~GemmShared() {
  lt.reset();
  if (handle) cublasDestroy(handle);
  if (workspace) cudaFree(workspace);
  if (scratch) cudaFree(scratch);
}
#endif

uint64_t GemmOpContext::data_buffer(size_t bytes, const std::string& what) {
  GemmShared::Buffer& buf = shared->data[what];
  if (buf.bytes == 0 || buf.bytes < bytes) {  // first, or larger than the one made (not shared then)
    buf.offset = b.heap().alloc_bytes(bytes, fmt::format("{}.{}x{}.{}", to_string(cfg.op), cfg.k, cfg.n, what));
    buf.bytes = bytes;
  }
  return buf.offset;
}

#ifdef WEFT_HAVE_CUDA
void GemmOpContext::init_gpu() {
  // Every kernel a spinning GEMM or wait of this op may wait behind, loaded now: with lazy
  // module loading a first launch can wait behind a kernel that spins (kernels::load_kernels).
  WEFT_CUDA_CHECK(kernels::gemm_preload());
  WEFT_CUDA_CHECK(kernels::overlap_preload());
  WEFT_CUDA_CHECK(kernels::runtime_preload());
  GemmShared& sh = *shared;
  if (!sh.handle) {  // the first context (the largest M)
    WEFT_CUBLAS_CHECK(cublasCreate(&sh.handle));
    const size_t ws = 32ull << 20;  // set explicitly: cuBLAS in CUDA graphs needs a user workspace
    WEFT_CUDA_CHECK(cudaMalloc(&sh.workspace, ws));
    WEFT_CUBLAS_CHECK(cublasSetWorkspace(sh.handle, sh.workspace, ws));
    WEFT_CUBLAS_CHECK(cublasSetMathMode(sh.handle, CUBLAS_DEFAULT_MATH));
    sh.lt = std::make_unique<detail::LtGemm>(sh.workspace, ws, sh.handle);
  }
  lt = sh.lt.get();
  const size_t scratch_bytes = cfg.op == GemmOp::kAgGemm   ? static_cast<size_t>(cfg.m * k_local) * eb
                               : cfg.op == GemmOp::kGemmRs ? static_cast<size_t>(cfg.m * cfg.n) * eb
                                                           : 0;
  if (scratch_bytes > sh.scratch_bytes) {
    WEFT_CHECK(!sh.scratch, "gemm_overlap: a prepared M needs more scratch than the largest");
    WEFT_CUDA_CHECK(cudaMalloc(&sh.scratch, scratch_bytes));
    sh.scratch_bytes = scratch_bytes;
  }
  scratch = sh.scratch;
  WEFT_CUDA_CHECK(cudaEventCreate(&ev_base));
  SymmetricHeap& heap = b.heap();
  const std::string tag = fmt::format("{}.{}x{}x{}", to_string(cfg.op), cfg.m, cfg.k, cfg.n);
  epoch_off = heap.alloc_bytes(8, tag + ".epoch");
  barrier = heap.alloc_barrier(tag + ".barrier");
}

// C[rows x cols] (ldc = N, starting at column c0) = A[rows x k] (lda = k) * op(B) columns
// [c0, c0 + cols): row-major through cuBLAS's column-major view (C^T = op(B)^T A^T).
void GemmOpContext::gemm(cudaStream_t s, const void* a, const void* bp, void* c, int64_t rows, int64_t k, int64_t c0,
                         int64_t cols, Blas lib, const void* add) {
  if (rows <= 0 || cols <= 0) return;
  const bool nk = cfg.b_layout == BLayout::kNK;
  detail::LtProblem p;
  p.rows = rows;
  p.cols = cols;
  p.k = k;
  p.lda = k;
  p.ldb = nk ? k : cfg.n;
  p.ldd = cfg.n;
  p.b_nk = nk;
  p.dtype = cfg.dtype;
  p.add_c = add != nullptr;
  const void* bptr = nk ? at(bp, static_cast<uint64_t>(c0 * k) * eb) : at(bp, static_cast<uint64_t>(c0) * eb);
  lt->run(p, a, bptr, add ? at(add, static_cast<uint64_t>(c0) * eb) : nullptr, at(c, static_cast<uint64_t>(c0) * eb), s,
          /*may_time=*/lib == Blas::kLt);
}

kernels::GemmArgs GemmOpContext::weft_gemm_args(const void* a, const void* bp, void* c, int64_t rows) const {
  kernels::GemmArgs g;
  g.m = static_cast<int>(rows);
  g.n = static_cast<int>(cfg.n);
  g.k = static_cast<int>(k_local);
  g.type = cfg.dtype == dev::DType::kBF16 ? kernels::GemmType::kBF16 : kernels::GemmType::kF16;
  g.b_layout = cfg.b_layout == BLayout::kNK ? kernels::GemmBLayout::kNK : kernels::GemmBLayout::kKN;
  g.a = a;
  g.lda = k_local;
  g.b = bp;
  g.ldb = cfg.b_layout == BLayout::kNK ? k_local : cfg.n;
  g.c[0] = c;
  g.ldc = cfg.n;
  return g;
}

void GemmOpContext::begin(cudaStream_t s, bool tracing) {
  if (!tracing) return;
  timed_used = 0;
  // Line the ranks up so every rank's t = 0 is the same moment (within a flag latency).
  WEFT_CUDA_CHECK(kernels::device_barrier(b.ctx(), barrier, s));
  WEFT_CUDA_CHECK(cudaEventRecord(ev_base, s));
}

size_t GemmOpContext::mark(cudaStream_t s, TraceKind kind, int64_t id, int lane, const char* lane_name,
                           std::string name, bool tracing) {
  if (!tracing) return 0;
  if (timed_used == timed.size()) {
    TimedEvent e;
    WEFT_CUDA_CHECK(cudaEventCreate(&e.start));
    WEFT_CUDA_CHECK(cudaEventCreate(&e.end));
    timed.push_back(e);
  }
  TimedEvent& e = timed[timed_used];
  e.meta = TraceEvent{rank, kind, id, lane, lane_name, std::move(name), 0, 0};
  WEFT_CUDA_CHECK(cudaEventRecord(e.start, s));
  return timed_used++;
}

void GemmOpContext::mark_end(size_t i, cudaStream_t s, bool tracing) {
  if (tracing) WEFT_CUDA_CHECK(cudaEventRecord(timed[i].end, s));
}

void GemmOpContext::collect(cudaStream_t s) {
  WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
  b.synchronize();
  for (size_t i = 0; i < timed_used; ++i) {
    float t0 = 0, t1 = 0;
    WEFT_CUDA_CHECK(cudaEventElapsedTime(&t0, ev_base, timed[i].start));
    WEFT_CUDA_CHECK(cudaEventElapsedTime(&t1, ev_base, timed[i].end));
    TraceEvent e = timed[i].meta;
    e.start_ns = static_cast<int64_t>(static_cast<double>(t0) * 1e6);
    e.end_ns = static_cast<int64_t>(static_cast<double>(t1) * 1e6);
    trace.push_back(std::move(e));
  }
}

kernels::OverlapWaits GemmOpContext::overlap_waits(const std::vector<std::tuple<int, uint64_t, int64_t>>& waits,
                                                   size_t begin) {
  kernels::OverlapWaits w{};
  for (size_t j = begin; j < waits.size() && j < begin + kernels::kOverlapListMax; ++j, ++w.count) {
    w.from[w.count] = std::get<0>(waits[j]);
    w.off[w.count] = std::get<1>(waits[j]);
    w.threshold[w.count] = std::get<2>(waits[j]);
  }
  return w;
}

void GemmOpContext::wait_list(cudaStream_t s, const std::vector<std::tuple<int, uint64_t, int64_t>>& waits) {
  for (size_t i = 0; i < waits.size(); i += kernels::kOverlapListMax)
    WEFT_CUDA_CHECK(kernels::overlap_wait(b.ctx(), epoch_off, overlap_waits(waits, i), s));
}

void GemmOpContext::signal(int peer, uint64_t off, uint64_t inc, cudaStream_t s) {
  kernels::OverlapSignals sig{};
  sig.count = 1;
  sig.peer[0] = peer;
  sig.off[0] = off;
  sig.inc[0] = inc;
  WEFT_CUDA_CHECK(kernels::overlap_signal(b.ctx(), sig, s));
}

bool GemmOpContext::copy_engine_took(cudaError_t e, cudaStream_t s) {
  if (e == cudaSuccess) return true;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (e != cudaErrorInvalidValue || cudaStreamIsCapturing(s, &st) != cudaSuccess || st != cudaStreamCaptureStatusNone)
    WEFT_CUDA_CHECK(e);
  (void)cudaGetLastError();
  std::fprintf(stderr, "weft: rank %d: the copy engine refused a peer pointer (%s); %s uses SM copies from now on\n",
               rank, cudaGetErrorString(e), to_string(cfg.op));
  sm_copies = true;
  return false;
}

void GemmOpContext::put_count(int peer, uint64_t off, cudaStream_t s) {
  const dev::DeviceCtx& ctx = b.ctx();
  WEFT_CUDA_CHECK(cudaMemcpyAsync(ctx.peer_base[peer] + off, ctx.peer_base[rank] + epoch_off, sizeof(uint64_t),
                                  cudaMemcpyDefault, s));
}

void GemmOpContext::copy_gathered(const char* gathered, bool own_missing, int64_t m, const void* a, void* dst,
                                  cudaStream_t s) {
  const size_t row = static_cast<size_t>(k_local) * eb;
  const size_t shard = static_cast<size_t>(m / world) * row;
  if (!own_missing) {
    WEFT_CUDA_CHECK(cudaMemcpyAsync(dst, gathered, static_cast<size_t>(m) * row, cudaMemcpyDefault, s));
    return;
  }
  char* d = static_cast<char*>(dst);
  const size_t own0 = static_cast<size_t>(rank) * shard, own1 = own0 + shard, end = static_cast<size_t>(m) * row;
  if (own0) WEFT_CUDA_CHECK(cudaMemcpyAsync(d, gathered, own0, cudaMemcpyDefault, s));
  WEFT_CUDA_CHECK(cudaMemcpyAsync(d + own0, a, shard, cudaMemcpyDefault, s));
  if (end > own1) WEFT_CUDA_CHECK(cudaMemcpyAsync(d + own1, gathered + own1, end - own1, cudaMemcpyDefault, s));
}

void GemmOpContext::copy2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows,
                           cudaStream_t s) {
  if (!sm_copies && copy_engine_took(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault, s), s))
    return;
  WEFT_CUDA_CHECK(kernels::overlap_copy(dst, dpitch, src, spitch, width, rows, 16, s));
}
#endif

}  // namespace weft::ops::detail
