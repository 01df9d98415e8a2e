// Symmetric heap: every rank allocates the same sizes in the same order, so one offset
// names the same tensor on every rank. Allocation is collective and checked: ranks that
// disagree get an InvalidArgument, never silent corruption. Memory comes back zeroed.
//
// Owners: every allocation belongs to the owner current when it is made (0: none, kept as long
// as the heap). An op takes an owner at construction, allocates inside a Scope of it and
// release()s it when destroyed: its blocks go back to a free list that later allocations take
// first-fit (lowest offset first), the same on every rank because every rank makes the same
// allocations and releases in the same order.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "weft/device/barrier.hpp"
#include "weft/device/signal.hpp"

namespace weft {

class Backend;

template <class T>
struct SymTensor {
  uint64_t offset = 0;
  size_t count = 0;
  size_t bytes() const { return count * sizeof(T); }
};

class SymmetricHeap {
 public:
  static constexpr size_t kDefaultAlign = 256;

  SymmetricHeap(Backend& backend, size_t capacity) : backend_(backend), capacity_(capacity) {}

  // Collective. Returns the offset of `bytes` zeroed bytes aligned to `align` (a power of two).
  // A request that does not fit (any size, up to SIZE_MAX: the arithmetic is checked) is an
  // InvalidArgument naming the allocation, its size and the capacity, on every rank.
  uint64_t alloc_bytes(size_t bytes, std::string_view name, size_t align = kDefaultAlign);

  template <class T>
  SymTensor<T> alloc(size_t count, std::string_view name) {
    return SymTensor<T>{alloc_bytes(checked_bytes(count, sizeof(T), name), name,
                                    alignof(T) > kDefaultAlign ? alignof(T) : kDefaultAlign),
                        count};
  }
  // count * elem_bytes, or an InvalidArgument naming the allocation when it overflows size_t.
  size_t checked_bytes(size_t count, size_t elem_bytes, std::string_view name) const;
  dev::SignalSlab alloc_signals(uint32_t count, std::string_view name);
  dev::BarrierHandle alloc_barrier(std::string_view name);

  // A fresh owner id (local: every rank hands out the same sequence).
  uint64_t new_owner() { return ++owners_; }
  uint64_t owner() const { return owner_; }  // the current one
  // While alive, allocations belong to `owner`; restores the previous owner after.
  class Scope {
   public:
    Scope(SymmetricHeap& h, uint64_t owner) : h_(h), prev_(h.owner_) { h.owner_ = owner; }
    ~Scope() { h_.owner_ = prev_; }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    SymmetricHeap& h_;
    uint64_t prev_;
  };
  // Every allocation of `owner` (> 0) goes back to the heap. Local, no exchange (a rank
  // destroying an op must not wait for its peers: one may be gone): every rank releases the
  // same owners in the same order, and one that does not disagrees at its next allocation,
  // whose offsets are compared. The caller makes sure this rank's device work no longer
  // touches the blocks (ops: Backend::synchronize first); a peer's can only touch them again
  // through a new allocation, which that peer makes after its own release, and which is zeroed
  // before its exchange.
  void release(uint64_t owner);

  size_t used() const { return used_; }  // the top: every live block ends at or below it
  size_t in_use() const;                  // bytes of the live blocks
  size_t capacity() const { return capacity_; }
  uint64_t allocations() const { return seq_; }  // collective allocations so far

 private:
  struct Block {
    uint64_t bytes;
    uint64_t owner;
  };
  Backend& backend_;
  size_t capacity_;
  size_t used_ = 0;
  uint64_t seq_ = 0;
  uint64_t owners_ = 0, owner_ = 0;
  std::map<uint64_t, Block> live_;      // by offset
  std::map<uint64_t, uint64_t> free_;  // offset -> bytes, coalesced, all below used_
};

}  // namespace weft
