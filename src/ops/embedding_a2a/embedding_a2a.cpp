// Embedding-bag lookups + all-to-all (include/weft/ops/embedding_a2a.hpp, docs/embedding_a2a.md):
// the host backend's baseline -- each rank pools its tables' bags for the whole global batch
// into a send buffer packed by destination ([world][batch][this rank's dims]), the library's
// all-to-all by counts moves every block to its samples' rank (packed by source), and the
// re-layout puts source s's block of each sample at s's tables' columns.
#include "weft/ops/embedding_a2a.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "../common/op_base.hpp"
#include "../moe/rows.hpp"
#include "weft/core/error.hpp"
#include "weft/ops/collectives.hpp"

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
};

EmbeddingA2A::EmbeddingA2A(Backend& backend, const EmbeddingA2AConfig& config) {
  WEFT_REQUIRE(backend.kind() == BackendKind::kHost,
               "embedding_a2a: the nccl backend is not built yet (issue 24); use the host backend");
  impl_ = std::make_unique<Impl>(backend, config);
  Impl& I = *impl_;
  I.op.set_share(&I.share);
  const std::string bad = faults(config);
  I.op.agree("whether the configuration is valid", bad.empty() ? std::string("valid") : bad);
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
  I.recv_elems = static_cast<uint64_t>(std::max<int64_t>(1, config.batch * I.total));
  const SymmetricHeap::Scope in(I.share.scope());
  I.recv_off = I.op.workspace(I.recv_elems * I.ob, "recv");
  I.coll.prepare_all_to_all_v(I.recv_elems, config.out_dtype, Method::kBaseline);
}

EmbeddingA2A::~EmbeddingA2A() = default;

void EmbeddingA2A::forward(const EmbeddingBagInput* tables, void* out, const EmbeddingA2ARunOptions& opt) {
  Impl& I = *impl_;
  I.op.guarded([&] {
    const EmbeddingA2AConfig& c = I.cfg;
    const int W = I.op.world(), me = I.op.rank();
    const int64_t B = c.batch, bags = static_cast<int64_t>(W) * B, Dm = I.rank_dim[static_cast<size_t>(me)];
    const size_t n_tables = c.tables.size();
    I.op.checked_everywhere("whether the forward call is valid", [&] {
      WEFT_REQUIRE(opt.method == EmbeddingA2AMethod::kAuto || opt.method == EmbeddingA2AMethod::kBaseline,
                   fmt::format("embedding_a2a: method {} is not built", to_string(opt.method)));
      if (n_tables) WEFT_REQUIRE(tables != nullptr, "embedding_a2a: tables: null pointer");
      if (B > 0 && I.total > 0) I.op.check_ptr(out, I.ob, "out");
      for (size_t t = 0; t < n_tables; ++t) {
        const EmbeddingBagInput& in = tables[t];
        const int64_t g = I.first + static_cast<int64_t>(t);
        I.op.check_ptr(in.offsets, 8, fmt::format("table {} (global {}): offsets", t, g));
        WEFT_REQUIRE(
            in.offsets[0] == 0,
            fmt::format("embedding_a2a: table {} (global {}): offsets[0] must be 0, got {}", t, g, in.offsets[0]));
        for (int64_t b = 0; b < bags; ++b)
          WEFT_REQUIRE(in.offsets[b + 1] >= in.offsets[b],
                       fmt::format("embedding_a2a: table {} (global {}): offsets decrease at bag {} ({} then {})", t, g,
                                   b, in.offsets[b], in.offsets[b + 1]));
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
        const uint64_t out_bytes = static_cast<uint64_t>(B * I.total) * I.ob;
        WEFT_REQUIRE(
            !detail::ranges_overlap(out, out_bytes, in.weight, static_cast<uint64_t>(rows * c.tables[t].dim) * I.wb) &&
                !detail::ranges_overlap(out, out_bytes, in.indices, static_cast<uint64_t>(nnz) * 8),
            fmt::format("embedding_a2a: out overlaps table {} (global {})'s inputs", t, g));
      }
    });
    // The lookups: bag q * B + b (rank q's sample b) of every table into send[q][b][col].
    I.send.assign(std::max<size_t>(static_cast<size_t>(bags * Dm) * I.ob, I.ob), 0);  // never empty: a valid pointer
    std::vector<float> acc;
    int64_t col = 0;
    for (size_t t = 0; t < n_tables; ++t) {
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
        unsigned char* dst = I.send.data() + static_cast<size_t>(bag * Dm + col) * I.ob;
        for (int64_t j = 0; j < D; ++j)
          store(
              dst, j,
              c.pooling == EmbeddingPooling::kMean ? acc[static_cast<size_t>(j)] * scale : acc[static_cast<size_t>(j)],
              c.out_dtype);
      }
      col += D;
    }
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

const EmbeddingA2AConfig& EmbeddingA2A::config() const { return impl_->cfg; }
const std::vector<int64_t>& EmbeddingA2A::dims() const { return impl_->dims; }
int64_t EmbeddingA2A::total_dim() const { return impl_->total; }
int64_t EmbeddingA2A::first_table() const { return impl_->first; }

}  // namespace weft::ops
