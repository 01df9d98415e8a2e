// The fused method of ops::GemmOverlap on GPUs (src/ops/gemm_overlap/fused.hpp):
// weft's persistent GEMM (kernels/gemm.hpp) with in-kernel waits and notifies, ordered by
// the plan; data moved by the copy engine. The GEMM runs on all SMs but one; the side
// stream's only kernels (the epoch barrier, gemm_rs's 1-thread piece waits) run on that one,
// so nothing a peer needs queues behind the GEMM. Calls are CUDA-graph replayable: every
// call advances a device-side call counter on the stream, signals are set to it by 8-byte
// copies, the GEMM's waits scale by it, and the epoch guard is a device barrier on the side
// stream (begin_call).
//
// ag_gemm: the plan's transfers (this rank's pushes of A_r chunks into every rank's gathered
//   A) run on a side stream as cudaMemcpyAsync (copy engine), each signal set to the call
//   count after its last transfer. The GEMM takes 128-row blocks in the plan's arrival order
//   (own shard first, read in place); before loading a block it waits for those signals.
// gemm_rs: the copy-engine fold (build_rs_ce): the peers' blocks' tiles first, piece by piece
//   into an outbox, each piece copied to its owner as soon as its tiles are in (a 1-thread
//   wait on a counter the tiles notify); then the own block's tiles, which add the
//   peers' pieces in their epilogue (GEMM sources) after waiting for them, straight into C.
// gemm_ar has no fused method on GPUs (decomposed runs it).
// The per-op State (side stream, events, device tables) is built once by make_state, at the
// op's set-up, and owned by the op (GemmOverlap): destroying the op frees it.
#include "fused.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "weft/core/cuda_check.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/kernels/gemm.hpp"
#include "weft/kernels/gemm_overlap_kernels.hpp"
#include "weft/kernels/runtime_kernels.hpp"
#include "weft/plan/plan.hpp"

namespace weft::ops::fused {
namespace {

template <class T>
std::vector<T> fetch(const T* dev, size_t n) {
  std::vector<T> h(n);
  if (n) WEFT_CUDA_CHECK(cudaMemcpy(h.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

template <class T>
T* upload(const std::vector<T>& h) {
  T* d = nullptr;
  WEFT_CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(h.size(), 1) * sizeof(T)));
  if (!h.empty()) WEFT_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

}  // namespace

// Host copy of the plan rows an op needs, and the GEMM's per-position tables (device).
struct State {
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  std::vector<cudaEvent_t> chunk_ev;  // start/end per transfer (tracing)
  cudaEvent_t gemm_ev = nullptr;      // just before the GEMM (tracing: CUDA-event to globaltimer anchor)
  std::vector<plan::TransferDesc> transfers;
  std::vector<TensorDesc> tensors;
  // ag_gemm, per transfer: whether it is the last of this call to write its signal (then the
  // signal is set to the call count, copied from the device counter, after it).
  std::vector<char> signal_last;
  // ag_gemm: this rank's own rows read in place by the GEMM (GemmArgs::a2), their local copy
  // left out (its signal still written).
  bool own_in_place = false;
  int64_t own_row0 = 0, own_rows = 0;
  int cluster = 1;  // 2 where the order table pairs M-blocks for CTA pairs
  // GEMM tables
  int positions = 0;
  int32_t* order = nullptr;
  int32_t* wait_begin = nullptr;
  int32_t* wait_idx = nullptr;
  uint64_t* wait_val = nullptr;  // per entry: threshold per epoch (the kernel scales it by the call)
  int32_t* wait_peer = nullptr;
  int8_t* dest = nullptr;
  int32_t* notify_idx = nullptr;
  int32_t* notify_rank = nullptr;
  uint64_t* trace = nullptr;
  std::vector<int64_t> chunk_id;  // per pair of chunk_ev: the trace id of that copy
  // gemm_rs, copy-engine fold (build_rs_ce): pieces per peer block, rows per piece, the
  // counters' layout, and whether the GEMM is one launch over all M (else one per block).
  int pieces = 0;
  int64_t piece_rows = 0;
  int recv_base = 0;                     // counters [0, recv_base): local piece counts
  std::vector<uint64_t> piece_notifies;  // per piece: notifies its tiles give (2 per tile)
  int32_t* own_wait_begin = nullptr;     // the own block's waits, per M-block of its launch
  // gemm_rs: the GEMM launches, peers' blocks first.
  struct Launch {
    int owner;      // -1: one launch over all M; else that rank's block only
    int pos_begin;  // first position of the launch in the tables above
    int positions;
  };
  std::vector<Launch> launches;

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() {
    for (void* p : {static_cast<void*>(order), static_cast<void*>(wait_begin), static_cast<void*>(own_wait_begin),
                    static_cast<void*>(wait_idx), static_cast<void*>(wait_val), static_cast<void*>(wait_peer),
                    static_cast<void*>(dest), static_cast<void*>(notify_idx), static_cast<void*>(notify_rank),
                    static_cast<void*>(trace)})
      if (p) cudaFree(p);
    for (cudaEvent_t e : chunk_ev) cudaEventDestroy(e);
    for (cudaEvent_t e : {fork, join, gemm_ev})
      if (e) cudaEventDestroy(e);
    if (side) cudaStreamDestroy(side);
  }
};

namespace {

uint64_t slot_off(const FusedArgs& A, int idx) { return A.counters.at(static_cast<uint32_t>(idx)); }

// Positions over row blocks `blocks` (in that order) and every N-block: groups of `group`
// consecutive row blocks (8 for single CTAs; 16, even, for CTA pairs, so positions 2q, 2q+1
// are consecutive blocks of one N-block), N-blocks outer, row blocks inner, so a wave of CTAs
// shares B tiles in L2 (as the plain GEMM's raster does).
// `ends` (optional): segment ends in `blocks` (ascending, the last = blocks.size()); a group
// never spans two segments (blocks that arrive at different times: a group mixing them would
// put tiles that wait into the first wave).
template <class F>
void grouped(const std::vector<int>& blocks, int tiles_n, F&& emit, size_t group = 8, std::vector<size_t> ends = {}) {
  if (ends.empty()) ends.push_back(blocks.size());
  size_t begin = 0;
  for (size_t end : ends) {
    for (size_t g = begin; g < end; g += group)
      for (int nb = 0; nb < tiles_n; ++nb)
        for (size_t i = g; i < std::min(end, g + group); ++i) emit(blocks[i], nb, i);
    begin = end;
  }
}

int gemm_ctas() {
  // One SM stays free for what the copy streams may run as kernels (a copy the driver does
  // with a kernel could not start while every SM holds a waiting GEMM CTA).
  return std::max(1, kernels::sm_count() - 1);
}

// The GEMM both ops run: this rank's B and the call's shape, single CTAs (the tables are
// built for them) on all SMs but one (gemm_ctas).
kernels::GemmArgs gemm_args(const FusedArgs& A, const void* a, int64_t lda) {
  kernels::GemmArgs g;
  g.m = static_cast<int>(A.m);
  g.n = static_cast<int>(A.n);
  g.k = static_cast<int>(A.k_local);
  g.type = A.dtype == dev::DType::kBF16 ? kernels::GemmType::kBF16 : kernels::GemmType::kF16;
  g.b_layout = A.b_layout == 0 ? kernels::GemmBLayout::kNK : kernels::GemmBLayout::kKN;
  g.a = a;
  g.lda = lda;
  g.b = A.b;
  g.ldb = A.b_layout == 0 ? A.k_local : A.n;
  g.ldc = A.n;
  g.cluster_m = 1;
  g.ctas = gemm_ctas();
  return g;
}

// The schedule, waits, destinations and notifies from `st` for the launch whose positions
// start at `pos_begin` (wait_begin entries are absolute offsets into the wait tables, which
// are shared); waits and notifies on `sig_off`. Thresholds scale by this rank's call counter
// in device memory (A.epoch_off, advanced on the stream by every call: CUDA-graph replays
// wait for new data).
kernels::GemmHooks gemm_hooks(const FusedArgs& A, const State& st, uint64_t sig_off, int pos_begin = 0) {
  auto from = [pos_begin](auto* table) { return table ? table + pos_begin : table; };
  kernels::GemmHooks h;
  h.ctx = A.ctx;
  h.op = A.op == Op::kAgGemm ? dev::op_tag("ag_gemm") : dev::op_tag("gemm_rs");  // named by a timeout
  h.order = from(st.order);
  h.wait_begin = from(st.wait_begin);
  h.wait_idx = st.wait_idx;
  h.wait_val = st.wait_val;
  h.wait_peer = st.wait_peer;
  h.wait_off = sig_off;
  h.wait_scale_dev = A.ctx.ptr<const uint64_t>(A.ctx.rank, A.epoch_off);
  h.dest = from(st.dest);
  h.notify_idx = from(st.notify_idx);
  h.notify_rank = from(st.notify_rank);
  h.notify_off = sig_off;
  h.trace = A.trace ? st.trace + 3 * static_cast<size_t>(pos_begin) : nullptr;
  return h;
}

// The tables every GEMM launch of an op reads, uploaded once per op.
void upload_schedule(State& st, const std::vector<int32_t>& order, const std::vector<int32_t>& wbegin,
                     const std::vector<int32_t>& widx, const std::vector<int32_t>& wpeer,
                     const std::vector<uint64_t>& wait_per_epoch) {
  st.positions = static_cast<int>(order.size());
  st.order = upload(order);
  st.wait_begin = upload(wbegin);
  st.wait_idx = upload(widx);
  st.wait_peer = upload(wpeer);
  st.wait_val = upload(wait_per_epoch);
  st.trace = upload(std::vector<uint64_t>(3 * order.size(), 0));
}

void launch_gemm(const kernels::GemmArgs& g, const kernels::GemmHooks& h, cudaStream_t s, const char* op) {
  const char* why = nullptr;
  const cudaError_t err = kernels::gemm(g, h, s, &why);
  if (err == cudaErrorInvalidValue && why) throw InvalidArgument(fmt::format("fused {}: {}", op, why));
  WEFT_CUDA_CHECK(err);
}

// The start of a replayable call (ag_gemm, gemm_rs's copy-engine fold): this rank's call
// counter +1 on the stream (returns its address), then the side stream forks and runs the
// epoch guard -- a device barrier, so no rank writes into a peer's buffers before that peer
// has finished the previous call (its side stream forks after its GEMM of that call). The
// barrier takes one CTA on the SM the GEMM leaves free (gemm_ctas).
const uint64_t* begin_call(const FusedArgs& A, State& st, cudaStream_t s) {
  WEFT_CUDA_CHECK(kernels::overlap_epoch_bump(A.ctx, A.epoch_off, s));
  WEFT_CUDA_CHECK(cudaEventRecord(st.fork, s));
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(st.side, st.fork, 0));
  if (A.ctx.world > 1) WEFT_CUDA_CHECK(kernels::device_barrier(A.ctx, A.barrier, st.side));
  return A.ctx.ptr<const uint64_t>(A.ctx.rank, A.epoch_off);
}

// Sets signal `off` on rank `peer` to this rank's call count, in stream order after the
// transfers it guards: an 8-byte copy from the device counter (copy engine: no SM needed,
// and a graph replay writes the new count). A 1-thread kernel adding 1 instead measured the
// same (docs/gemm_overlap.md).
void set_count(const FusedArgs& A, int peer, uint64_t off, const uint64_t* epoch, cudaStream_t q) {
  WEFT_CUDA_CHECK(
      cudaMemcpyAsync(A.ctx.ptr<uint64_t>(peer, off), epoch, sizeof(uint64_t), cudaMemcpyDeviceToDevice, q));
}

// ---- ag_gemm ---------------------------------------------------------------------------
void build_ag(const FusedArgs& A, State& st) {
  const int world = A.ctx.world;
  const int tiles_m = kernels::gemm_tiles_m(static_cast<int>(A.m));
  const int tiles_n = kernels::gemm_tiles_n(static_cast<int>(A.n));
  WEFT_REQUIRE(
      A.tile_rows == kernels::kGemmTileM,
      fmt::format("fused ag_gemm: the plan's tile rows ({}) must be the GEMM's {}", A.tile_rows, kernels::kGemmTileM));
  st.transfers = fetch(A.transfers, static_cast<size_t>(A.num_transfers));
  for (const auto& t : st.transfers) {
    WEFT_REQUIRE(t.wait_count == 0 && (t.kind == static_cast<int32_t>(plan::Kind::kPush) ||
                                       t.kind == static_cast<int32_t>(plan::Kind::kCopy)),
                 fmt::format("fused ag_gemm runs push/copy transfers without waits (direct all-gather); chunk {} "
                             "is not one",
                             t.chunk));
    WEFT_REQUIRE(t.src_rank == A.ctx.rank,
                 fmt::format("fused ag_gemm: chunk {} is read from rank {}", t.chunk, t.src_rank));
  }
  // Own rows in place: where the plan copies them from the input into the
  // gathered A and they sit on whole 128-row blocks (a2's rule). Measured: that device-local
  // copy is an SM kernel the GEMM would wait behind (docs/gemm_overlap.md).
  {
    const int me = A.ctx.rank;
    st.own_rows = A.m / world;
    st.own_row0 = me * st.own_rows;
    bool ok = A.m % world == 0 && st.own_row0 % kernels::kGemmTileM == 0 &&
              (st.own_rows % kernels::kGemmTileM == 0 || st.own_row0 + st.own_rows == A.m);
    for (const auto& t : st.transfers)
      if (t.dst_rank == me)
        ok = ok && t.src_tensor == A.input_tensor && t.dst_tensor == A.gemm_tensor && t.dst_row >= st.own_row0 &&
             t.dst_row + t.rows <= st.own_row0 + st.own_rows;
    st.own_in_place = ok;
  }
  // Signals hold the call count (copied from the device counter A.epoch_off after the last
  // transfer of the call that writes them: graph replays write new values), so a wait is
  // "signal >= call": every transfer of a signal must run on one stream (this rank's own
  // rows on the main stream, the pushes on the side stream), in table order.
  {
    const int me = A.ctx.rank;
    std::map<std::pair<int, int>, size_t> last;
    std::map<std::pair<int, int>, bool> own;
    for (size_t i = 0; i < st.transfers.size(); ++i) {
      const auto& t = st.transfers[i];
      if (t.signal < 0) continue;
      const std::pair<int, int> key{t.signal_rank, t.signal};
      const bool mine = t.dst_rank == me;
      WEFT_REQUIRE(!own.count(key) || own[key] == mine,
                   fmt::format("fused ag_gemm: signal {} is written by local and remote transfers", t.signal));
      own[key] = mine;
      last[key] = i;
    }
    st.signal_last.assign(st.transfers.size(), 0);
    for (const auto& [key, i] : last) st.signal_last[i] = 1;
  }
  // GEMM order: M-blocks in the order the plan's tiles first name them; per block, the union
  // of its tiles' waits (highest threshold per signal).
  const auto tiles = fetch(A.tiles, static_cast<size_t>(A.num_tiles));
  int32_t max_wait = 0;
  for (const auto& t : tiles) max_wait = std::max(max_wait, t.wait_begin + t.wait_count);
  const auto waits = fetch(A.tile_waits, static_cast<size_t>(max_wait));
  const int32_t nsig = static_cast<int32_t>(A.signals.count);
  const auto producer = fetch(A.signal_producer, static_cast<size_t>(nsig));
  std::vector<int> seen(tiles_m, 0);
  std::vector<std::map<int32_t, int64_t>> block_waits(tiles_m);
  std::vector<int> block_order;
  for (const auto& t : tiles) {
    WEFT_REQUIRE(t.m >= 0 && t.m < tiles_m, fmt::format("fused ag_gemm: tile row block {} out of range", t.m));
    if (!seen[t.m]) {
      seen[t.m] = 1;
      block_order.push_back(t.m);
    }
    for (int i = t.wait_begin; i < t.wait_begin + t.wait_count; ++i) {
      auto& th = block_waits[t.m][waits[i].signal];
      th = std::max(th, waits[i].threshold);
    }
  }
  WEFT_REQUIRE(static_cast<int>(block_order.size()) == tiles_m, "fused ag_gemm: the plan's tiles miss row blocks");
  // Own rows read in place: nothing moves them, so the GEMM waits for none of their signals
  // (nor does the main stream set them: an 8-byte copy there delayed the GEMM in a trace,
  // docs/gemm_overlap.md).
  std::set<int32_t> local_sigs;
  if (st.own_in_place)
    for (const auto& t : st.transfers)
      if (t.dst_rank == A.ctx.rank && t.signal >= 0) local_sigs.insert(t.signal);
  std::vector<int32_t> order, wbegin{0}, widx, wpeer;
  std::vector<uint64_t> wait_per_epoch;
  auto emit = [&](int mb, int nb, size_t) {
    order.push_back(mb * tiles_n + nb);
    if (mb < tiles_m)  // a phantom partner waits for nothing
      for (auto [sig, th] : block_waits[mb]) {
        if (th <= 0 || local_sigs.count(sig)) continue;
        widx.push_back(sig);
        wait_per_epoch.push_back(1);  // the signal holds the call count once all its transfers ran
        wpeer.push_back(sig < nsig ? producer[sig] : -1);
      }
    wbegin.push_back(static_cast<int32_t>(widx.size()));
  };
  // CTA pairs (B multicast to two M-blocks of one N-block; the plain GEMM's default, measured
  // faster under load: docs/gemm.md) on consecutive blocks of the arrival order, an odd count
  // padded with a phantom block; groups of 16 blocks, N-blocks outer.
  st.cluster = 2;
  // Segments: runs of blocks that wait for the same peers (this rank's own rows, then each
  // peer's shard as the plan orders them). Grouping across a boundary put the peer's tiles into
  // the first wave, waiting for data, when a shard is smaller than a group (e.g. 8 own blocks,
  // groups of 16: docs/gemm_overlap.md). With CTA
  // pairs a segment ends on an even position (a pair never spans two M-block sets of
  // different arrival, except the one straddling an odd boundary).
  auto segment_ends = [&](const std::vector<int>& blocks, size_t align) {
    std::vector<size_t> ends;
    auto peers_of = [&](int mb) {
      std::set<int> p;
      if (mb < tiles_m)
        for (auto [sig, th] : block_waits[mb])
          if (th > 0 && !local_sigs.count(sig)) p.insert(sig < nsig ? producer[sig] : -1);
      return p;
    };
    for (size_t i = 1; i < blocks.size(); ++i)
      if (peers_of(blocks[i]) != peers_of(blocks[i - 1])) {
        const size_t e = (i + align - 1) / align * align;
        if (e < blocks.size() && (ends.empty() || e > ends.back())) ends.push_back(e);
      }
    ends.push_back(blocks.size());
    return ends;
  };
  std::vector<int> blocks = block_order;
  if (blocks.size() % 2) blocks.push_back(tiles_m);  // the phantom
  grouped(blocks, tiles_n, emit, 16, segment_ends(blocks, 2));
  upload_schedule(st, order, wbegin, widx, wpeer, wait_per_epoch);
}

void run_ag(const FusedArgs& A, State& st, cudaStream_t s) {
  const int me = A.ctx.rank;
  const size_t eb = A.dtype == dev::DType::kF32 ? 4 : 2;
  const uint64_t* epoch = begin_call(A, st, s);
  const TensorDesc& in = st.tensors[static_cast<size_t>(A.input_tensor)];
  // This rank's own rows are copied on the main stream before the GEMM (a device-local copy
  // may run as a kernel: it must not wait behind the GEMM's CTAs); peers' on the side stream.
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < st.transfers.size(); ++i) {
      const auto& t = st.transfers[i];
      if ((t.dst_rank == me) != (pass == 0)) continue;
      cudaStream_t q = pass == 0 ? s : st.side;
      const TensorDesc& dt = st.tensors[static_cast<size_t>(t.dst_tensor)];
      WEFT_REQUIRE(t.cols == dt.cols && t.src_col == 0 && t.dst_col == 0,
                   fmt::format("fused ag_gemm: chunk {} is not whole rows", t.chunk));
      if (pass == 0 && st.own_in_place) continue;  // read in place, waited for by nobody
      const char* src = t.src_tensor == A.input_tensor
                            ? static_cast<const char*>(A.a) + static_cast<size_t>(t.src_row * in.cols) * eb
                            : A.ctx.ptr<const char>(me, st.tensors[static_cast<size_t>(t.src_tensor)].offset) +
                                  static_cast<size_t>(t.src_row * in.cols) * eb;
      char* dst = A.ctx.ptr<char>(t.dst_rank, dt.offset) + static_cast<size_t>(t.dst_row * dt.cols) * eb;
      if (A.trace) WEFT_CUDA_CHECK(cudaEventRecord(st.chunk_ev[2 * i], q));
      WEFT_CUDA_CHECK(
          cudaMemcpyAsync(dst, src, static_cast<size_t>(t.rows * t.cols) * eb, cudaMemcpyDeviceToDevice, q));
      if (t.signal >= 0 && st.signal_last[i])
        set_count(A, t.signal_rank, A.signals.at(static_cast<uint32_t>(t.signal)), epoch, q);
      if (A.trace) WEFT_CUDA_CHECK(cudaEventRecord(st.chunk_ev[2 * i + 1], q));
    }
  WEFT_CUDA_CHECK(cudaEventRecord(st.join, st.side));
  // The GEMM on the gathered A, waiting per row block.
  const TensorDesc& ga = st.tensors[static_cast<size_t>(A.gemm_tensor)];
  auto g = gemm_args(A, A.ctx.ptr<const char>(me, ga.offset), ga.cols);
  g.c[0] = A.c;
  g.cluster_m = st.cluster;
  if (st.own_in_place) {
    g.a2 = A.a;
    g.a2_row0 = st.own_row0;
    g.a2_rows = st.own_rows;
  }
  if (A.trace) WEFT_CUDA_CHECK(cudaEventRecord(st.gemm_ev, s));
  launch_gemm(g, gemm_hooks(A, st, A.signals.offset), s, "ag_gemm");
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(s, st.join, 0));
}

// ---- gemm_rs: the copy-engine fold ---------------------------------------------------------
// One persistent GEMM per call (or one launch per rank's block where a block is not whole
// 128-row GEMM blocks). Tiles of the peers' blocks come first (peer me+1's block first, as
// the decomposed method), in `pieces` pieces per block, each piece's tiles before the next's;
// they store this rank's partial rows into the plan's partial-product tensor (an outbox) and
// notify a local counter per piece. The side stream waits for a piece's count, copies the piece into its owner's
// staging slot `me` (copy engine) and sets the owner's signal for (me, piece) to the call count (set_count). Then the
// own block's tiles: their main loops run at once; a few k-blocks before its epilogue each tile waits for every peer's
// piece of its rows and adds the peers' slots in the epilogue (GEMM sources: fp32, one rounding), storing straight into
// C. No reduce pass, no kernel launch between GEMMs; what the peers need runs on the copy engine and on the one SM the
// GEMM leaves free (the barrier of begin_call, the 1-thread piece waits). Graph-replayable: the waits and signals use
// the device call counter. Counters: [0, (world-1) * pieces) local piece counts; [recv_base, + world * pieces)
// "rank q's piece j is in my slot q".
int pick_pieces(int blocks, int tiles_n, int ctas) {
  if (const int64_t forced = tunable_value(tunables::kFusedRsPieces); forced > 0)
    return static_cast<int>(std::min<int64_t>(blocks, forced));
  // Pieces of >= 8 M-blocks (a wave of CTAs then reads few B tiles: the raster's L2 reuse),
  // at most 8, dividing the block's M-blocks evenly; one where a block is about a wave.
  int want = std::clamp(blocks / 8, 1, 8);
  if (blocks * tiles_n <= ctas) want = 1;
  while (want > 1 && blocks % want != 0) --want;
  return want;
}

void build_rs_ce(const FusedArgs& A, State& st) {
  const int me = A.ctx.rank, world = A.ctx.world;
  constexpr int64_t TM = kernels::kGemmTileM;
  WEFT_REQUIRE(A.m % world == 0, fmt::format("fused gemm_rs: M = {} is not a multiple of {} ranks", A.m, world));
  WEFT_REQUIRE(A.stage_off != 0 || world == 1, "fused gemm_rs: the op gave no staging slots");
  const TensorDesc& outbox = st.tensors[static_cast<size_t>(A.input_tensor)];
  WEFT_REQUIRE(outbox.rows == A.m && outbox.cols == A.n, "fused gemm_rs: the plan's partial product is not [M x N]");
  const int64_t ms = A.m / world;
  const int tiles_n = kernels::gemm_tiles_n(static_cast<int>(A.n));
  const int blocks = static_cast<int>((ms + TM - 1) / TM);  // GEMM M-blocks per rank's block
  const bool single = ms % TM == 0;
  st.pieces = pick_pieces(blocks, tiles_n, gemm_ctas());
  const int bpp = (blocks + st.pieces - 1) / st.pieces;  // M-blocks per piece
  st.pieces = (blocks + bpp - 1) / bpp;
  st.piece_rows = bpp * TM;
  st.recv_base = (world - 1) * st.pieces;
  const int need = st.recv_base + world * st.pieces;
  WEFT_REQUIRE(static_cast<int64_t>(A.counters.count) >= need,
               fmt::format("fused gemm_rs: {} counters, need {}", A.counters.count, need));
  // CTA pairs (positions 2q, 2q+1: consecutive M-blocks of one N-block) where every piece has
  // an even number of M-blocks and one launch runs everything.
  st.cluster = single && bpp % 2 == 0 && blocks % bpp == 0 ? 2 : 1;
  std::vector<int32_t> order, nidx, nrank;
  std::vector<int8_t> dest;
  st.launches.clear();
  st.piece_notifies.clear();
  for (int j = 0; j < st.pieces; ++j)  // each of a peer block's pieces: its tiles, 2 notifies each
    st.piece_notifies.push_back(static_cast<uint64_t>(kernels::kGemmNotifyPerTile) * tiles_n *
                                static_cast<uint64_t>(std::min(blocks, (j + 1) * bpp) - j * bpp));
  for (int d = 1; d <= world; ++d) {
    const int p = (me + d) % world;  // d == world: this rank's own block, last
    const bool own = p == me;
    const int first = single ? p * blocks : 0;  // global M-block of the block's first row
    if (!single) st.launches.push_back({p, static_cast<int>(order.size()), 0});
    for (int j = 0; j < st.pieces; ++j) {
      std::vector<int> bl;
      for (int b = j * bpp; b < std::min(blocks, (j + 1) * bpp); ++b) bl.push_back(first + b);
      grouped(
          bl, tiles_n,
          [&](int mb, int nb, size_t) {
            order.push_back(mb * tiles_n + nb);
            dest.push_back(static_cast<int8_t>(own || !single ? 0 : 1));
            nidx.push_back(own ? -1 : (d - 1) * st.pieces + j);
            nrank.push_back(me);
          },
          std::min<size_t>(bl.size(), 16));
    }
    if (!single) st.launches.back().positions = static_cast<int>(order.size()) - st.launches.back().pos_begin;
  }
  if (single) st.launches.push_back({-1, 0, static_cast<int>(order.size())});
  // The own block's waits, per M-block of its launch (global M-blocks when single).
  const int launch_blocks = single ? kernels::gemm_tiles_m(static_cast<int>(A.m)) : blocks;
  const int own_first = single ? me * blocks : 0;
  std::vector<int32_t> wbegin{0}, widx, wpeer;
  std::vector<uint64_t> wval;
  for (int mb = 0; mb < launch_blocks; ++mb) {
    if (mb >= own_first && mb < own_first + blocks)
      for (int q = 0; q < world; ++q)
        if (q != me) {
          widx.push_back(st.recv_base + q * st.pieces + (mb - own_first) / bpp);
          wval.push_back(1);  // >= the call count
          wpeer.push_back(q);
        }
    wbegin.push_back(static_cast<int32_t>(widx.size()));
  }
  for (const auto& l : st.launches) {
    const int64_t m = l.owner < 0 ? A.m : ms;
    const int kernel_positions = kernels::gemm_positions(static_cast<int>(m), static_cast<int>(A.n), st.cluster);
    WEFT_REQUIRE(l.positions == kernel_positions,
                 fmt::format("fused gemm_rs: a launch's table has {} positions, the GEMM runs {} (M = {}, N = {})",
                             l.positions, kernel_positions, m, A.n));
  }
  upload_schedule(st, order, {0}, widx, wpeer, wval);
  st.own_wait_begin = upload(wbegin);
  st.dest = upload(dest);
  st.notify_idx = upload(nidx);
  st.notify_rank = upload(nrank);
  for (int d = 1; d < world; ++d)
    for (int j = 0; j < st.pieces; ++j) st.chunk_id.push_back((d - 1) * st.pieces + j);
}

void run_rs_ce(const FusedArgs& A, State& st, cudaStream_t s) {
  const int me = A.ctx.rank, world = A.ctx.world;
  const size_t eb = 2;
  const int64_t ms = A.m / world;
  const uint64_t slot_bytes = static_cast<uint64_t>(ms * A.n) * eb;
  const TensorDesc& outbox_t = st.tensors[static_cast<size_t>(A.input_tensor)];
  char* outbox = A.ctx.ptr<char>(me, outbox_t.offset);
  const uint64_t* epoch = begin_call(A, st, s);
  // Side stream (after the epoch guard): each piece to its owner as soon as its tiles are in.
  for (int d = 1; d < world; ++d) {
    const int p = (me + d) % world;
    for (int j = 0; j < st.pieces; ++j) {
      const size_t ci = static_cast<size_t>((d - 1) * st.pieces + j);
      // The piece's tiles are in: its counter >= notifies per call x the call count. A 1-thread
      // kernel on the SM the GEMM leaves free, not a stream memory wait: it has the backend's
      // deadline (a GEMM that failed cannot leave this stream, and the caller, hanging).
      kernels::OverlapWaits w{};
      w.count = 1;
      w.from[0] = me;
      w.off[0] = slot_off(A, static_cast<int>(ci));
      w.threshold[0] = static_cast<int64_t>(st.piece_notifies[static_cast<size_t>(j)]);
      WEFT_CUDA_CHECK(kernels::overlap_wait(A.ctx, A.epoch_off, w, st.side));
      const int64_t r0 = j * st.piece_rows, r1 = std::min(ms, r0 + st.piece_rows);
      if (A.trace) WEFT_CUDA_CHECK(cudaEventRecord(st.chunk_ev[2 * ci], st.side));
      WEFT_CUDA_CHECK(cudaMemcpyAsync(A.ctx.ptr<char>(p, A.stage_off) + slot_bytes * static_cast<uint64_t>(me) +
                                          static_cast<uint64_t>(r0 * A.n) * eb,
                                      outbox + static_cast<uint64_t>((p * ms + r0) * A.n) * eb,
                                      static_cast<size_t>((r1 - r0) * A.n) * eb, cudaMemcpyDeviceToDevice, st.side));
      set_count(A, p, slot_off(A, st.recv_base + me * st.pieces + j), epoch, st.side);
      if (A.trace) WEFT_CUDA_CHECK(cudaEventRecord(st.chunk_ev[2 * ci + 1], st.side));
    }
  }
  WEFT_CUDA_CHECK(cudaEventRecord(st.join, st.side));
  if (A.trace) WEFT_CUDA_CHECK(cudaEventRecord(st.gemm_ev, s));
  const char* stage = A.ctx.ptr<const char>(me, A.stage_off);
  auto own_sources = [&](kernels::GemmArgs& g, int64_t row0) {
    for (int q = 0; q < world; ++q)
      if (q != me) g.src[g.num_src++] = stage + slot_bytes * static_cast<uint64_t>(q);
    g.ld_src = A.n;
    g.src_row0 = row0;
    g.src_rows = ms;
  };
  // The piece counts given at k-block 4 of a CTA's next tile, not right after the stores (tid
  // 0's wait for their completion held the next tile's first WGMMA: docs/gemm_overlap.md,
  // "Variants removed from the code"); a copy then starts a few microseconds later.
  for (const auto& l : st.launches) {
    kernels::GemmHooks h = gemm_hooks(A, st, A.counters.offset, l.pos_begin);
    h.wait_begin = nullptr;
    h.wait_per_mblock = true;
    h.wait_at_epilogue = true;
    h.notify_deferred = true;
    h.notify_flush_kb = 4;
    kernels::GemmArgs g;
    if (l.owner < 0) {  // one launch: dest 0 = C (this rank's rows), dest 1 = the outbox (all rows)
      g = gemm_args(A, A.a, A.k_local);
      g.cluster_m = st.cluster;
      g.num_dests = 2;
      g.c[0] = A.c;
      g.c_row0[0] = me * ms;
      g.c_rows[0] = ms;
      g.c[1] = outbox;
      g.c_row0[1] = 0;
      g.c_rows[1] = A.m;
      if (world > 1) {
        own_sources(g, me * ms);
        h.wait_begin = st.own_wait_begin;
      }
    } else {  // rank `owner`'s block alone (A and the destination offset to its rows)
      g = gemm_args(A, static_cast<const char*>(A.a) + static_cast<size_t>(l.owner * ms * A.k_local) * eb, A.k_local);
      g.m = static_cast<int>(ms);
      g.c[0] = l.owner == me ? A.c : outbox + static_cast<size_t>(l.owner * ms * A.n) * eb;
      if (l.owner == me && world > 1) {
        own_sources(g, 0);
        h.wait_begin = st.own_wait_begin;
      }
    }
    launch_gemm(g, h, s, "gemm_rs");
  }
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(s, st.join, 0));
}

// Converts the GEMM's per-position globaltimer stamps and the side stream's CUDA events into
// TraceRecords (events are placed on the globaltimer axis through the GEMM launch event and
// the first tile's start: an offset, good to a few microseconds).
void collect_trace(const FusedArgs& A, State& st, cudaStream_t s) {
  WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
  const auto tr = fetch(st.trace, 3 * static_cast<size_t>(st.positions));
  std::vector<TraceRecord> recs;
  uint64_t first = ~0ull;
  for (int p = 0; p < st.positions; ++p) {
    if (!tr[3 * p] || !tr[3 * p + 1]) continue;  // not run, or a pair's phantom
    first = std::min(first, tr[3 * p]);
    recs.push_back({0, static_cast<int32_t>(tr[3 * p + 2]), p, tr[3 * p], tr[3 * p + 1]});
  }
  for (size_t i = 0; i < st.chunk_id.size() && first != ~0ull; ++i) {
    float t0 = 0, t1 = 0;
    if (st.chunk_id[i] < 0 || cudaEventElapsedTime(&t0, st.gemm_ev, st.chunk_ev[2 * i]) != cudaSuccess ||
        cudaEventElapsedTime(&t1, st.gemm_ev, st.chunk_ev[2 * i + 1]) != cudaSuccess)
      continue;
    const auto at = [&](float ms) {
      return static_cast<uint64_t>(static_cast<int64_t>(first) + static_cast<int64_t>(ms * 1e6));
    };
    recs.push_back({1, -1, st.chunk_id[i], at(t0), at(t1)});
  }
  const uint32_t n = static_cast<uint32_t>(std::min<size_t>(recs.size(), A.trace_capacity));
  WEFT_CUDA_CHECK(cudaMemcpy(A.trace, recs.data(), n * sizeof(TraceRecord), cudaMemcpyHostToDevice));
  WEFT_CUDA_CHECK(cudaMemcpy(A.trace_count, &n, sizeof n, cudaMemcpyHostToDevice));
}

}  // namespace

bool fused_available() { return kernels::gemm_sm90_available(); }

bool fused_supports(Op op) { return op != Op::kGemmAr; }

void StateDeleter::operator()(State* st) const { delete st; }

StatePtr make_state(const FusedArgs& A) {
  if (!fused_available()) throw Error("fused method: needs an sm_90 GPU (weft's GEMM)");
  if (!fused_supports(A.op))
    throw Error("fused method: ag_gemm and gemm_rs only (gemm_ar runs decomposed; docs/gemm_overlap.md)");
  WEFT_REQUIRE(A.dtype == dev::DType::kBF16 || A.dtype == dev::DType::kF16, "fused method: bf16 or f16 only");
  StatePtr st(new State);
  st->tensors = fetch(A.tensors, static_cast<size_t>(A.num_tensors));
  WEFT_CUDA_CHECK(cudaStreamCreateWithFlags(&st->side, cudaStreamNonBlocking));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&st->fork, cudaEventDisableTiming));
  WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&st->join, cudaEventDisableTiming));
  WEFT_CUDA_CHECK(cudaEventCreate(&st->gemm_ev));
  if (A.op == Op::kAgGemm) {
    build_ag(A, *st);
    for (const auto& t : st->transfers)  // -1: own rows read in place, never copied
      st->chunk_id.push_back(st->own_in_place && t.dst_rank == A.ctx.rank ? -1 : t.chunk);
  } else {
    build_rs_ce(A, *st);
  }
  st->chunk_ev.resize(2 * st->chunk_id.size());
  for (auto& ev : st->chunk_ev) WEFT_CUDA_CHECK(cudaEventCreate(&ev));
  return st;
}

bool own_rows_in_place(const State& st) { return st.own_in_place; }

void run_fused(const FusedArgs& A, State& st) {
  auto s = static_cast<cudaStream_t>(A.stream);
  if (A.op == Op::kAgGemm)
    run_ag(A, st, s);
  else
    run_rs_ce(A, st, s);
  if (A.trace) collect_trace(A, st, s);
}

}  // namespace weft::ops::fused
