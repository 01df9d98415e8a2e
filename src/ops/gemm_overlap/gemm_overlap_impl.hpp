// Private to src/ops/gemm_overlap: the GEMM + communication ops in the op skeleton
// (docs/architecture.md, "Adding an op"; docs/gemm_overlap.md, "Code layout"):
//  - the op (gemm_overlap.cpp: GemmOverlap::Impl): argument checks, the method choice (`auto`:
//    the cost model, model.cpp, and the tuning cache), one object per method, dispatch;
//  - GemmOpContext (context.cpp): what every method of the op reads or shares, written once:
//    the configuration and the per-rank shapes, the decisions the methods follow (chunks, the
//    gemm_rs fold), cuBLAS (LtGemm), the op's scratch, the epoch word and barrier of the heap,
//    the trace, and the stream-level helpers several methods call (gemm, signal, put_count,
//    copy2d, ...);
//  - one class per method behind GemmMethodImpl, each owning its state and freeing it in its
//    destructor: baseline.cpp (BaselineGpu: NCCL + cuBLAS; BaselineHost: the reference
//    collectives + a CPU GEMM), decomposed.cpp (DecomposedGpu: per-chunk cuBLAS GEMMs beside
//    copy-engine transfers), fused_method.cpp (FusedGpu: one persistent kernel, fused.cpp),
//    host_plan.cpp (HostPlanMethod: decomposed and fused on the host backend, the plan
//    executor).
// Every method's state is set up when the op is constructed (collective: symmetric heap
// allocations are matched across ranks by name, size and order), never inside a CUDA graph
// capture.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../common/op_base.hpp"
#include "plan.hpp"
#include "weft/ops/collectives.hpp"
#include "weft/ops/gemm_overlap.hpp"
#include "weft/ops/gemm_overlap_model.hpp"

#ifdef WEFT_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "fused.hpp"
#include "lt_gemm.hpp"
#include "weft/core/cuda_check.hpp"
#include "weft/kernels/gemm.hpp"
#include "weft/kernels/gemm_overlap_kernels.hpp"
#endif

namespace weft::ops::detail {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One method of the op. The op has checked a, b, c (shapes, alignment, overlap) and resolved
// `auto`. GPU: enqueue one call on `stream` (a cudaStream_t); host: run it (stream unused).
// `m`: the call's M. Every method runs its context's M (cfg.m: the tables it built); the
// baseline runs any M up to it (an M the op did not prepare). `tracing`: append this call's
// events to GemmOpContext::trace (cleared by the op).
class GemmMethodImpl {
 public:
  virtual ~GemmMethodImpl() = default;
  virtual void run(int64_t m, const void* a, const void* b, void* c, void* stream, bool tracing) = 0;
  // ag_gemm, after run() of M rows with the same A: leaves that call's gathered A [M x K_local]
  // in dst (GemmRunOptions::gathered_a), in the stream's order.
  virtual void keep_gathered(int64_t m, const void* a, void* dst, void* stream) = 0;
  // Set by the op for the next run() only: where baseline gathers A (dst of keep_gathered).
  void* gather_into = nullptr;
};

#ifdef WEFT_HAVE_CUDA
struct TimedEvent {
  cudaEvent_t start = nullptr, end = nullptr;
  TraceEvent meta;
};

inline char* at(const void* p, uint64_t bytes) { return static_cast<char*>(const_cast<void*>(p)) + bytes; }

// Host tables packed into one device allocation, each 16-byte aligned: add() them in order,
// upload() once (the caller frees the allocation), then table(dev, i) is the i-th one there.
struct TableBlob {
  std::vector<char> bytes;
  std::vector<size_t> offs;
  template <class V>
  void add(const V& v) {
    const size_t o = (bytes.size() + 15) & ~size_t{15}, n = v.size() * sizeof(v[0]);
    bytes.resize(o + n);
    if (n) std::memcpy(bytes.data() + o, v.data(), n);
    offs.push_back(o);
  }
  void* upload() const {
    void* d = nullptr;
    WEFT_CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(bytes.size(), 16)));
    WEFT_CUDA_CHECK(cudaMemcpy(d, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
    return d;
  }
  template <class T>
  const T* table(void* dev, int i) const {
    return reinterpret_cast<const T*>(static_cast<char*>(dev) + offs[static_cast<size_t>(i)]);
  }
};
#endif

// What the prepared Ms of one op share (GemmOverlap: one context per prepared M, the largest
// first): the symmetric data buffers (gathered A, staging, outboxes), each sized by the
// largest M that asked for it and used from its start by the others -- a call of any M begins
// with its epoch guard (every peer has begun this call, so it has finished reading its
// buffers for the previous one, whatever that call's M), so sharing them needs no more
// synchronisation. Signals, counters, barriers and epoch words are never shared: their
// thresholds count one M's calls. On GPUs also cuBLAS (handle, workspace, LtGemm: its
// choices are per problem) and the scratch.
struct GemmShared {
  struct Buffer {
    uint64_t offset = 0;
    size_t bytes = 0;
  };
  std::map<std::string, Buffer> data;
#ifdef WEFT_HAVE_CUDA
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::unique_ptr<LtGemm> lt;
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  ~GemmShared();
#endif
};

// What the op's methods share: the op (GemmOverlap::Impl) is one, and hands itself to every
// method object it makes. The op fills the shapes (validate) and the decisions (decide)
// before any method is made; init_gpu() then sets up the GPU part, before the methods' own.
// One context per prepared M; `shared` is what they have in common (GemmShared).
struct GemmOpContext {
  GemmOpContext(Backend& backend, const GemmOverlapConfig& c, std::shared_ptr<GemmShared> sh)
      : b(backend), cfg(c), op(backend, to_string(c.op)), coll(backend), shared(std::move(sh)) {}
  ~GemmOpContext();
  GemmOpContext(const GemmOpContext&) = delete;
  GemmOpContext& operator=(const GemmOpContext&) = delete;

  Backend& b;
  GemmOverlapConfig cfg;
  OpBase op;
  int world = 1, rank = 0;
  size_t eb = 2;
  int64_t k_local = 0, m_shard = 0;  // m_shard: rows of A_r (ag_gemm) or of C_r (gemm_rs)
  int64_t a_rows = 0, a_cols = 0, b_rows = 0, b_cols = 0, c_rows = 0, c_cols = 0;
  int chunks = 1;
  std::vector<TraceEvent> trace;
  Collectives coll;  // the host baseline's collectives
  bool fused_gpu = false;
  std::string unaligned_why;  // non-empty: K per rank is not 16-byte aligned, the baseline only
  // gemm_rs decomposed: how the own block meets the peers' partial products (decide():
  // choose_rs_fold): a reduce pass after it, or folded into its GEMM's epilogue -- weft's
  // GEMM (one launch waiting per M-block) or cuBLASLt (2 ranks: D = A B + the peer's piece).
  RsFold rs_fold = RsFold::kNone;
  // host backend: baseline's gathered A or partial product; the GEMM alone's output
  std::vector<unsigned char> host_scratch;
  std::shared_ptr<GemmShared> shared;

  // Collective: a symmetric data buffer of at least `bytes` named `what` ("decomposed.staging"),
  // shared with the op's other prepared Ms (GemmShared): the one already made under that name
  // where it is large enough, else a new one (which later, smaller Ms then share).
  uint64_t data_buffer(size_t bytes, const std::string& what);

#ifdef WEFT_HAVE_CUDA
  // shared->lt and ->scratch (made by the first context: the largest M)
  LtGemm* lt = nullptr;  // every cuBLAS GEMM of the op (gemm())
  // [M x K_local] (ag_gemm: baseline's gathered A) or [M x N] (gemm_rs: the partial products
  // of baseline and decomposed) of the largest M; the GEMM alone's A or C. None for gemm_ar.
  void* scratch = nullptr;
  uint64_t epoch_off = 0;        // the call counter (decomposed: bumped per call; wait thresholds scale by it)
  dev::BarrierHandle barrier{};  // tracing's line-up (begin), decomposed's epoch guard
  // Transfers by SM copy kernels instead of the copy engine: WEFT_OVERLAP_ENGINE=sm, or after
  // the copy engine refused a pointer.
  bool sm_copies = false;
  // tracing
  cudaEvent_t ev_base = nullptr;
  std::vector<TimedEvent> timed;
  size_t timed_used = 0;

  // Loads the kernels, creates cuBLAS and its workspace, the scratch, the trace's base event
  // and the heap's epoch word and barrier (the op's first symmetric allocations).
  void init_gpu();

  // cuBLAS of rows x cols of this op's local product (below), through `lt`: kGemmEx is its
  // candidate 0, never timed (cublasGemmEx; cublasLt's first heuristic where C is added), kLt
  // the candidate LtGemm chose (timed where WEFT_GEMM_TUNE asks). `add`: C += add (C's layout).
  enum class Blas { kGemmEx, kLt };
  void gemm(cudaStream_t s, const void* a, const void* bp, void* c, int64_t rows, int64_t k, int64_t c0, int64_t cols,
            Blas lib = Blas::kGemmEx, const void* add = nullptr);

  // weft's GEMM (kernels/gemm.hpp) of `rows` rows of this op's local product: a [rows x
  // k_local], B, c [rows x N]; hooks and fusion arguments are the caller's to add.
  // Launch it with ops::gemm_gpu.
  kernels::GemmArgs weft_gemm_args(const void* a, const void* bp, void* c, int64_t rows) const;
  // Tracing by CUDA events (baseline and decomposed): begin() lines the ranks up and records
  // the base; mark() / mark_end() bracket a piece of work on a stream; collect() synchronises
  // and appends the events to `trace`. Each does nothing unless tracing.
  void begin(cudaStream_t s, bool tracing);
  size_t mark(cudaStream_t s, TraceKind kind, int64_t id, int lane, const char* lane_name, std::string name,
              bool tracing);
  void mark_end(size_t i, cudaStream_t s, bool tracing);
  void collect(cudaStream_t s);
  void wait_list(cudaStream_t s, const std::vector<std::tuple<int, uint64_t, int64_t>>& waits);
  // waits[begin, begin + kOverlapListMax) as one wait kernel's (or reduce kernel's) list.
  static kernels::OverlapWaits overlap_waits(const std::vector<std::tuple<int, uint64_t, int64_t>>& waits,
                                             size_t begin = 0);
  // A one-CTA kernel on `s`: fence, then peer's signal at `off` += inc (after what `s` ran).
  void signal(int peer, uint64_t off, uint64_t inc, cudaStream_t s);
  // Sets the word at `off` on `peer` to this rank's call count, by the copy engine in `s`'s
  // order (after the transfer it flags; no SM): what a signal kernel's +1 per call gives.
  void put_count(int peer, uint64_t off, cudaStream_t s);
  // The result of a copy-engine call on `s`: true if it was taken; false if the copy engine
  // refused a peer pointer (outside a capture: sm_copies from now on, with a message; the
  // caller falls back to SMs); any other error is thrown.
  bool copy_engine_took(cudaError_t e, cudaStream_t s);
  // ag_gemm's keep_gathered: the gathered A [m x k_local] at `gathered` (this rank's address
  // of the method's buffer) into dst; own_missing: this rank's rows were read in place and
  // never copied there, so they come from a.
  void copy_gathered(const char* gathered, bool own_missing, int64_t m, const void* a, void* dst, cudaStream_t s);
  void copy2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows, cudaStream_t s);
  const char* engine_name() const { return sm_copies ? "SM copy" : "copy engine"; }
#endif
};

// ---- methods (one file each) -----------------------------------------------------------------
// Each holds the op's context (it outlives them) and owns its own state.

// `baseline` on the host backend: the reference collectives + a CPU GEMM (baseline.cpp).
class BaselineHost final : public GemmMethodImpl {
 public:
  explicit BaselineHost(GemmOpContext& op) : op_(op) {}
  void run(int64_t m, const void* a, const void* bp, void* c, void* stream, bool tracing) override;
  void keep_gathered(int64_t m, const void* a, void* dst, void* stream) override;

 private:
  GemmOpContext& op_;
};

// `decomposed` (one GEMM per chunk of rows, one transfer team) or `fused` (small tiles,
// several teams) on the host backend: the plan executor, HostGemmExec (host_plan.cpp).
class HostPlanMethod final : public GemmMethodImpl {
 public:
  HostPlanMethod(GemmOpContext& op, bool decomposed);
  void run(int64_t m, const void* a, const void* bp, void* c, void* stream, bool tracing) override;
  void keep_gathered(int64_t m, const void* a, void* dst, void* stream) override;

 private:
  GemmOpContext& op_;
  std::unique_ptr<HostGemmExec> exec_;
};

#ifdef WEFT_HAVE_CUDA
// `baseline` on GPUs: NCCL's collective and one cuBLAS GEMM, through the op's scratch
// (baseline.cpp). No state of its own.
class BaselineGpu final : public GemmMethodImpl {
 public:
  explicit BaselineGpu(GemmOpContext& op) : op_(op) {}
  void run(int64_t m, const void* a, const void* bp, void* c, void* stream, bool tracing) override;
  void keep_gathered(int64_t m, const void* a, void* dst, void* stream) override;

 private:
  void gpu_baseline(int64_t m, const void* a, const void* bp, void* c, cudaStream_t s, bool tracing);
  GemmOpContext& op_;
  void* gathered_ = nullptr;  // ag_gemm: where the last call gathered A
};
// `decomposed` on GPUs (decomposed.cpp): per-chunk cuBLAS GEMMs on the caller's stream
// beside the transfers on a copy stream. ag_gemm: the all-gather plan's transfers, tiles in
// arrival order; gemm_rs: partial products pushed into their owners' staging, the own block
// then met by the fold the op chose (RsFold: a reduce pass, weft's GEMM, cuBLASLt, or the
// gathered inputs); gemm_ar: the two-shot all-reduce plan, each sum one SM pass (ar_sums). Setup (the constructor) allocates
// in the order the heap records on every rank.
class DecomposedGpu final : public GemmMethodImpl {
 public:
  explicit DecomposedGpu(GemmOpContext& op);
  ~DecomposedGpu() override;
  DecomposedGpu(const DecomposedGpu&) = delete;
  DecomposedGpu& operator=(const DecomposedGpu&) = delete;
  void run(int64_t m, const void* a, const void* bp, void* c, void* stream, bool tracing) override;
  void keep_gathered(int64_t m, const void* a, void* dst, void* stream) override;
  // gemm_rs: the heap offset of the staging slots [world][m_shard x N] (0 for other ops); the
  // fused method lands the peers' pieces there too.
  uint64_t staging() const { return rs_stage; }

 private:
  void setup();    // the constructor's work
  void release();  // the destructor's (also where setup() throws)
  void gpu_decomposed(const void* a, const void* bp, void* c, cudaStream_t s, bool tracing);
  void gather_rs(const void* a, const void* bp, void* c, cudaStream_t s, bool tracing);  // RsFold::kGather
  void ar_sums(const void* a, const void* bp, void* c, cudaStream_t s, bool tracing);    // gemm_ar, 2+ ranks
  // gemm_rs's epoch guard on `s` without an SM (rs_memop_guard): tell every peer this rank
  // began this call, wait until every peer did, reset those words. No deadline: the waits for
  // the peers' data must not sit behind it (they name a missing peer).
  void memop_guard(cudaStream_t s);
  // The waits of the plan's sum of own piece j (the peers' pushes of it), for wait_list.
  std::vector<std::tuple<int, uint64_t, int64_t>> piece_waits(size_t j) const;

  GemmOpContext& op_;
  cudaStream_t cs = nullptr;  // copy / communication stream
  cudaEvent_t ev_fork = nullptr, ev_join = nullptr;
  std::vector<cudaEvent_t> ev_piece;
  std::vector<std::pair<int64_t, int64_t>> pieces;  // chunk row ranges
  // gemm_rs, RsFold::kLt (2 ranks): the peer's piece j has landed here (recorded on cs after
  // its wait).
  std::vector<cudaEvent_t> ev_recv;
  // ... RsFold::kGather (2 ranks; gather_rs): the tables of plan "gemm_rs.gather_inputs"
  // (gather_inputs_plan, which the host tests run too): this rank's pushes of its rows of A
  // for the peer's block and its B in column pieces into the peer's g_a / g_b (symmetric; the
  // plan's scratch tensors), each flagged by a copy of the call counter into the peer's word
  // of the plan's signal; one tile per column piece, waiting for the A push's and its B
  // piece's signals (a wait kernel on cw). Its epoch guard: rs_guard (memop_guard).
  OpPlan gp;
  std::vector<uint64_t> g_tensor_off;  // per plan tensor: heap offset (the inputs: 0, read in place)
  dev::SignalSlab g_signals{};         // the plan's signals (Lowered::max_signals)
  // Per tile of this rank (table order): its waits, for wait_list; the transfer of this rank
  // after which ev_out[tile] is recorded (the one mirroring the peer's push it waits for last).
  std::vector<std::vector<std::tuple<int, uint64_t, int64_t>>> g_waits;
  std::vector<int32_t> g_out_after;
  uint64_t* one = nullptr;
  cudaStream_t cw = nullptr;  // the data waits
  std::vector<cudaEvent_t> ev_out;  // this rank's pushes up to g_out_after[tile] (and their flags) are done
  // gemm_ar (2+ ranks; ar_sums): the two-shot plan, what this rank runs of it, its "in" (the
  // GEMM's rows) and "out" (the peers' sums land there) in the window, its signals and tile
  // counters (world x counters: slot q * counters + c is rank q's counter c), an arrival word
  // per sum, the streams of the counters' copies (cn) and of the landings (cl); and what each
  // call issues, resolved at setup: per tile its counter and the ranks it is set on, per sum
  // its kernel's arguments (dst[0], C, per call), waits past one kernel's list and CTA count,
  // per landing its waits.
  struct ArTile {
    uint64_t counter;
    std::vector<int32_t> to;
  };
  OpPlan ar;
  ArChainTables ar_tables;
  uint64_t ar_in = 0, ar_out = 0;
  dev::SignalSlab ar_signals{}, ar_counters{};
  unsigned long long* ar_arrivals = nullptr;
  std::vector<ArTile> ar_tile;
  std::vector<kernels::OverlapChain> ar_chain_args;
  std::vector<std::vector<std::tuple<int, uint64_t, int64_t>>> ar_chain_waits, ar_landing_waits;
  std::vector<int> ar_ctas;
  cudaStream_t cn = nullptr, cl = nullptr;
  cudaEvent_t ev_cn = nullptr, ev_cl = nullptr;
  // ag_gemm: the plan's tables and tensors
  OpPlan ag;
  std::vector<uint64_t> ag_tensor_off;
  dev::SignalSlab ag_signals{};
  bool ag_own_in_place = false;  // own rows read in place, their local copy left out (constructor)
  // gemm_rs: the staged plan and what the GPU reads of its tables (plan.hpp), the staging
  // [world][m_shard x N] (the plan's "stage") and the plan's signals (Lowered::max_signals)
  OpPlan rs;
  RsDecomposedTables rs_tables;
  uint64_t rs_stage = 0;
  dev::SignalSlab rs_signals{};
  // ... the epoch guard without an SM (rs_memop_guard: the gathered inputs always, the reduce
  // pass unless with SM copies or without stream memory operations): slot q = "rank q
  // began this call", a copy of `one` from q, waited for by a stream memory operation and reset
  // by the waiter (memop_guard). (A device-barrier kernel on the copy stream waited in graph
  // replays for an SM until the first GEMM's last wave, delaying the first copy.)
  bool rs_memop_guard = false;
  dev::SignalSlab rs_guard{};
  // ... and its deadline: a kernel on cg waiting for the peers' call counters (memop_guard),
  // joined at the call's end (ev_watch).
  cudaStream_t cg = nullptr;
  cudaEvent_t ev_watch = nullptr;
  // ... with the own block on weft's GEMM (RsFold::kWeft): one launch that waits per M-block
  // for the peers' pieces and adds them in its epilogue -- no reduce pass. Its wait tables.
  void* rs_fold_tables = nullptr;
  kernels::GemmHooks rs_fold_hooks{};
  cudaEvent_t ev_guard = nullptr;  // after the epoch guard's barrier on the copy stream
};

// `fused` on GPUs (fused_method.cpp): the op's plan for the fused geometry in the heap and
// this rank's lowered tables on the device, run by one persistent kernel per call
// (fused.hpp, fused.cpp). ag_gemm and gemm_rs (GemmOpContext::fused_gpu).
class FusedGpu final : public GemmMethodImpl {
 public:
  // rs_stage: the decomposed method's staging (gemm_rs; DecomposedGpu::staging()).
  FusedGpu(GemmOpContext& op, uint64_t rs_stage);
  ~FusedGpu() override;
  FusedGpu(const FusedGpu&) = delete;
  FusedGpu& operator=(const FusedGpu&) = delete;
  void run(int64_t m, const void* a, const void* bp, void* c, void* stream, bool tracing) override;
  void keep_gathered(int64_t m, const void* a, void* dst, void* stream) override;

 private:
  void setup(uint64_t rs_stage);  // the constructor's work
  void release();                 // the destructor's (also where setup() throws)
  void gpu_fused(const void* a, const void* bp, void* c, cudaStream_t s, bool tracing);

  GemmOpContext& op_;
  OpPlan fp;
  std::vector<uint64_t> f_tensor_off;
  dev::SignalSlab f_signals{}, f_counters{};
  dev::BarrierHandle f_barrier{};
  uint64_t f_epoch_off = 0;
  void* f_tables = nullptr;
  fused::FusedArgs f_args{};
  fused::StatePtr f_state;  // the fused kernel's stream, events and tables (constructor: make_state)
  int64_t f_epoch = 0;
  fused::TraceRecord* f_trace = nullptr;
  uint32_t* f_trace_count = nullptr;
  uint32_t f_trace_capacity = 0;
};
#endif

}  // namespace weft::ops::detail
