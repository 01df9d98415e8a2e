#include "weft/runtime/heap.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <functional>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/runtime/backend.hpp"

namespace weft {
namespace {

// What each rank says about one allocation; every rank must say the same.
struct AllocRecord {
  uint64_t seq;
  uint64_t bytes;
  uint64_t align;
  uint64_t name_hash;
  uint64_t offset;
  uint32_t fits;
  char name[36];
};

}  // namespace

uint64_t SymmetricHeap::alloc_bytes(size_t bytes, std::string_view name, size_t align) {
  WEFT_REQUIRE(align != 0 && (align & (align - 1)) == 0,
               fmt::format("symmetric allocation '{}': alignment {} is not a power of two", name, align));
  auto align_up = [&](uint64_t x, uint64_t& out) {  // false on overflow
    if (x > UINT64_MAX - (align - 1)) return false;
    out = (x + align - 1) & ~static_cast<uint64_t>(align - 1);
    return true;
  };
  // First fit in the free list (lowest offset first), else at the top.
  uint64_t offset = 0;
  bool fits = false, from_free = false;
  if (bytes > 0)
    for (const auto& [o, n] : free_) {
      uint64_t start = 0;
      if (align_up(o, start) && start - o <= n && bytes <= n - (start - o)) {
        offset = start;
        fits = from_free = true;
        break;
      }
    }
  if (!from_free) fits = align_up(used_, offset) && offset <= capacity_ && bytes <= capacity_ - offset;
  AllocRecord me{};
  me.seq = seq_;
  me.bytes = bytes;
  me.align = align;
  me.name_hash = std::hash<std::string_view>{}(name);
  me.offset = offset;
  me.fits = fits ? 1 : 0;
  std::strncpy(me.name, std::string(name).c_str(), sizeof me.name - 1);
  // Zero before the exchange: the exchange is the barrier after which peers may write here.
  if (me.fits && bytes > 0) backend_.zero(offset, bytes);

  const int n = backend_.size();
  std::vector<AllocRecord> all(n);
  backend_.bootstrap().allgather(&me, sizeof me, all.data());
  for (int r = 0; r < n; ++r) {
    const AllocRecord& o = all[r];
    WEFT_REQUIRE(o.bytes == me.bytes && o.align == me.align && o.name_hash == me.name_hash && o.offset == me.offset,
                 fmt::format("symmetric allocation #{} disagrees across ranks: rank {} allocates '{}' ({} bytes, "
                             "align {}, offset {}), rank {} allocates '{}' ({} bytes, align {}, offset {}); every "
                             "rank must allocate the same sizes in the same order",
                             seq_, backend_.rank(), me.name, me.bytes, me.align, me.offset, r, o.name, o.bytes,
                             o.align, o.offset));
  }
  WEFT_REQUIRE(me.fits, fmt::format("symmetric heap exhausted: '{}' needs {} bytes (align {}), but the heap holds {} "
                                    "bytes, {} of them in use (raise WEFT_GPU_HEAP_MIB / WEFT_HOST_HEAP_MIB, or use "
                                    "smaller sizes)",
                                    name, bytes, align, capacity_, in_use()));
  if (from_free) {
    auto it = free_.upper_bound(offset);
    --it;  // the block holding offset
    const uint64_t o = it->first, end = o + it->second;
    free_.erase(it);
    if (offset > o) free_[o] = offset - o;
    if (offset + bytes < end) free_[offset + bytes] = end - (offset + bytes);
  } else {
    if (offset > used_) free_[used_] = offset - used_;  // the alignment gap
    used_ = offset + bytes;
  }
  if (bytes > 0) live_[offset] = Block{bytes, owner_};
  ++seq_;
  return offset;
}

void SymmetricHeap::release(uint64_t owner) {
  WEFT_REQUIRE(owner > 0, "symmetric heap: release of owner 0 (allocations without an owner stay)");
  for (auto it = live_.begin(); it != live_.end();) {
    if (it->second.owner != owner) {
      ++it;
      continue;
    }
    uint64_t o = it->first, len = it->second.bytes;
    it = live_.erase(it);
    // Coalesce with the free neighbours.
    auto next = free_.lower_bound(o);
    if (next != free_.end() && next->first == o + len) {
      len += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == o) {
        o = prev->first;
        len += prev->second;
        free_.erase(prev);
      }
    }
    free_[o] = len;
  }
  // A free block at the top lowers it.
  if (!free_.empty()) {
    auto last = std::prev(free_.end());
    if (last->first + last->second == used_) {
      used_ = last->first;
      free_.erase(last);
    }
  }
}

size_t SymmetricHeap::in_use() const {
  size_t total = 0;
  for (const auto& [o, b] : live_) total += b.bytes;
  return total;
}

size_t SymmetricHeap::checked_bytes(size_t count, size_t elem_bytes, std::string_view name) const {
  size_t bytes = 0;
  WEFT_REQUIRE(!__builtin_mul_overflow(count, elem_bytes, &bytes),
               fmt::format("symmetric allocation '{}': {} elements of {} bytes overflow a 64-bit size (the heap holds "
                           "{} bytes)",
                           name, count, elem_bytes, capacity_));
  return bytes;
}

dev::SignalSlab SymmetricHeap::alloc_signals(uint32_t count, std::string_view name) {
  return dev::SignalSlab{alloc_bytes(8ull * count, name), count};
}

dev::BarrierHandle SymmetricHeap::alloc_barrier(std::string_view name) {
  const uint64_t off = alloc_bytes(8ull * (backend_.size() + 1), name);
  return dev::BarrierHandle{off, off + 8ull * backend_.size()};
}

}  // namespace weft
