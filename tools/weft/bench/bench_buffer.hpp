// A buffer in the backend's memory for the benchmarks: device memory on GPUs (zeroed), else
// 16-byte aligned host bytes (zeroed); copies in and out. Header-only.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime.h>

#include "weft/core/cuda_check.hpp"
#endif

namespace weft::bench {

class BenchBuffer {
 public:
  BenchBuffer(bool gpu, size_t bytes) : gpu_(gpu) {
#ifdef WEFT_HAVE_CUDA
    if (gpu) {
      WEFT_CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(bytes, 16)));
      WEFT_CUDA_CHECK(cudaMemset(p_, 0, std::max<size_t>(bytes, 16)));
      return;
    }
#endif
    host_.assign(bytes + 16, 0);
    p_ = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(host_.data()) + 15) & ~uintptr_t{15});
  }
  ~BenchBuffer() {
#ifdef WEFT_HAVE_CUDA
    if (gpu_) cudaFree(p_);
#endif
  }
  BenchBuffer(const BenchBuffer&) = delete;
  BenchBuffer& operator=(const BenchBuffer&) = delete;
  void* get() const { return p_; }
  // `bytes` from src (host memory) to the buffer's start.
  void load(const void* src, size_t bytes) {
#ifdef WEFT_HAVE_CUDA
    if (gpu_) {
      WEFT_CUDA_CHECK(cudaMemcpy(p_, src, bytes, cudaMemcpyHostToDevice));
      return;
    }
#endif
    if (bytes) std::memcpy(p_, src, bytes);
  }
  // The first `n` values of type T (the caller has synchronised the stream that wrote them).
  template <class T>
  std::vector<T> read(size_t n) const {
    std::vector<T> out(n);
#ifdef WEFT_HAVE_CUDA
    if (gpu_) {
      WEFT_CUDA_CHECK(cudaMemcpy(out.data(), p_, n * sizeof(T), cudaMemcpyDeviceToHost));
      return out;
    }
#endif
    if (n) std::memcpy(out.data(), p_, n * sizeof(T));
    return out;
  }

 private:
  bool gpu_;
  void* p_ = nullptr;
  std::vector<unsigned char> host_;
};

}  // namespace weft::bench
