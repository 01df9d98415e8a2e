#include "op_base.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

#include "weft/core/error.hpp"

#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime.h>

#include "weft/core/cuda_check.hpp"
#endif

namespace weft::ops::detail {

namespace {
// Descriptions travel in fixed-size records (the bootstrap's allgather takes equal sizes); a
// longer one is compared by its first kWire - 1 bytes and its length.
constexpr size_t kWire = 248;
struct Wire {
  uint64_t length;
  char text[kWire];
};
}  // namespace

void OpBase::agree(std::string_view what, const std::string& description) const {
  if (world() == 1) return;
  Wire mine;
  std::memset(&mine, 0, sizeof mine);  // compared bytewise
  mine.length = description.size();
  std::memcpy(mine.text, description.data(), std::min(description.size(), kWire - 1));
  std::vector<Wire> all(static_cast<size_t>(world()));
  b_.bootstrap().allgather(&mine, sizeof mine, all.data());
  for (int r = 1; r < world(); ++r)
    WEFT_REQUIRE(std::memcmp(&all[0], &all[static_cast<size_t>(r)], sizeof mine) == 0,
                 fmt::format("{}: ranks disagree on {}: rank 0 has {}, rank {} has {}", name_, what, all[0].text, r,
                             all[static_cast<size_t>(r)].text));
}

void OpBase::check_ptr(const void* p, size_t align, std::string_view what, std::string_view align_name) const {
  WEFT_REQUIRE(p != nullptr, fmt::format("{}: {}: null pointer", name_, what));
  WEFT_REQUIRE(reinterpret_cast<uintptr_t>(p) % align == 0,
               fmt::format("{}: {}: pointer {} is not aligned to {}", name_, what, p,
                           align_name.empty() ? fmt::format("{} bytes", align) : std::string(align_name)));
}

uint64_t OpBase::workspace(size_t bytes, std::string_view what) const {
  const SymmetricHeap::Scope in(b_.heap(), share_ ? share_->owner() : b_.heap().owner());
  return b_.heap().alloc_bytes(bytes, fmt::format("{}.{}", name_, what));
}

HeapShare::HeapShare(Backend& backend, std::string op_name)
    : b_(backend), name_(std::move(op_name)), owner_(backend.heap().new_owner()),
      exceptions_(std::uncaught_exceptions()) {}

HeapShare::~HeapShare() {
  if (std::uncaught_exceptions() > exceptions_) return;  // unwinding: a peer may be gone
  try {
    b_.synchronize();
    b_.heap().release(owner_);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft: %s: its symmetric-heap space stays allocated: %s\n", name_.c_str(), e.what());
  }
}

bool OpBase::capturing(void* stream) const {
#ifdef WEFT_HAVE_CUDA
  if (b_.kind() == BackendKind::kNccl) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    WEFT_CUDA_CHECK(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &st));
    return st != cudaStreamCaptureStatusNone;
  }
#endif
  (void)stream;
  return false;
}

}  // namespace weft::ops::detail
