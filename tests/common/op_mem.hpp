// Where a test's operands live, shared by the ops' host and GPU tests: the host backend's
// memory (HostMem) or a GPU's (DevMem). alloc gives 16-byte aligned bytes the op may read and
// write (kept until the Mem goes); to/from copy.
#pragma once
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime.h>

#include "weft/core/cuda_check.hpp"
#endif

namespace weft::testing {

struct Mem {
  std::function<void*(size_t)> alloc;
  std::function<void(void*, const void*, size_t)> to;    // op memory <- host
  std::function<void(void*, const void*, size_t)> from;  // host <- op memory
  void* stream = nullptr;
};

struct HostMem : Mem {
  std::vector<std::vector<unsigned char>> blocks;
  HostMem() {
    alloc = [this](size_t n) {
      blocks.emplace_back(n + 16);
      return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(blocks.back().data()) + 15) & ~uintptr_t{15});
    };
    to = [](void* d, const void* s, size_t n) {
      if (n) std::memcpy(d, s, n);
    };
    from = to;
  }
  HostMem(const HostMem&) = delete;
};

#ifdef WEFT_HAVE_CUDA
// Device memory, freed with it; copies on `stream`, then synchronised.
struct DevMem : Mem {
  std::vector<void*> blocks;
  explicit DevMem(cudaStream_t s) {
    stream = s;
    alloc = [this](size_t n) {
      void* p = nullptr;
      WEFT_CUDA_CHECK(cudaMalloc(&p, n));
      blocks.push_back(p);
      return p;
    };
    to = [s](void* d, const void* h, size_t n) {
      if (n) WEFT_CUDA_CHECK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s));
      WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
    };
    from = [s](void* h, const void* d, size_t n) {
      WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
      if (n) WEFT_CUDA_CHECK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
    };
  }
  ~DevMem() {
    for (void* p : blocks) cudaFree(p);
  }
  DevMem(const DevMem&) = delete;
};
#endif

}  // namespace weft::testing
