#include "weft/runtime/heap.hpp"

#include <fmt/format.h>

#include <cstring>
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
  // Checked: `bytes` and `align` come from users (shapes), and any of them may be near
  // SIZE_MAX. used_ <= capacity_ always, so offset only wraps when align does not fit at all.
  const bool align_fits = align <= capacity_;
  const uint64_t offset = align_fits ? (used_ + align - 1) & ~static_cast<uint64_t>(align - 1) : used_;
  AllocRecord me{};
  me.seq = seq_;
  me.bytes = bytes;
  me.align = align;
  me.name_hash = std::hash<std::string_view>{}(name);
  me.offset = offset;
  me.fits = align_fits && offset <= capacity_ && bytes <= capacity_ - offset ? 1 : 0;
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
  WEFT_REQUIRE(me.fits, fmt::format("symmetric heap exhausted: '{}' needs {} bytes (align {}) at offset {}, but the "
                                    "heap holds {} bytes, {} of them free (raise WEFT_GPU_HEAP_MIB / "
                                    "WEFT_HOST_HEAP_MIB, or use smaller sizes)",
                                    name, bytes, align, offset, capacity_, capacity_ - used_));
  used_ = offset + bytes;
  ++seq_;
  return offset;
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
