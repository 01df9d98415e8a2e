// Stream memory operations (CUDA builds; internal to the ops): a stream waits until a 64-bit
// word in device memory is >= a value, or writes one, without an SM. Driver API through the
// runtime's entry points (no -lcuda). Used where a wait must not occupy an SM beside a
// running GEMM: gemm_rs decomposed's epoch guard (the gathered inputs, the reduce pass).
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstdint>

#include "weft/core/error.hpp"

namespace weft::ops::detail {

struct StreamMemops {
  PFN_cuStreamWriteValue64_v11070 write = nullptr;
  PFN_cuStreamWaitValue64_v11070 wait = nullptr;
};

inline const StreamMemops& stream_memops() {
  static const StreamMemops ops = [] {
    StreamMemops o;
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue64", &f, 11070, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      o.write = reinterpret_cast<PFN_cuStreamWriteValue64_v11070>(f);
    f = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", &f, 11070, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      o.wait = reinterpret_cast<PFN_cuStreamWaitValue64_v11070>(f);
    return o;
  }();
  return ops;
}

inline bool stream_memops_available() { return stream_memops().write && stream_memops().wait; }

inline void stream_wait_geq(cudaStream_t s, const void* addr, uint64_t v) {
  const CUresult r = stream_memops().wait(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(addr), v,
                                          CU_STREAM_WAIT_VALUE_GEQ);
  if (r != CUDA_SUCCESS) throw Error(fmt::format("cuStreamWaitValue64 failed: CUresult {}", static_cast<int>(r)));
}

inline void stream_write(cudaStream_t s, const void* addr, uint64_t v) {
  const CUresult r = stream_memops().write(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(addr), v,
                                           CU_STREAM_WRITE_VALUE_DEFAULT);
  if (r != CUDA_SUCCESS) throw Error(fmt::format("cuStreamWriteValue64 failed: CUresult {}", static_cast<int>(r)));
}

}  // namespace weft::ops::detail
