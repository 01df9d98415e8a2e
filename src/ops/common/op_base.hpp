// Private to src/ops: what every op shares (docs/architecture.md, "Adding an op").
//
// An op object holds an OpBase and one object per method it runs. OpBase carries the
// concerns that are the same for every op, written once:
//  - the backend, rank and world, and the op's name for messages;
//  - cross-rank agreement: agree() compares a description of what every rank is about to do
//    (shape, dtype, method) and refuses a mismatch on every rank, naming both values, instead
//    of letting the ranks allocate or move different things and hang;
//  - the failure report: every call runs inside guarded(), so that a timeout leaving it goes
//    through Backend::raise_failure (which rank actually died, or which calls differ);
//  - argument checks with the op's name in the message (null, alignment);
//  - the symmetric workspace: heap allocations tagged "<op>.<what>", made at construction or
//    at a shape's first call, never inside a CUDA graph capture.
#pragma once
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

#include "weft/core/error.hpp"
#include "weft/runtime/backend.hpp"
#include "weft/runtime/heap.hpp"

namespace weft::ops::detail {

// An op's share of the symmetric heap: what is allocated while a scope() of it is open is the
// op's, and goes back to the heap when the share is destroyed (with the op), once this rank's
// device work is done (Backend::synchronize; SymmetricHeap::release says why no peer write
// lands in memory handed out again). Not while an exception unwinds the op (its device work
// may never end): then the space stays allocated.
class HeapShare {
 public:
  HeapShare(Backend& backend, std::string op_name);
  ~HeapShare();
  HeapShare(const HeapShare&) = delete;
  HeapShare& operator=(const HeapShare&) = delete;
  SymmetricHeap::Scope scope() const { return SymmetricHeap::Scope(b_.heap(), owner_); }
  uint64_t owner() const { return owner_; }

 private:
  Backend& b_;
  std::string name_;
  uint64_t owner_;
  int exceptions_;  // std::uncaught_exceptions() at construction
};

// Whether the byte ranges [x, x + nx) and [y, y + ny) share a byte (an output that would be
// written while an input is read); an empty range shares none.
inline bool ranges_overlap(const void* x, uint64_t nx, const void* y, uint64_t ny) {
  const auto p = reinterpret_cast<uintptr_t>(x), q = reinterpret_cast<uintptr_t>(y);
  return nx && ny && p < q + ny && q < p + nx;
}

class OpBase {
 public:
  OpBase(Backend& backend, std::string op_name) : b_(backend), name_(std::move(op_name)) {}

  Backend& backend() const { return b_; }
  int rank() const { return b_.rank(); }
  int world() const { return b_.size(); }
  const std::string& name() const { return name_; }

  // Collective: every rank passes its description of `what` (a short text: the same text on
  // every rank means they agree). Throws InvalidArgument on every rank when any differs:
  // "<op>: ranks disagree on <what>: rank 0 has <...>, rank r has <...>".
  void agree(std::string_view what, const std::string& description) const;

  // Runs one call of the op: a TimeoutError leaving it (a wait of its workers on the host
  // backend, a bootstrap exchange anywhere) becomes what the failure report finds
  // (Backend::raise_failure). No cost unless something throws.
  template <class F>
  void guarded(F&& call) const {
    try {
      call();
    } catch (const TimeoutError& e) {
      b_.raise_failure(e);
    }
  }

  // Throws InvalidArgument "<op>: <what>: null pointer" / "...: pointer P is not aligned to
  // <align_name>" (align_name empty: "<align> bytes").
  void check_ptr(const void* p, size_t align, std::string_view what, std::string_view align_name = {}) const;

  // Collective: `bytes` of the symmetric heap (zeroed), tagged "<op>.<what>"; its offset.
  // With a share (set_share), the allocation is the share's.
  uint64_t workspace(size_t bytes, std::string_view what) const;
  void set_share(const HeapShare* share) { share_ = share; }

  // Whether `stream` (a cudaStream_t on the nccl backend) is being captured into a graph.
  bool capturing(void* stream) const;

  // Runs a call's local checks (throwing InvalidArgument) and refuses on every rank when any
  // rank's failed: the verdicts are agreed under `what` first (a rank that threw alone would
  // leave its peers waiting for it); this rank's own error is rethrown where it failed.
  template <class F>
  void checked_everywhere(std::string_view what, F&& checks) const {
    std::string bad;
    std::exception_ptr error;
    try {
      checks();
    } catch (const InvalidArgument& e) {
      bad = e.message();
      error = std::current_exception();
    }
    agree(what, bad.empty() ? std::string("valid") : bad);
    if (error) std::rethrow_exception(error);
  }

 private:
  Backend& b_;
  std::string name_;
  const HeapShare* share_ = nullptr;
};

}  // namespace weft::ops::detail
