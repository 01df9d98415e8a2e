// Plan templates for the collectives. Every template emits a plan that the verifier accepts
// for any world size >= 1, any positive shape and any chunk split (tests hold them to that).
//
// Shapes (rows x cols of each symmetric tensor, per rank):
//   all-gather      in [rows x cols]          -> out [world*rows x cols]; out rows
//                   [q*rows, (q+1)*rows) on every rank = in of rank q.
//   reduce-scatter  in [world*rows x cols]    -> out [rows x cols]; out on rank r = sum over
//                   ranks of in rows [r*rows, (r+1)*rows). Staged adds a scratch tensor
//                   stage [world*rows x cols]: rank q pushes its rows for owner p into p's
//                   slot q (stage rows [q*rows, (q+1)*rows)), its own rows into its own slot
//                   by a local copy; then each owner sums its slots into out, piece by piece
//                   (a copy of its own slot, then a reduce of each peer's slot, chained).
//                   Pushes go to the other ranks in rotated order (rank q: q+1, q+2, ...),
//                   each in `splits` pieces; the GPU decomposed gemm_rs runs these tables.
//   all-reduce      in [rows x cols]          -> out [rows x cols] = sum over ranks of in.
//                   Two-shot and ring cut rows into `world` shards of ceil(rows/world) rows
//                   (the last shards shorter or empty when rows does not divide).
//   all-to-all      in [world*rows x cols]    -> out [world*rows x cols]; rank q's in slot p
//                   (rows [p*rows, (p+1)*rows)) lands in rank p's out slot q.
//   all-to-all by counts: counts[q][p] rows go from q to p; in rows are packed by destination,
//                   out rows by source; tensors are as tall as the largest rank needs.
//
// `splits` cuts every transfer into that many chunks along rows (ceil-sized, the last one
// shorter; chunks that would be empty are dropped). A chunk's signal is on the rank that
// consumes it, one signal per chunk, so a wait never covers more than the chunk it needs.
#pragma once
#include <vector>

#include "weft/plan/plan.hpp"

namespace weft::plan {

enum class AllGatherAlgo { kDirect, kRing, kBidirectionalRing };
enum class ReduceScatterAlgo { kDirect, kRing, kStaged };
enum class AllReduceAlgo { kOneShot, kTwoShot, kRing };

struct TemplateOptions {
  int splits = 1;
  Engine engine = Engine::kSm;
  int elem_bytes = 2;
};

CommPlan all_gather(AllGatherAlgo algo, int world, int64_t rows, int64_t cols, TemplateOptions opt = {});
CommPlan reduce_scatter(ReduceScatterAlgo algo, int world, int64_t rows, int64_t cols, TemplateOptions opt = {});
CommPlan all_reduce(AllReduceAlgo algo, int world, int64_t rows, int64_t cols, TemplateOptions opt = {});
CommPlan all_to_all(int world, int64_t rows, int64_t cols, TemplateOptions opt = {});
// counts[q][p]: rows rank q sends to rank p (world x world, non-negative).
CommPlan all_to_all_counts(const std::vector<std::vector<int64_t>>& counts, int64_t cols, TemplateOptions opt = {});

// Splits every transfer of a plan into `splits` chunks along rows (the last one shorter).
// A dependency on a split chunk becomes a dependency on the piece with the same rows when
// the two transfers line up piece by piece (same row count), else on every piece; each
// piece gets a signal of its own on the rank its parent signalled.
CommPlan split_chunks(const CommPlan& plan, int splits);

}  // namespace weft::plan
