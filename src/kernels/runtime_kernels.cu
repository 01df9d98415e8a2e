#include <nccl_device.h>

#include "weft/core/env.hpp"
#include "weft/device/api.hpp"
#include "weft/kernels/runtime_kernels.hpp"

namespace weft::kernels {
namespace {

__global__ void lsa_bases_kernel(ncclWindow_t win, int world, char** out) {
  for (int p = threadIdx.x; p < world; p += blockDim.x) out[p] = static_cast<char*>(ncclGetPeerPointer(win, 0, p));
}

__global__ void symmetry_write_kernel(const __grid_constant__ dev::DeviceCtx c) {
  for (int p = threadIdx.x; p < c.world; p += blockDim.x)
    *c.ptr<uint64_t>(p, 8ull * c.rank) = (static_cast<uint64_t>(c.rank + 1) << 32) | static_cast<uint64_t>(p);
}

__global__ void barrier_kernel(const __grid_constant__ dev::DeviceCtx c,
                               const __grid_constant__ dev::BarrierHandle bar) {
  dev::barrier(dev::CoopThread{}, c, bar);
}

__global__ void sleep_kernel(uint64_t ns) {
  const uint64_t t0 = ptx::globaltimer_ns();
  while (ptx::globaltimer_ns() - t0 < ns) __nanosleep(1000);
}

}  // namespace

cudaError_t load_kernels(const void* const* fns, size_t n) {
  cudaFuncAttributes fa;
  for (size_t i = 0; i < n; ++i)
    if (const cudaError_t e = cudaFuncGetAttributes(&fa, fns[i]); e != cudaSuccess) return e;
  return cudaSuccess;
}

cudaError_t runtime_preload() {
  const void* fns[] = {reinterpret_cast<const void*>(barrier_kernel), reinterpret_cast<const void*>(sleep_kernel)};
  return load_kernels(fns, 2);
}

cudaError_t device_sleep(uint64_t ns, cudaStream_t stream) {
  sleep_kernel<<<1, 1, 0, stream>>>(ns);
  return cudaGetLastError();
}

cudaError_t lsa_bases(ncclWindow_t win, int world, char** out, cudaStream_t stream) {
  lsa_bases_kernel<<<1, 128, 0, stream>>>(win, world, out);
  return cudaGetLastError();
}

cudaError_t symmetry_write(const dev::DeviceCtx& c, cudaStream_t stream) {
  symmetry_write_kernel<<<1, 128, 0, stream>>>(c);
  return cudaGetLastError();
}

cudaError_t device_barrier(const dev::DeviceCtx& c, dev::BarrierHandle bar, cudaStream_t stream) {
  barrier_kernel<<<1, 1, 0, stream>>>(c, bar);
  return cudaGetLastError();
}

int sm_count(int device) {
  int n = 0;
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) return 1;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 1;
  return n > 0 ? n : 1;
}

bool pdl_enabled() {
  static const bool on = tunable_value(tunables::kPdl) != 0;
  return on;
}

}  // namespace weft::kernels
