// Kernels of the GPU device-API tests: each scenario of devapi_scenarios.hpp at thread
// (<<<1,1>>>), warp (<<<1,32>>>) and block (<<<1,256>>>) granularity.
#include "devapi_gpu_kernels.hpp"

namespace weft::testing {
namespace {

template <class Coop>
__global__ void put_kernel(dev::DeviceCtx c, PutArgs a) {
  scenario_put_signal(Coop{}, c, a);
}
template <class Coop>
__global__ void get_kernel(dev::DeviceCtx c, GetArgs a) {
  scenario_get(Coop{}, c, a);
}
template <class Coop>
__global__ void barrier_rounds_kernel(dev::DeviceCtx c, BarrierArgs a) {
  scenario_barrier(Coop{}, c, a);
}
template <class Coop>
__global__ void barrier_once_kernel(dev::DeviceCtx c, dev::BarrierHandle b) {
  scenario_barrier_once(Coop{}, c, b);
}

}  // namespace

#define WEFT_DISPATCH_GRAN(kernel, g, ...)                                        \
  do {                                                                            \
    if (g == Gran::kThread) kernel<dev::CoopThread><<<1, 1>>>(__VA_ARGS__);       \
    if (g == Gran::kWarp) kernel<dev::CoopWarp><<<1, 32>>>(__VA_ARGS__);          \
    if (g == Gran::kBlock) kernel<dev::CoopCta><<<1, 256>>>(__VA_ARGS__);         \
    return cudaGetLastError();                                                    \
  } while (0)

cudaError_t gpu_put_signal(Gran g, const dev::DeviceCtx& c, const PutArgs& a) { WEFT_DISPATCH_GRAN(put_kernel, g, c, a); }
cudaError_t gpu_get(Gran g, const dev::DeviceCtx& c, const GetArgs& a) { WEFT_DISPATCH_GRAN(get_kernel, g, c, a); }
cudaError_t gpu_barrier_rounds(Gran g, const dev::DeviceCtx& c, const BarrierArgs& a) {
  WEFT_DISPATCH_GRAN(barrier_rounds_kernel, g, c, a);
}
cudaError_t gpu_barrier_once(Gran g, const dev::DeviceCtx& c, const dev::BarrierHandle& b) {
  WEFT_DISPATCH_GRAN(barrier_once_kernel, g, c, b);
}

}  // namespace weft::testing
