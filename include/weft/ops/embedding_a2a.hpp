// Embedding-bag lookups + all-to-all for recommendation models (issue 24; docs/embedding_a2a.md).
// The tables are sharded across ranks (model parallel: each rank holds a set of whole tables),
// the samples are not (data parallel: rank p owns samples p * batch ... (p + 1) * batch - 1 of
// the global batch of world * batch). Every rank pools its tables' bags for the whole global
// batch; each sample's pooled rows go to the rank that owns the sample.
//
//   forward: for each of this rank's tables, the bags of the global batch (offsets and indices
//            as nn.EmbeddingBag takes them, optional per-sample weights) ->
//            out [batch, total_dim()] on every rank: its own samples' pooled rows for every
//            table of every rank, the tables in global order (rank 0's tables, then rank 1's,
//            ...; TorchRec's pooled layout), each table's dim columns.
//
// A bag's pooled row: the sum over its indices, in index order, of weight * row (weight 1
// without per-sample weights), in fp32, rounded once to the output dtype; mean divides the sum
// by the bag's size first. An empty bag pools to zeros. Methods (docs/embedding_a2a.md):
// `baseline` (each rank's lookups, NCCL's all-to-all of the pooled rows, the re-layout),
// `decomposed` (the lookups by destination, each one's transfer beside the next one's
// lookups), `fused` (one kernel stores every pooled row straight into its sample's rank), `auto`
// (fused on GPUs). The host backend runs every method as the baseline (the same result).
//
// Construction and forward are collective: every rank makes the same calls in the same order.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weft/device/dtype.hpp"
#include "weft/ops/names.hpp"
#include "weft/runtime/backend.hpp"

namespace weft::ops {

enum class EmbeddingA2AMethod { kAuto, kBaseline, kDecomposed, kFused };
inline constexpr Named<EmbeddingA2AMethod> kEmbeddingA2AMethodNames[] = {
    {EmbeddingA2AMethod::kAuto, "auto"},
    {EmbeddingA2AMethod::kBaseline, "baseline"},
    {EmbeddingA2AMethod::kDecomposed, "decomposed"},
    {EmbeddingA2AMethod::kFused, "fused"}};
inline const char* to_string(EmbeddingA2AMethod m) { return name_in(kEmbeddingA2AMethodNames, m); }
inline EmbeddingA2AMethod parse_embedding_a2a_method(const std::string& s) {
  return parse_in(kEmbeddingA2AMethodNames, s, "method");
}

enum class EmbeddingPooling { kSum, kMean };

// The most columns of one table.
inline constexpr int64_t kEmbeddingMaxDim = 1024;

struct EmbeddingTableShape {
  int64_t rows = 0;  // >= 1
  int64_t dim = 0;   // a multiple of 8, at most kEmbeddingMaxDim
};

struct EmbeddingA2AConfig {
  std::vector<EmbeddingTableShape> tables;     // this rank's tables, in order (may be none)
  int64_t batch = 0;                           // samples each rank owns (>= 0)
  dev::DType weight_dtype = dev::DType::kF32;  // f32, bf16 or f16
  dev::DType out_dtype = dev::DType::kF32;     // f32 or bf16
  EmbeddingPooling pooling = EmbeddingPooling::kSum;
  // GPUs: the indices are checked on the device (an index outside its table is left out of
  // its bag, never read); with check_indices, forward reads the verdict back and throws (a
  // host synchronisation: not inside a CUDA graph capture, where it is skipped).
  bool check_indices = true;
};

// One of this rank's tables, for the global batch (world * batch bags).
struct EmbeddingBagInput {
  const void* weight = nullptr;               // [rows, dim] in weight_dtype
  const int64_t* offsets = nullptr;           // [world * batch + 1]: bag b is indices[offsets[b] .. offsets[b + 1])
  const int64_t* indices = nullptr;           // [offsets[world * batch]] rows of the table (may be null when empty)
  const float* per_sample_weights = nullptr;  // optional, one per index
  // The number of indices (offsets[world * batch]); -1: not given. backward on GPUs needs it
  // (its sort's size, known without reading the offsets back); where given it is checked.
  int64_t num_indices = -1;
};

// What backward makes of each table's gradient: the dense gradient, the sparse one (the rows the
// bags index and their gradients), or an optimizer's update of those rows in place.
enum class EmbeddingGradKind { kDense, kSparse, kSgd, kAdagrad };
inline constexpr Named<EmbeddingGradKind> kEmbeddingGradKindNames[] = {{EmbeddingGradKind::kDense, "dense"},
                                                                       {EmbeddingGradKind::kSparse, "sparse"},
                                                                       {EmbeddingGradKind::kSgd, "sgd"},
                                                                       {EmbeddingGradKind::kAdagrad, "adagrad"}};
inline const char* to_string(EmbeddingGradKind k) { return name_in(kEmbeddingGradKindNames, k); }
inline EmbeddingGradKind parse_embedding_grad_kind(const std::string& s) {
  return parse_in(kEmbeddingGradKindNames, s, "gradient kind");
}

// One of this rank's tables' gradient sink (the fields its kind uses; the others are ignored).
// A row's gradient g is fp32: see backward.
struct EmbeddingTableGrad {
  float* dense = nullptr;    // kDense: [rows, dim], set (rows no bag indexes: zeros)
  int64_t* rows = nullptr;   // kSparse: [n] the distinct rows the bags index, ascending
  float* values = nullptr;   // kSparse: [n, dim] their gradients (n <= the table's indices)
  int64_t* count = nullptr;  // kSparse: n (one int64; device memory on GPUs)
  // kSgd: w = w - lr * g; kAdagrad (torch.optim.Adagrad's sparse step): state = state + g * g,
  // w = w + (-lr) * (g / (sqrt(state) + eps)); in fp32, each operation rounded, w rounded once
  // to weight_dtype; only the rows the bags index.
  void* weight = nullptr;  // kSgd, kAdagrad: [rows, dim] in weight_dtype (usually the table's weight)
  float* state = nullptr;  // kAdagrad: [rows, dim]
};

struct EmbeddingBackwardOptions {
  EmbeddingA2AMethod method = EmbeddingA2AMethod::kAuto;
  void* stream = nullptr;
  EmbeddingGradKind kind = EmbeddingGradKind::kDense;
  float lr = 0.f;      // kSgd, kAdagrad
  float eps = 1e-10f;  // kAdagrad (torch.optim.Adagrad's default)
};

struct EmbeddingA2ARunOptions {
  EmbeddingA2AMethod method = EmbeddingA2AMethod::kAuto;
  void* stream = nullptr;
};

class EmbeddingA2A {
 public:
  // Collective. Throws InvalidArgument naming the value: batch < 0, a table with rows < 1 or a
  // dim that is not a multiple of 8 in 8 ... kEmbeddingMaxDim, a dtype it does not take, ranks
  // that disagree on batch, dtypes or pooling; the nccl backend (not built yet).
  EmbeddingA2A(Backend& backend, const EmbeddingA2AConfig& config);
  ~EmbeddingA2A();
  EmbeddingA2A(const EmbeddingA2A&) = delete;
  EmbeddingA2A& operator=(const EmbeddingA2A&) = delete;

  // tables: one input per table of config().tables; out [batch, total_dim()] in out_dtype.
  // Throws InvalidArgument -- on every rank, when any rank's call is bad -- for null pointers,
  // offsets that do not start at 0 or decrease, an index outside its table (naming the table,
  // its global number and the position), out overlapping an input. On GPUs the offsets and
  // indices are checked by the kernel as it reads them (config().check_indices): there the
  // call completes on every rank and throws after it on the rank that passed them.
  void forward(const EmbeddingBagInput* tables, void* out, const EmbeddingA2ARunOptions& opt = {});

  // Collective. The transpose of forward. grad_out [batch, total_dim()] in out_dtype: the
  // gradient of forward's out on every rank; each rank's columns go back to the tables' owners
  // (the all-to-all reversed). Row r of this rank's table t gets the gradient g: the sum, in
  // fp32 from 0, over every bag of the global batch in order and each of its indices i in order
  // with indices[i] == r, of (w_i * s) * the bag's pooled gradient (w_i the per-sample weight or
  // 1, s 1, or 1 / the bag's size for mean), each product and sum rounded; grads[t] takes it as
  // opt.kind says. Methods: `baseline` (NCCL's all-to-all, then the sort by row and the sums),
  // `decomposed` (the sort beside the all-to-all), `fused` (each rank stores its gradients
  // straight into the owners' heap while they sort; the sums wait for them under the deadline),
  // `auto` (fused on GPUs). Checks as forward's, and the sinks' pointers; on GPUs every table's
  // num_indices is needed (an InvalidArgument without it).
  void backward(const EmbeddingBagInput* tables, const void* grad_out, const EmbeddingTableGrad* grads,
                const EmbeddingBackwardOptions& opt);
  // The dense gradient into grad_weights[t] ([rows, dim] fp32 for this rank's table t).
  void backward(const EmbeddingBagInput* tables, const void* grad_out, float* const* grad_weights,
                const EmbeddingA2ARunOptions& opt = {});

  // This rank's lookups alone (not collective; the forward's first step): pooled
  // [world * batch, local_dim()] in out_dtype, bag g's row the pooled rows of bag g of every
  // one of this rank's tables, side by side in table order (what nn.EmbeddingBag on each table
  // and a concatenation give). Checks as forward's, this rank's own.
  void pool(const EmbeddingBagInput* tables, void* pooled, const EmbeddingA2ARunOptions& opt = {});

  const EmbeddingA2AConfig& config() const;
  // Every rank's tables' dims in global order (rank 0's first), their sum, and where this
  // rank's first table is in that order.
  const std::vector<int64_t>& dims() const;
  int64_t total_dim() const;
  int64_t first_table() const;
  int64_t local_dim() const;  // the sum of this rank's tables' dims
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft::ops
