#include "weft/kernels/collective_kernels.hpp"

namespace weft::kernels {
namespace {

// One kernel per (type, algorithm): the bandwidth paths (unrolled fp32 sums) need many
// registers, the LL paths few; one kernel for all would give every path the worst case.
template <class T, coll::Algo A>
__global__ void __launch_bounds__(kCollThreads) collective_kernel(dev::DeviceCtx c, coll::Args a) {
  coll::run_slice_as<T>(dev::CoopCta{}, c, a, static_cast<int>(blockIdx.x), A);
}

template <class T>
void launch(const dev::DeviceCtx& c, const coll::Args& a, int threads, cudaStream_t s) {
  using coll::Algo;
  switch (a.algo) {
    case Algo::kAllReduceOneShot:
      collective_kernel<T, Algo::kAllReduceOneShot><<<a.ctas, threads, 0, s>>>(c, a);
      break;
    case Algo::kAllReduceTwoShot:
      collective_kernel<T, Algo::kAllReduceTwoShot><<<a.ctas, threads, 0, s>>>(c, a);
      break;
    case Algo::kAllGather:
      collective_kernel<T, Algo::kAllGather><<<a.ctas, threads, 0, s>>>(c, a);
      break;
    case Algo::kReduceScatter:
      collective_kernel<T, Algo::kReduceScatter><<<a.ctas, threads, 0, s>>>(c, a);
      break;
    case Algo::kAllToAll:
      collective_kernel<T, Algo::kAllToAll><<<a.ctas, threads, 0, s>>>(c, a);
      break;
    case Algo::kAllReduceLL:
      collective_kernel<T, Algo::kAllReduceLL><<<a.ctas, threads, 0, s>>>(c, a);
      break;
    case Algo::kAllToAllV:
      collective_kernel<T, Algo::kAllToAllV><<<a.ctas, threads, 0, s>>>(c, a);
      break;
    case Algo::kAllGatherLL:
      collective_kernel<T, Algo::kAllGatherLL><<<a.ctas, threads, 0, s>>>(c, a);
      break;
    case Algo::kReduceScatterLL:
      collective_kernel<T, Algo::kReduceScatterLL><<<a.ctas, threads, 0, s>>>(c, a);
      break;
    case Algo::kAllToAllLL:
      collective_kernel<T, Algo::kAllToAllLL><<<a.ctas, threads, 0, s>>>(c, a);
      break;
  }
}

}  // namespace

cudaError_t collective(const dev::DeviceCtx& c, const coll::Args& a, dev::DType dtype, cudaStream_t s) {
  const int threads = a.threads > 0 && a.threads <= kCollThreads ? a.threads : kCollThreads;
  switch (dtype) {
    case dev::DType::kF32:
      launch<float>(c, a, threads, s);
      break;
    case dev::DType::kF16:
      launch<dev::f16_t>(c, a, threads, s);
      break;
    case dev::DType::kBF16:
      launch<dev::bf16_t>(c, a, threads, s);
      break;
  }
  return cudaGetLastError();
}

}  // namespace weft::kernels
