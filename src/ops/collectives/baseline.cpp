// The collectives' `baseline` method: NCCL on GPUs, a bootstrap reference on the host backend.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives_impl.hpp"
#include "weft/core/error.hpp"

#ifdef WEFT_HAVE_CUDA
#include <cuda_runtime.h>
#include <nccl.h>

#include "weft/core/cuda_check.hpp"
#endif

namespace weft::ops::detail {

namespace {

#ifdef WEFT_HAVE_CUDA
ncclDataType_t nccl_type(dev::DType t) {
  return t == dev::DType::kF32 ? ncclFloat32 : t == dev::DType::kF16 ? ncclFloat16 : ncclBfloat16;
}
#endif

template <class T>
void host_reduce(const std::vector<char>& all, size_t stride, uint64_t first, uint64_t n, int world, T* out) {
  for (uint64_t i = 0; i < n; ++i) {
    float acc = 0.f;
    for (int p = 0; p < world; ++p)
      acc += dev::to_float(reinterpret_cast<const T*>(all.data() + stride * p)[first + i]);
    out[i] = dev::from_float<T>(acc);
  }
}

}  // namespace

BaselineCollective::~BaselineCollective() {
#ifdef WEFT_HAVE_CUDA
  if (a2a_scratch_) cudaFree(a2a_scratch_);
#endif
}

void BaselineCollective::run(coll::Algo algo, const void* in, void* out, uint64_t count, dev::DType t, void* stream) {
  Backend& b = op_.backend();
  const int world = b.size();
  const size_t elem = dev::dtype_size(t);
#ifdef WEFT_HAVE_CUDA
  if (b.kind() == BackendKind::kNccl) {
    auto comm = static_cast<ncclComm_t>(b.nccl_comm());
    auto s = static_cast<cudaStream_t>(stream);
    const ncclDataType_t nt = nccl_type(t);
    switch (algo) {
      case coll::Algo::kAllReduceOneShot:
      case coll::Algo::kAllReduceTwoShot:
      case coll::Algo::kAllReduceLL:
      case coll::Algo::kAllReduceLL128:
        WEFT_NCCL_CHECK(ncclAllReduce(in, out, count, nt, ncclSum, comm, s));
        break;
      case coll::Algo::kAllGather:
      case coll::Algo::kAllGatherLL:
        WEFT_NCCL_CHECK(ncclAllGather(in, out, count, nt, comm, s));
        break;
      case coll::Algo::kReduceScatter:
      case coll::Algo::kReduceScatterLL:
        WEFT_NCCL_CHECK(ncclReduceScatter(in, out, count, nt, ncclSum, comm, s));
        break;
      case coll::Algo::kAllToAll:
      case coll::Algo::kAllToAllLL:
        WEFT_NCCL_CHECK(ncclAlltoAll(in, out, count, nt, comm, s));
        break;
      case coll::Algo::kAllToAllV:
        throw_error(__FILE__, __LINE__, "all_to_all_v has its own baseline");
    }
    return;
  }
#else
  (void)stream;
#endif
  // Host reference: every rank's whole input through the bootstrap, summed in rank order
  // in fp32 (the order weft's own kernels use, so results match bit for bit).
  const uint64_t in_elems = algo == coll::Algo::kAllGather || algo == coll::Algo::kAllGatherLL || is_all_reduce(algo)
                                ? count
                                : count * static_cast<uint64_t>(world);
  const size_t stride = in_elems * elem;
  std::vector<char> all(stride * world);
  b.bootstrap().allgather(in, stride, all.data());
  auto reduce = [&](uint64_t first, uint64_t n, void* dst) {
    switch (t) {
      case dev::DType::kF32:
        host_reduce<float>(all, stride, first, n, world, static_cast<float*>(dst));
        break;
      case dev::DType::kF16:
        host_reduce<dev::f16_t>(all, stride, first, n, world, static_cast<dev::f16_t*>(dst));
        break;
      case dev::DType::kBF16:
        host_reduce<dev::bf16_t>(all, stride, first, n, world, static_cast<dev::bf16_t*>(dst));
        break;
    }
  };
  switch (algo) {
    case coll::Algo::kAllReduceOneShot:
    case coll::Algo::kAllReduceTwoShot:
    case coll::Algo::kAllReduceLL:
    case coll::Algo::kAllReduceLL128:
      reduce(0, count, out);
      break;
    case coll::Algo::kReduceScatter:
    case coll::Algo::kReduceScatterLL:
      reduce(count * b.rank(), count, out);
      break;
    case coll::Algo::kAllGather:
    case coll::Algo::kAllGatherLL:
      std::memcpy(out, all.data(), all.size());
      break;
    case coll::Algo::kAllToAllV:
      throw_error(__FILE__, __LINE__, "all_to_all_v has its own baseline");
    case coll::Algo::kAllToAll:
    case coll::Algo::kAllToAllLL:
      for (int p = 0; p < world; ++p)
        std::memcpy(static_cast<char*>(out) + count * elem * p, all.data() + stride * p + count * elem * b.rank(),
                    count * elem);
      break;
  }
}

void BaselineCollective::all_to_all_symmetric(const void* in, uint64_t out_off, uint64_t count, dev::DType t,
                                              void* stream) {
  Backend& b = op_.backend();
#ifdef WEFT_HAVE_CUDA
  if (b.kind() == BackendKind::kNccl) {
    // NCCL 2.28.9's all-to-all into a buffer of a symmetric window gave wrong data (and
    // hung at 2 MiB per peer) on 2xH200; into plain memory it is right. So the baseline
    // lands in scratch outside the window and is copied into the symmetric output.
    const size_t bytes = count * b.size() * dev::dtype_size(t);
    if (a2a_scratch_bytes_ < bytes) {
      WEFT_REQUIRE(!op_.capturing(stream),
                   "all_to_all baseline: make one call of this shape outside the capture first");
      if (a2a_scratch_) WEFT_CUDA_CHECK(cudaFree(a2a_scratch_));
      WEFT_CUDA_CHECK(cudaMalloc(&a2a_scratch_, bytes));
      a2a_scratch_bytes_ = bytes;
    }
    run(coll::Algo::kAllToAll, in, a2a_scratch_, count, t, stream);
    WEFT_CUDA_CHECK(cudaMemcpyAsync(b.local_ptr(out_off), a2a_scratch_, bytes, cudaMemcpyDeviceToDevice,
                                    static_cast<cudaStream_t>(stream)));
    return;
  }
#endif
  run(coll::Algo::kAllToAll, in, b.local_ptr(out_off), count, t, stream);
}

void BaselineCollective::all_to_all_v(const void* in, const uint64_t* send_counts, uint64_t out_off,
                                      uint64_t out_capacity, uint64_t* recv_counts, dev::DType t, void* stream) {
  Backend& b = op_.backend();
  const int world = b.size();
  const size_t elem = dev::dtype_size(t);
  (void)stream;  // host backend
  // Counts to the host, every rank's row through the bootstrap, then point-to-point.
  std::vector<uint64_t> mine(world), all(static_cast<size_t>(world) * world);
  if (b.kind() == BackendKind::kNccl) {
#ifdef WEFT_HAVE_CUDA
    WEFT_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    WEFT_CUDA_CHECK(cudaMemcpy(mine.data(), send_counts, 8ull * world, cudaMemcpyDeviceToHost));
#endif
  } else {
    std::memcpy(mine.data(), send_counts, 8ull * world);
  }
  b.bootstrap().allgather(mine.data(), 8ull * world, all.data());
  auto cnt = [&](int s, int d) { return all[static_cast<size_t>(s) * world + d]; };
  std::vector<uint64_t> recv(world);
  uint64_t need = 0;
  for (int s = 0; s < world; ++s) need += recv[s] = cnt(s, b.rank());
  WEFT_REQUIRE(need <= out_capacity, fmt::format("all_to_all_v: rank {} would receive {} elements but the output "
                                                 "holds {}",
                                                 b.rank(), need, out_capacity));
  char* out = static_cast<char*>(b.local_ptr(out_off));
#ifdef WEFT_HAVE_CUDA
  if (b.kind() == BackendKind::kNccl) {
    auto comm = static_cast<ncclComm_t>(b.nccl_comm());
    auto s = static_cast<cudaStream_t>(stream);
    const ncclDataType_t nt = nccl_type(t);
    // As in all_to_all_symmetric: NCCL 2.28.9's point-to-point into (or out of) a buffer of
    // the heap's symmetric window hung at ~1 MiB a peer, so both sides are staged in plain
    // device memory: [sends | receives]. This path synchronises anyway (never captured).
    uint64_t total_in = 0;
    for (int p = 0; p < world; ++p) total_in += mine[p];
    const char* heap0 = static_cast<const char*>(b.local_ptr(0));
    const char* src = static_cast<const char*>(in);
    const bool in_window = src >= heap0 && src < heap0 + b.heap().capacity();
    const size_t send_bytes = in_window ? total_in * elem : 0;
    const size_t bytes = send_bytes + need * elem;
    if (a2a_scratch_bytes_ < bytes) {
      if (a2a_scratch_) WEFT_CUDA_CHECK(cudaFree(a2a_scratch_));
      a2a_scratch_ = nullptr;
      a2a_scratch_bytes_ = 0;
      WEFT_CUDA_CHECK(cudaMalloc(&a2a_scratch_, bytes));
      a2a_scratch_bytes_ = bytes;
    }
    char* stage = static_cast<char*>(a2a_scratch_);
    if (send_bytes) {
      WEFT_CUDA_CHECK(cudaMemcpyAsync(stage, src, send_bytes, cudaMemcpyDeviceToDevice, s));
      src = stage;
    }
    char* land = stage + send_bytes;
    WEFT_NCCL_CHECK(ncclGroupStart());
    uint64_t sd = 0, rd = 0;
    for (int p = 0; p < world; ++p) {
      if (mine[p]) WEFT_NCCL_CHECK(ncclSend(src + sd * elem, mine[p], nt, p, comm, s));
      if (recv[p]) WEFT_NCCL_CHECK(ncclRecv(land + rd * elem, recv[p], nt, p, comm, s));
      sd += mine[p];
      rd += recv[p];
    }
    WEFT_NCCL_CHECK(ncclGroupEnd());
    if (need) WEFT_CUDA_CHECK(cudaMemcpyAsync(out, land, need * elem, cudaMemcpyDeviceToDevice, s));
    WEFT_CUDA_CHECK(cudaMemcpyAsync(recv_counts, recv.data(), 8ull * world, cudaMemcpyHostToDevice, s));
    WEFT_CUDA_CHECK(cudaStreamSynchronize(s));  // recv lives on this stack frame
    return;
  }
#endif
  // Host reference: every rank's whole input through the bootstrap.
  uint64_t total_in = 0;
  for (int p = 0; p < world; ++p) total_in += mine[p];
  std::vector<uint64_t> sizes(world);
  b.bootstrap().allgather(&total_in, 8, sizes.data());
  const uint64_t max_in = *std::max_element(sizes.begin(), sizes.end());
  std::vector<char> padded(max_in * elem), every(max_in * elem * world);
  if (total_in) std::memcpy(padded.data(), in, total_in * elem);
  b.bootstrap().allgather(padded.data(), padded.size(), every.data());
  uint64_t rd = 0;
  for (int s = 0; s < world; ++s) {
    uint64_t sd = 0;
    for (int d = 0; d < b.rank(); ++d) sd += cnt(s, d);
    if (recv[s]) std::memcpy(out + rd * elem, every.data() + (max_in * s + sd) * elem, recv[s] * elem);
    rd += recv[s];
  }
  std::memcpy(recv_counts, recv.data(), 8ull * world);
}

}  // namespace weft::ops::detail
