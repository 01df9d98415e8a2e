// Embedding-bag lookup kernels (ops::EmbeddingA2A on GPUs; docs/embedding_a2a.md, "GPU path"):
// the table-batched pooled lookup, which stores each pooled row where its method wants it (a
// send buffer packed by destination, the output, or straight into a peer's landing buffer), the
// fused method's landing (wait, then copy into the output) and the re-layout of what an
// all-to-all received. Launchers: raw values and a stream in, cudaError_t out; no allocation,
// no host synchronisation.
#pragma once
#include <cstdint>

#include "weft/device/config.hpp"
#include "weft/device/ctx.hpp"
#include "weft/device/dtype.hpp"

#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace weft::kernels {

// The most tables of one rank the lookup takes (its tables travel as kernel parameters).
inline constexpr int kEmbeddingMaxTables = 128;
// The most consecutive bags one group of lanes pools (one run of their indices: rows loaded
// ahead across the bags' edges): about 64 indices a run, from the table's average bag (the
// kernel reads it from the offsets), 1 ... 8 bags.
inline constexpr int kEmbeddingPoolerBags = 8;

struct EmbeddingTableArgs {
  const void* weight = nullptr;      // [rows, dim]
  const int64_t* offsets = nullptr;  // [world * batch + 1]
  const int64_t* indices = nullptr;
  const float* psw = nullptr;  // per-sample weights, one per index (optional)
  int64_t rows = 0;
  int32_t dim = 0;
  int32_t col = 0;     // the table's first column among this rank's tables
  int32_t group = 32;  // lanes that pool one bag: a power of two, <= 32
  int32_t global = 0;  // the table's global number (the error's)
};

// Bag q * batch + b of every table is rank q's sample b. A work item is one warp's bags
// (32 / group groups of lanes, up to kEmbeddingPoolerBags bags each) of one table for one
// destination; one destination's items are table-major.
struct EmbeddingPoolArgs {
  dev::DeviceCtx ctx;
  EmbeddingTableArgs t[kEmbeddingMaxTables];
  int n_tables = 0;
  dev::DType wt = dev::DType::kF32, ot = dev::DType::kF32;
  bool mean = false;
  int64_t batch = 0;
  // Destinations (dest_first + k) % world for k < dest_count (their items interleaved).
  int dest_first = 0, dest_count = 1;
  // Where destination q's pooled row of bag (q, b) for table t goes, elements of ot:
  //  - q == rank and out: out + b * out_stride + out_col + t.col;
  //  - else with push: peer q's heap at land_off + parity * land_bytes, the same place in a
  //    [batch][out_stride] buffer; each CTA signals every peer (sig_off + 8 * rank, +1) once its
  //    rows are stored; parity is that of the call number calls[0] + 1;
  //  - else: send + q * send_dest_bytes + (b * send_stride + t.col) * elem.
  void* out = nullptr;
  int64_t out_stride = 0, out_col = 0;
  void* send = nullptr;
  int64_t send_stride = 0;
  uint64_t send_dest_bytes = 0;
  bool push = false;
  uint64_t land_off = 0, land_bytes = 0, sig_off = 0;
  const uint64_t* calls = nullptr;
  // [2], atomicMin: (global table << 40) | position of the first index outside its table, and
  // (global table << 40) | bag of the first bag whose offsets decrease; ~0: none. Never reset here.
  unsigned long long* bad = nullptr;
  int ctas = 0;  // the grid (0: as many as the GPU holds at once); the same on every rank with push
};

// The fused method's receiving side: waits until every source's CTAs signalled this call
// (sig_off + 8 * s >= call * ctas, under the deadline, naming s), copies the landing buffer's
// other ranks' columns ([batch][stride]; columns [skip_col, skip_col + skip_cols) are this
// rank's own, already in out) into out, then counts the call (calls[0] += 1).
struct EmbeddingLandArgs {
  dev::DeviceCtx ctx;
  uint64_t land_off = 0, land_bytes = 0, sig_off = 0;
  int64_t batch = 0, stride = 0, skip_col = 0, skip_cols = 0;
  size_t elem = 4;
  int src_ctas = 0;  // the pool kernel's grid on every rank
  void* out = nullptr;
  uint64_t* calls = nullptr;  // [2]: calls made, and this call's CTAs done (the last one counts it)
};

#ifdef WEFT_HAVE_CUDA
// The grid the pool kernel runs with ctas = 0 on this GPU.
int embedding_pool_ctas();
cudaError_t embedding_pool(const EmbeddingPoolArgs& a, cudaStream_t s);
cudaError_t embedding_land(const EmbeddingLandArgs& a, cudaStream_t s);
// recv packed by source ([s][batch][dims[s]] at recv_at[s] elements) into out [batch][stride] at
// columns cols[s] ... for every source but `skip` (-1: none). world <= dev::kMaxPeers.
struct EmbeddingRelayoutArgs {
  const void* recv = nullptr;
  void* out = nullptr;
  int world = 1, skip = -1;
  int64_t batch = 0, stride = 0;
  size_t elem = 4;
  int64_t dims[dev::kMaxPeers] = {}, cols[dev::kMaxPeers] = {}, recv_at[dev::kMaxPeers] = {};
};
cudaError_t embedding_relayout(const EmbeddingRelayoutArgs& a, cudaStream_t s);
#endif

}  // namespace weft::kernels
