#include "weft/device/ptx/launch_control.cuh"
#include "weft/kernels/collective_kernels.hpp"
#include "weft/kernels/runtime_kernels.hpp"

namespace weft::kernels {
namespace {

// Programmatic dependent launch (sm_90; pdl_enabled()): a collective may be scheduled while
// the stream's previous kernel finishes. It waits (griddepcontrol.wait) for that kernel to
// complete, with its memory visible, before touching any memory, so the order is the stream's
// as always; what it saves is the launch gap between back-to-back kernels. It then lets the
// next kernel of the stream start its own launch.

// One kernel per (type, algorithm): the bandwidth paths (unrolled fp32 sums) need many
// registers, the LL paths few; one kernel for all would give every path the worst case.
template <class T, coll::Algo A>
__global__ void __launch_bounds__(kCollThreads)
    collective_kernel(const __grid_constant__ dev::DeviceCtx c, const __grid_constant__ coll::Args a) {
  ptx::griddepcontrol_wait();
  ptx::griddepcontrol_launch_dependents();
  coll::run_slice_as<T>(dev::CoopCta{}, c, a, static_cast<int>(blockIdx.x), A);
}

template <class T, coll::Algo A>
cudaError_t start(const dev::DeviceCtx& c, const coll::Args& a, int threads, cudaStream_t s) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(a.ctas));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.stream = s;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, collective_kernel<T, A>, c, a);
}

template <class T>
cudaError_t launch(const dev::DeviceCtx& c, const coll::Args& a, int threads, cudaStream_t s) {
  using coll::Algo;
  switch (a.algo) {
    case Algo::kAllReduceOneShot:
      return start<T, Algo::kAllReduceOneShot>(c, a, threads, s);
    case Algo::kAllReduceTwoShot:
      return start<T, Algo::kAllReduceTwoShot>(c, a, threads, s);
    case Algo::kAllGather:
      return start<T, Algo::kAllGather>(c, a, threads, s);
    case Algo::kReduceScatter:
      return start<T, Algo::kReduceScatter>(c, a, threads, s);
    case Algo::kAllToAll:
      return start<T, Algo::kAllToAll>(c, a, threads, s);
    case Algo::kAllReduceLL:
      return start<T, Algo::kAllReduceLL>(c, a, threads, s);
    case Algo::kAllToAllV:
      return start<T, Algo::kAllToAllV>(c, a, threads, s);
    case Algo::kAllGatherLL:
      return start<T, Algo::kAllGatherLL>(c, a, threads, s);
    case Algo::kReduceScatterLL:
      return start<T, Algo::kReduceScatterLL>(c, a, threads, s);
    case Algo::kAllToAllLL:
      return start<T, Algo::kAllToAllLL>(c, a, threads, s);
    case Algo::kAllReduceLL128:
      return start<T, Algo::kAllReduceLL128>(c, a, threads, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t collective(const dev::DeviceCtx& c, const coll::Args& a, dev::DType dtype, cudaStream_t s) {
  const int threads = a.threads > 0 && a.threads <= kCollThreads ? a.threads : kCollThreads;
  switch (dtype) {
    case dev::DType::kF32:
      return launch<float>(c, a, threads, s);
    case dev::DType::kF16:
      return launch<dev::f16_t>(c, a, threads, s);
    case dev::DType::kBF16:
      return launch<dev::bf16_t>(c, a, threads, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace weft::kernels
