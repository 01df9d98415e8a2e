#include "weft/runtime/host_backend.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>

#include "weft/core/error.hpp"

namespace weft {
namespace {

// Rank 0's segment name, unlinked when this goes out of scope: on success once every rank
// has mapped it, on every failure path (a peer that never arrives, a failed reservation)
// too, so that nothing is left in /dev/shm whatever the other ranks do.
struct SegmentName {
  char name[64] = {};
  bool created = false;
  ~SegmentName() {
    if (created) shm_unlink(name);
  }
};

// Reserves `bytes` for the segment behind `fd`, so that running out of /dev/shm is an error
// here, at start-up, rather than SIGBUS on every rank at the first touch of a missing page.
// Checked against the free space first: tmpfs's fallocate takes pages one by one until it
// fails, so a reservation far too large would first fill /dev/shm (and RAM).
void reserve_segment(int fd, size_t bytes, int64_t mib, int ranks) {
  const std::string what = fmt::format("the host symmetric heap needs {} bytes of /dev/shm ({}={} MiB x {} ranks)",
                                       bytes, tunables::kHostHeapMiB.env, mib, ranks);
  const std::string fix = fmt::format("lower {} or make /dev/shm larger (docker: --shm-size)", tunables::kHostHeapMiB.env);
  struct statvfs vfs{};
  if (fstatvfs(fd, &vfs) == 0 && vfs.f_frsize > 0) {
    const unsigned __int128 free_bytes = static_cast<unsigned __int128>(vfs.f_bavail) * vfs.f_frsize;
    WEFT_REQUIRE(free_bytes >= bytes, fmt::format("{}, but only {} bytes are free: {}", what,
                                                  static_cast<uint64_t>(free_bytes), fix));
  }
  WEFT_REQUIRE(bytes <= static_cast<uint64_t>(std::numeric_limits<off_t>::max()), what + ": too large for a file");
  const int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  WEFT_REQUIRE(rc == 0, fmt::format("{}, and reserving it failed: {}: {}", what, std::strerror(rc), fix));
}

class HostBackend final : public Backend {
 public:
  HostBackend(const World& w, const EnvMap& env, std::unique_ptr<Bootstrap> bs)
      : Backend(BackendKind::kHost, w, std::move(bs)) {
    ctx_.timeout_ns = static_cast<uint64_t>(tunable_value(tunables::kTimeoutMs, env)) * 1000000ull;
    // In range by the registry (at most 1 TiB x 1024 ranks), checked all the same.
    const int64_t mib = tunable_value(tunables::kHostHeapMiB, env);
    WEFT_REQUIRE(!__builtin_mul_overflow(static_cast<size_t>(mib), size_t{1} << 20, &heap_bytes_) &&
                     !__builtin_mul_overflow(heap_bytes_, static_cast<size_t>(w.size), &map_bytes_),
                 fmt::format("{}={} x {} ranks overflows a 64-bit size", tunables::kHostHeapMiB.env, mib, w.size));

    // Rank 0 creates and reserves the segment, then tells every rank its name, or why it
    // could not: every rank then fails with rank 0's reason instead of a timeout.
    SegmentName seg;
    struct Announce {
      char name[64];
      char error[448];
    } ann{};
    if (w.rank == 0) {
      std::random_device rd;
      // The name starts with rank 0's pid: a launcher that outlives a killed rank 0 removes
      // /dev/shm/weft-<pid>-* of its ranks (launch.cpp).
      std::snprintf(seg.name, sizeof seg.name, "/weft-%d-%08x", static_cast<int>(getpid()), rd());
      try {
        int fd = shm_open(seg.name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0) throw_errno(__FILE__, __LINE__, fmt::format("shm_open({}) in /dev/shm", seg.name));
        seg.created = true;
        try {
          reserve_segment(fd, map_bytes_, mib, w.size);
        } catch (...) {
          ::close(fd);
          throw;
        }
        ::close(fd);
        std::memcpy(ann.name, seg.name, sizeof seg.name);
      } catch (const std::exception& e) {
        std::snprintf(ann.error, sizeof ann.error, "%s", e.what());
      }
    }
    bootstrap_->broadcast(&ann, sizeof ann, 0);  // throws (and seg unlinks) when a rank is gone
    if (ann.error[0]) {
      if (w.rank == 0) throw InvalidArgument(ann.error);
      throw InvalidArgument(fmt::format("rank 0 could not create the host symmetric heap: {}", ann.error));
    }
    int fd = shm_open(ann.name, O_RDWR, 0600);
    int open_errno = errno;
    if (fd >= 0) {
      void* p = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      open_errno = errno;
      ::close(fd);
      if (p != MAP_FAILED) base_ = static_cast<char*>(p);
    }
    // Every rank has mapped (or failed) before the name goes away (seg's destructor on rank
    // 0): nothing leaks in /dev/shm even if a rank dies later.
    int ok = base_ != nullptr;
    std::vector<int> oks(w.size);
    try {
      bootstrap_->allgather(&ok, sizeof ok, oks.data());
    } catch (...) {
      if (base_) munmap(base_, map_bytes_);  // the destructor does not run for a failed constructor
      throw;
    }
    if (!std::all_of(oks.begin(), oks.end(), [](int o) { return o != 0; }) && base_) {
      munmap(base_, map_bytes_);
      base_ = nullptr;
    }
    for (int r = 0; r < w.size; ++r)
      WEFT_CHECK(oks[r], fmt::format("rank {} could not map the host symmetric heap /dev/shm{} ({} bytes){}", r,
                                     ann.name, map_bytes_,
                                     r == w.rank ? std::string(": ") + std::strerror(open_errno) : ""));
    for (int p = 0; p < w.size; ++p) ctx_.peer_base[p] = base_ + heap_bytes_ * static_cast<size_t>(p);
    ctx_.error = &slot_;
    host_slot_ = &slot_;
    init_heap(heap_bytes_);
  }

  ~HostBackend() override {
    if (base_) munmap(base_, map_bytes_);
  }

  std::string device_name() const override { return fmt::format("host ({} ranks, shared memory)", size()); }
  void zero(uint64_t offset, size_t bytes) override { std::memset(base_ + heap_bytes_ * rank() + offset, 0, bytes); }
  void* local_ptr(uint64_t offset) const override { return base_ + heap_bytes_ * rank() + offset; }
  void copy_to_host(void* dst, uint64_t offset, size_t bytes) override {
    if (bytes) std::memcpy(dst, base_ + heap_bytes_ * rank() + offset, bytes);  // dst may be null when empty
  }
  void copy_from_host(uint64_t offset, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(base_ + heap_bytes_ * rank() + offset, src, bytes);
  }
  void synchronize() override { check_error_slot(); }

 private:
  size_t heap_bytes_ = 0;
  size_t map_bytes_ = 0;
  char* base_ = nullptr;
  dev::ErrorSlot slot_{};
};

}  // namespace

std::unique_ptr<Backend> make_host_backend(const World& w, const EnvMap& env, std::unique_ptr<Bootstrap> bs) {
  return std::make_unique<HostBackend>(w, env, std::move(bs));
}

}  // namespace weft
