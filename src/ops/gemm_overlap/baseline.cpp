// `baseline`: the library calls one after the other, no overlap -- NCCL's collective and one
// cuBLAS GEMM on GPUs, the reference collectives and a CPU GEMM on the host backend. Any M up
// to the op's (the calls of an M the op did not prepare run here): nothing in it depends on M
// but the counts.
#include <fmt/format.h>

#include <chrono>
#include <cstring>

#include "gemm_overlap_impl.hpp"

#ifdef WEFT_HAVE_CUDA
#include <nccl.h>
#endif

namespace weft::ops::detail {

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void BaselineHost::keep_gathered(int64_t m, const void*, void* dst, void*) {
  std::memcpy(dst, op_.host_scratch.data(), static_cast<size_t>(m * op_.k_local) * op_.eb);
}

void BaselineHost::run(int64_t m, const void* a, const void* bp, void* c, void* /*stream*/, bool tracing) {
  const GemmOverlapConfig& cfg = op_.cfg;
  const int rank = op_.rank;
  const size_t eb = op_.eb;
  const int64_t k_local = op_.k_local;
  const dev::DType t = cfg.dtype;
  TraceEvent g{rank, TraceKind::kTile, 0, 0, "compute", "gemm", 0, 0};
  TraceEvent x{rank, TraceKind::kChunk, 0, 1, "communication", "", 0, 0};
  if (cfg.op == GemmOp::kAgGemm) {
    op_.host_scratch.resize(static_cast<size_t>(m * k_local) * eb);
    x.name = "all_gather (reference)";
    x.start_ns = now_ns();
    op_.coll.baseline_all_gather(a, op_.host_scratch.data(), static_cast<uint64_t>(m / op_.world * k_local), t);
    x.end_ns = g.start_ns = now_ns();
    detail::host_gemm(t, cfg.b_layout, op_.host_scratch.data(), bp, c, k_local, cfg.n, 0, m, 0, cfg.n);
    g.end_ns = now_ns();
  } else {
    void* partial = c;
    if (cfg.op == GemmOp::kGemmRs) {
      op_.host_scratch.resize(static_cast<size_t>(m * cfg.n) * eb);
      partial = op_.host_scratch.data();
    }
    g.start_ns = now_ns();
    detail::host_gemm(t, cfg.b_layout, a, bp, partial, k_local, cfg.n, 0, m, 0, cfg.n);
    g.end_ns = x.start_ns = now_ns();
    if (cfg.op == GemmOp::kGemmRs) {
      x.name = "reduce_scatter (reference)";
      op_.coll.reduce_scatter(partial, c, static_cast<uint64_t>(m / op_.world * cfg.n), t, Method::kBaseline);
    } else {
      x.name = "all_reduce (reference)";
      op_.coll.all_reduce(c, c, static_cast<uint64_t>(m * cfg.n), t, Method::kBaseline);
    }
    x.end_ns = now_ns();
  }
  if (tracing) {
    op_.trace.push_back(g);
    op_.trace.push_back(x);
  }
}

#ifdef WEFT_HAVE_CUDA
namespace {
ncclDataType_t nccl_type(dev::DType t) { return t == dev::DType::kF16 ? ncclFloat16 : ncclBfloat16; }
}  // namespace

void BaselineGpu::keep_gathered(int64_t m, const void*, void* dst, void* stream) {
  if (dst == gathered_) return;  // gathered straight into it
  WEFT_CUDA_CHECK(cudaMemcpyAsync(dst, gathered_, static_cast<size_t>(m * op_.k_local) * op_.eb, cudaMemcpyDefault,
                                  static_cast<cudaStream_t>(stream)));
}

void BaselineGpu::run(int64_t m, const void* a, const void* bp, void* c, void* stream, bool tracing) {
  const auto s = static_cast<cudaStream_t>(stream);
  op_.begin(s, tracing);
  gpu_baseline(m, a, bp, c, s, tracing);
  if (tracing) op_.collect(s);
}

void BaselineGpu::gpu_baseline(int64_t m, const void* a, const void* bp, void* c, cudaStream_t s, bool tracing) {
  const GemmOverlapConfig& cfg = op_.cfg;
  const int64_t k_local = op_.k_local;
  auto comm = static_cast<ncclComm_t>(op_.b.nccl_comm());
  const ncclDataType_t nt = nccl_type(cfg.dtype);
  if (cfg.op == GemmOp::kAgGemm) {
    size_t x = op_.mark(s, TraceKind::kChunk, 0, 1, "nccl", "ncclAllGather", tracing);
    gathered_ = gather_into ? gather_into : op_.scratch;
    WEFT_NCCL_CHECK(ncclAllGather(a, gathered_, static_cast<size_t>(m / op_.world * k_local), nt, comm, s));
    op_.mark_end(x, s, tracing);
    x = op_.mark(s, TraceKind::kTile, 0, 0, "compute stream", "cublas gemm", tracing);
    op_.gemm(s, gathered_, bp, c, m, k_local, 0, cfg.n);
    op_.mark_end(x, s, tracing);
    return;
  }
  void* partial = cfg.op == GemmOp::kGemmRs ? op_.scratch : c;
  size_t x = op_.mark(s, TraceKind::kTile, 0, 0, "compute stream", "cublas gemm", tracing);
  op_.gemm(s, a, bp, partial, m, k_local, 0, cfg.n);
  op_.mark_end(x, s, tracing);
  x = op_.mark(s, TraceKind::kChunk, 0, 1, "nccl", cfg.op == GemmOp::kGemmRs ? "ncclReduceScatter" : "ncclAllReduce",
               tracing);
  if (cfg.op == GemmOp::kGemmRs)
    WEFT_NCCL_CHECK(ncclReduceScatter(partial, c, static_cast<size_t>(m / op_.world * cfg.n), nt, ncclSum, comm, s));
  else
    WEFT_NCCL_CHECK(ncclAllReduce(c, c, static_cast<size_t>(m * cfg.n), nt, ncclSum, comm, s));
  op_.mark_end(x, s, tracing);
}
#endif

}  // namespace weft::ops::detail
