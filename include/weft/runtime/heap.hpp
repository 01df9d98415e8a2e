// Symmetric heap: every rank allocates the same sizes in the same order, so one offset
// names the same tensor on every rank. Allocation is collective and checked: ranks that
// disagree get an InvalidArgument, never silent corruption. Memory comes back zeroed.
#pragma once
#include <cstddef>
#include <cstdint>
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

  size_t used() const { return used_; }
  size_t capacity() const { return capacity_; }
  uint64_t allocations() const { return seq_; }

 private:
  Backend& backend_;
  size_t capacity_;
  size_t used_ = 0;
  uint64_t seq_ = 0;
};

}  // namespace weft
