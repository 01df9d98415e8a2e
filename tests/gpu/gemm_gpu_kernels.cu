// Test helper kernels for the GEMM's GPU tests.
#include "gemm_gpu_kernels.hpp"
#include "weft/device/atomics.hpp"

namespace weft::testing {
namespace {
__global__ void set_signals_kernel(uint64_t* sig, int n, uint64_t v) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) dev::store_release(sig + i, v);
}
}  // namespace

cudaError_t set_signals(uint64_t* sig, int n, uint64_t v, cudaStream_t s) {
  set_signals_kernel<<<1, 128, 0, s>>>(sig, n, v);
  return cudaGetLastError();
}

}  // namespace weft::testing
