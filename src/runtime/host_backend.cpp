#include "weft/runtime/host_backend.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "weft/core/error.hpp"

namespace weft {
namespace {

class HostBackend final : public Backend {
 public:
  HostBackend(const World& w, const EnvMap& env, std::unique_ptr<Bootstrap> bs)
      : Backend(BackendKind::kHost, w, std::move(bs)) {
    const int64_t mib = tunable_value(tunables::kHostHeapMiB, env);
    WEFT_REQUIRE(mib >= 1, fmt::format("{}={} must be at least 1", tunables::kHostHeapMiB.env, mib));
    heap_bytes_ = static_cast<size_t>(mib) << 20;
    map_bytes_ = heap_bytes_ * static_cast<size_t>(w.size);

    char name[64] = {};
    if (w.rank == 0) {
      std::random_device rd;
      std::snprintf(name, sizeof name, "/weft-%d-%08x", static_cast<int>(getpid()), rd());
      int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
      WEFT_SYSCHECK(fd);
      if (ftruncate(fd, static_cast<off_t>(map_bytes_)) != 0) {
        ::close(fd);
        shm_unlink(name);
        throw_errno(__FILE__, __LINE__, "ftruncate of the host symmetric heap");
      }
      ::close(fd);
    }
    bootstrap_->broadcast(name, sizeof name, 0);
    int fd = shm_open(name, O_RDWR, 0600);
    int open_errno = errno;
    if (fd >= 0) {
      void* p = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      ::close(fd);
      if (p != MAP_FAILED) base_ = static_cast<char*>(p);
    }
    // Every rank has mapped (or failed) before the name goes away; nothing leaks in /dev/shm
    // even if a rank dies later.
    int ok = base_ != nullptr;
    std::vector<int> oks(w.size);
    try {
      bootstrap_->allgather(&ok, sizeof ok, oks.data());
    } catch (...) {
      if (w.rank == 0) shm_unlink(name);
      throw;
    }
    if (w.rank == 0) shm_unlink(name);
    for (int r = 0; r < w.size; ++r)
      WEFT_CHECK(oks[r], fmt::format("rank {} could not map the host symmetric heap '{}' ({} bytes){}", r, name,
                                     map_bytes_, r == w.rank ? std::string(": ") + std::strerror(open_errno) : ""));
    for (int p = 0; p < w.size; ++p) ctx_.peer_base[p] = base_ + heap_bytes_ * static_cast<size_t>(p);
    ctx_.error = &slot_;
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
