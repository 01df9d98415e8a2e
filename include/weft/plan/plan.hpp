// The plan compiler's vocabulary: regions of symmetric tensors, transfers (chunks) and
// communication plans. Host-only C++: nothing here includes CUDA.
//
// A CommPlan says what moves where, in which order and on which engine, for one call
// (one epoch) of an op. Signals are never reset between calls, so every count in a plan
// is "per epoch": call number e waits for e * expected.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace weft::plan {

// A rectangle of a row-major 2-D tensor: rows [row_begin, row_end) x cols [col_begin, col_end).
// A byte range is the same thing on a tensor of one row with 1-byte elements: Region::bytes.
struct Region {
  int64_t row_begin = 0;
  int64_t row_end = 0;
  int64_t col_begin = 0;
  int64_t col_end = 0;

  static Region rect(int64_t r0, int64_t r1, int64_t c0, int64_t c1) { return Region{r0, r1, c0, c1}; }
  static Region bytes(int64_t b0, int64_t b1) { return Region{0, 1, b0, b1}; }

  int64_t rows() const { return row_end - row_begin; }
  int64_t cols() const { return col_end - col_begin; }
  int64_t elements() const { return rows() * cols(); }
  bool empty() const { return rows() <= 0 || cols() <= 0; }
  bool overlaps(const Region& o) const {
    return row_begin < o.row_end && o.row_begin < row_end && col_begin < o.col_end && o.col_begin < col_end;
  }
  bool operator==(const Region&) const = default;
};

// What a transfer does to its destination.
//  push:   executed by the source rank, overwrites dst (usually on a peer).
//  pull:   executed by the destination rank, overwrites dst from src (usually on a peer).
//  reduce: dst += src; executed by either end (push-reduce or pull-reduce).
//  copy:   a local copy, src, dst and executor on one rank.
enum class Kind : uint8_t { kPush, kPull, kReduce, kCopy };
// The engine that moves the bytes.
enum class Engine : uint8_t { kSm, kTma, kCopyEngine, kNccl, kNet };

std::string_view to_string(Kind k);
std::string_view to_string(Engine e);

// What a tensor holds at the start of an epoch and what the verifier expects of it at the end.
//  input:   holds this rank's contribution; read-only for the plan.
//  output:  undefined at the start; every valid element is overwritten exactly once, and
//           (when `sum`) ends holding every rank's contribution exactly once, otherwise exactly
//           one rank's contribution.
//  scratch: undefined at the start; may be written any number of times; nothing is expected.
enum class Role : uint8_t { kInput, kOutput, kScratch };
std::string_view to_string(Role r);

// A symmetric tensor: the same shape (and heap offset) on every rank.
struct Tensor {
  std::string name;
  int64_t rows = 0;
  int64_t cols = 0;
  int elem_bytes = 2;
  Role role = Role::kScratch;
  // Output only: the elements must end as a sum over all ranks (reduce-scatter, all-reduce).
  bool sum = false;
  // Output only: rows that rank r must receive are [0, valid_rows[r]); empty: all rows on every
  // rank. All-to-all by counts receives different row counts on different ranks.
  std::vector<int64_t> valid_rows;

  bool operator==(const Tensor&) const = default;
};

// One end of a transfer.
struct Endpoint {
  int rank = 0;
  int tensor = 0;  // index into CommPlan::tensors
  Region region;
  bool operator==(const Endpoint&) const = default;
};

// A signal increment. A signal is named by (rank, index): index into that rank's signal slab.
struct SignalRef {
  int rank = -1;  // -1: the transfer bumps no signal
  int index = -1;
  bool operator==(const SignalRef&) const = default;
};

// One chunk: the unit that moves, waits and signals.
// Invariants (checked by the verifier): chunk ids are unique in the plan; src and dst have the
// same shape; the executing rank is src.rank for push, dst.rank for pull, either for reduce,
// both for copy; every dep bumps a signal on the executing rank (that is what the transfer
// waits on), and it waits for that signal's whole per-epoch total.
struct Transfer {
  int64_t chunk = 0;
  Kind kind = Kind::kPush;
  Endpoint src;
  Endpoint dst;
  std::vector<int64_t> deps;  // chunks that must complete before this one starts
  SignalRef signal;           // bumped after the data is complete at dst
  int64_t increment = 1;
  Engine engine = Engine::kSm;
  bool operator==(const Transfer&) const = default;
};

// A signal's per-epoch total: a wait on it (by a transfer or a tile) waits for exactly this.
struct Signal {
  int rank = 0;
  int index = 0;
  int64_t expected = 0;
  bool operator==(const Signal&) const = default;
};

struct CommPlan {
  std::string name;  // e.g. "all_gather.ring"
  int world = 1;
  std::vector<Tensor> tensors;
  // queues[r]: the transfers rank r executes, in issue order. Issue order is not completion
  // order: workers take transfers in this order, but only deps order their completion.
  std::vector<std::vector<Transfer>> queues;
  std::vector<Signal> signals;

  int tensor_id(std::string_view name) const;  // -1 when absent
  size_t num_transfers() const;
  // The transfer with this chunk id (nullptr when absent); `rank` receives its queue.
  const Transfer* find(int64_t chunk, int* rank = nullptr) const;
  const Signal* find_signal(int rank, int index) const;
  bool operator==(const CommPlan&) const = default;
};

// Splits [begin, end) into at most `parts` ranges of ceil(n / parts) rows, the last one
// shorter when n does not divide evenly; ranges that would be empty are dropped.
std::vector<std::pair<int64_t, int64_t>> split_range(int64_t begin, int64_t end, int parts);

// Builds plans: hands out chunk ids and signal indices, and sets each signal's expected
// total from the increments that reach it.
class PlanBuilder {
 public:
  PlanBuilder(std::string name, int world);
  int add_tensor(Tensor t);
  // A fresh signal on `rank`.
  SignalRef new_signal(int rank);
  // Appends to the executing rank's queue; returns the chunk id.
  int64_t add(int exec_rank, Transfer t);
  // Sets every signal's expected total to the increments that reach it and returns the plan.
  CommPlan finish();
  CommPlan& plan() { return plan_; }

 private:
  CommPlan plan_;
  std::vector<int> next_signal_;
  int64_t next_chunk_ = 0;
};

// Recomputes every signal's expected total from the increments that reach it, adding
// signals that transfers bump but the plan does not declare.
void recount_signals(CommPlan& plan);

}  // namespace weft::plan
