// Built only with CUDA: how many GPUs this process sees.
#include <cuda_runtime.h>

#include "weft/runtime/backend.hpp"

namespace weft {

int count_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no device: a machine without GPUs
    return 0;
  }
  return n;
}

}  // namespace weft
