// Embedding-bag lookups + all-to-all (include/weft/ops/embedding_a2a.hpp, docs/embedding_a2a.md):
// the host backend's baseline -- each rank pools its tables' bags for the whole global batch
// into a send buffer packed by destination ([world][batch][this rank's dims]), the library's
// all-to-all by counts moves every block to its samples' rank (packed by source), and the
// re-layout puts source s's block of each sample at s's tables' columns.
#include "weft/ops/embedding_a2a.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../common/op_base.hpp"
#include "../common/rows.hpp"
#include "runs.hpp"
#include "weft/core/error.hpp"
#include "weft/kernels/embedding_kernels.hpp"
#include "weft/ops/collectives.hpp"

#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include "weft/core/cuda_check.hpp"
#endif

namespace weft::ops {

namespace {

using moe_rows::load;
using moe_rows::store;

const char* pooling_name(EmbeddingPooling p) { return p == EmbeddingPooling::kSum ? "sum" : "mean"; }

// What every rank must have alike.
std::string describe(const EmbeddingA2AConfig& c) {
  return fmt::format("batch {} weights {} out {} pooling {}", c.batch, dev::dtype_name(c.weight_dtype),
                     dev::dtype_name(c.out_dtype), pooling_name(c.pooling));
}

// This rank's configuration's faults, "" when none.
std::string faults(const EmbeddingA2AConfig& c) {
  if (c.batch < 0) return fmt::format("embedding_a2a: batch must be >= 0, got {}", c.batch);
  if (c.weight_dtype != dev::DType::kF32 && c.weight_dtype != dev::DType::kBF16 && c.weight_dtype != dev::DType::kF16)
    return fmt::format("embedding_a2a: weights must be f32, bf16 or f16, got {}", dev::dtype_name(c.weight_dtype));
  if (c.out_dtype != dev::DType::kF32 && c.out_dtype != dev::DType::kBF16)
    return fmt::format("embedding_a2a: the output must be f32 or bf16, got {}", dev::dtype_name(c.out_dtype));
  for (size_t t = 0; t < c.tables.size(); ++t) {
    const EmbeddingTableShape& s = c.tables[t];
    if (s.rows < 1) return fmt::format("embedding_a2a: table {} must have rows >= 1, got {}", t, s.rows);
    if (s.dim < 8 || s.dim % 8 != 0 || s.dim > kEmbeddingMaxDim)
      return fmt::format("embedding_a2a: table {}'s dim must be a multiple of 8 in 8 ... {}, got {}", t,
                         kEmbeddingMaxDim, s.dim);
  }
  return "";
}

}  // namespace

struct EmbeddingA2A::Impl {
  Impl(Backend& backend, const EmbeddingA2AConfig& c)
      : b(backend), cfg(c), share(backend, "embedding_a2a"), op(backend, "embedding_a2a"), coll(backend) {}

  Backend& b;
  EmbeddingA2AConfig cfg;
  detail::HeapShare share;  // before op: the symmetric state goes back after everything else
  detail::OpBase op;
  Collectives coll;
  std::vector<int64_t> dims;      // every rank's tables' dims, global order
  std::vector<int64_t> rank_dim;  // [world]: the sum of each rank's dims
  std::vector<int64_t> rank_col;  // [world]: each rank's first column in out
  int64_t total = 0, first = 0;   // the sum of every dim; this rank's first table's global number
  size_t ob = 4, wb = 4;          // bytes of an output and a weight element
  uint64_t recv_off = 0;          // [world][batch][rank_dim[s]] packed by source: the all-to-all's output
  uint64_t recv_elems = 0;
  std::vector<unsigned char> send;  // [world][batch][rank_dim[me]]
  bool gpu = false;
#ifdef WEFT_HAVE_CUDA
  // GPUs (docs/embedding_a2a.md, "GPU path"): plain device memory for NCCL (its point-to-point
  // into the heap's window hung, as the collectives' baseline says) and the small state.
  void* d_send = nullptr;               // [world][batch][rank_dim[me]]
  void* d_recv = nullptr;               // [sum over s of batch * rank_dim[s]], packed by source
  unsigned long long* d_bad = nullptr;  // [2] (EmbeddingPoolArgs::bad)
  uint64_t* d_calls = nullptr;          // [2] (EmbeddingLandArgs::calls)
  cudaStream_t side = nullptr;          // decomposed: the transfers
  std::vector<cudaEvent_t> ev;          // decomposed: [world]: chunk k pooled (k >= 1); [0]: the transfers done
  cudaEvent_t ev_fork = nullptr;
  // fused: [2 parities][batch][total] landing buffers and [world] signals in the heap; 0 where
  // the heap could not hold them (then fused runs as decomposed).
  uint64_t land_off = 0, land_bytes = 0, sig_off = 0;
  int push_ctas = 0;  // the fused pool kernel's grid: the fewest any rank's GPU holds
  int pool_ctas = 0;  // the pool kernel's grid otherwise (this GPU's)
  // backward: fused's [2 parities][world][batch][widest] landing buffers and [world] signals in
  // the heap (0 where it could not hold them: then decomposed), its send grid, the join event;
  // the sort's work space (EmbeddingGradArgs), grown by a call that needs more.
  uint64_t bland_off = 0, bland_bytes = 0, bland_rank_bytes = 0, bsig_off = 0;
  int bsend_ctas = 0;
  cudaEvent_t ev_join = nullptr;
  void* d_ws = nullptr;
  int64_t ws_positions = -1;
  size_t scratch_bytes = 0;
  ~Impl() {
    if (!gpu) return;
    cudaDeviceSynchronize();
    cudaFree(d_send);
    cudaFree(d_recv);
    cudaFree(d_bad);
    cudaFree(d_ws);
    if (ev_join) cudaEventDestroy(ev_join);
    for (cudaEvent_t e : ev) cudaEventDestroy(e);
    if (ev_fork) cudaEventDestroy(ev_fork);
    if (side) cudaStreamDestroy(side);
  }
#endif
};

EmbeddingA2A::EmbeddingA2A(Backend& backend, const EmbeddingA2AConfig& config) {
  impl_ = std::make_unique<Impl>(backend, config);
  Impl& I = *impl_;
  I.op.set_share(&I.share);
  I.gpu = backend.kind() != BackendKind::kHost;
  std::string bad = faults(config);
  if (bad.empty() && I.gpu && config.tables.size() > static_cast<size_t>(kernels::kEmbeddingMaxTables))
    bad = fmt::format("embedding_a2a: a rank holds at most {} tables on GPUs, this one {}",
                      kernels::kEmbeddingMaxTables, config.tables.size());
  I.op.agree("whether the configuration is valid", bad.empty() ? std::string("valid") : bad);
  WEFT_REQUIRE(bad.empty(), bad);  // every rank alike
  I.op.agree("the configuration", describe(config));
  // Every rank's tables: their count, then their dims (a bootstrap exchange of fixed size).
  const int W = I.op.world();
  int64_t mine = static_cast<int64_t>(config.tables.size());
  std::vector<int64_t> counts(static_cast<size_t>(W));
  backend.bootstrap().allgather(&mine, sizeof mine, counts.data());
  const int64_t most = *std::max_element(counts.begin(), counts.end());
  std::vector<int64_t> my_dims(static_cast<size_t>(std::max<int64_t>(1, most)), 0);
  for (size_t t = 0; t < config.tables.size(); ++t) my_dims[t] = config.tables[t].dim;
  std::vector<int64_t> all(my_dims.size() * static_cast<size_t>(W));
  backend.bootstrap().allgather(my_dims.data(), my_dims.size() * sizeof(int64_t), all.data());
  I.rank_dim.assign(static_cast<size_t>(W), 0);
  I.rank_col.assign(static_cast<size_t>(W), 0);
  for (int r = 0; r < W; ++r) {
    if (r == I.op.rank()) I.first = static_cast<int64_t>(I.dims.size());
    I.rank_col[static_cast<size_t>(r)] = I.total;
    for (int64_t t = 0; t < counts[static_cast<size_t>(r)]; ++t) {
      const int64_t d = all[static_cast<size_t>(r) * my_dims.size() + static_cast<size_t>(t)];
      I.dims.push_back(d);
      I.rank_dim[static_cast<size_t>(r)] += d;
      I.total += d;
    }
  }
  I.ob = dev::dtype_size(config.out_dtype);
  I.wb = dev::dtype_size(config.weight_dtype);
  // forward receives [batch][total]; backward every rank's gradients of this rank's columns (the
  // same size on every rank: a symmetric allocation).
  const int64_t widest = *std::max_element(I.rank_dim.begin(), I.rank_dim.end());
  I.recv_elems = static_cast<uint64_t>(std::max<int64_t>(1, config.batch * std::max(I.total, W * widest)));
  const SymmetricHeap::Scope in(I.share.scope());
  if (!I.gpu) {
    I.recv_off = I.op.workspace(I.recv_elems * I.ob, "recv");
    I.coll.prepare_all_to_all_v(I.recv_elems, config.out_dtype, Method::kBaseline);
    return;
  }
#ifdef WEFT_HAVE_CUDA
  const uint64_t B = static_cast<uint64_t>(config.batch), T = static_cast<uint64_t>(I.total);
  // forward sends [world][batch][own dims] and receives [batch][total]; backward the reverse.
  const uint64_t own = static_cast<uint64_t>(W) * B * static_cast<uint64_t>(I.rank_dim[I.op.rank()]) * I.ob;
  WEFT_CUDA_CHECK(cudaMalloc(&I.d_send, std::max<uint64_t>({own, B * T * I.ob, 256})));
  WEFT_CUDA_CHECK(cudaMalloc(&I.d_recv, std::max<uint64_t>({own, B * T * I.ob, 256})));
  // [0 ... 2]: the kernels' bad-input slots; [4, 5]: forward's calls; [6, 7]: backward's.
  WEFT_CUDA_CHECK(cudaMalloc(&I.d_bad, 64));
  I.d_calls = reinterpret_cast<uint64_t*>(I.d_bad + 4);
  WEFT_CUDA_CHECK(cudaMemset(I.d_bad, 0xFF, 32));
  WEFT_CUDA_CHECK(cudaMemset(I.d_calls, 0, 32));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&I.ev_join, cudaEventDisableTiming));
  int lo = 0, hi = 0;
  WEFT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  WEFT_CUDA_CHECK(cudaStreamCreateWithPriority(&I.side, cudaStreamNonBlocking, hi));
  I.ev.assign(static_cast<size_t>(W), nullptr);
  for (cudaEvent_t& e : I.ev) WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&I.ev_fork, cudaEventDisableTiming));
  // fused: the landing buffers where the heap holds them (its use is the same on every rank).
  int ctas = kernels::embedding_pool_ctas();
  I.pool_ctas = ctas;
  std::vector<int> all_ctas(static_cast<size_t>(W));
  backend.bootstrap().allgather(&ctas, sizeof ctas, all_ctas.data());
  I.push_ctas = *std::min_element(all_ctas.begin(), all_ctas.end());
  const uint64_t land = (B * T * I.ob + 255) / 256 * 256;
  SymmetricHeap& heap = backend.heap();
  if (W > 1 && land > 0 && 2 * land + 4096 + (1ull << 20) <= heap.capacity() - heap.used()) {
    I.land_bytes = land;
    I.land_off = I.op.workspace(2 * land, "landing");
    I.sig_off = I.op.workspace(8ull * static_cast<uint64_t>(W), "signals");
  }
  int bctas = kernels::embedding_grad_send_ctas();
  backend.bootstrap().allgather(&bctas, sizeof bctas, all_ctas.data());
  I.bsend_ctas = *std::min_element(all_ctas.begin(), all_ctas.end());
  const uint64_t brank = (B * static_cast<uint64_t>(widest) * I.ob + 255) / 256 * 256;
  const uint64_t bland = brank * static_cast<uint64_t>(W);
  if (W > 1 && bland > 0 && 2 * bland + 4096 + (1ull << 20) <= heap.capacity() - heap.used()) {
    I.bland_rank_bytes = brank;
    I.bland_bytes = bland;
    I.bland_off = I.op.workspace(2 * bland, "backward landing");
    I.bsig_off = I.op.workspace(8ull * static_cast<uint64_t>(W), "backward signals");
  }
  WEFT_CUDA_CHECK(cudaDeviceSynchronize());  // before any stream's call (torch's streams do not wait)
#endif
}

EmbeddingA2A::~EmbeddingA2A() = default;

#ifdef WEFT_HAVE_CUDA
namespace {

// The pool kernel's arguments for this rank's tables (tables: the call's inputs).
kernels::EmbeddingPoolArgs pool_args(const EmbeddingA2A::Impl& I, const EmbeddingBagInput* tables) {
  const EmbeddingA2AConfig& c = I.cfg;
  kernels::EmbeddingPoolArgs a;
  a.ctx = I.b.ctx();
  a.n_tables = static_cast<int>(c.tables.size());
  a.wt = c.weight_dtype;
  a.ot = c.out_dtype;
  a.mean = c.pooling == EmbeddingPooling::kMean;
  a.batch = c.batch;
  const int64_t per_vec = c.weight_dtype == dev::DType::kF32 ? 4 : 8;
  int64_t col = 0;
  for (int t = 0; t < a.n_tables; ++t) {
    kernels::EmbeddingTableArgs& x = a.t[t];
    const EmbeddingBagInput& in = tables[t];
    x.weight = in.weight;
    x.offsets = in.offsets;
    x.indices = in.indices;
    x.psw = in.per_sample_weights;
    x.rows = c.tables[static_cast<size_t>(t)].rows;
    x.dim = static_cast<int32_t>(c.tables[static_cast<size_t>(t)].dim);
    x.col = static_cast<int32_t>(col);
    x.global = static_cast<int32_t>(I.first + t);
    int group = 1;
    while (group < 32 && 2 * group < x.dim / per_vec) group *= 2;  // two vectors a lane
    x.group = group;
    col += x.dim;
  }
  a.bad = I.d_bad;
  a.calls = I.d_calls;
  return a;
}

kernels::EmbeddingRelayoutArgs relayout_args(const EmbeddingA2A::Impl& I, void* out, int skip) {
  kernels::EmbeddingRelayoutArgs r;
  r.recv = I.d_recv;
  r.out = out;
  r.world = I.op.world();
  r.skip = skip;
  r.batch = I.cfg.batch;
  r.stride = I.total;
  r.elem = I.ob;
  int64_t at = 0;
  for (int s = 0; s < r.world; ++s) {
    r.dims[s] = I.rank_dim[static_cast<size_t>(s)];
    r.cols[s] = I.rank_col[static_cast<size_t>(s)];
    r.recv_at[s] = at;
    at += I.cfg.batch * r.dims[s];
  }
  return r;
}

// Rank p's NCCL sends and receives of one step: this rank's block for `to` out of d_send, and
// `from`'s block into d_recv (its place packed by source); bytes, no transfer of an empty block.
void nccl_step(const EmbeddingA2A::Impl& I, int to, int from, cudaStream_t s) {
  auto comm = static_cast<ncclComm_t>(I.b.nccl_comm());
  const int me = I.op.rank();
  const size_t B = static_cast<size_t>(I.cfg.batch);
  const size_t mine = B * static_cast<size_t>(I.rank_dim[static_cast<size_t>(me)]) * I.ob;
  const size_t theirs = B * static_cast<size_t>(I.rank_dim[static_cast<size_t>(from)]) * I.ob;
  size_t at = 0;
  for (int q = 0; q < from; ++q) at += B * static_cast<size_t>(I.rank_dim[static_cast<size_t>(q)]) * I.ob;
  if (mine)
    WEFT_NCCL_CHECK(
        ncclSend(static_cast<char*>(I.d_send) + mine * static_cast<size_t>(to), mine, ncclChar, to, comm, s));
  if (theirs) WEFT_NCCL_CHECK(ncclRecv(static_cast<char*>(I.d_recv) + at, theirs, ncclChar, from, comm, s));
}

// GPUs: what the host can check without reading device memory (the offsets and indices are
// checked by the kernel: an index outside its table is left out and reported after the call).
void gpu_checks(const EmbeddingA2A::Impl& I, const EmbeddingBagInput* tables, const void* out, uint64_t out_bytes) {
  const EmbeddingA2AConfig& c = I.cfg;
  const size_t n_tables = c.tables.size();
  if (n_tables) WEFT_REQUIRE(tables != nullptr, "embedding_a2a: tables: null pointer");
  if (out_bytes > 0) I.op.check_ptr(out, 16, "out", "16 bytes");
  for (size_t t = 0; t < n_tables && c.batch > 0; ++t) {
    const EmbeddingBagInput& in = tables[t];
    const int64_t g = I.first + static_cast<int64_t>(t);
    I.op.check_ptr(in.offsets, 8, fmt::format("table {} (global {}): offsets", t, g));
    I.op.check_ptr(in.weight, 16, fmt::format("table {} (global {}): weight", t, g), "16 bytes");
    if (in.per_sample_weights)
      I.op.check_ptr(in.per_sample_weights, 4, fmt::format("table {} (global {}): per_sample_weights", t, g));
    WEFT_REQUIRE(!detail::ranges_overlap(out, out_bytes, in.weight,
                                         static_cast<uint64_t>(c.tables[t].rows * c.tables[t].dim) * I.wb),
                 fmt::format("embedding_a2a: out overlaps table {} (global {})'s weight", t, g));
  }
}

void read_bad(EmbeddingA2A::Impl& I, const EmbeddingBagInput* tables, cudaStream_t s);

// Each table's run length for launches with a's destination count and grid (runs.hpp), where
// every table's num_indices is given; else the kernel's own rule (run_bags 0).
void choose_runs(const EmbeddingA2A::Impl& I, const EmbeddingBagInput* tables, kernels::EmbeddingPoolArgs& a) {
  std::vector<embedding::RunTable> rt(static_cast<size_t>(a.n_tables));
  const double bags = static_cast<double>(I.op.world()) * static_cast<double>(a.batch);
  bool known = bags > 0;
  for (int t = 0; t < a.n_tables && known; ++t) {
    known = tables[t].num_indices >= 0;
    rt[static_cast<size_t>(t)] = {a.batch, static_cast<double>(tables[t].num_indices) / bags, 32 / a.t[t].group};
  }
  if (known) {
    const int64_t warps = static_cast<int64_t>(a.ctas > 0 ? a.ctas : I.pool_ctas) * kernels::kEmbeddingPoolWarps;
    const std::vector<int> runs = embedding::choose_run_bags(rt, a.dest_count, warps, kernels::embedding_pool_ahead(a),
                                                             kernels::kEmbeddingPoolerBags);
    for (int t = 0; t < a.n_tables; ++t) a.t[t].run_bags = runs[static_cast<size_t>(t)];
  }
}

// One pool launch with a's destinations and grid, its run lengths chosen for it.
void pool(const EmbeddingA2A::Impl& I, const EmbeddingBagInput* tables, kernels::EmbeddingPoolArgs a, cudaStream_t s) {
  choose_runs(I, tables, a);
  WEFT_CUDA_CHECK(kernels::embedding_pool(a, s));
}

void gpu_pool(EmbeddingA2A::Impl& I, const EmbeddingBagInput* tables, void* pooled, uint64_t bytes,
              const EmbeddingA2ARunOptions& opt) {
  gpu_checks(I, tables, pooled, bytes);
  if (bytes == 0) return;
  auto s = static_cast<cudaStream_t>(opt.stream);
  kernels::EmbeddingPoolArgs a = pool_args(I, tables);
  a.send = pooled;
  a.send_stride = I.rank_dim[static_cast<size_t>(I.op.rank())];
  a.send_dest_bytes = static_cast<uint64_t>(I.cfg.batch * a.send_stride) * I.ob;
  a.dest_count = I.op.world();
  pool(I, tables, a, s);
  if (I.cfg.check_indices && !I.op.capturing(opt.stream)) read_bad(I, tables, s);
}

void gpu_forward(EmbeddingA2A::Impl& I, const EmbeddingBagInput* tables, void* out, const EmbeddingA2ARunOptions& opt) {
  const EmbeddingA2AConfig& c = I.cfg;
  const int W = I.op.world(), me = I.op.rank();
  I.op.checked_everywhere("whether the forward call is valid",
                          [&] { gpu_checks(I, tables, out, static_cast<uint64_t>(c.batch * I.total) * I.ob); });
  EmbeddingA2AMethod m = opt.method;
  if (m == EmbeddingA2AMethod::kAuto) m = EmbeddingA2AMethod::kFused;
  if (m == EmbeddingA2AMethod::kFused && I.land_bytes == 0 && W > 1) m = EmbeddingA2AMethod::kDecomposed;
  I.op.agree("the method", to_string(m));
  if (c.batch == 0 || I.total == 0) return;
  auto s = static_cast<cudaStream_t>(opt.stream);
  kernels::EmbeddingPoolArgs a = pool_args(I, tables);
  a.out = out;
  a.out_stride = I.total;
  a.out_col = I.rank_col[static_cast<size_t>(me)];
  a.send = I.d_send;
  a.send_stride = I.rank_dim[static_cast<size_t>(me)];
  a.send_dest_bytes = static_cast<uint64_t>(c.batch * a.send_stride) * I.ob;
  if (W == 1) {  // nothing to exchange: every method pools straight into out
    a.dest_first = me;
    pool(I, tables, a, s);
  } else if (m == EmbeddingA2AMethod::kBaseline) {
    a.out = nullptr;  // every destination's rows into d_send, then NCCL, then the re-layout
    a.dest_count = W;
    pool(I, tables, a, s);
    WEFT_NCCL_CHECK(ncclGroupStart());
    for (int p = 0; p < W; ++p) nccl_step(I, p, p, s);
    WEFT_NCCL_CHECK(ncclGroupEnd());
    WEFT_CUDA_CHECK(kernels::embedding_relayout(relayout_args(I, out, -1), s));
  } else if (m == EmbeddingA2AMethod::kDecomposed) {
    // Step k pools destination me + k's rows and sends them on the side stream while step k + 1
    // pools; this rank's own rows go straight into out last; then the re-layout of the rest.
    WEFT_CUDA_CHECK(cudaEventRecord(I.ev_fork, s));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(I.side, I.ev_fork, 0));
    choose_runs(I, tables, a);  // every step: one destination, the same grid
    for (int k = 1; k < W; ++k) {
      a.dest_first = (me + k) % W;
      WEFT_CUDA_CHECK(kernels::embedding_pool(a, s));
      WEFT_CUDA_CHECK(cudaEventRecord(I.ev[static_cast<size_t>(k)], s));
      WEFT_CUDA_CHECK(cudaStreamWaitEvent(I.side, I.ev[static_cast<size_t>(k)], 0));
      WEFT_NCCL_CHECK(ncclGroupStart());
      nccl_step(I, (me + k) % W, (me - k + W) % W, I.side);
      WEFT_NCCL_CHECK(ncclGroupEnd());
    }
    a.dest_first = me;
    WEFT_CUDA_CHECK(kernels::embedding_pool(a, s));
    WEFT_CUDA_CHECK(cudaEventRecord(I.ev[0], I.side));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(s, I.ev[0], 0));
    WEFT_CUDA_CHECK(kernels::embedding_relayout(relayout_args(I, out, me), s));
  } else {
    // fused: one kernel pools every destination's rows (their items interleaved: the link's
    // traffic spread over the whole kernel), storing the peers' straight into their landing
    // buffers and its own into out; the landing waits for every peer's CTAs, then copies the
    // peers' columns into out.
    a.push = true;
    a.dest_first = (me + 1) % W;
    a.dest_count = W;
    a.land_off = I.land_off;
    a.land_bytes = I.land_bytes;
    a.sig_off = I.sig_off;
    a.ctas = I.push_ctas;
    pool(I, tables, a, s);
    kernels::EmbeddingLandArgs l;
    l.ctx = I.b.ctx();
    l.land_off = I.land_off;
    l.land_bytes = I.land_bytes;
    l.sig_off = I.sig_off;
    l.batch = c.batch;
    l.stride = I.total;
    l.skip_col = I.rank_col[static_cast<size_t>(me)];
    l.skip_cols = I.rank_dim[static_cast<size_t>(me)];
    l.elem = I.ob;
    l.src_ctas = I.push_ctas;
    l.out = out;
    l.calls = I.d_calls;
    WEFT_CUDA_CHECK(kernels::embedding_land(l, s));
  }
  if (c.check_indices && !I.op.capturing(opt.stream)) read_bad(I, tables, s);
}

// The kernels' verdict on the indices and offsets, read back: throws naming the first bad one.
void read_bad(EmbeddingA2A::Impl& I, const EmbeddingBagInput* tables, cudaStream_t s) {
  const EmbeddingA2AConfig& c = I.cfg;
  unsigned long long bad[3] = {~0ull, ~0ull, ~0ull};
  WEFT_CUDA_CHECK(cudaMemcpyAsync(bad, I.d_bad, 24, cudaMemcpyDeviceToHost, s));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
  if (bad[0] == ~0ull && bad[1] == ~0ull && bad[2] == ~0ull) return;
  WEFT_CUDA_CHECK(cudaMemsetAsync(I.d_bad, 0xFF, 24, s));
  WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
  const unsigned long long x = bad[0] != ~0ull ? bad[0] : bad[1] != ~0ull ? bad[1] : bad[2];
  const int64_t g = static_cast<int64_t>(x >> 40), at = static_cast<int64_t>(x & ((1ull << 40) - 1));
  const int64_t t = g - I.first;
  if (bad[0] == ~0ull && bad[1] == ~0ull)
    throw_invalid(__FILE__, __LINE__,
                  fmt::format("embedding_a2a: table {} (global {}): the offsets end at {}, past num_indices = {}: the "
                              "indices past it were left out",
                              t, g, at, tables[t].num_indices));
  if (bad[0] != ~0ull) {
    int64_t v = 0;
    WEFT_CUDA_CHECK(cudaMemcpy(&v, tables[t].indices + at, 8, cudaMemcpyDeviceToHost));
    throw_invalid(__FILE__, __LINE__,
                  fmt::format("embedding_a2a: table {} (global {}): indices[{}] = {} is outside 0 ... {}: it was left "
                              "out of its bag",
                              t, g, at, v, c.tables[static_cast<size_t>(t)].rows - 1));
  }
  throw_invalid(__FILE__, __LINE__,
                fmt::format("embedding_a2a: table {} (global {}): offsets decrease at bag {}: the bag was pooled empty",
                            t, g, at));
}

}  // namespace
#endif

namespace {

// The host backend's checks of a call (out: `out_bytes` the call writes).
void host_checks(const EmbeddingA2A::Impl& I, const EmbeddingBagInput* tables, const void* out, uint64_t out_bytes) {
  const EmbeddingA2AConfig& c = I.cfg;
  const int64_t bags = static_cast<int64_t>(I.op.world()) * c.batch;
  const size_t n_tables = c.tables.size();
  if (n_tables) WEFT_REQUIRE(tables != nullptr, "embedding_a2a: tables: null pointer");
  if (out_bytes > 0) I.op.check_ptr(out, I.ob, "out");
  for (size_t t = 0; t < n_tables; ++t) {
    const EmbeddingBagInput& in = tables[t];
    const int64_t g = I.first + static_cast<int64_t>(t);
    I.op.check_ptr(in.offsets, 8, fmt::format("table {} (global {}): offsets", t, g));
    WEFT_REQUIRE(in.offsets[0] == 0,
                 fmt::format("embedding_a2a: table {} (global {}): offsets[0] must be 0, got {}", t, g, in.offsets[0]));
    for (int64_t b = 0; b < bags; ++b)
      WEFT_REQUIRE(in.offsets[b + 1] >= in.offsets[b],
                   fmt::format("embedding_a2a: table {} (global {}): offsets decrease at bag {} ({} then {})", t, g, b,
                               in.offsets[b], in.offsets[b + 1]));
    const int64_t nnz = in.offsets[bags];
    if (nnz > 0) {
      I.op.check_ptr(in.weight, I.wb, fmt::format("table {} (global {}): weight", t, g));
      I.op.check_ptr(in.indices, 8, fmt::format("table {} (global {}): indices", t, g));
    }
    const int64_t rows = c.tables[t].rows;
    for (int64_t i = 0; i < nnz; ++i)
      WEFT_REQUIRE(in.indices[i] >= 0 && in.indices[i] < rows,
                   fmt::format("embedding_a2a: table {} (global {}): indices[{}] = {} is outside 0 ... {}", t, g, i,
                               in.indices[i], rows - 1));
    WEFT_REQUIRE(
        !detail::ranges_overlap(out, out_bytes, in.weight, static_cast<uint64_t>(rows * c.tables[t].dim) * I.wb) &&
            !detail::ranges_overlap(out, out_bytes, in.indices, static_cast<uint64_t>(nnz) * 8),
        fmt::format("embedding_a2a: out overlaps table {} (global {})'s inputs", t, g));
  }
}

// The host backend's lookups: bag g (rank g / batch's sample g % batch) of every table into
// dst[g][col ...] ([world * batch][local dim]).
void host_pool(const EmbeddingA2A::Impl& I, const EmbeddingBagInput* tables, unsigned char* dst) {
  const EmbeddingA2AConfig& c = I.cfg;
  const int64_t bags = static_cast<int64_t>(I.op.world()) * c.batch, Dm = I.rank_dim[static_cast<size_t>(I.op.rank())];
  std::vector<float> acc;
  int64_t col = 0;
  for (size_t t = 0; t < c.tables.size(); ++t) {
    const EmbeddingBagInput& in = tables[t];
    const int64_t D = c.tables[t].dim;
    const auto* wt = static_cast<const unsigned char*>(in.weight);
    acc.assign(static_cast<size_t>(D), 0.f);
    for (int64_t bag = 0; bag < bags; ++bag) {
      std::fill(acc.begin(), acc.end(), 0.f);
      const int64_t i0 = in.offsets[bag], i1 = in.offsets[bag + 1];
      for (int64_t i = i0; i < i1; ++i) {
        const float w = in.per_sample_weights ? in.per_sample_weights[i] : 1.f;
        const unsigned char* row = wt + static_cast<size_t>(in.indices[i] * D) * I.wb;
        for (int64_t j = 0; j < D; ++j) acc[static_cast<size_t>(j)] += w * load(row, j, c.weight_dtype);
      }
      const float scale = c.pooling == EmbeddingPooling::kMean && i1 > i0 ? 1.f / static_cast<float>(i1 - i0) : 1.f;
      unsigned char* row_out = dst + static_cast<size_t>(bag * Dm + col) * I.ob;
      for (int64_t j = 0; j < D; ++j)
        store(row_out, j,
              c.pooling == EmbeddingPooling::kMean ? acc[static_cast<size_t>(j)] * scale : acc[static_cast<size_t>(j)],
              c.out_dtype);
    }
    col += D;
  }
}

}  // namespace

void EmbeddingA2A::forward(const EmbeddingBagInput* tables, void* out, const EmbeddingA2ARunOptions& opt) {
  Impl& I = *impl_;
  I.op.guarded([&] {
#ifdef WEFT_HAVE_CUDA
    if (I.gpu) return gpu_forward(I, tables, out, opt);
#endif
    const EmbeddingA2AConfig& c = I.cfg;
    const int W = I.op.world();
    const int64_t B = c.batch, Dm = I.rank_dim[static_cast<size_t>(I.op.rank())];
    I.op.agree("the method", to_string(opt.method));  // the host runs every method as the baseline
    I.op.checked_everywhere("whether the forward call is valid",
                            [&] { host_checks(I, tables, out, static_cast<uint64_t>(B * I.total) * I.ob); });
    // The lookups: send[q][b] is rank q's sample b.
    I.send.assign(std::max<size_t>(static_cast<size_t>(W * B * Dm) * I.ob, I.ob), 0);  // never empty: a valid pointer
    host_pool(I, tables, I.send.data());
    // Every rank's block for rank q: B bags of Dm columns.
    std::vector<uint64_t> send_counts(static_cast<size_t>(W), static_cast<uint64_t>(B * Dm)),
        recv_counts(static_cast<size_t>(W));
    I.coll.all_to_all_v(I.send.data(), send_counts.data(), I.recv_off, I.recv_elems, recv_counts.data(), c.out_dtype,
                        Method::kBaseline, opt.stream);
    // The re-layout: source s's [B][rank_dim[s]] block to out[b][rank_col[s] ...].
    const unsigned char* recv = I.b.ctx().local<const unsigned char>(I.recv_off);
    auto* o = static_cast<unsigned char*>(out);
    uint64_t at = 0;
    for (int s = 0; s < W; ++s) {
      const int64_t Ds = I.rank_dim[static_cast<size_t>(s)];
      WEFT_CHECK(recv_counts[static_cast<size_t>(s)] == static_cast<uint64_t>(B * Ds),
                 "embedding_a2a: the all-to-all's counts disagree with the ranks' tables");
      for (int64_t b = 0; b < B && Ds > 0; ++b)
        std::memcpy(o + static_cast<size_t>(b * I.total + I.rank_col[static_cast<size_t>(s)]) * I.ob,
                    recv + (at + static_cast<uint64_t>(b * Ds)) * I.ob, static_cast<size_t>(Ds) * I.ob);
      at += static_cast<uint64_t>(B * Ds);
    }
  });
}

namespace {

// What every backward call must have alike on every rank (the sinks' pointers are checked by
// each rank for its own tables): both backends.
void grad_checks(const EmbeddingA2A::Impl& I, const EmbeddingBagInput* tables, const void* grad_out,
                 const EmbeddingTableGrad* grads, const EmbeddingBackwardOptions& opt) {
  const EmbeddingA2AConfig& c = I.cfg;
  const size_t n_tables = c.tables.size();
  const size_t align = I.gpu ? 16 : 4;
  const int64_t bags = static_cast<int64_t>(I.op.world()) * c.batch;
  if (c.batch > 0 && I.total > 0) I.op.check_ptr(grad_out, I.gpu ? 16 : I.ob, "grad_out");
  if (n_tables) WEFT_REQUIRE(grads != nullptr, "embedding_a2a: grads: null pointer");
  const bool update = opt.kind == EmbeddingGradKind::kSgd || opt.kind == EmbeddingGradKind::kAdagrad;
  if (update) WEFT_REQUIRE(std::isfinite(opt.lr), fmt::format("embedding_a2a: lr must be finite, got {}", opt.lr));
  if (opt.kind == EmbeddingGradKind::kAdagrad)
    WEFT_REQUIRE(std::isfinite(opt.eps) && opt.eps >= 0.f,
                 fmt::format("embedding_a2a: eps must be finite and >= 0, got {}", opt.eps));
  uint64_t rows = 0, positions = 0;
  for (size_t t = 0; t < n_tables; ++t) {
    const int64_t g = I.first + static_cast<int64_t>(t);
    const std::string name = fmt::format("table {} (global {})", t, g);
    const EmbeddingTableGrad& x = grads[t];
    const uint64_t elems = static_cast<uint64_t>(c.tables[t].rows * c.tables[t].dim);
    rows += static_cast<uint64_t>(c.tables[t].rows);
    const int64_t given = tables[t].num_indices;
    if (I.gpu) {
      WEFT_REQUIRE(given >= 0 || bags == 0,
                   fmt::format("embedding_a2a: {}: backward on GPUs needs num_indices (the indices' count)", name));
      if (bags > 0) positions += static_cast<uint64_t>(given);
    } else if (given >= 0) {
      WEFT_REQUIRE(given == tables[t].offsets[bags],
                   fmt::format("embedding_a2a: {}: num_indices = {} but the offsets end at {}", name, given,
                               tables[t].offsets[bags]));
    }
    switch (opt.kind) {
      case EmbeddingGradKind::kDense:
        I.op.check_ptr(x.dense, align, name + ": the dense gradient");
        for (size_t u = 0; u < n_tables; ++u)
          WEFT_REQUIRE(!detail::ranges_overlap(x.dense, elems * 4, tables[u].weight,
                                               static_cast<uint64_t>(c.tables[u].rows * c.tables[u].dim) * I.wb),
                       fmt::format("embedding_a2a: {}'s dense gradient overlaps a weight", name));
        break;
      case EmbeddingGradKind::kSparse:
        I.op.check_ptr(x.rows, 8, name + ": the sparse gradient's rows");
        I.op.check_ptr(x.values, align, name + ": the sparse gradient's values");
        I.op.check_ptr(x.count, 8, name + ": the sparse gradient's count");
        break;
      case EmbeddingGradKind::kAdagrad:
        I.op.check_ptr(x.state, align, name + ": the Adagrad state");
        [[fallthrough]];
      case EmbeddingGradKind::kSgd:
        I.op.check_ptr(x.weight, I.gpu ? 16 : I.wb, name + ": the weight to update");
        break;
    }
  }
  if (I.gpu) {
    WEFT_REQUIRE(rows < 0xFFFFFFFFull,
                 fmt::format("embedding_a2a: backward on GPUs takes fewer than 2^32 - 1 rows over a rank's tables, "
                             "this one has {}",
                             rows));
    WEFT_REQUIRE(positions < (1ull << 31),
                 fmt::format("embedding_a2a: backward on GPUs takes fewer than 2^31 indices over a rank's tables, "
                             "this call has {}",
                             positions));
  }
}

// Row r's gradient g (the k-th distinct row of its table) into the table's sink (host backend).
void host_sink(const EmbeddingA2A::Impl& I, const EmbeddingTableGrad& x, const EmbeddingBackwardOptions& opt, int64_t D,
               int64_t r, int64_t k, const std::vector<float>& g) {
  const dev::DType wt = I.cfg.weight_dtype;
  switch (opt.kind) {
    case EmbeddingGradKind::kDense:
      std::copy(g.begin(), g.end(), x.dense + r * D);
      return;
    case EmbeddingGradKind::kSparse:
      x.rows[k] = r;
      std::copy(g.begin(), g.end(), x.values + k * D);
      return;
    case EmbeddingGradKind::kSgd:
    case EmbeddingGradKind::kAdagrad: {
      auto* w = static_cast<unsigned char*>(x.weight) + static_cast<size_t>(r * D) * I.wb;
      for (int64_t j = 0; j < D; ++j) {
        const float gj = g[static_cast<size_t>(j)];
        float v = load(w, j, wt);
        if (opt.kind == EmbeddingGradKind::kSgd) {
          const float step = opt.lr * gj;
          v = v - step;
        } else {
          float& st = x.state[r * D + j];
          const float sq = gj * gj;
          st = st + sq;
          const float den = std::sqrt(st) + opt.eps;
          const float d = gj / den;
          const float step = -opt.lr * d;
          v = v + step;
        }
        store(w, j, v, wt);
      }
      return;
    }
  }
}

// The host backend: the reversed all-to-all, then each table's positions in a stable order by
// row, and each row's sum in that order.
void host_backward(EmbeddingA2A::Impl& I, const EmbeddingBagInput* tables, const void* grad_out,
                   const EmbeddingTableGrad* grads, const EmbeddingBackwardOptions& opt) {
  const EmbeddingA2AConfig& c = I.cfg;
  const int W = I.op.world(), me = I.op.rank();
  const int64_t B = c.batch, Dm = I.rank_dim[static_cast<size_t>(me)];
  // Each owner s's columns of grad_out, packed by owner: [s][B][rank_dim[s]].
  std::vector<unsigned char> send(std::max<size_t>(static_cast<size_t>(B * I.total) * I.ob, I.ob));
  std::vector<uint64_t> send_counts(static_cast<size_t>(W)), recv_counts(static_cast<size_t>(W));
  const auto* go = static_cast<const unsigned char*>(grad_out);
  uint64_t at = 0;
  for (int s = 0; s < W; ++s) {
    const int64_t Ds = I.rank_dim[static_cast<size_t>(s)];
    send_counts[static_cast<size_t>(s)] = static_cast<uint64_t>(B * Ds);
    for (int64_t b = 0; b < B && Ds > 0; ++b)
      std::memcpy(send.data() + (at + static_cast<uint64_t>(b * Ds)) * I.ob,
                  go + static_cast<size_t>(b * I.total + I.rank_col[static_cast<size_t>(s)]) * I.ob,
                  static_cast<size_t>(Ds) * I.ob);
    at += static_cast<uint64_t>(B * Ds);
  }
  I.coll.all_to_all_v(send.data(), send_counts.data(), I.recv_off, I.recv_elems, recv_counts.data(), c.out_dtype,
                      Method::kBaseline, opt.stream);
  // Received packed by sample rank: [q][B][Dm] -- bag q * B + b's pooled gradient, forward's send layout.
  const unsigned char* gp = I.b.ctx().local<const unsigned char>(I.recv_off);
  for (int q = 0; q < W; ++q)
    WEFT_CHECK(recv_counts[static_cast<size_t>(q)] == static_cast<uint64_t>(B * Dm),
               "embedding_a2a: the backward's all-to-all counts disagree with the ranks' tables");
  const int64_t bags = static_cast<int64_t>(W) * B;
  int64_t col = 0;
  std::vector<int64_t> order, bag_of;
  std::vector<float> g;
  for (size_t t = 0; t < c.tables.size(); ++t) {
    const EmbeddingBagInput& in = tables[t];
    const EmbeddingTableGrad& x = grads[t];
    const int64_t D = c.tables[t].dim, nnz = in.offsets[bags];
    if (opt.kind == EmbeddingGradKind::kDense) std::fill(x.dense, x.dense + c.tables[t].rows * D, 0.f);
    bag_of.assign(static_cast<size_t>(nnz), 0);
    for (int64_t bag = 0; bag < bags; ++bag)
      for (int64_t i = in.offsets[bag]; i < in.offsets[bag + 1]; ++i) bag_of[static_cast<size_t>(i)] = bag;
    order.resize(static_cast<size_t>(nnz));
    for (int64_t i = 0; i < nnz; ++i) order[static_cast<size_t>(i)] = i;
    std::stable_sort(order.begin(), order.end(), [&](int64_t u, int64_t v) { return in.indices[u] < in.indices[v]; });
    int64_t k = 0;
    for (size_t a = 0; a < order.size(); ++k) {
      const int64_t r = in.indices[order[a]];
      g.assign(static_cast<size_t>(D), 0.f);
      for (; a < order.size() && in.indices[order[a]] == r; ++a) {
        const int64_t i = order[a], bag = bag_of[static_cast<size_t>(i)];
        const int64_t n = in.offsets[bag + 1] - in.offsets[bag];
        const float s = c.pooling == EmbeddingPooling::kMean && n > 0 ? 1.f / static_cast<float>(n) : 1.f;
        const float f = (in.per_sample_weights ? in.per_sample_weights[i] : 1.f) * s;
        const unsigned char* row = gp + static_cast<size_t>(bag * Dm + col) * I.ob;
        for (int64_t j = 0; j < D; ++j) {
          const float p = f * load(row, j, c.out_dtype);
          g[static_cast<size_t>(j)] = g[static_cast<size_t>(j)] + p;
        }
      }
      host_sink(I, x, opt, D, r, k, g);
    }
    if (opt.kind == EmbeddingGradKind::kSparse) *x.count = k;
    col += D;
  }
}

#ifdef WEFT_HAVE_CUDA
// GPUs (docs/embedding_a2a.md, "Backward"): the gradients to their owners by the method, beside
// it the sort of this rank's positions by row, then the sums into the sinks.
// backward's all-to-all through NCCL: peer q's [batch][dims[q]] gradients (packed at send_at[q]
// in d_send) to q; from each peer q, this rank's columns of its batch into d_recv's block q.
void grad_exchange(const EmbeddingA2A::Impl& I, const kernels::EmbeddingGradSendArgs& x, cudaStream_t s) {
  const int W = I.op.world(), me = I.op.rank();
  const size_t mine = static_cast<size_t>(I.cfg.batch * I.rank_dim[static_cast<size_t>(me)]) * I.ob;
  auto comm = static_cast<ncclComm_t>(I.b.nccl_comm());
  WEFT_NCCL_CHECK(ncclGroupStart());
  for (int q = 0; q < W; ++q) {
    if (q == me) continue;
    const size_t theirs = static_cast<size_t>(I.cfg.batch * x.dims[q]) * I.ob;
    if (theirs)
      WEFT_NCCL_CHECK(ncclSend(static_cast<char*>(I.d_send) + static_cast<size_t>(x.send_at[q]) * I.ob, theirs,
                               ncclChar, q, comm, s));
    if (mine)
      WEFT_NCCL_CHECK(
          ncclRecv(static_cast<char*>(I.d_recv) + static_cast<size_t>(q) * mine, mine, ncclChar, q, comm, s));
  }
  WEFT_NCCL_CHECK(ncclGroupEnd());
}

void gpu_backward(EmbeddingA2A::Impl& I, const EmbeddingBagInput* tables, const void* grad_out,
                  const EmbeddingTableGrad* grads, const EmbeddingBackwardOptions& opt, EmbeddingA2AMethod m) {
  const EmbeddingA2AConfig& c = I.cfg;
  const int W = I.op.world(), me = I.op.rank();
  const int n_tables = static_cast<int>(c.tables.size());
  const int64_t B = c.batch, bags = static_cast<int64_t>(W) * B, Dm = I.rank_dim[static_cast<size_t>(me)];
  auto s = static_cast<cudaStream_t>(opt.stream);
  kernels::EmbeddingGradArgs a;
  a.ctx = I.b.ctx();
  a.n_tables = n_tables;
  a.bags = bags;
  a.mean = c.pooling == EmbeddingPooling::kMean;
  int64_t positions = 0, rows = 0, col = 0;
  for (int t = 0; t < n_tables; ++t) {
    kernels::EmbeddingGradTableArgs& x = a.t[t];
    const EmbeddingBagInput& in = tables[t];
    const EmbeddingTableGrad& g = grads[t];
    x.offsets = in.offsets;
    x.indices = in.indices;
    x.psw = in.per_sample_weights;
    x.rows = c.tables[static_cast<size_t>(t)].rows;
    x.count = bags > 0 ? in.num_indices : 0;
    x.pos_base = positions;
    x.row_base = static_cast<uint32_t>(rows);
    x.dim = static_cast<int32_t>(c.tables[static_cast<size_t>(t)].dim);
    x.col = static_cast<int32_t>(col);
    x.global = static_cast<int32_t>(I.first + t);
    x.dense = g.dense;
    x.rows_out = g.rows;
    x.values = g.values;
    x.count_out = g.count;
    x.weight = g.weight;
    x.state = g.state;
    positions += x.count;
    rows += x.rows;
    col += x.dim;
  }
  a.positions = positions;
  a.keys = static_cast<uint32_t>(rows);
  // The sort's work space: [positions] of key, key_sorted, pos, pos_sorted, bag_of, run_key,
  // run_len, run_start (4 bytes each), num_runs, then CUB's.
  if (positions > I.ws_positions) {
    WEFT_REQUIRE(!I.op.capturing(opt.stream),
                 fmt::format("embedding_a2a: backward's work space holds {} indices and this call has {}: make a call "
                             "with at least as many before capturing it",
                             std::max<int64_t>(0, I.ws_positions), positions));
    WEFT_CUDA_CHECK(cudaDeviceSynchronize());
    WEFT_CUDA_CHECK(cudaFree(I.d_ws));
    I.d_ws = nullptr;
    I.scratch_bytes = kernels::embedding_grad_scratch(positions);
    WEFT_CUDA_CHECK(cudaMalloc(&I.d_ws, 32 * static_cast<size_t>(positions) + 256 + I.scratch_bytes));
    I.ws_positions = positions;
  }
  const size_t n = static_cast<size_t>(std::max<int64_t>(I.ws_positions, 0));
  auto* ws = static_cast<char*>(I.d_ws);
  a.key = reinterpret_cast<uint32_t*>(ws);
  a.key_sorted = a.key + n;
  a.pos = reinterpret_cast<int32_t*>(a.key_sorted + n);
  a.pos_sorted = a.pos + n;
  a.bag_of = a.pos_sorted + n;
  a.run_key = reinterpret_cast<uint32_t*>(a.bag_of + n);
  a.run_len = reinterpret_cast<int32_t*>(a.run_key + n);
  a.run_start = a.run_len + n;
  a.num_runs = a.run_start + n;
  void* scratch = ws + 32 * n + 256;
  a.bad = I.d_bad;
  a.gt = c.out_dtype;
  a.wt = c.weight_dtype;
  a.own = static_cast<const char*>(grad_out) + static_cast<size_t>(I.rank_col[static_cast<size_t>(me)]) * I.ob;
  a.own_stride = I.total;
  a.src = I.d_recv;
  a.src_rank_bytes = static_cast<uint64_t>(B * Dm) * I.ob;
  a.src_stride = Dm;
  a.batch = B;
  a.sink = static_cast<kernels::EmbeddingSink>(static_cast<int>(opt.kind));
  a.lr = opt.lr;
  a.eps = opt.eps;
  a.calls = I.d_calls + 2;
  kernels::EmbeddingGradSendArgs x;
  x.ctx = I.b.ctx();
  x.grad = grad_out;
  x.batch = B;
  x.stride = I.total;
  x.elem = I.ob;
  int64_t at = 0;
  for (int q = 0; q < W; ++q) {
    x.dims[q] = I.rank_dim[static_cast<size_t>(q)];
    x.cols[q] = I.rank_col[static_cast<size_t>(q)];
    x.send_at[q] = at;
    at += B * x.dims[q];
  }
  x.send = I.d_send;
  x.calls = a.calls;
  if (W == 1 || B == 0 || I.total == 0) {
    WEFT_CUDA_CHECK(kernels::embedding_grad_sort(a, scratch, I.scratch_bytes, s));
    WEFT_CUDA_CHECK(kernels::embedding_grad_sums(a, s));
  } else if (m == EmbeddingA2AMethod::kBaseline) {
    WEFT_CUDA_CHECK(kernels::embedding_grad_send(x, s));
    grad_exchange(I, x, s);
    WEFT_CUDA_CHECK(kernels::embedding_grad_sort(a, scratch, I.scratch_bytes, s));
    WEFT_CUDA_CHECK(kernels::embedding_grad_sums(a, s));
  } else {
    // decomposed: the packing and NCCL's transfers on the side stream; fused: the stores into the
    // owners' heap there. The sort runs beside them; the sums start once this rank's sends are
    // done (so that they never hold the GPU while its own sends wait) and, fused, wait for the
    // peers' signals.
    WEFT_CUDA_CHECK(cudaEventRecord(I.ev_fork, s));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(I.side, I.ev_fork, 0));
    if (m == EmbeddingA2AMethod::kFused) {
      x.push = true;
      x.land_off = I.bland_off;
      x.land_bytes = I.bland_bytes;
      x.rank_bytes = I.bland_rank_bytes;
      x.sig_off = I.bsig_off;
      x.ctas = I.bsend_ctas;
      WEFT_CUDA_CHECK(kernels::embedding_grad_send(x, I.side));
      a.wait = true;
      a.land_off = I.bland_off;
      a.land_bytes = I.bland_bytes;
      a.sig_off = I.bsig_off;
      a.send_ctas = I.bsend_ctas;
      a.src_rank_bytes = I.bland_rank_bytes;
    } else {
      WEFT_CUDA_CHECK(kernels::embedding_grad_send(x, I.side));
      grad_exchange(I, x, I.side);
    }
    WEFT_CUDA_CHECK(cudaEventRecord(I.ev_join, I.side));
    WEFT_CUDA_CHECK(kernels::embedding_grad_sort(a, scratch, I.scratch_bytes, s));
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(s, I.ev_join, 0));
    WEFT_CUDA_CHECK(kernels::embedding_grad_sums(a, s));
  }
  if (c.check_indices && !I.op.capturing(opt.stream)) read_bad(I, tables, s);
}
#endif

}  // namespace

void EmbeddingA2A::backward(const EmbeddingBagInput* tables, const void* grad_out, const EmbeddingTableGrad* grads,
                            const EmbeddingBackwardOptions& opt) {
  Impl& I = *impl_;
  I.op.guarded([&] {
    [[maybe_unused]] const int W = I.op.world();
    EmbeddingA2AMethod m = opt.method;
#ifdef WEFT_HAVE_CUDA
    if (I.gpu) {
      if (m == EmbeddingA2AMethod::kAuto) m = EmbeddingA2AMethod::kFused;
      if (m == EmbeddingA2AMethod::kFused && I.bland_bytes == 0 && W > 1) m = EmbeddingA2AMethod::kDecomposed;
    }
#endif
    I.op.agree("the backward's method and gradient kind", fmt::format("{} {}", to_string(m), to_string(opt.kind)));
    I.op.checked_everywhere("whether the backward call is valid", [&] {
#ifdef WEFT_HAVE_CUDA
      if (I.gpu) gpu_checks(I, tables, nullptr, 0);
#endif
      if (!I.gpu) host_checks(I, tables, nullptr, 0);
      grad_checks(I, tables, grad_out, grads, opt);
    });
#ifdef WEFT_HAVE_CUDA
    if (I.gpu) return gpu_backward(I, tables, grad_out, grads, opt, m);
#endif
    host_backward(I, tables, grad_out, grads, opt);
  });
}

void EmbeddingA2A::backward(const EmbeddingBagInput* tables, const void* grad_out, float* const* grad_weights,
                            const EmbeddingA2ARunOptions& opt) {
  std::vector<EmbeddingTableGrad> g(impl_->cfg.tables.size());
  for (size_t t = 0; t < g.size() && grad_weights; ++t) g[t].dense = grad_weights[t];
  EmbeddingBackwardOptions o;
  o.method = opt.method;
  o.stream = opt.stream;
  backward(tables, grad_out, grad_weights ? g.data() : nullptr, o);
}

void EmbeddingA2A::pool(const EmbeddingBagInput* tables, void* pooled,
                        [[maybe_unused]] const EmbeddingA2ARunOptions& opt) {
  Impl& I = *impl_;
  const uint64_t bytes = static_cast<uint64_t>(I.op.world() * I.cfg.batch * local_dim()) * I.ob;
#ifdef WEFT_HAVE_CUDA
  if (I.gpu) return gpu_pool(I, tables, pooled, bytes, opt);
#endif
  host_checks(I, tables, pooled, bytes);
  if (bytes > 0) host_pool(I, tables, static_cast<unsigned char*>(pooled));
}

const EmbeddingA2AConfig& EmbeddingA2A::config() const { return impl_->cfg; }
const std::vector<int64_t>& EmbeddingA2A::dims() const { return impl_->dims; }
int64_t EmbeddingA2A::total_dim() const { return impl_->total; }
int64_t EmbeddingA2A::first_table() const { return impl_->first; }
int64_t EmbeddingA2A::local_dim() const { return impl_->rank_dim[static_cast<size_t>(impl_->op.rank())]; }

}  // namespace weft::ops
