// GEMMs overlapped with communication (issue 6): AllGather+GEMM, GEMM+ReduceScatter and
// GEMM+AllReduce, with methods `baseline` (NCCL + cuBLAS; on the host backend the reference
// collectives + a CPU GEMM), `decomposed` (per-chunk library GEMMs overlapped with copy-engine
// transfers at stream level; on the host backend the plan executor with one GEMM per chunk),
// `fused` (one persistent kernel: see gemm_overlap_fused.hpp; on the host backend the plan
// executor with small tiles) and `auto` (cost model + on-disk tuning cache). docs/gemm_overlap.md.
//
// Shapes (row-major; M, N, K are the op's global shape as in docs/anchors.md):
//   ag_gemm   A_r [M/world x K] (rows of A, gathered)  B: W [N x K] or B [K x N]   C [M x N]
//   gemm_rs   A_r [M x K/world] (K sharded)            B: W [N x K/world] or [K/world x N]
//                                                       C [M/world x N] = rows [r*M/world, ...)
//                                                       of the sum over ranks of A_r * B_r
//   gemm_ar   A_r [M x K/world]                         B as gemm_rs        C [M x N] = the sum
// Inputs bf16 or f16; products accumulate in fp32; C has the inputs' type. The partial
// products of gemm_rs / gemm_ar travel in that type too (as with NCCL); reductions add in
// fp32 (the host plan executor rounds after every add, the GPU decomposed reduce once).
//
// Construction and run() are collective: every rank makes the same calls, in the same order,
// with the same configuration and methods. The op's symmetric state (gathered A, staging,
// signals, epoch counters) is allocated from the backend's heap at construction and reused;
// signals are never reset, so calls can be replayed in CUDA graphs, from the first call of
// every prepared M and method. One op serves every M up to config.m (docs/gemm_overlap.md,
// "One op object for every M").
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weft/device/dtype.hpp"
#include "weft/ops/names.hpp"
#include "weft/ops/trace.hpp"
#include "weft/runtime/backend.hpp"

namespace weft::ops {

enum class GemmOp { kAgGemm, kGemmRs, kGemmAr };
enum class GemmMethod { kAuto, kBaseline, kDecomposed, kFused };
// kNK: W [N x K], the torch.nn.functional.linear weight (C = A W^T); kKN: B [K x N] (C = A B).
enum class BLayout { kNK, kKN };

inline constexpr Named<GemmOp> kGemmOpNames[] = {
    {GemmOp::kAgGemm, "ag_gemm"}, {GemmOp::kGemmRs, "gemm_rs"}, {GemmOp::kGemmAr, "gemm_ar"}};
inline constexpr Named<GemmMethod> kGemmMethodNames[] = {{GemmMethod::kAuto, "auto"},
                                                         {GemmMethod::kBaseline, "baseline"},
                                                         {GemmMethod::kDecomposed, "decomposed"},
                                                         {GemmMethod::kFused, "fused"}};
inline constexpr Named<BLayout> kBLayoutNames[] = {{BLayout::kNK, "nk"}, {BLayout::kKN, "kn"}};

inline const char* to_string(GemmOp op) { return name_in(kGemmOpNames, op); }
inline const char* to_string(GemmMethod m) { return name_in(kGemmMethodNames, m); }
inline const char* to_string(BLayout l) { return name_in(kBLayoutNames, l); }
inline GemmOp parse_gemm_op(const std::string& s) { return parse_in(kGemmOpNames, s, "GEMM op"); }
inline GemmMethod parse_gemm_method(const std::string& s) { return parse_in(kGemmMethodNames, s, "method"); }
// nk: W [N, K]; kn: B [K, N].
inline BLayout parse_b_layout(const std::string& s) { return parse_in(kBLayoutNames, s, "B layout"); }

struct GemmOverlapConfig {
  GemmOp op = GemmOp::kAgGemm;
  // Global shape (see above). M is the largest a call may have: one op serves every M from 1
  // to it (N and K fixed; GemmRunOptions::m), with no allocation or set-up per call.
  int64_t m = 0, n = 0, k = 0;
  // Further Ms (each <= m; ag_gemm, gemm_rs: multiples of the world size) prepared at
  // construction beside m: each gets its own tables, chunk count, cuBLAS choices and `auto`
  // decision, sharing m's buffers, so every method runs it and it is CUDA-graph capturable
  // from its first call. A call of an M not prepared runs the baseline (NCCL + cuBLAS: any M,
  // also capturable); `auto` picks it, and decomposed or fused fall back to it (reported once
  // on stderr). Decode: the batch sizes captured into graphs.
  std::vector<int64_t> m_buckets;
  dev::DType dtype = dev::DType::kBF16;
  BLayout b_layout = BLayout::kNK;
  // Chunks per peer shard for `decomposed` (and the plan's splits). 0: the cost model picks.
  int chunks = 0;
  // Plan template: all-gather direct | ring | bidir; reduce-scatter direct | ring | staged;
  // all-reduce one-shot | two-shot | ring. Empty: direct, direct, two-shot. The host plan
  // executor runs any of them; decomposed gemm_rs runs the staged plan whatever this says
  // (on both backends), the GPU decomposed method the direct shapes (docs/gemm_overlap.md).
  std::string algo;
  // Tile of the host `fused` executor (rows x cols of C); 0: 8 x 16.
  int64_t tile_rows = 0, tile_cols = 0;
  // Host plan executor: worker teams taking transfers and tiles (decomposed: always 1 + 1,
  // one "copy stream" and one "compute stream").
  int host_transfer_workers = 2, host_tile_workers = 2;
  // Tuning cache (JSON) that `auto` reads: empty: $WEFT_TUNE_CACHE, else
  // $XDG_CACHE_HOME/weft/gemm_overlap.json or ~/.cache/weft/gemm_overlap.json; "-": none.
  std::string tune_cache;
};

struct GemmRunOptions {
  GemmMethod method = GemmMethod::kAuto;
  // Rows M of this call (0: config.m): A_r, C as in the shapes above with this M; 1 <= M <=
  // config.m, ag_gemm and gemm_rs: a multiple of the world size.
  int64_t m = 0;
  // Record every chunk's and tile's start and end into trace() (host clock on the host
  // backend; CUDA events on GPUs, which synchronises the stream at the end of the call:
  // not for graph capture). Each traced call replaces the previous call's events.
  bool trace = false;
  void* stream = nullptr;  // cudaStream_t on the nccl backend (nullptr: the default stream)
  // ag_gemm only: where this call's gathered A [M x K] (every rank's rows, row-major) is left
  // too, for a weight gradient (dB = AG(A)^T dC) without gathering A again. baseline gathers
  // straight into it; decomposed and fused copy it out of their workspace after the GEMM (one
  // device copy of M x K elements on the stream; the host backend gathers it again).
  // 16-byte aligned, not overlapping A, B or C. nullptr: not kept.
  void* gathered_a = nullptr;
};

// What `auto` decided and why.
struct AutoChoice {
  GemmMethod method = GemmMethod::kBaseline;
  int chunks = 1;
  std::string source;  // "tuning cache <path>", "cost model", "host backend default"
  // Cost-model predictions in us (0: not predicted): baseline, decomposed (at `chunks`), fused.
  double predicted_baseline_us = 0, predicted_decomposed_us = 0, predicted_fused_us = 0;
};

class GemmOverlap {
 public:
  // Collective. Throws InvalidArgument naming the shape when it cannot run: a dimension < 1,
  // M (ag_gemm, gemm_rs) or K (gemm_rs, gemm_ar) not divisible by the world size, a dtype
  // other than bf16/f16, chunks < 0, an unknown algo. K per rank not a multiple of 8 (rows of
  // A not 16-byte aligned): the baseline runs the operands as they are; decomposed and fused
  // run an op on K padded to a multiple of 8 (made here, collectively), A and B copied into its
  // zero-padded operands each call (device copies on the stream); `auto` picks that op's
  // choice where the cost model predicts it faster than the baseline (cuBLAS on unaligned
  // rows: gemm_overlap_model.hpp), and always on the host backend. gathered_a: baseline only.
  GemmOverlap(Backend& backend, const GemmOverlapConfig& config);
  ~GemmOverlap();
  GemmOverlap(const GemmOverlap&) = delete;
  GemmOverlap& operator=(const GemmOverlap&) = delete;

  // One call. a, b, c are this rank's (device pointers on nccl, host pointers on host), each
  // 16-byte aligned, of the shapes above for opt.m; c must not overlap a or b. Returns with the work
  // enqueued on `stream` (GPU) or done (host). Throws InvalidArgument for null or misaligned
  // pointers, and Error("fused method not built yet") for `fused` on GPUs while the fused
  // kernel is the stub.
  void run(const void* a, const void* b, void* c, const GemmRunOptions& opt = {});
  // The local GEMM alone, no communication (the overlap ceiling in benchmarks): ag_gemm
  // multiplies whatever the baseline's gathered A holds; gemm_rs/gemm_ar write A_r * B_r
  // into c (gemm_rs: into internal scratch, c untouched). `which`: cublasGemmEx (cuBLAS's
  // first heuristic), the decomposed method's cuBLAS path (with WEFT_GEMM_TUNE=1 the fastest of
  // GemmEx and cuBLASLt's candidates, timed at the first eager call; else GemmEx), or weft's sm_90a GEMM
  // (kernels/gemm.hpp: what the fused methods run; Error where it cannot run). The host
  // backend runs its CPU GEMM for every `which`.
  enum class GemmAlone { kCublas, kCublasTuned, kWeft };
  void run_gemm_only(const void* a, const void* b, void* c, void* stream = nullptr,
                     GemmAlone which = GemmAlone::kCublas);
  // The cuBLASLt choices made so far (GPU), one line per GEMM problem: for reports.
  std::vector<std::string> gemm_choices() const;
  // Whether every decomposed GEMM is timed among cuBLAS's candidates (WEFT_GEMM_TUNE=1; GPU).
  bool times_every_gemm() const;

  // Methods this build and backend can run (fused only when fused_available() on GPUs).
  std::vector<GemmMethod> available_methods() const;
  const AutoChoice& auto_choice() const;  // of config.m
  AutoChoice auto_choice(int64_t m) const;  // of a call of M rows
  // The Ms every method runs (config.m and m_buckets), ascending.
  std::vector<int64_t> prepared_m() const;
  // Stores a measured choice for this shape in the tuning cache (rank 0 writes; collective
  // only in that every rank should pass the same values). No-op without a cache path.
  void store_tuning(GemmMethod method, int chunks, double us) const;

  const GemmOverlapConfig& config() const;
  int chunks() const;  // chunks decomposed runs with (resolved from 0)
  // Per-rank shapes: A_r rows x cols, the B rows x cols as stored, C rows x cols; rows of a
  // call of M rows (0: config.m).
  int64_t a_rows(int64_t m = 0) const;
  int64_t a_cols() const;
  int64_t b_rows() const;
  int64_t b_cols() const;
  int64_t c_rows(int64_t m = 0) const;
  int64_t c_cols() const;
  // The tuning-cache key of this shape: op|device|world|MxKxN|dtype|layout.
  std::string tuning_key() const;

  // Events of the last traced call on this rank.
  const std::vector<TraceEvent>& trace() const;

  struct Impl;   // one prepared M
  struct State;  // every prepared M

 private:
  std::unique_ptr<State> state_;
};

}  // namespace weft::ops
