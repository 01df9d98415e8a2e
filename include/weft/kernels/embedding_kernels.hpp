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
// ahead across the bags' edges): 1 ... 8 bags, the host's choice (EmbeddingTableArgs::run_bags),
// else about 64 indices a run from the table's average bag (the kernel reads it from the offsets).
inline constexpr int kEmbeddingPoolerBags = 8;
// The pool kernel's warps a CTA (one work item a warp at a time).
inline constexpr int kEmbeddingPoolWarps = 4;

struct EmbeddingTableArgs {
  const void* weight = nullptr;      // [rows, dim]
  const int64_t* offsets = nullptr;  // [world * batch + 1]
  const int64_t* indices = nullptr;
  const float* psw = nullptr;  // per-sample weights, one per index (optional)
  int64_t rows = 0;
  int32_t dim = 0;
  int32_t col = 0;     // the table's first column among this rank's tables
  int32_t group = 32;  // lanes that pool one bag: a power of two >= half the row's 16-byte vectors, <= 32
  int32_t global = 0;  // the table's global number (the error's)
  int32_t run_bags = 0;  // bags a group pools as one run, 1 ... kEmbeddingPoolerBags; 0: the kernel's rule
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

// The rows a lane of the pool kernel loads ahead (8 16-byte vectors a lane in flight, over the
// most vectors a lane of any table holds: 1, 2, 4 or 8).
inline int embedding_pool_ahead(const EmbeddingPoolArgs& a) {
  const int e = a.wt == dev::DType::kF32 ? 4 : 8;  // elements of a 16-byte vector
  int vectors = 1;
  for (int i = 0; i < a.n_tables; ++i) {
    const int v = (a.t[i].dim / e + a.t[i].group - 1) / a.t[i].group;
    vectors = v > vectors ? v : vectors;
  }
  return vectors <= 1 ? 8 : vectors <= 2 ? 4 : vectors <= 4 ? 2 : 1;
}

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

// ---- Backward (ops::EmbeddingA2A::backward on GPUs; docs/embedding_a2a.md, "Backward") ----
// Every position of the rank's tables' indices, concatenated (table t's at pos_base ...), gets a
// key -- row_base + its row, or `keys` (past every table's) where it is left out -- and its bag;
// a stable radix sort by key then puts each row's positions together in their order, and the
// sums walk each row's run in that order (the host's order: the same bits).

enum class EmbeddingSink : int { kDense, kSparse, kSgd, kAdagrad };

struct EmbeddingGradTableArgs {
  const int64_t* offsets = nullptr;  // [world * batch + 1]
  const int64_t* indices = nullptr;  // [count]
  const float* psw = nullptr;
  int64_t rows = 0, count = 0;           // count: the indices given (num_indices)
  int64_t pos_base = 0;                  // its first position among every table's
  uint32_t row_base = 0;                 // its first key
  int32_t dim = 0, col = 0, global = 0;  // col: its first column among the rank's dims
  // The sink (EmbeddingA2AGradArgs::sink says which fields).
  float* dense = nullptr;
  int64_t* rows_out = nullptr;
  float* values = nullptr;
  int64_t* count_out = nullptr;
  void* weight = nullptr;
  float* state = nullptr;
};

struct EmbeddingGradArgs {
  dev::DeviceCtx ctx;
  EmbeddingGradTableArgs t[kEmbeddingMaxTables];
  int n_tables = 0;
  int64_t bags = 0, positions = 0;  // world * batch; the sum of the tables' counts
  uint32_t keys = 0;                // the sum of the tables' rows (row_base of a table past the last)
  bool mean = false;
  // The work space ([positions] each; num_runs one).
  uint32_t* key = nullptr;  // the keys kernel's; the sorted ones in key_sorted
  uint32_t* key_sorted = nullptr;
  int32_t* pos = nullptr;  // 0 ... positions - 1; sorted by key in pos_sorted
  int32_t* pos_sorted = nullptr;
  int32_t* bag_of = nullptr;  // each position's bag
  uint32_t* run_key = nullptr;
  int32_t* run_len = nullptr;
  int32_t* run_start = nullptr;
  int32_t* num_runs = nullptr;
  // [3], atomicMin as EmbeddingPoolArgs::bad: a bad index, decreasing offsets, and
  // (global << 40) | bag count where a table's offsets run past its count.
  unsigned long long* bad = nullptr;
  // The sums: bag g's (rank g / batch's sample g % batch) pooled gradient row for this rank's
  // columns is, for g / batch == own_rank, own + (g % batch) * own_stride elements of gt, else
  // src + (g / batch) * src_rank_bytes + (g % batch) * src_stride elements.
  dev::DType gt = dev::DType::kF32;
  dev::DType wt = dev::DType::kF32;
  const void* own = nullptr;
  int64_t own_stride = 0;
  const void* src = nullptr;
  uint64_t src_rank_bytes = 0;
  int64_t src_stride = 0;
  int64_t batch = 0;
  EmbeddingSink sink = EmbeddingSink::kDense;
  float lr = 0.f, eps = 0.f;
  // fused: src is the heap's landing buffer (land_off + parity * land_bytes, parity that of the
  // call calls[0] + 1); the sums wait until every peer's send CTAs signalled (sig_off + 8 * q >=
  // call * send_ctas), and the last CTA counts the call (calls[0] += 1; calls[1] its CTAs done).
  bool wait = false;
  uint64_t land_off = 0, land_bytes = 0, sig_off = 0;
  int send_ctas = 0;
  uint64_t* calls = nullptr;
};

// Sends grad_out's columns to their owners: owner q's [batch][dims[q]] block (columns cols[q] ...
// of grad_out [batch][stride]) to q, every q but the own rank: with push into q's heap at
// land_off + parity * land_bytes + rank * rank_bytes (parity that of calls[0] + 1; then every CTA
// signals every peer, sig_off + 8 * rank), else into send + send_at[q] elements.
struct EmbeddingGradSendArgs {
  dev::DeviceCtx ctx;
  const void* grad = nullptr;
  int64_t batch = 0, stride = 0;
  size_t elem = 4;
  int64_t dims[dev::kMaxPeers] = {}, cols[dev::kMaxPeers] = {}, send_at[dev::kMaxPeers] = {};
  void* send = nullptr;
  bool push = false;
  uint64_t land_off = 0, land_bytes = 0, rank_bytes = 0, sig_off = 0;
  const uint64_t* calls = nullptr;
  int ctas = 0;  // with push: the same on every rank
};

#ifdef WEFT_HAVE_CUDA
// The grid the send kernel runs with push.
int embedding_grad_send_ctas();
cudaError_t embedding_grad_send(const EmbeddingGradSendArgs& a, cudaStream_t s);
// The CUB work space the sort and the runs need for `positions` (bytes; positions < 2^31).
size_t embedding_grad_scratch(int64_t positions);
// The keys, the stable sort and the runs (no gradient read), then the sums and the sinks (dense:
// the whole tables set, zeros where no bag indexes a row; sparse: every table's count written).
cudaError_t embedding_grad_sort(const EmbeddingGradArgs& a, void* scratch, size_t scratch_bytes, cudaStream_t s);
cudaError_t embedding_grad_sums(const EmbeddingGradArgs& a, cudaStream_t s);
#endif

}  // namespace weft::kernels
