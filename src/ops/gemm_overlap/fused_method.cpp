// `fused` on GPUs: the op's plan for the fused geometry (tiles of 128 x 128 by default, SM
// transfers), its tensors, signals, tile counters and barrier in the symmetric heap, this
// rank's lowered tables in one device block, and the persistent kernel's state (fused.hpp;
// the kernel's host side: fused.cpp).
#include <fmt/format.h>

#include "gemm_overlap_impl.hpp"
#include "weft/core/error.hpp"

namespace weft::ops::detail {

FusedGpu::FusedGpu(GemmOpContext& op, uint64_t rs_stage) : op_(op) {
  try {
    setup(rs_stage);
  } catch (...) {  // the destructor does not run for a constructor that throws
    release();
    throw;
  }
}

void FusedGpu::setup(uint64_t rs_stage) {
  const GemmOverlapConfig& cfg = op_.cfg;
  const int world = op_.world;
  const int rank = op_.rank;
  const int64_t k_local = op_.k_local;
  const int64_t m_shard = op_.m_shard;
  const int chunks = op_.chunks;
  SymmetricHeap& heap = op_.b.heap();
  const std::string tag = fmt::format("{}.{}x{}x{}", to_string(cfg.op), cfg.m, cfg.k, cfg.n);
  fp = detail::build_op_plan(detail::fused_plan_params(cfg, world, k_local, chunks));
  for (const plan::Tensor& x : fp.plan.tensors)
    f_tensor_off.push_back(
        op_.data_buffer(static_cast<size_t>(x.rows * x.cols * x.elem_bytes), "fused." + x.name));
  f_signals = heap.alloc_signals(static_cast<uint32_t>(fp.lowered.max_signals()), tag + ".fused.signals");
  // The plan's tile counters, plus what the GPU fused gemm_rs keeps beside them: its piece
  // counters, (2 world - 1) x pieces per rank's block, pieces <= the block's 128-row blocks.
  const int fused_extra = cfg.op == GemmOp::kGemmRs ? static_cast<int>((2 * world - 1) * ceil_div(m_shard, 128)) : 0;
  f_counters =
      heap.alloc_signals(static_cast<uint32_t>(std::max(1, world * fp.tiles_m) + fused_extra), tag + ".fused.counters");
  f_barrier = heap.alloc_barrier(tag + ".fused.barrier");
  f_epoch_off = heap.alloc_bytes(8, tag + ".fused.epoch");
  // Upload this rank's tables into one device block.
  const plan::LoweredRank& lr = fp.lowered.ranks[static_cast<size_t>(rank)];
  std::vector<fused::TensorDesc> td;
  for (size_t t = 0; t < fp.plan.tensors.size(); ++t) {
    const auto& x = fp.plan.tensors[t];
    td.push_back({f_tensor_off[t], x.rows, x.cols, x.elem_bytes, 0});
  }
  TableBlob blob;
  blob.add(lr.tiles);
  blob.add(lr.tile_waits);
  blob.add(lr.transfers);
  blob.add(lr.transfer_waits);
  blob.add(lr.counter_wait_begin);
  blob.add(lr.counter_waits);
  blob.add(lr.notify_begin);
  blob.add(lr.notify_ranks);
  blob.add(lr.signal_producer);
  blob.add(lr.final_waits);
  blob.add(td);
  f_tables = blob.upload();
  auto dp = [&](int i) { return blob.table<char>(f_tables, i); };
  fused::FusedArgs& A = f_args;
  A.op = static_cast<fused::Op>(static_cast<int32_t>(cfg.op));
  A.dtype = cfg.dtype;
  A.b_layout = cfg.b_layout == BLayout::kNK ? 0 : 1;
  A.m = cfg.m;
  A.n = cfg.n;
  A.k = cfg.k;
  A.k_local = k_local;
  A.tiles = reinterpret_cast<const plan::TileEntry*>(dp(0));
  A.num_tiles = static_cast<int32_t>(lr.tiles.size());
  A.tile_waits = reinterpret_cast<const plan::WaitEntry*>(dp(1));
  A.transfers = reinterpret_cast<const plan::TransferDesc*>(dp(2));
  A.num_transfers = static_cast<int32_t>(lr.transfers.size());
  A.transfer_waits = reinterpret_cast<const plan::WaitEntry*>(dp(3));
  A.tt_begin = reinterpret_cast<const int32_t*>(dp(4));
  A.transfer_tile_waits = reinterpret_cast<const plan::CounterWait*>(dp(5));
  A.notify_begin = reinterpret_cast<const int32_t*>(dp(6));
  A.notify_ranks = reinterpret_cast<const int32_t*>(dp(7));
  A.signal_producer = reinterpret_cast<const int32_t*>(dp(8));
  A.final_waits = reinterpret_cast<const plan::WaitEntry*>(dp(9));
  A.num_final_waits = static_cast<int32_t>(lr.final_waits.size());
  A.tensors = reinterpret_cast<const fused::TensorDesc*>(dp(10));
  A.num_tensors = static_cast<int32_t>(td.size());
  A.input_tensor = fp.input;
  A.gemm_tensor = fp.gemm;
  A.output_tensor = fp.output;
  A.tile_rows = fp.schedule.tile_rows;
  A.tile_cols = fp.schedule.tile_cols;
  A.tiles_m = fp.tiles_m;
  A.tiles_n = fp.tiles_n;
  A.signals = f_signals;
  A.counters = f_counters;
  A.barrier = f_barrier;
  A.epoch_off = f_epoch_off;
  A.stage_off = cfg.op == GemmOp::kGemmRs ? rs_stage : 0;
  f_trace_capacity = static_cast<uint32_t>(lr.tiles.size() + lr.transfers.size() + 64);
  WEFT_CUDA_CHECK(cudaMalloc(&f_trace, f_trace_capacity * sizeof(fused::TraceRecord)));
  WEFT_CUDA_CHECK(cudaMalloc(&f_trace_count, sizeof(uint32_t)));
  A.ctx = op_.b.ctx();
  f_state = fused::make_state(A);
}

FusedGpu::~FusedGpu() { release(); }

void FusedGpu::release() {
  if (f_tables) cudaFree(f_tables);
  if (f_trace) cudaFree(f_trace);
  if (f_trace_count) cudaFree(f_trace_count);
}

void FusedGpu::keep_gathered(int64_t m, const void* a, void* dst, void* stream) {
  op_.copy_gathered(op_.b.ctx().peer_base[op_.rank] + f_tensor_off[static_cast<size_t>(fp.gemm)],
                    fused::own_rows_in_place(*f_state), m, a, dst, static_cast<cudaStream_t>(stream));
}

void FusedGpu::run(int64_t m, const void* a, const void* bp, void* c, void* stream, bool tracing) {
  WEFT_CHECK(m == op_.cfg.m, "fused runs its prepared M only");
  gpu_fused(a, bp, c, static_cast<cudaStream_t>(stream), tracing);
}

void FusedGpu::gpu_fused(const void* a, const void* bp, void* c, cudaStream_t s, bool tracing) {
  const int rank = op_.rank;
  fused::FusedArgs A = f_args;
  A.a = a;
  A.b = bp;
  A.c = c;
  A.epoch = ++f_epoch;
  A.ctx = op_.b.ctx();
  A.stream = s;
  A.trace = nullptr;
  A.trace_count = nullptr;
  A.trace_capacity = 0;
  if (tracing) {
    WEFT_CUDA_CHECK(cudaMemsetAsync(f_trace_count, 0, sizeof(uint32_t), s));
    A.trace = f_trace;
    A.trace_count = f_trace_count;
    A.trace_capacity = f_trace_capacity;
  }
  try {
    fused::run_fused(A, *f_state);
  } catch (...) {
    --f_epoch;  // nothing was enqueued
    throw;
  }
  if (tracing) {
    WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
    op_.b.synchronize();
    uint32_t n = 0;
    WEFT_CUDA_CHECK(cudaMemcpy(&n, f_trace_count, sizeof n, cudaMemcpyDeviceToHost));
    n = std::min(n, f_trace_capacity);
    std::vector<fused::TraceRecord> rec(n);
    if (n) WEFT_CUDA_CHECK(cudaMemcpy(rec.data(), f_trace, n * sizeof(fused::TraceRecord), cudaMemcpyDeviceToHost));
    for (const auto& r : rec)
      op_.trace.push_back(TraceEvent{rank, r.kind == 0 ? TraceKind::kTile : TraceKind::kChunk, r.id, r.lane,
                                     fmt::format("SM {}", r.lane),
                                     fmt::format("{} {}", r.kind == 0 ? "tile" : "chunk", r.id),
                                     static_cast<int64_t>(r.start_ns), static_cast<int64_t>(r.end_ns)});
  }
}

}  // namespace weft::ops::detail
