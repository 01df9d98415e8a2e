// The collectives' own algorithms (include/weft/kernels/collective_algos.hpp): one CUDA kernel
// per call on GPUs, host worker teams on the host backend, over per-shape symmetric state.
#include <fmt/format.h>

#include <algorithm>

#include "collectives_impl.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/runtime/host_exec.hpp"

#ifdef WEFT_HAVE_CUDA
#include "weft/core/cuda_check.hpp"
#include "weft/kernels/collective_kernels.hpp"
#endif

namespace weft::ops::detail {

coll::Args AlgoCollective::args(coll::Algo algo, uint64_t count, dev::DType t, void* stream) {
  auto key = std::make_tuple(static_cast<int>(algo), count, static_cast<int>(t));
  auto it = instances_.find(key);
  if (it != instances_.end()) return it->second;
  Backend& b = op_.backend();
  WEFT_REQUIRE(!op_.capturing(stream),
               fmt::format("{} of {} {} elements is captured before its first call: make one call of this shape "
                           "outside the capture (it allocates the call's symmetric state)",
                           algo_name(algo), count, dev::dtype_name(t)));
  const std::string tag = fmt::format("{}.{}.{}", algo_name(algo), count, dev::dtype_name(t));
  // A shape's first call is collective (it allocates): every rank must make the same one.
  op_.agree("the call", tag);
  const size_t elem = dev::dtype_size(t);
  const uint64_t unit = is_all_reduce(algo) || is_ll(algo) || algo == coll::Algo::kAllToAllV
                            ? count
                            : count * static_cast<uint64_t>(b.size());
  coll::Args a{};
  a.algo = algo;
  a.count = count;
  a.ctas = coll_ctas(algo, unit * elem, static_cast<int>(tunable_value(tunables::kCollCtas)));
  if (b.kind() == BackendKind::kHost) a.ctas = std::min(a.ctas, 2);  // CI machines have two cores
  a.threads = coll_threads(algo, unit * elem, a.ctas);
  a.staging_elems = coll_staging_elems(algo, count, elem, a.ctas);
  const size_t slot_unit = algo == coll::Algo::kAllReduceLL128 ? 128 : is_ll(algo) ? 16 : elem;
  if (a.staging_elems) a.staging_off = op_.workspace(2ull * b.size() * a.staging_elems * slot_unit, tag + ".staging");
  a.sig_off = op_.workspace(8ull * static_cast<uint64_t>(a.ctas * 2 * b.size()), tag + ".signals");
  a.epoch_off = op_.workspace(8ull * a.ctas, tag + ".epochs");
  if (algo == coll::Algo::kAllToAllV)
    a.matrix_off = op_.workspace(8ull * 2 * a.ctas * b.size() * b.size(), tag + ".counts");
  return instances_.emplace(key, a).first->second;
}

void AlgoCollective::run(const coll::Args& a, dev::DType t, void* stream) {
  Backend& b = op_.backend();
  if (b.kind() == BackendKind::kNccl) {
#ifdef WEFT_HAVE_CUDA
    WEFT_CUDA_CHECK(kernels::collective(b.ctx(), a, t, static_cast<cudaStream_t>(stream)));
    return;
#endif
  }
  (void)stream;
  const dev::DeviceCtx c = b.ctx();
  host_launch(a.ctas, 2, [&](CoopHostTeam g, int k) {
    switch (t) {
      case dev::DType::kF32:
        coll::run_slice<float>(g, c, a, k);
        break;
      case dev::DType::kF16:
        coll::run_slice<dev::f16_t>(g, c, a, k);
        break;
      case dev::DType::kBF16:
        coll::run_slice<dev::bf16_t>(g, c, a, k);
        break;
    }
  });
  b.synchronize();
}

}  // namespace weft::ops::detail
