#include "weft/ops/collectives.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/runtime/host_exec.hpp"

#ifdef WEFT_HAVE_CUDA
#include <nccl.h>

#include "weft/core/cuda_check.hpp"
#include "weft/kernels/collective_kernels.hpp"
#endif

namespace weft::ops {

const char* to_string(Method m) {
  switch (m) {
    case Method::kAuto:
      return "auto";
    case Method::kBaseline:
      return "baseline";
    case Method::kOneShot:
      return "one-shot";
    case Method::kTwoShot:
      return "two-shot";
    case Method::kDirect:
      return "direct";
    case Method::kLowLatency:
      return "ll";
    case Method::kLowLatency128:
      return "ll128";
  }
  return "?";
}

Method parse_method(const std::string& s) {
  for (Method m :
       {Method::kAuto, Method::kBaseline, Method::kOneShot, Method::kTwoShot, Method::kDirect, Method::kLowLatency,
        Method::kLowLatency128})
    if (s == to_string(m)) return m;
  throw_invalid(__FILE__, __LINE__,
                fmt::format("unknown method '{}': expected auto, baseline, one-shot, two-shot, ll, ll128 or direct", s));
}

namespace {

const char* algo_name(coll::Algo a) {
  switch (a) {
    case coll::Algo::kAllReduceOneShot:
      return "all-reduce (one-shot)";
    case coll::Algo::kAllReduceTwoShot:
      return "all-reduce (two-shot)";
    case coll::Algo::kAllGather:
      return "all-gather";
    case coll::Algo::kReduceScatter:
      return "reduce-scatter";
    case coll::Algo::kAllToAll:
      return "all-to-all";
    case coll::Algo::kAllReduceLL:
      return "all-reduce (ll)";
    case coll::Algo::kAllToAllV:
      return "all-to-all by counts";
    case coll::Algo::kAllGatherLL:
      return "all-gather (ll)";
    case coll::Algo::kReduceScatterLL:
      return "reduce-scatter (ll)";
    case coll::Algo::kAllToAllLL:
      return "all-to-all (ll)";
    case coll::Algo::kAllReduceLL128:
      return "all-reduce (ll128)";
  }
  return "?";
}

bool is_ll(coll::Algo a) {
  return a == coll::Algo::kAllReduceLL || a == coll::Algo::kAllGatherLL || a == coll::Algo::kReduceScatterLL ||
         a == coll::Algo::kAllToAllLL;
}

bool is_all_reduce(coll::Algo a) {
  return a == coll::Algo::kAllReduceOneShot || a == coll::Algo::kAllReduceTwoShot || a == coll::Algo::kAllReduceLL ||
         a == coll::Algo::kAllReduceLL128;
}

#ifdef WEFT_HAVE_CUDA
ncclDataType_t nccl_type(dev::DType t) {
  return t == dev::DType::kF32 ? ncclFloat32 : t == dev::DType::kF16 ? ncclFloat16 : ncclBfloat16;
}
#endif

// Elements of staging one (parity, source) slot holds (LL: 16-byte lines of 8 data bytes;
// LL128: 128-byte lines, the same number for every CTA's slice).
uint64_t staging_elems(coll::Algo a, uint64_t count, size_t elem, int ctas) {
  switch (a) {
    case coll::Algo::kAllReduceLL128:
      return static_cast<uint64_t>(ctas) * coll::ll128_lines_per_cta(count, ctas, elem);
    case coll::Algo::kAllReduceLL:
    case coll::Algo::kAllGatherLL:
    case coll::Algo::kReduceScatterLL:
    case coll::Algo::kAllToAllLL:
      return (count * elem + 7) / 8;
    case coll::Algo::kAllReduceOneShot:
    case coll::Algo::kAllReduceTwoShot:
    case coll::Algo::kReduceScatter:
      return count;
    default:
      return 0;
  }
}

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

int Collectives::ctas_for(coll::Algo algo, uint64_t bytes) const {
  if (const char* env = std::getenv("WEFT_COLL_CTAS")) return std::max(1, std::atoi(env));
  int ctas;
  if (algo == coll::Algo::kAllReduceLL128) {
    // LL128: four 128-byte lines (120 data bytes each) per warp and step; a CTA per four
    // lines, up to 128 CTAs (LL measured fastest with its lines spread over 128 CTAs).
    const uint64_t lines = (bytes + 119) / 120;
    ctas = static_cast<int>(std::clamp<uint64_t>((lines + 3) / 4, 1, 128));
  } else if (is_ll(algo)) {
    // LL (bytes = one peer's payload): a CTA per 8 lines (16 bytes, 8 of them data), up to
    // 128; about one line per thread, so no thread has a chain of lines to go through. 8 KiB
    // -> 128 CTAs of 64 threads, 1 MiB -> 128 CTAs of 512 threads, 2 lines each. Measured
    // (2xH200, all-reduce, bench/results/ar-ctas-20261122/): 128 CTAs beat the first rule's
    // one CTA per 512 lines at every size up to 256 KiB (8 KiB: 3.16 vs 3.57 us).
    const uint64_t lines = (bytes + 7) / 8;
    ctas = static_cast<int>(std::clamp<uint64_t>((lines + 7) / 8, 1, 128));
  } else {
    // One CTA moves ~20 GB/s over NVLink (bench: 344 GB/s with 16 CTAs), so a CTA should
    // own ~32 KiB: a 256 KiB call then runs 8 CTAs at ~2 µs of wire time, not 1 CTA at 12 µs
    // (the first tuning, 256 KiB per CTA, measured 19 µs for a 256 KiB reduce-scatter).
    // From 32 MiB the bandwidth-bound methods take 128 CTAs: NVLink push grows from 350.5
    // GB/s at 32 CTAs to 362.8 at 528, and the local reduce/copy passes want HBM loads in
    // flight.
    const uint64_t per_cta = 32ull << 10;
    const bool wide = algo == coll::Algo::kAllGather || algo == coll::Algo::kAllToAll ||
                      algo == coll::Algo::kReduceScatter || algo == coll::Algo::kAllReduceTwoShot;
    const uint64_t cap = algo == coll::Algo::kAllReduceOneShot ? 32 : wide && bytes >= (32ull << 20) ? 128 : 64;
    const uint64_t want = (bytes + per_cta - 1) / per_cta;
    ctas = static_cast<int>(std::clamp<uint64_t>(want, 1, cap));
  }
  if (b_.kind() == BackendKind::kHost) ctas = std::min(ctas, 2);  // CI machines have two cores
  return ctas;
}

int Collectives::threads_for(coll::Algo algo, uint64_t bytes, int ctas) const {
  if (algo == coll::Algo::kAllReduceLL128) {
    // A warp per four lines of the CTA's slice, at least two warps.
    const uint64_t lines = coll::ll128_lines_per_cta(bytes, ctas, 1);
    return static_cast<int>(std::clamp<uint64_t>((lines + 3) / 4 * 32, 64, coll::kCtaThreads));
  }
  if (!is_ll(algo)) return coll::kCtaThreads;
  // LL: the lines of one CTA's slice, one per thread, in whole warps (at least two).
  const uint64_t lines = (bytes + 7) / 8;
  const uint64_t per_cta = (lines + static_cast<uint64_t>(ctas) - 1) / static_cast<uint64_t>(ctas);
  return static_cast<int>(std::clamp<uint64_t>((per_cta + 31) / 32 * 32, 64, coll::kCtaThreads));
}

Method Collectives::auto_all_reduce(uint64_t bytes) const {
  // One-shot methods send (world-1) x bytes from every rank, two-shot ~2 x bytes in two
  // rounds. LL128 is a one-shot with one NVLink crossing, no flag round and 16/15 of the
  // bytes on the link; on 2xH200 (bench/results/collectives-nccl-2r-20261122-0241*.json) it
  // beat LL, one-shot and two-shot at every size from 8 KiB to 4 MiB (4 MiB: 20.1 us vs
  // two-shot 24.0), so it takes every call that sends <= 4 MiB per rank; two-shot above.
  // (Before LL128, one-shot won while (world-1) x bytes <= 3 MiB on 2 and 4 GPUs.)
  // On more ranks the one-shot's extra bytes grow: LL128 puts (w-1) x 16/15 x bytes on each
  // rank's link, two-shot 2 (w-1)/w x bytes in two crossings; LL128 is kept while its extra
  // bytes are at most 2 MiB (~6 us of NVLink, about what two-shot's second crossing and
  // flag round cost). The cost model agrees at every size it was asked (4 ranks: LL128 up to
  // 1 MiB; 8 ranks: up to 256 KiB; bench/results/predictions-4-8-gpus-20261122-ll128.md) --
  // predictions: 4 and 8 GPUs were not lent since LL128 exists.
  const uint64_t w = static_cast<uint64_t>(b_.size());
  const uint64_t sent = bytes * (w - 1);
  const double extra = static_cast<double>(bytes) * (static_cast<double>(w - 1) * 16.0 / 15.0 - 2.0 * (w - 1) / w);
  return sent <= (4ull << 20) && extra <= static_cast<double>(2ull << 20) ? Method::kLowLatency128 : Method::kTwoShot;
}

Method Collectives::auto_exchange(uint64_t bytes_to_peers) const {
  // direct pays a handshake and a completion flag round (~2 x 1.3 µs) on top of the push;
  // LL one crossing at twice the bytes. Measured (bench/results/collectives-nccl-2r-20261122-030825.json,
  // collectives-nccl-4r-20261122-062209.json): LL ahead at every point up to 1.5 MiB sent per
  // rank -- 2 ranks, 1 MiB sent: all-gather 9.8 vs 10.5 us; 4 ranks, 1.5 MiB: all-gather
  // 14.5 vs 18.2, 768 KiB: reduce-scatter 9.9 vs 12.3, all-to-all 10.0 vs 16.1 -- and behind
  // at 3 MiB (4-rank all-gather, 24.5 vs 22.9). (The first rule, 512 KiB, came from 2 ranks.)
  return bytes_to_peers <= (3ull << 19) ? Method::kLowLatency : Method::kDirect;
}

void Collectives::check_symmetric_out(uint64_t out_off, uint64_t elems, dev::DType t, const char* what) const {
  WEFT_REQUIRE(out_off % dev::dtype_size(t) == 0,
               fmt::format("{} output offset is not aligned to its element size", what));
  WEFT_REQUIRE(out_off + elems * dev::dtype_size(t) <= b_.heap().used(),
               fmt::format("{} output is not a symmetric allocation (or too small for {} elements)", what, elems));
}

void Collectives::check_pointer(const void* p, dev::DType t, const char* what) const {
  WEFT_REQUIRE(p != nullptr, fmt::format("{}: null pointer", what));
  WEFT_REQUIRE(reinterpret_cast<uintptr_t>(p) % dev::dtype_size(t) == 0,
               fmt::format("{}: pointer {} is not aligned to its element size ({} bytes for {})", what, p,
                           dev::dtype_size(t), dev::dtype_name(t)));
}

const Collectives::Instance& Collectives::instance(coll::Algo algo, uint64_t count, dev::DType t, void* stream) {
  auto key = std::make_tuple(static_cast<int>(algo), count, static_cast<int>(t));
  auto it = instances_.find(key);
  if (it != instances_.end()) return it->second;
#ifdef WEFT_HAVE_CUDA
  if (b_.kind() == BackendKind::kNccl) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    WEFT_CUDA_CHECK(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &st));
    WEFT_REQUIRE(st == cudaStreamCaptureStatusNone,
                 fmt::format("{} of {} {} elements is captured before its first call: make one call of this "
                             "shape outside the capture (it allocates the call's symmetric state)",
                             algo_name(algo), count, dev::dtype_name(t)));
  }
#else
  (void)stream;
#endif
  const size_t elem = dev::dtype_size(t);
  const uint64_t unit = is_all_reduce(algo) || is_ll(algo) || algo == coll::Algo::kAllToAllV
                            ? count
                            : count * static_cast<uint64_t>(b_.size());
  coll::Args a{};
  a.algo = algo;
  a.count = count;
  a.ctas = ctas_for(algo, unit * elem);
  a.threads = threads_for(algo, unit * elem, a.ctas);
  a.staging_elems = staging_elems(algo, count, elem, a.ctas);
  const size_t slot_unit = algo == coll::Algo::kAllReduceLL128 ? 128 : is_ll(algo) ? 16 : elem;
  const std::string tag = fmt::format("{}.{}.{}", algo_name(algo), count, dev::dtype_name(t));
  auto& heap = b_.heap();
  if (a.staging_elems)
    a.staging_off = heap.alloc_bytes(2ull * b_.size() * a.staging_elems * slot_unit, tag + ".staging");
  a.sig_off = heap.alloc_signals(static_cast<uint32_t>(a.ctas * 2 * b_.size()), tag + ".signals").offset;
  a.epoch_off = heap.alloc_bytes(8ull * a.ctas, tag + ".epochs");
  if (algo == coll::Algo::kAllToAllV)
    a.matrix_off = heap.alloc_bytes(8ull * 2 * a.ctas * b_.size() * b_.size(), tag + ".counts");
  return instances_.emplace(key, Instance{a}).first->second;
}

void Collectives::run(coll::Args a, dev::DType t, void* stream) {
  if (b_.kind() == BackendKind::kNccl) {
#ifdef WEFT_HAVE_CUDA
    WEFT_CUDA_CHECK(kernels::collective(b_.ctx(), a, t, static_cast<cudaStream_t>(stream)));
    return;
#endif
  }
  (void)stream;
  const dev::DeviceCtx c = b_.ctx();
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
  b_.synchronize();
}

void Collectives::baseline(coll::Algo algo, const void* in, void* out, uint64_t count, dev::DType t, void* stream) {
  const int world = b_.size();
  const size_t elem = dev::dtype_size(t);
#ifdef WEFT_HAVE_CUDA
  if (b_.kind() == BackendKind::kNccl) {
    auto comm = static_cast<ncclComm_t>(b_.nccl_comm());
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
  b_.bootstrap().allgather(in, stride, all.data());
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
      reduce(count * b_.rank(), count, out);
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
        std::memcpy(static_cast<char*>(out) + count * elem * p, all.data() + stride * p + count * elem * b_.rank(),
                    count * elem);
      break;
  }
}

Collectives::~Collectives() {
#ifdef WEFT_HAVE_CUDA
  if (a2a_scratch_) cudaFree(a2a_scratch_);
#endif
}

void Collectives::baseline_all_gather(const void* in, void* out, uint64_t count, dev::DType t, void* stream) {
  if (count == 0) return;
  check_pointer(in, t, "all_gather input");
  check_pointer(out, t, "all_gather output");
  baseline(coll::Algo::kAllGather, in, out, count, t, stream);
}

void Collectives::baseline_all_to_all(const void* in, void* out, uint64_t count, dev::DType t, void* stream) {
  if (count == 0) return;
  check_pointer(in, t, "all_to_all input");
  check_pointer(out, t, "all_to_all output");
  baseline(coll::Algo::kAllToAll, in, out, count, t, stream);
}

void Collectives::all_to_all_v(const void* in, const uint64_t* send_counts, uint64_t out_off, uint64_t out_capacity,
                               uint64_t* recv_counts, dev::DType t, Method m, void* stream) {
  const int world = b_.size();
  const size_t elem = dev::dtype_size(t);
  WEFT_REQUIRE(send_counts && recv_counts, "all_to_all_v: send_counts and recv_counts must not be null");
  check_symmetric_out(out_off, out_capacity, t, "all_to_all_v");
  if (m == Method::kBaseline) {
    // Counts to the host, every rank's row through the bootstrap, then point-to-point.
    std::vector<uint64_t> mine(world), all(static_cast<size_t>(world) * world);
    if (b_.kind() == BackendKind::kNccl) {
#ifdef WEFT_HAVE_CUDA
      WEFT_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
      WEFT_CUDA_CHECK(cudaMemcpy(mine.data(), send_counts, 8ull * world, cudaMemcpyDeviceToHost));
#endif
    } else {
      std::memcpy(mine.data(), send_counts, 8ull * world);
    }
    b_.bootstrap().allgather(mine.data(), 8ull * world, all.data());
    auto cnt = [&](int s, int d) { return all[static_cast<size_t>(s) * world + d]; };
    std::vector<uint64_t> recv(world);
    uint64_t need = 0;
    for (int s = 0; s < world; ++s) need += recv[s] = cnt(s, b_.rank());
    WEFT_REQUIRE(need <= out_capacity, fmt::format("all_to_all_v: rank {} would receive {} elements but the output "
                                                   "holds {}",
                                                   b_.rank(), need, out_capacity));
    char* out = static_cast<char*>(b_.local_ptr(out_off));
#ifdef WEFT_HAVE_CUDA
    if (b_.kind() == BackendKind::kNccl) {
      auto comm = static_cast<ncclComm_t>(b_.nccl_comm());
      auto s = static_cast<cudaStream_t>(stream);
      const ncclDataType_t nt = nccl_type(t);
      WEFT_NCCL_CHECK(ncclGroupStart());
      uint64_t sd = 0, rd = 0;
      for (int p = 0; p < world; ++p) {
        if (mine[p]) WEFT_NCCL_CHECK(ncclSend(static_cast<const char*>(in) + sd * elem, mine[p], nt, p, comm, s));
        if (recv[p]) WEFT_NCCL_CHECK(ncclRecv(out + rd * elem, recv[p], nt, p, comm, s));
        sd += mine[p];
        rd += recv[p];
      }
      WEFT_NCCL_CHECK(ncclGroupEnd());
      WEFT_CUDA_CHECK(cudaMemcpyAsync(recv_counts, recv.data(), 8ull * world, cudaMemcpyHostToDevice, s));
      WEFT_CUDA_CHECK(cudaStreamSynchronize(s));  // recv lives on this stack frame
      return;
    }
#endif
    // Host reference: every rank's whole input through the bootstrap.
    uint64_t total_in = 0;
    for (int p = 0; p < world; ++p) total_in += mine[p];
    std::vector<uint64_t> sizes(world);
    b_.bootstrap().allgather(&total_in, 8, sizes.data());
    const uint64_t max_in = *std::max_element(sizes.begin(), sizes.end());
    std::vector<char> padded(max_in * elem), every(max_in * elem * world);
    if (total_in) std::memcpy(padded.data(), in, total_in * elem);
    b_.bootstrap().allgather(padded.data(), padded.size(), every.data());
    uint64_t rd = 0;
    for (int s = 0; s < world; ++s) {
      uint64_t sd = 0;
      for (int d = 0; d < b_.rank(); ++d) sd += cnt(s, d);
      if (recv[s]) std::memcpy(out + rd * elem, every.data() + (max_in * s + sd) * elem, recv[s] * elem);
      rd += recv[s];
    }
    std::memcpy(recv_counts, recv.data(), 8ull * world);
    return;
  }
  WEFT_REQUIRE(m == Method::kAuto || m == Method::kDirect,
               fmt::format("all_to_all_v has no method '{}'", to_string(m)));
  coll::Args a = instance(coll::Algo::kAllToAllV, out_capacity, t, stream).args;
  a.in = in;
  a.out_off = out_off;
  a.send_counts = send_counts;
  a.recv_counts = recv_counts;
  a.out_capacity = out_capacity;
  run(a, t, stream);
}

void Collectives::all_reduce(const void* in, void* out, uint64_t count, dev::DType t, Method m, void* stream) {
  if (count == 0) return;
  check_pointer(in, t, "all_reduce input");
  check_pointer(out, t, "all_reduce output");
  if (m == Method::kAuto) m = auto_all_reduce(count * dev::dtype_size(t));
  WEFT_REQUIRE(m == Method::kBaseline || m == Method::kOneShot || m == Method::kTwoShot || m == Method::kLowLatency ||
                   m == Method::kLowLatency128,
               fmt::format("all_reduce has no method '{}'", to_string(m)));
  if (m == Method::kBaseline) return baseline(coll::Algo::kAllReduceOneShot, in, out, count, t, stream);
  const auto algo = m == Method::kOneShot         ? coll::Algo::kAllReduceOneShot
                    : m == Method::kTwoShot       ? coll::Algo::kAllReduceTwoShot
                    : m == Method::kLowLatency128 ? coll::Algo::kAllReduceLL128
                                                  : coll::Algo::kAllReduceLL;
  coll::Args a = instance(algo, count, t, stream).args;
  a.in = in;
  a.out = out;
  run(a, t, stream);
}

void Collectives::all_gather(const void* in, uint64_t out_off, uint64_t count, dev::DType t, Method m, void* stream) {
  if (count == 0) return;
  check_pointer(in, t, "all_gather input");
  check_symmetric_out(out_off, count * b_.size(), t, "all_gather");
  if (m == Method::kBaseline) return baseline(coll::Algo::kAllGather, in, b_.local_ptr(out_off), count, t, stream);
  const size_t elem = dev::dtype_size(t);
  if (m == Method::kAuto) m = auto_exchange(count * elem * static_cast<uint64_t>(b_.size() - 1));
  WEFT_REQUIRE(m == Method::kDirect || m == Method::kLowLatency,
               fmt::format("all_gather has no method '{}'", to_string(m)));
  const auto algo = m == Method::kDirect ? coll::Algo::kAllGather : coll::Algo::kAllGatherLL;
  coll::Args a = instance(algo, count, t, stream).args;
  a.in = in;
  a.out_off = out_off;
  run(a, t, stream);
}

void Collectives::reduce_scatter(const void* in, void* out, uint64_t count, dev::DType t, Method m, void* stream) {
  if (count == 0) return;
  check_pointer(in, t, "reduce_scatter input");
  check_pointer(out, t, "reduce_scatter output");
  if (m == Method::kBaseline) return baseline(coll::Algo::kReduceScatter, in, out, count, t, stream);
  const size_t elem = dev::dtype_size(t);
  if (m == Method::kAuto) m = auto_exchange(count * elem * static_cast<uint64_t>(b_.size() - 1));
  WEFT_REQUIRE(m == Method::kDirect || m == Method::kLowLatency,
               fmt::format("reduce_scatter has no method '{}'", to_string(m)));
  const auto algo = m == Method::kDirect ? coll::Algo::kReduceScatter : coll::Algo::kReduceScatterLL;
  coll::Args a = instance(algo, count, t, stream).args;
  a.in = in;
  a.out = out;
  run(a, t, stream);
}

void Collectives::all_to_all(const void* in, uint64_t out_off, uint64_t count, dev::DType t, Method m, void* stream) {
  if (count == 0) return;
  check_pointer(in, t, "all_to_all input");
  check_symmetric_out(out_off, count * b_.size(), t, "all_to_all");
  if (m == Method::kBaseline) {
#ifdef WEFT_HAVE_CUDA
    if (b_.kind() == BackendKind::kNccl) {
      // NCCL 2.28.9's all-to-all into a buffer of a symmetric window gave wrong data (and
      // hung at 2 MiB per peer) on 2xH200; into plain memory it is right. So the baseline
      // lands in scratch outside the window and is copied into the symmetric output.
      const size_t bytes = count * b_.size() * dev::dtype_size(t);
      if (a2a_scratch_bytes_ < bytes) {
        WEFT_REQUIRE(
            stream == nullptr ||
                [&] {
                  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
                  cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &st);
                  return st == cudaStreamCaptureStatusNone;
                }(),
            "all_to_all baseline: make one call of this shape outside the capture first");
        if (a2a_scratch_) WEFT_CUDA_CHECK(cudaFree(a2a_scratch_));
        WEFT_CUDA_CHECK(cudaMalloc(&a2a_scratch_, bytes));
        a2a_scratch_bytes_ = bytes;
      }
      baseline(coll::Algo::kAllToAll, in, a2a_scratch_, count, t, stream);
      WEFT_CUDA_CHECK(cudaMemcpyAsync(b_.local_ptr(out_off), a2a_scratch_, bytes, cudaMemcpyDeviceToDevice,
                                      static_cast<cudaStream_t>(stream)));
      return;
    }
#endif
    return baseline(coll::Algo::kAllToAll, in, b_.local_ptr(out_off), count, t, stream);
  }
  const size_t elem = dev::dtype_size(t);
  if (m == Method::kAuto) m = auto_exchange(count * elem * static_cast<uint64_t>(b_.size() - 1));
  WEFT_REQUIRE(m == Method::kDirect || m == Method::kLowLatency,
               fmt::format("all_to_all has no method '{}'", to_string(m)));
  const auto algo = m == Method::kDirect ? coll::Algo::kAllToAll : coll::Algo::kAllToAllLL;
  coll::Args a = instance(algo, count, t, stream).args;
  a.in = in;
  a.out_off = out_off;
  run(a, t, stream);
}

}  // namespace weft::ops
