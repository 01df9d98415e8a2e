#include "weft/kernels/collective_kernels.hpp"

namespace weft::kernels {
namespace {

template <class T>
__global__ void __launch_bounds__(kCollThreads) collective_kernel(dev::DeviceCtx c, coll::Args a) {
  coll::run_slice<T>(dev::CoopCta{}, c, a, static_cast<int>(blockIdx.x));
}

}  // namespace

cudaError_t collective(const dev::DeviceCtx& c, const coll::Args& a, dev::DType dtype, cudaStream_t s) {
  switch (dtype) {
    case dev::DType::kF32: collective_kernel<float><<<a.ctas, kCollThreads, 0, s>>>(c, a); break;
    case dev::DType::kF16: collective_kernel<dev::f16_t><<<a.ctas, kCollThreads, 0, s>>>(c, a); break;
    case dev::DType::kBF16: collective_kernel<dev::bf16_t><<<a.ctas, kCollThreads, 0, s>>>(c, a); break;
  }
  return cudaGetLastError();
}

}  // namespace weft::kernels
