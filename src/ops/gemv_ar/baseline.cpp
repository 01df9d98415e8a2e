// `baseline`: the library calls one after the other -- cuBLAS's GEMM, NCCL's all-reduce in place
// on the stream (the backend's communicator), then the unfused add + RMSNorm; on the host backend
// a CPU GEMV, the collectives' reference all-reduce and a CPU loop. No per-M state.
#include "gemv_ar_impl.hpp"

#ifdef WEFT_HAVE_CUDA
#include <nccl.h>

#include "weft/core/cuda_check.hpp"
#endif

namespace weft::ops::detail {

void GemvBaseline::all_reduce(void* y, int64_t m, void* stream) {
  const uint64_t count = static_cast<uint64_t>(m * c_.cfg.n);
#ifdef WEFT_HAVE_CUDA
  if (!c_.host()) {
    const ncclDataType_t t = c_.cfg.dtype == dev::DType::kF16 ? ncclFloat16 : ncclBfloat16;
    WEFT_NCCL_CHECK(ncclAllReduce(y, y, count, t, ncclSum, static_cast<ncclComm_t>(c_.b.nccl_comm()),
                                  static_cast<cudaStream_t>(stream)));
    return;
  }
#endif
  // Every rank's y through the bootstrap, summed in rank order in fp32 (Collectives' baseline).
  c_.coll.all_reduce(y, y, count, c_.cfg.dtype, Method::kBaseline, stream);
}

void GemvBaseline::run(int64_t m, const void* x, const void* w, void* y, const GemvEpilogue& ep, void* stream) {
  void* sum = ep ? c_.sum_buffer() : y;
  c_.gemv(x, w, sum, m, stream);
  all_reduce(sum, m, stream);
  if (ep) c_.add_rmsnorm(sum, ep.residual, ep.gamma, ep.residual_out, y, m, stream);
}

}  // namespace weft::ops::detail
