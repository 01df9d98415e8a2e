// Mixture-of-experts token exchange (issue 25): dispatch sends each token's row to the ranks of
// its top-k experts, combine brings the experts' output rows back and sums them per token with
// the router's weights. Expert parallelism: E experts, E / world on each rank (rank p holds
// experts p * E/world ... (p + 1) * E/world - 1).
//
//   dispatch: x [T, H] and ids [T, top_k] (int32 global expert ids) on every rank ->
//             recv [rows, H] on every rank: rank-major, expert-grouped -- the rows from source
//             rank 0 for local expert 0, then for local expert 1, ..., then those from source 1,
//             ...; within one (source, expert) chunk in the source's (token, slot) order.
//             recv_counts [world][E / world]: the rows of each chunk.
//   combine:  expert_out [rows, H] in recv's layout (the experts' outputs, row for row) and
//             weights [T, top_k] (fp32) -> y [T, H], y[t] = sum over slots j of
//             weights[t][j] * expert_out[row of (t, j)], in slot order, in fp32, rounded once.
//
// T may differ between ranks and calls (0 ... max_tokens); dispatch and combine of one call
// use the routing of that dispatch. A routing that would give any rank more than
// recv_capacity rows is refused on every rank (InvalidArgument naming the rank and the rows),
// before any row moves. Methods: `baseline` (the exchange by the library's all-to-all: NCCL
// send/recv on GPUs; on the host backend the collectives' reference), `decomposed` (weft's
// all-to-all by counts, the counts exchanged through the symmetric heap), `direct` (one kernel a
// direction: every rank's chunk counts into every rank's symmetric matrix, then each row stored
// by its sender straight into its final place in the receiver's buffer, no all-to-all -- or,
// where a token would send one rank several rows (top-k >> world; rows_once()), its row sent
// once into a staging slot there and copied to its places on arrival; where every rank's
// expert_out lies in its symmetric heap -- recv() itself, the experts run in place -- combine
// pulls each token's rows from their ranks into the sum instead: WEFT_MOE_COMBINE_PULL),
// `auto` (= direct).
//
// On the host backend every check is agreed across ranks before anything moves (a call bad on
// one rank is refused on all). On GPUs (at most kernels::kMoeMaxExperts experts) the routing,
// the counts' exchange and the weighted sum run on the device, without the host: dispatch and
// combine can be captured into a CUDA graph (methods decomposed and direct); each rank checks its
// own call's arguments, an invalid id is found on the device (MoeConfig::check_ids), an overflow
// is refused -- direct: on every rank alike, nothing moves, recv_counts() zero, combine's y zero,
// and an eager call with check_ids throws; decomposed: by the all-to-all's capacity check (the
// error slot names the rank). The layer (dispatch, the experts' FFNs, combine): MoeLayer below;
// its fused method stores combine's rows from the down projection's epilogue (docs/moe.md).
//
// Construction, dispatch and combine are collective: every rank makes the same calls in the
// same order with the same configuration and method.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "weft/device/dtype.hpp"
#include "weft/ops/names.hpp"
#include "weft/runtime/backend.hpp"

namespace weft::ops {

enum class MoeMethod { kAuto, kBaseline, kDecomposed, kDirect };
inline constexpr Named<MoeMethod> kMoeMethodNames[] = {{MoeMethod::kAuto, "auto"},
                                                       {MoeMethod::kBaseline, "baseline"},
                                                       {MoeMethod::kDecomposed, "decomposed"},
                                                       {MoeMethod::kDirect, "direct"}};
inline const char* to_string(MoeMethod m) { return name_in(kMoeMethodNames, m); }
inline MoeMethod parse_moe_method(const std::string& s) { return parse_in(kMoeMethodNames, s, "method"); }

// The most experts one token may go to.
inline constexpr int64_t kMoeMaxTopK = 8;

struct MoeConfig {
  int64_t hidden = 0;      // H: elements per row, a multiple of 8
  int64_t experts = 0;     // E: global experts, a multiple of the world size
  int64_t top_k = 1;       // experts per token: 1 ... min(kMoeMaxTopK, E)
  int64_t max_tokens = 0;  // T per rank per call, at most (>= 0)
  // Rows one rank may receive in one call; 0: every token of every rank to this rank's experts,
  // world * max_tokens * min(top_k, E / world) (no routing can overflow it).
  int64_t recv_capacity = 0;
  dev::DType dtype = dev::DType::kBF16;  // x, recv, expert_out, y: bf16, f16 or f32
  // GPUs: after a dispatch outside a CUDA graph capture, read back at once whether an id was
  // invalid or (direct) the routing was refused (synchronizes the stream), and throw naming it.
  // Off, or in a capture, an invalid pair is left out silently (its row goes nowhere, its
  // weight counts for nothing), and so is every row of a refused direct dispatch.
  bool check_ids = true;
  // recv's layout (method direct, and auto on GPUs): false -- rank-major, expert-grouped (above);
  // true -- expert blocks: local expert l's rows (from source 0, then 1, ...; each source's in
  // its (token, slot) order) in whole blocks of kernels::kMoeBlockRows rows starting on a block
  // boundary, the blocks in expert order, the rows up to the block's end padding (never
  // written): the layout a grouped GEMM reads in place (recv_groups()). recv_capacity counts
  // the padding; its default adds (kMoeBlockRows - 1) rows an expert. baseline and decomposed
  // refuse it.
  bool expert_blocks = false;
};

struct MoeRunOptions {
  MoeMethod method = MoeMethod::kAuto;
  int64_t tokens = -1;     // T of this call, 0 ... max_tokens (-1: max_tokens)
  void* stream = nullptr;  // cudaStream_t on the nccl backend
};

class MoeDispatchCombine {
 public:
  // Collective. Throws InvalidArgument naming the value: hidden < 8 or not a multiple of 8,
  // experts < 1 or not a multiple of the world size, top_k outside 1 ... min(8, experts),
  // max_tokens < 0, recv_capacity < 0, a dtype it does not move, ranks that disagree, more than
  // kernels::kMoeMaxExperts experts on GPUs.
  MoeDispatchCombine(Backend& backend, const MoeConfig& config);
  ~MoeDispatchCombine();
  MoeDispatchCombine(const MoeDispatchCombine&) = delete;
  MoeDispatchCombine& operator=(const MoeDispatchCombine&) = delete;

  // x [T, H], ids [T, top_k] (this rank's; T = opt.tokens), 16-byte aligned x. Throws
  // InvalidArgument for T outside 0 ... max_tokens, null or misaligned pointers (with T > 0),
  // an id outside 0 ... E - 1 (naming the token and slot), ranks calling with different methods,
  // and -- on every rank -- a routing that overflows some rank's recv_capacity.
  void dispatch(const void* x, const int32_t* ids, const MoeRunOptions& opt = {});
  // After a dispatch: this rank's received rows ([recv_capacity, H], the first recv_rows()
  // written), and the chunk counts [world][E / world] (rows from source s for local expert e at
  // s * E/world + e), in the backend's memory. recv_rows() is their sum (GPUs: read back,
  // synchronizing the device, once per dispatch).
  const void* recv() const;
  const int64_t* recv_counts() const;
  int64_t recv_rows() const;
  // expert_blocks: after a dispatch, each block's local expert (-1: no expert's rows) --
  // int32 [ceil(recv_capacity / kMoeBlockRows)] in the backend's memory (the grouped GEMM's
  // GemmArgs::group_of); null without expert_blocks.
  const int32_t* recv_groups() const;
  // expert_out [recv_rows(), H] in recv()'s layout (may be recv() itself), weights [T, top_k],
  // y [T, H] (T: the last dispatch's). Throws InvalidArgument without a dispatch before it, for
  // another T or method than that dispatch's, null or misaligned pointers, y overlapping
  // expert_out.
  void combine(const void* expert_out, const float* weights, void* y, const MoeRunOptions& opt = {});
  // expert_blocks on GPUs: after a dispatch, each recv row's place in its token's rank's return
  // buffer -- uint64 [ceil(recv_capacity / kMoeBlockRows) * kMoeBlockRows], device addresses in
  // this process (a peer's through the symmetric heap), 0 for padding rows: a GEMM that stores
  // its rows there (GemmArgs::row_dst) delivers combine's rows from its epilogue. Null otherwise.
  const uint64_t* recv_destinations() const;
  // combine of rows already stored at recv_destinations() by work before it on the stream:
  // every rank's arrival, then the weighted sum, no copies. Throws as combine does, and
  // InvalidArgument on the host backend or without expert_blocks.
  void combine_delivered(const float* weights, void* y, const MoeRunOptions& opt = {});

  // Whether direct dispatch sends each token's row once to every peer rank holding any of its
  // experts, staged there and copied to the experts' places on arrival (GPUs; chosen when the op
  // is made, by WEFT_MOE_DISPATCH_ONCE and its rule: docs/moe.md, "Rows once a peer"), rather
  // than a row for every (token, expert) pair.
  bool rows_once() const;
  const MoeConfig& config() const;
  int64_t local_experts() const;
  int64_t recv_capacity() const;
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The MoE layer (issue 25; docs/moe.md, "Layer"): dispatch -> each local expert's FFN ->
// combine. Expert e's FFN: h = x W_up[e]^T ([2F] per row: the gate's F, then the up
// projection's F), a = silu(h_gate) * h_up, out = a W_down[e]^T; the GEMMs accumulate in fp32
// and round their outputs to the dtype (h, then a, then out), combine sums in fp32 and rounds
// once. Methods:
//   baseline    the exchange by the library's all-to-all (MoeMethod::kBaseline), the received
//               counts read by the host, the received rows regrouped expert-major, a cuBLAS GEMM
//               per expert (the PyTorch-style path; not capturable);
//   decomposed  the exchange by weft's direct kernels with recv in expert blocks
//               (MoeConfig::expert_blocks: dispatch stores each row straight into its expert's
//               whole 128-row blocks), weft's grouped GEMM on those rows in place (one launch
//               for every expert, the blocks' experts read on the device, SiLU * up in its
//               epilogue), the second grouped GEMM, combine from the same blocks: no host
//               synchronisation, no regrouping pass, capturable (GPUs; the host backend runs it
//               rank-major);
//   fused       decomposed's dispatch and gate/up GEMM, then GEMM + All-to-All: the down
//               projection's epilogue stores each output row straight into its token's rank's
//               return buffer (MoeDispatchCombine::recv_destinations(), GemmArgs::row_dst), and
//               combine only meets every rank's arrival and sums -- no combine pass over the rows
//               (GPUs; bitwise equal to decomposed; the host backend runs decomposed's path);
//   auto        fused on GPUs (measured faster than decomposed on every shape), else decomposed.
// On the host backend every method computes the same values (CPU GEMMs, the same rounding points).
enum class MoeLayerMethod { kAuto, kBaseline, kDecomposed, kFused };
inline constexpr Named<MoeLayerMethod> kMoeLayerMethodNames[] = {{MoeLayerMethod::kAuto, "auto"},
                                                                 {MoeLayerMethod::kBaseline, "baseline"},
                                                                 {MoeLayerMethod::kDecomposed, "decomposed"},
                                                                 {MoeLayerMethod::kFused, "fused"}};
inline const char* to_string(MoeLayerMethod m) { return name_in(kMoeLayerMethodNames, m); }
inline MoeLayerMethod parse_moe_layer_method(const std::string& s) {
  return parse_in(kMoeLayerMethodNames, s, "method");
}

struct MoeLayerConfig {
  MoeConfig moe;    // the exchange (hidden, experts, top_k, max_tokens, recv_capacity, dtype)
  int64_t ffn = 0;  // F: the experts' intermediate size, a multiple of 8
};

struct MoeLayerRunOptions {
  MoeLayerMethod method = MoeLayerMethod::kAuto;
  int64_t tokens = -1;     // T of this call, 0 ... max_tokens (-1: max_tokens)
  void* stream = nullptr;  // cudaStream_t on the nccl backend
};

class MoeLayer {
 public:
  // Collective. Throws InvalidArgument as MoeDispatchCombine does, and for ffn < 8 or not a
  // multiple of 8, a dtype other than bf16 or f16 on GPUs.
  MoeLayer(Backend& backend, const MoeLayerConfig& config);
  ~MoeLayer();
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  // x [T, H], ids [T, top_k] int32 global expert ids, weights [T, top_k] fp32 (the router's),
  // w_up [E / world, 2F, H] and w_down [E / world, H, F]: this rank's experts (rank p holds
  // experts p * E/world ...), y [T, H]; all in the backend's memory, 16-byte aligned. Throws
  // InvalidArgument as dispatch and combine do, and for null or misaligned weights.
  void forward(const void* x, const int32_t* ids, const float* weights, const void* w_up, const void* w_down, void* y,
               const MoeLayerRunOptions& opt = {});

  const MoeLayerConfig& config() const;
  MoeDispatchCombine& exchange();  // the token exchange the layer runs (its recv(), recv_counts())
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft::ops
