// The MoE token exchange (include/weft/ops/moe.hpp; docs/moe.md): the op skeleton's checks and
// agreement, the routing (a stable counting sort of the (token, slot) pairs by expert), the
// per-chunk counts exchanged through the symmetric heap and checked against every rank's
// capacity, the rows moved by Collectives::all_to_all_v (baseline: the library's; decomposed:
// weft's), and combine's return trip and weighted sum. Host backend: the routing, the pack and
// the weighted sum are CPU loops; GPUs: kernels (kernels/moe_kernels.hpp), the counts exchanged
// on the device (docs/moe.md, "GPU path").
#include "weft/ops/moe.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "../common/op_base.hpp"
#include "../common/rows.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/device/dtype.hpp"
#include "weft/kernels/moe_kernels.hpp"
#include "weft/ops/collectives.hpp"

#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime.h>

#include "weft/core/cuda_check.hpp"
#endif

namespace weft::ops {

static_assert(kMoeMaxTopK <= kernels::kMoeMaxSlots, "the kernels take every slot of a token");

namespace {

std::string describe(const MoeConfig& c) {
  return fmt::format("hidden {} experts {} top_k {} max_tokens {} recv_capacity {} {}{}", c.hidden, c.experts, c.top_k,
                     c.max_tokens, c.recv_capacity, dev::dtype_name(c.dtype), c.expert_blocks ? " expert_blocks" : "");
}

void validate(const MoeConfig& c, int world) {
  WEFT_REQUIRE(c.hidden >= 8 && c.hidden % 8 == 0,
               fmt::format("moe: hidden must be a positive multiple of 8, got {}", c.hidden));
  WEFT_REQUIRE(c.experts >= 1 && c.experts % world == 0,
               fmt::format("moe: experts must be a positive multiple of the world size {}, got {}", world, c.experts));
  WEFT_REQUIRE(c.top_k >= 1 && c.top_k <= std::min(kMoeMaxTopK, c.experts),
               fmt::format("moe: top_k must be in 1 ... {}, got {}", std::min(kMoeMaxTopK, c.experts), c.top_k));
  WEFT_REQUIRE(c.max_tokens >= 0, fmt::format("moe: max_tokens must be >= 0, got {}", c.max_tokens));
  WEFT_REQUIRE(c.recv_capacity >= 0, fmt::format("moe: recv_capacity must be >= 0, got {}", c.recv_capacity));
  WEFT_REQUIRE(c.dtype == dev::DType::kBF16 || c.dtype == dev::DType::kF16 || c.dtype == dev::DType::kF32,
               "moe: dtype must be bf16, f16 or f32");
}

using moe_rows::load;
using moe_rows::store;

}  // namespace

struct MoeDispatchCombine::Impl {
  Impl(Backend& backend, const MoeConfig& c)
      : b(backend),
        cfg(c),
        share(backend, "moe"),
        op(backend, "moe"),
        coll(backend),
        world(backend.size()),
        rank(backend.rank()) {}

  Backend& b;
  MoeConfig cfg;
  detail::HeapShare share;  // before op: the symmetric state goes back after everything else
  detail::OpBase op;
  Collectives coll;
  int world, rank;
  int64_t local = 0;     // experts per rank
  int64_t capacity = 0;  // rows a rank may receive
  size_t eb = 2;
  uint64_t recv_off = 0;    // [capacity, H]: dispatch's output
  uint64_t back_off = 0;    // [max_tokens * top_k, H]: combine's return rows, in send order
  uint64_t counts_off = 0;  // [2 parities][world src][world dst][local] uint64 rows, every rank's
  uint64_t calls = 0;       // dispatches made (the same on every rank): the counts' parity
  // The last dispatch: its T, method, this rank's send order (pos[t * top_k + j]: row of (t, j)
  // in the rows sent, dest-major, expert-grouped), rows received from each rank.
  bool routed = false;
  int64_t tokens = 0;
  MoeMethod method = MoeMethod::kAuto;
  std::vector<int64_t> pos;
  std::vector<uint64_t> got_rows;  // rows from each rank (combine sends as many back)
  std::vector<uint64_t> ret_off;   // direct: where each rank's rows to this rank start in its send order
  std::vector<int64_t> counts;     // [world][local]: recv_counts()
  // expert_blocks (host backend): each block's local expert (recv_groups()), and each chunk's
  // (source, local expert) first row in recv.
  std::vector<int32_t> groups;
  std::vector<uint64_t> chunk_start;
  int64_t extent = 0;  // rows of recv the last dispatch used (with blocks: their padding too)
  int64_t rows = 0;
  std::vector<unsigned char> send;  // [T * top_k, H]: dispatch's rows in send order
  std::vector<std::string> agreed;  // "dispatch <method>" / "combine <method>" once checked
  // GPUs: the routing's device state (kernels/moe_kernels.hpp) in one allocation, and the
  // symmetric [world][local] uint32 chunk counts the counts' all-to-all delivers.
  bool gpu = false;
  void* dev_mem = nullptr;
  int32_t* d_pos = nullptr;             // [max_tokens * top_k]
  unsigned char* d_send = nullptr;      // [max_tokens * top_k, H]
  uint32_t* d_expert_counts = nullptr;  // [experts]
  uint64_t* d_send_elems = nullptr;     // [world]
  uint64_t* d_recv_elems = nullptr;     // [world]: dispatch's all-to-all counts, combine's send counts
  uint64_t* d_back_elems = nullptr;     // [world]
  int64_t* d_chunks = nullptr;          // [world * local]: recv_counts()
  unsigned long long* d_bad = nullptr;  // the first invalid pair (~0: none)
  uint64_t chunk_off = 0;
  // Method direct (kernels::MoeDirectArgs): the call counter, the return offsets, the verdict.
  uint64_t* d_calls = nullptr;              // [3] (kernels::MoeDirectArgs::calls)
  int64_t* d_ret = nullptr;                 // [world][3]
  unsigned long long* d_refused = nullptr;  // [1]
  uint32_t* d_slices = nullptr;             // [kMoeDirectMaxCtas][experts]
  int32_t* d_groups = nullptr;              // expert_blocks: [groups_n()] (recv_groups())
  int64_t* d_chunk_rows = nullptr;          // expert_blocks: [world * local][2]
  uint64_t* d_row_dst = nullptr;            // expert_blocks: [groups_n() * kMoeBlockRows] (recv_destinations())
  int64_t* d_pair_src = nullptr;            // [max_tokens * top_k]: each pair's (rank << 40 | row) there
  uint64_t ready_off = 0;                   // [2][world] combine-by-pull words (MoeDirectArgs::pull)
  // Direct dispatch with rows once a peer (MoeDirectArgs::once): its staging, places and token words.
  bool once = false;
  uint64_t stage_off = 0, place_off = 0, tok_off = 0;
  int ctas = 0;          // the direct kernels' CTAs (WEFT_MOE_DIRECT_CTAS, read once: the signals count CTAs)
  uint64_t sig_off = 0;  // [2][world] signals
  ~Impl() {
#ifdef WEFT_HAVE_CUDA
    if (dev_mem) cudaFree(dev_mem);
#endif
  }

  // The all-to-alls' output capacities in elements (at least a row: a state of 0 elements is none).
  uint64_t recv_elems() const {
    return static_cast<uint64_t>(std::max<int64_t>(1, capacity)) * static_cast<uint64_t>(cfg.hidden);
  }
  uint64_t back_elems() const {
    return static_cast<uint64_t>(std::max<int64_t>(1, cfg.max_tokens * cfg.top_k)) * static_cast<uint64_t>(cfg.hidden);
  }
  Method coll_method(MoeMethod m) const { return m == MoeMethod::kDecomposed ? Method::kDirect : Method::kBaseline; }
  // auto: direct (on GPUs up to kernels::kMoeDirectMaxWorld ranks, else decomposed).
  MoeMethod resolve(MoeMethod m) const {
    if (m == MoeMethod::kAuto)
      m = gpu && world > kernels::kMoeDirectMaxWorld && !cfg.expert_blocks ? MoeMethod::kDecomposed
                                                                           : MoeMethod::kDirect;
    WEFT_REQUIRE(m == MoeMethod::kDirect || !cfg.expert_blocks,
                 fmt::format("moe: expert_blocks places rows by method direct only, not {}", to_string(m)));
    return m;
  }
  int64_t groups_n() const { return (capacity + kernels::kMoeBlockRows - 1) / kernels::kMoeBlockRows; }
  int64_t tokens_of(const MoeRunOptions& o) const {
    const int64_t t = o.tokens < 0 ? cfg.max_tokens : o.tokens;
    WEFT_REQUIRE(t <= cfg.max_tokens, fmt::format("moe: tokens must be in 0 ... {}, got {}", cfg.max_tokens, o.tokens));
    return t;
  }
  // The method of a call kind, checked across ranks the first time (later calls check nothing:
  // every rank makes the same calls).
  void agree_method(const char* kind, MoeMethod m) {
    const std::string what = fmt::format("{} {}", kind, to_string(m));
    if (std::find(agreed.begin(), agreed.end(), what) != agreed.end()) return;
    op.agree(fmt::format("the {} method", kind), what);
    agreed.push_back(what);
  }
  uint64_t* counts_at(int q, uint64_t par, int src, int dst) {
    return b.ctx().ptr<uint64_t>(
        q,
        counts_off + 8ull * static_cast<uint64_t>(((static_cast<int64_t>(par) * world + src) * world + dst) * local));
  }
};

#ifdef WEFT_HAVE_CUDA
namespace {
// Rows once a peer pays where a token that reaches a peer rank sends it at least 1.5 rows on
// average, routing uniform: top_k / world rows a rank, over the chance that a token's top_k
// distinct experts miss none of its E / world (2 GPUs: Mixtral 1.27, Qwen3 and DeepSeek-like 4.0).
bool once_rule(const MoeConfig& c, int world) {
  const double E = static_cast<double>(c.experts), L = E / world;
  double miss = 1;  // no expert of the rank among the token's: C(E - L, k) / C(E, k)
  for (int64_t i = 0; i < c.top_k; ++i)
    miss *= std::max(0.0, (E - L - static_cast<double>(i)) / (E - static_cast<double>(i)));
  return static_cast<double>(c.top_k) / world >= 1.5 * (1 - miss);
}
}  // namespace
#endif

MoeDispatchCombine::MoeDispatchCombine(Backend& backend, const MoeConfig& config) {
  validate(config, backend.size());
#ifndef WEFT_HAVE_CUDA
  WEFT_REQUIRE(backend.kind() == BackendKind::kHost, "moe: the nccl backend needs a CUDA build");
#endif
  WEFT_REQUIRE(backend.kind() == BackendKind::kHost || config.experts <= kernels::kMoeMaxExperts,
               fmt::format("moe: at most {} experts on GPUs, got {}", kernels::kMoeMaxExperts, config.experts));
  impl_ = std::make_unique<Impl>(backend, config);
  Impl& I = *impl_;
  I.op.set_share(&I.share);
  I.op.agree("the configuration", describe(config));
  const SymmetricHeap::Scope mine = I.share.scope();
  I.local = config.experts / I.world;
  I.eb = dev::dtype_size(config.dtype);
  I.capacity = config.recv_capacity > 0
                   ? config.recv_capacity
                   : static_cast<int64_t>(I.world) * config.max_tokens * std::min(config.top_k, I.local) +
                         (config.expert_blocks ? I.local * (kernels::kMoeBlockRows - 1) : 0);
  if (config.expert_blocks) I.groups.assign(static_cast<size_t>(I.groups_n()), -1);
  I.recv_off = I.op.workspace(I.recv_elems() * I.eb, "recv");
  I.back_off = I.op.workspace(I.back_elems() * I.eb, "back");
  I.counts_off = I.op.workspace(2ull * static_cast<uint64_t>(I.world * I.world * I.local) * 8, "counts");
  // decomposed's all-to-all states, both directions (made here: a call makes nothing).
  I.coll.prepare_all_to_all_v(I.recv_elems(), config.dtype, Method::kDirect);
  I.coll.prepare_all_to_all_v(I.back_elems(), config.dtype, Method::kDirect);
  I.counts.assign(static_cast<size_t>(I.world * I.local), 0);
  I.gpu = backend.kind() != BackendKind::kHost;
#ifdef WEFT_HAVE_CUDA
  if (I.gpu) {
    I.chunk_off = I.op.workspace(static_cast<uint64_t>(I.world * I.local) * 4, "chunks");
    I.sig_off = I.op.workspace(2ull * static_cast<uint64_t>(I.world) * 8, "signals");
    I.ready_off = I.op.workspace(2ull * static_cast<uint64_t>(I.world) * 8, "pull words");
    // Rows once a peer (docs/moe.md, "Rows once a peer"): by the rule where a token reaching a
    // peer rank sends it at least 1.5 rows on average under uniform routing and the staging
    // takes at most half the heap's free space; WEFT_MOE_DISPATCH_ONCE=0 / 2: never / always.
    const int64_t once_mode = tunable_value(tunables::kMoeDispatchOnce);
    I.ctas = static_cast<int>(tunable_value(tunables::kMoeDirectCtas));
    const uint64_t stage_bytes = 2ull * static_cast<uint64_t>(I.world * config.max_tokens * config.hidden) * I.eb;
    const SymmetricHeap& heap = backend.heap();
    I.once = I.world > 1 && config.max_tokens > 0 && static_cast<uint64_t>(I.capacity) <= 0xFFFFFFFFull &&
             (once_mode == 2 ||
              (once_mode == 1 && once_rule(config, I.world) && stage_bytes <= (heap.capacity() - heap.in_use()) / 2));
    if (I.once) {
      I.stage_off = I.op.workspace(stage_bytes, "stage");
      I.place_off =
          I.op.workspace(2ull * static_cast<uint64_t>(I.world * config.max_tokens * config.top_k) * 8, "stage places");
      I.tok_off = I.op.workspace(2ull * static_cast<uint64_t>(I.world) * 8, "stage tokens");
    }
    I.coll.prepare_all_to_all(static_cast<uint64_t>(I.local), dev::DType::kF32, Method::kDirect);
    const uint64_t pairs = static_cast<uint64_t>(std::max<int64_t>(1, config.max_tokens * config.top_k));
    const uint64_t W = static_cast<uint64_t>(I.world);
    auto up = [](uint64_t b) { return (b + 255) / 256 * 256; };
    const uint64_t sizes[] = {
        up(pairs * 4),
        up(pairs * static_cast<uint64_t>(config.hidden) * I.eb),
        up(static_cast<uint64_t>(config.experts) * 4),
        up(W * 8),
        up(W * 8),
        up(W * 8),
        up(W * static_cast<uint64_t>(I.local) * 8),
        up(8),
        up(24),
        up(W * 3 * 8),
        up(8),
        up(static_cast<uint64_t>(kernels::kMoeDirectMaxCtas) * config.experts * 4),
        up(static_cast<uint64_t>(std::max<int64_t>(1, I.groups_n())) * 4),
        up(static_cast<uint64_t>(config.experts) * 16),
        up(static_cast<uint64_t>(std::max<int64_t>(1, I.groups_n())) * kernels::kMoeBlockRows * 8),
        up(pairs * 8)};
    uint64_t total = 0;
    for (uint64_t b : sizes) total += b;
    WEFT_CUDA_CHECK(cudaMalloc(&I.dev_mem, total));
    unsigned char* at = static_cast<unsigned char*>(I.dev_mem);
    auto take = [&](size_t i) {
      unsigned char* p = at;
      at += sizes[i];
      return p;
    };
    I.d_pos = reinterpret_cast<int32_t*>(take(0));
    I.d_send = take(1);
    I.d_expert_counts = reinterpret_cast<uint32_t*>(take(2));
    I.d_send_elems = reinterpret_cast<uint64_t*>(take(3));
    I.d_recv_elems = reinterpret_cast<uint64_t*>(take(4));
    I.d_back_elems = reinterpret_cast<uint64_t*>(take(5));
    I.d_chunks = reinterpret_cast<int64_t*>(take(6));
    I.d_bad = reinterpret_cast<unsigned long long*>(take(7));
    I.d_calls = reinterpret_cast<uint64_t*>(take(8));
    I.d_ret = reinterpret_cast<int64_t*>(take(9));
    I.d_refused = reinterpret_cast<unsigned long long*>(take(10));
    I.d_slices = reinterpret_cast<uint32_t*>(take(11));
    I.d_groups = reinterpret_cast<int32_t*>(take(12));
    I.d_chunk_rows = reinterpret_cast<int64_t*>(take(13));
    I.d_row_dst = reinterpret_cast<uint64_t*>(take(14));
    I.d_pair_src = reinterpret_cast<int64_t*>(take(15));
    WEFT_CUDA_CHECK(cudaMemset(I.dev_mem, 0, total));
    WEFT_CUDA_CHECK(cudaMemset(I.d_groups, 0xFF, static_cast<size_t>(std::max<int64_t>(1, I.groups_n())) * 4));
    WEFT_CUDA_CHECK(cudaMemset(I.d_bad, 0xFF, 8));
    WEFT_CUDA_CHECK(cudaMemset(I.d_refused, 0xFF, 8));
    WEFT_CUDA_CHECK(cudaDeviceSynchronize());  // before any stream's call (torch's streams do not wait)
  }
#endif
}

MoeDispatchCombine::~MoeDispatchCombine() = default;

#ifdef WEFT_HAVE_CUDA
namespace {
// GPUs: the calls' checks are this rank's own (no host exchange: a call can be captured; a rank
// that refuses alone leaves its peers to their deadline, which names it); the ids are checked
// on the device (moe_route) and, outside a capture, read back at once when
// MoeConfig::check_ids is on.
kernels::MoeDirectArgs direct_args(const MoeDispatchCombine::Impl& I, int64_t T) {
  kernels::MoeDirectArgs a;
  a.ctx = I.b.ctx();
  a.local = static_cast<int>(I.local);
  a.top_k = static_cast<int>(I.cfg.top_k);
  a.hidden = static_cast<int>(I.cfg.hidden);
  a.tokens = static_cast<int>(T);
  a.dtype = I.cfg.dtype;
  a.capacity = static_cast<uint64_t>(I.capacity);
  a.recv_off = I.recv_off;
  a.back_off = I.back_off;
  a.counts_off = I.counts_off;
  a.sig_off = I.sig_off;
  a.calls = I.d_calls;
  a.slice_counts = I.d_slices;
  a.chunks = I.d_chunks;
  a.ret = I.d_ret;
  a.refused = I.d_refused;
  a.blocks = I.cfg.expert_blocks;
  a.groups = I.d_groups;
  a.groups_n = static_cast<int>(I.groups_n());
  a.chunk_rows = I.d_chunk_rows;
  if (I.cfg.expert_blocks) a.row_dst = I.d_row_dst;
  a.pair_src = I.d_pair_src;
  a.ready_off = I.ready_off;
  a.once = I.once;
  a.ctas = I.ctas;
  a.max_tokens = static_cast<int>(I.cfg.max_tokens);
  a.stage_off = I.stage_off;
  a.place_off = I.place_off;
  a.tok_off = I.tok_off;
  return a;
}

void gpu_dispatch(MoeDispatchCombine::Impl& I, const void* x, const int32_t* ids, const MoeRunOptions& opt,
                  MoeMethod m) {
  const MoeConfig& c = I.cfg;
  const int64_t T = I.tokens_of(opt);
  if (T > 0) {
    I.op.check_ptr(x, 16, "x");
    I.op.check_ptr(ids, 4, "ids");
  }
  WEFT_REQUIRE(m != MoeMethod::kDirect || I.world <= kernels::kMoeDirectMaxWorld,
               fmt::format("moe: method direct takes at most {} ranks on GPUs, not {} (use decomposed)",
                           kernels::kMoeDirectMaxWorld, I.world));
  I.agree_method("dispatch", m);
  cudaStream_t s = static_cast<cudaStream_t>(opt.stream);
  kernels::MoeRouteArgs ra;
  ra.ids = ids;
  ra.tokens = static_cast<int>(T);
  ra.top_k = static_cast<int>(c.top_k);
  ra.experts = static_cast<int>(c.experts);
  ra.world = I.world;
  ra.hidden = static_cast<int>(c.hidden);
  ra.pos = I.d_pos;
  ra.expert_counts = I.d_expert_counts;
  ra.send_counts = I.d_send_elems;
  ra.bad = I.d_bad;
  if (m == MoeMethod::kDirect) {
    ra.send_counts = nullptr;
    kernels::MoeDirectArgs a = direct_args(I, T);
    a.route = ra;
    a.x = x;
    WEFT_CUDA_CHECK(kernels::moe_dispatch_direct(a, s));
  } else {
    WEFT_CUDA_CHECK(kernels::moe_route(ra, s));
    WEFT_CUDA_CHECK(kernels::moe_pack(x, I.d_pos, I.d_send, static_cast<int>(T), static_cast<int>(c.top_k),
                                      static_cast<int>(c.hidden), I.eb, s));
    // The chunk counts (uint32 bit patterns moved as f32 elements: an all-to-all copies, never adds).
    I.coll.all_to_all(I.d_expert_counts, I.chunk_off, static_cast<uint64_t>(I.local), dev::DType::kF32,
                      I.coll_method(m), s);
    I.coll.all_to_all_v(I.d_send, I.d_send_elems, I.recv_off, I.recv_elems(), I.d_recv_elems, c.dtype, I.coll_method(m),
                        s);
    WEFT_CUDA_CHECK(kernels::moe_widen_counts(I.b.ctx().local<const uint32_t>(I.chunk_off), I.d_chunks,
                                              static_cast<int>(I.world * I.local), s));
  }
  I.tokens = T;
  I.method = m;
  I.routed = true;
  I.rows = -1;  // unknown here until read back (recv_rows)
  if (c.check_ids && !I.op.capturing(opt.stream)) {
    unsigned long long bad = 0, refused = ~0ull;
    WEFT_CUDA_CHECK(cudaMemcpyAsync(&bad, I.d_bad, 8, cudaMemcpyDeviceToHost, s));
    if (m == MoeMethod::kDirect) WEFT_CUDA_CHECK(cudaMemcpyAsync(&refused, I.d_refused, 8, cudaMemcpyDeviceToHost, s));
    WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
    if (refused != ~0ull)  // every rank's kernel found the same: every rank throws this
      throw_invalid(__FILE__, __LINE__,
                    fmt::format("moe: dispatch refused: rank {} would receive {} rows, more than its recv_capacity {} "
                                "(raise MoeConfig::recv_capacity; 0 sizes it for any routing); nothing moved",
                                refused >> 40, refused & ((1ull << 40) - 1), I.capacity));
    if (bad != ~0ull) {
      WEFT_CUDA_CHECK(cudaMemset(I.d_bad, 0xFF, 8));
      std::vector<int32_t> pair(static_cast<size_t>(c.top_k));
      const int64_t t = static_cast<int64_t>(bad) / c.top_k, j = static_cast<int64_t>(bad) % c.top_k;
      WEFT_CUDA_CHECK(cudaMemcpy(pair.data(), ids + t * c.top_k, pair.size() * 4, cudaMemcpyDeviceToHost));
      throw_invalid(__FILE__, __LINE__,
                    fmt::format("moe: ids[{}][{}] = {} is not an expert of 0 ... {} or repeats one of its token's: the "
                                "pair was left out of this dispatch",
                                t, j, pair[static_cast<size_t>(j)], c.experts - 1));
    }
  }
}

// delivered: the rows are already in place (MoeDispatchCombine::combine_delivered; expert_out unused).
void gpu_combine(MoeDispatchCombine::Impl& I, const void* expert_out, const float* weights, void* y,
                 const MoeRunOptions& opt, MoeMethod m, bool delivered) {
  const MoeConfig& c = I.cfg;
  WEFT_REQUIRE(I.routed, "moe: combine needs a dispatch before it (its routing)");
  const int64_t T = I.tokens_of(opt);
  WEFT_REQUIRE(T == I.tokens, fmt::format("moe: combine of {} tokens after a dispatch of {}", T, I.tokens));
  WEFT_REQUIRE(m == I.method,
               fmt::format("moe: combine by {} after a dispatch by {}", to_string(m), to_string(I.method)));
  if (!delivered) I.op.check_ptr(expert_out, 16, "expert_out");
  if (T > 0) {
    I.op.check_ptr(weights, 4, "weights");
    I.op.check_ptr(y, 16, "y");
  }
  I.agree_method("combine", m);
  cudaStream_t s = static_cast<cudaStream_t>(opt.stream);
  if (m == MoeMethod::kDirect) {
    kernels::MoeDirectArgs a = direct_args(I, T);
    a.expert_out = expert_out;
    a.delivered = delivered;
    // Combine by pull (docs/moe.md): where every rank's rows lie in its symmetric heap (recv()
    // itself, the in-place experts) each rank pulls its tokens' rows into the sum where they lie
    // instead of every rank pushing them back first -- faster on every measured shape with T > 0.
    // The kernels agree on it (each rank says whether its rows are in its heap): the same on
    // every rank whatever each passes.
    const auto* base = I.b.ctx().local<const unsigned char>(0);
    const auto* at = static_cast<const unsigned char*>(expert_out);
    const uint64_t bytes = static_cast<uint64_t>(std::max<int64_t>(1, I.capacity)) * c.hidden * I.eb;
    a.pull = tunable_value(tunables::kMoeCombinePull) == 1 && !delivered;
    a.here = a.pull && at >= base && static_cast<uint64_t>(at - base) + bytes <= I.b.ctx().heap_bytes;
    if (a.here) a.expert_off = static_cast<uint64_t>(at - base);
    a.weights = weights;
    a.y = y;
    a.route.pos = I.d_pos;
    WEFT_CUDA_CHECK(kernels::moe_combine_direct(a, s));
    return;
  }
  I.coll.all_to_all_v(expert_out, I.d_recv_elems, I.back_off, I.back_elems(), I.d_back_elems, c.dtype, I.coll_method(m),
                      s);
  WEFT_CUDA_CHECK(kernels::moe_combine(I.b.ctx().local<const unsigned char>(I.back_off), I.d_pos, weights, y,
                                       static_cast<int>(T), static_cast<int>(c.top_k), static_cast<int>(c.hidden),
                                       c.dtype, s));
}
}  // namespace
#endif

void MoeDispatchCombine::dispatch(const void* x, const int32_t* ids, const MoeRunOptions& opt) {
  Impl& I = *impl_;
  I.op.guarded([&] {
#ifdef WEFT_HAVE_CUDA
    if (I.gpu) return gpu_dispatch(I, x, ids, opt, I.resolve(opt.method));
#endif
    const MoeConfig& c = I.cfg;
    const int64_t k = c.top_k, H = c.hidden, L = I.local;
    int64_t T = 0;
    const MoeMethod m = I.resolve(opt.method);
    // Every check first, refused on every rank alike: nothing moves for a bad call.
    I.op.checked_everywhere("whether the dispatch call is valid", [&] {
      T = I.tokens_of(opt);
      if (T > 0) {
        I.op.check_ptr(x, 16, "x");
        I.op.check_ptr(ids, 4, "ids");
      }
      for (int64_t i = 0; i < T * k; ++i) {
        WEFT_REQUIRE(ids[i] >= 0 && ids[i] < c.experts, fmt::format("moe: ids[{}][{}] = {} is not an expert (0 ... {})",
                                                                    i / k, i % k, ids[i], c.experts - 1));
        for (int64_t j = i - i % k; j < i; ++j)  // (recv_capacity's default counts on it)
          WEFT_REQUIRE(ids[j] != ids[i], fmt::format("moe: ids[{}][{}] = {} names expert {} again (each token's "
                                                     "experts must differ)",
                                                     i / k, i % k, ids[i], ids[i]));
      }
    });
    I.agree_method("dispatch", m);
    // Routing: a stable counting sort of the (token, slot) pairs by global expert, i.e. by
    // (destination, local expert).
    std::vector<int64_t> per_expert(static_cast<size_t>(c.experts) + 1, 0);
    for (int64_t i = 0; i < T * k; ++i) ++per_expert[static_cast<size_t>(ids[i]) + 1];
    for (int64_t e = 0; e < c.experts; ++e)
      per_expert[static_cast<size_t>(e) + 1] += per_expert[static_cast<size_t>(e)];
    std::vector<int64_t> next(per_expert.begin(), per_expert.end() - 1);
    I.pos.assign(static_cast<size_t>(T * k), 0);
    const size_t row = static_cast<size_t>(H) * I.eb;
    // The rows packed in send order for the all-to-all (direct stores them from x instead).
    const bool pack = m != MoeMethod::kDirect;
    I.send.assign(pack ? static_cast<size_t>(T * k) * row : 0, 0);
    const unsigned char* xb = static_cast<const unsigned char*>(x);
    for (int64_t i = 0; i < T * k; ++i) {
      const int64_t p = next[static_cast<size_t>(ids[i])]++;
      I.pos[static_cast<size_t>(i)] = p;
      if (pack) std::memcpy(I.send.data() + static_cast<size_t>(p) * row, xb + static_cast<size_t>(i / k) * row, row);
    }
    // The chunk counts: this rank's [dst][local] row into every rank's matrix, so that every
    // rank sees every destination's total and refuses an overflow alike.
    const uint64_t par = I.calls & 1;
    for (int q = 0; q < I.world; ++q)
      for (int d = 0; d < I.world; ++d) {
        uint64_t* dst = I.counts_at(q, par, I.rank, d);
        for (int64_t e = 0; e < L; ++e)
          dst[e] = static_cast<uint64_t>(per_expert[static_cast<size_t>(d * L + e) + 1] -
                                         per_expert[static_cast<size_t>(d * L + e)]);
      }
    I.b.barrier();  // every rank's counts are in (parity par is rewritten two dispatches on)
    ++I.calls;
    std::vector<uint64_t> sent_rows(static_cast<size_t>(I.world), 0);
    I.got_rows.assign(static_cast<size_t>(I.world), 0);
    const uint64_t BR = kernels::kMoeBlockRows;
    for (int d = 0; d < I.world; ++d) {
      uint64_t total = 0;
      for (int64_t e = 0; e < L; ++e) {
        uint64_t expert_rows = 0;
        for (int s = 0; s < I.world; ++s) {
          const uint64_t n = I.counts_at(I.rank, par, s, d)[e];
          expert_rows += n;
          if (s == I.rank) sent_rows[static_cast<size_t>(d)] += n;
          if (d == I.rank) {
            I.got_rows[static_cast<size_t>(s)] += n;
            I.counts[static_cast<size_t>(s * L + e)] = static_cast<int64_t>(n);
          }
        }
        total += c.expert_blocks ? (expert_rows + BR - 1) / BR * BR : expert_rows;  // blocks: with the padding
      }
      if (d == I.rank) I.extent = static_cast<int64_t>(total);
      if (total > static_cast<uint64_t>(I.capacity)) {
        I.routed = false;
        throw_invalid(
            __FILE__, __LINE__,
            fmt::format("moe: dispatch refused: rank {} would receive {} rows{}, more than its recv_capacity {} "
                        "(raise MoeConfig::recv_capacity; 0 sizes it for any routing)",
                        d, total, c.expert_blocks ? " in expert blocks" : "", I.capacity));
      }
    }
    if (m == MoeMethod::kDirect) {
      // Every rank's places from the same matrix: each pair's row stored straight at its place
      // in its expert's rank's recv -- after the rows from lower ranks, at its send-order place
      // among this rank's rows to that rank.
      auto rows_of = [&](int src, int d) {
        uint64_t n = 0;
        for (int64_t e = 0; e < L; ++e) n += I.counts_at(I.rank, par, src, d)[e];
        return n;
      };
      std::vector<uint64_t> base(static_cast<size_t>(I.world), 0), off(static_cast<size_t>(I.world), 0);
      I.ret_off.assign(static_cast<size_t>(I.world), 0);
      for (int d = 0; d < I.world; ++d) {
        for (int src = 0; src < I.rank; ++src) base[static_cast<size_t>(d)] += rows_of(src, d);
        for (int q = 0; q < d; ++q) off[static_cast<size_t>(d)] += rows_of(I.rank, q);
        for (int q = 0; q < I.rank; ++q) I.ret_off[static_cast<size_t>(d)] += rows_of(d, q);
      }
      // expert_blocks: chunk (s, l)'s first row in rank d's recv -- expert l's block start, then
      // the rows of lower sources -- for this rank's chunks to every d (place[d][l]) and for
      // every source's chunk to this rank (chunk_start[s][l], combine's).
      std::vector<uint64_t> place(static_cast<size_t>(I.world * L), 0);
      if (c.expert_blocks) {
        I.chunk_start.assign(static_cast<size_t>(I.world * L), 0);
        for (int d = 0; d < I.world; ++d) {
          uint64_t block = 0;
          for (int64_t e = 0; e < L; ++e) {
            uint64_t at = block * BR, total = 0;
            for (int src = 0; src < I.world; ++src) {
              const uint64_t n = I.counts_at(I.rank, par, src, d)[e];
              if (src == I.rank) place[static_cast<size_t>(d * L + e)] = at;
              if (d == I.rank) I.chunk_start[static_cast<size_t>(src * L + e)] = at;
              at += n;
              total += n;
            }
            if (d == I.rank)
              for (uint64_t b = block; b < block + (total + BR - 1) / BR; ++b)
                I.groups[static_cast<size_t>(b)] = static_cast<int32_t>(e);
            block += (total + BR - 1) / BR;
          }
          if (d == I.rank)
            for (size_t b = block; b < I.groups.size(); ++b) I.groups[b] = -1;
        }
      }
      for (int64_t i = 0; i < T * k; ++i) {
        const size_t d = static_cast<size_t>(ids[i] / L);
        const int64_t e = ids[i] % L;
        // Rank-major: after the lower ranks' rows, at the pair's send-order place among this
        // rank's rows to d. Blocks: its chunk's place, then its place within the chunk.
        const uint64_t at = c.expert_blocks ? place[d * static_cast<size_t>(L) + static_cast<size_t>(e)] +
                                                  static_cast<uint64_t>(I.pos[static_cast<size_t>(i)]) -
                                                  static_cast<uint64_t>(per_expert[static_cast<size_t>(ids[i])])
                                            : base[d] + static_cast<uint64_t>(I.pos[static_cast<size_t>(i)]) - off[d];
        std::memcpy(I.b.ctx().ptr<unsigned char>(static_cast<int>(d), I.recv_off) + at * row,
                    xb + static_cast<size_t>(i / k) * row, row);
      }
      I.b.barrier();  // every rank's rows are in
      I.rows = 0;
      for (uint64_t n : I.got_rows) I.rows += static_cast<int64_t>(n);
      I.tokens = T;
      I.method = m;
      I.routed = true;
      return;
    }
    // The rows, packed by destination, into every rank's recv (packed by source).
    std::vector<uint64_t> send_counts(static_cast<size_t>(I.world)), recv_counts(static_cast<size_t>(I.world));
    for (int d = 0; d < I.world; ++d)
      send_counts[static_cast<size_t>(d)] = sent_rows[static_cast<size_t>(d)] * static_cast<uint64_t>(H);
    I.coll.all_to_all_v(I.send.data(), send_counts.data(), I.recv_off, I.recv_elems(), recv_counts.data(), c.dtype,
                        I.coll_method(m), opt.stream);
    I.rows = 0;
    for (int s = 0; s < I.world; ++s) {
      WEFT_CHECK(recv_counts[static_cast<size_t>(s)] == I.got_rows[static_cast<size_t>(s)] * static_cast<uint64_t>(H),
                 "moe: the all-to-all's counts disagree with the exchanged chunk counts");
      I.rows += static_cast<int64_t>(I.got_rows[static_cast<size_t>(s)]);
    }
    I.tokens = T;
    I.method = m;
    I.routed = true;
  });
}

const void* MoeDispatchCombine::recv() const { return impl_->b.ctx().local<const unsigned char>(impl_->recv_off); }
const int64_t* MoeDispatchCombine::recv_counts() const { return impl_->gpu ? impl_->d_chunks : impl_->counts.data(); }
const int32_t* MoeDispatchCombine::recv_groups() const {
  if (!impl_->cfg.expert_blocks) return nullptr;
  return impl_->gpu ? impl_->d_groups : impl_->groups.data();
}
int64_t MoeDispatchCombine::recv_rows() const {
  Impl& I = *impl_;
#ifdef WEFT_HAVE_CUDA
  if (I.gpu && I.routed && I.rows < 0) {  // read back once per dispatch (synchronizes the device)
    std::vector<int64_t> n(static_cast<size_t>(I.world * I.local));
    WEFT_CUDA_CHECK(cudaDeviceSynchronize());
    WEFT_CUDA_CHECK(cudaMemcpy(n.data(), I.d_chunks, n.size() * 8, cudaMemcpyDeviceToHost));
    I.rows = 0;
    for (int64_t v : n) I.rows += v;
  }
#endif
  return I.routed ? I.rows : 0;
}

const uint64_t* MoeDispatchCombine::recv_destinations() const {
  return impl_->gpu && impl_->cfg.expert_blocks ? impl_->d_row_dst : nullptr;
}

void MoeDispatchCombine::combine_delivered(const float* weights, void* y, const MoeRunOptions& opt) {
  Impl& I = *impl_;
  I.op.guarded([&] {
    WEFT_REQUIRE(I.gpu && I.cfg.expert_blocks,
                 "moe: combine_delivered takes rows stored at recv_destinations(): GPUs with expert_blocks only");
#ifdef WEFT_HAVE_CUDA
    gpu_combine(I, nullptr, weights, y, opt, I.resolve(opt.method), true);
#else
    (void)weights, (void)y, (void)opt;
#endif
  });
}

void MoeDispatchCombine::combine(const void* expert_out, const float* weights, void* y, const MoeRunOptions& opt) {
  Impl& I = *impl_;
  I.op.guarded([&] {
#ifdef WEFT_HAVE_CUDA
    if (I.gpu) return gpu_combine(I, expert_out, weights, y, opt, I.resolve(opt.method), false);
#endif
    const MoeConfig& c = I.cfg;
    const int64_t k = c.top_k, H = c.hidden;
    const MoeMethod m = I.resolve(opt.method);
    const size_t row = static_cast<size_t>(H) * I.eb;
    int64_t T = 0;
    I.op.checked_everywhere("whether the combine call is valid", [&] {
      WEFT_REQUIRE(I.routed, "moe: combine needs a dispatch before it (its routing)");
      T = I.tokens_of(opt);
      WEFT_REQUIRE(T == I.tokens, fmt::format("moe: combine of {} tokens after a dispatch of {}", T, I.tokens));
      WEFT_REQUIRE(m == I.method,
                   fmt::format("moe: combine by {} after a dispatch by {}", to_string(m), to_string(I.method)));
      if (I.extent > 0) I.op.check_ptr(expert_out, 16, "expert_out");
      if (T > 0) {
        I.op.check_ptr(weights, 4, "weights");
        I.op.check_ptr(y, 16, "y");
        WEFT_REQUIRE(!detail::ranges_overlap(y, static_cast<uint64_t>(T) * row, expert_out,
                                             static_cast<uint64_t>(I.extent) * row),
                     "moe: y overlaps expert_out");
      }
    });
    I.agree_method("combine", m);
    // The return trip: recv's layout is packed by source, i.e. by destination for the rows going
    // back; each rank receives its rows packed by expert rank, which is its send order.
    if (m == MoeMethod::kDirect) {  // each row stored straight at its place in its token's rank's back
      const unsigned char* eo = static_cast<const unsigned char*>(expert_out);
      uint64_t before = 0;
      for (int src = 0; src < I.world; ++src) {
        const uint64_t n = I.got_rows[static_cast<size_t>(src)];
        unsigned char* to = I.b.ctx().ptr<unsigned char>(src, I.back_off) + I.ret_off[static_cast<size_t>(src)] * row;
        if (c.expert_blocks) {  // source src's rows: a chunk in each expert's block, in expert order
          for (int64_t e = 0; e < I.local; ++e) {
            const uint64_t m = static_cast<uint64_t>(I.counts[static_cast<size_t>(src * I.local + e)]);
            if (m) std::memcpy(to, eo + I.chunk_start[static_cast<size_t>(src * I.local + e)] * row, m * row);
            to += m * row;
          }
        } else if (n) {
          std::memcpy(to, eo + before * row, n * row);
        }
        before += n;
      }
      I.b.barrier();  // every rank's rows are back
    } else {
      std::vector<uint64_t> send_counts(static_cast<size_t>(I.world)), recv_counts(static_cast<size_t>(I.world));
      for (int s = 0; s < I.world; ++s)
        send_counts[static_cast<size_t>(s)] = I.got_rows[static_cast<size_t>(s)] * static_cast<uint64_t>(H);
      I.coll.all_to_all_v(expert_out, send_counts.data(), I.back_off, I.back_elems(), recv_counts.data(), c.dtype,
                          I.coll_method(m), opt.stream);
    }
    const unsigned char* back = I.b.ctx().local<const unsigned char>(I.back_off);
    unsigned char* yb = static_cast<unsigned char*>(y);
    std::vector<float> acc(static_cast<size_t>(H));
    for (int64_t t = 0; t < T; ++t) {
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = 0; j < k; ++j) {  // slot order: the same sum on every call
        const float w = weights[t * k + j];
        const unsigned char* r = back + static_cast<size_t>(I.pos[static_cast<size_t>(t * k + j)]) * row;
        for (int64_t h = 0; h < H; ++h) acc[static_cast<size_t>(h)] += w * load(r, h, c.dtype);
      }
      for (int64_t h = 0; h < H; ++h) store(yb + static_cast<size_t>(t) * row, h, acc[static_cast<size_t>(h)], c.dtype);
    }
  });
}

bool MoeDispatchCombine::rows_once() const { return impl_->once; }
const MoeConfig& MoeDispatchCombine::config() const { return impl_->cfg; }
int64_t MoeDispatchCombine::local_experts() const { return impl_->local; }
int64_t MoeDispatchCombine::recv_capacity() const { return impl_->capacity; }

}  // namespace weft::ops
