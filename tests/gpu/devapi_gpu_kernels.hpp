// Launchers of the GPU device-API test kernels (framework-free; status out).
#pragma once
#include <cuda_runtime.h>

#include "devapi_scenarios.hpp"

namespace weft::testing {

cudaError_t gpu_put_signal(Gran g, const dev::DeviceCtx& c, const PutArgs& a);
cudaError_t gpu_get(Gran g, const dev::DeviceCtx& c, const GetArgs& a);
cudaError_t gpu_barrier_rounds(Gran g, const dev::DeviceCtx& c, const BarrierArgs& a);
cudaError_t gpu_barrier_once(Gran g, const dev::DeviceCtx& c, const dev::BarrierHandle& b);

}  // namespace weft::testing
