#include "weft/device/api.hpp"
#include "weft/kernels/collective_algos.hpp"
#include "weft/kernels/gemm_overlap_kernels.hpp"
#include "weft/kernels/runtime_kernels.hpp"

namespace weft::kernels {
namespace {

__global__ void epoch_bump_kernel(const __grid_constant__ dev::DeviceCtx c, uint64_t epoch_off) {
  uint64_t* e = c.local<uint64_t>(epoch_off);
  *e = *e + 1;
  __threadfence();
}

__global__ void signal_kernel(const __grid_constant__ dev::DeviceCtx c, const __grid_constant__ OverlapSignals sig) {
  // The copy before this kernel has completed; the sc fence orders its data (and anything
  // else this GPU wrote) before the release adds at system scope.
  dev::quiet();
  for (int i = 0; i < sig.count; ++i) dev::signal_add(c, sig.peer[i], sig.off[i], sig.inc[i]);
}

// Waits until every w entry's local signal >= epoch * threshold (the rank named in `from`
// on a timeout).
__device__ inline void wait_all(const dev::DeviceCtx& c, uint64_t epoch_off, const OverlapWaits& w) {
  const uint64_t e = *c.local<volatile uint64_t>(epoch_off);
  for (int i = 0; i < w.count; ++i) dev::wait_ge(c, w.off[i], e * static_cast<uint64_t>(w.threshold[i]), w.from[i]);
  dev::fence_acq_rel();
}

__global__ void wait_kernel(const __grid_constant__ dev::DeviceCtx c, uint64_t epoch_off,
                            const __grid_constant__ OverlapWaits w) {
  wait_all(c, epoch_off, w);
}

// Thread q waits until peer q's call counter (its heap word at epoch_off) has reached this
// rank's, under the deadline that names q. Reads the peer's word in place: the counter is the
// peer's own, bumped by nobody else, never reset.
__global__ void peer_epochs_kernel(const __grid_constant__ dev::DeviceCtx c, uint64_t epoch_off, uint64_t op) {
  const int q = static_cast<int>(threadIdx.x);
  if (q >= c.world || q == c.rank) return;
  const uint64_t e = *c.local<volatile uint64_t>(epoch_off);
  const uint64_t* p = c.ptr<const uint64_t>(q, epoch_off);
  uint64_t v = dev::load_acquire(p);
  if (v >= e) return;
  const uint64_t t0 = dev::now_ns();
  uint32_t spins = 0;
  while ((v = dev::load_acquire(p)) < e) {
    dev::spin_pause(++spins);
    if ((spins & 63u) == 0u) {
      const uint64_t waited = dev::now_ns() - t0;
      if (waited > c.timeout_ns) dev::fail_wait(c, dev::WaitKind::kSignal, q, epoch_off, e, v, waited, op);
    }
  }
}

// The reduce kernels' waits (none when w.count is 0): thread 0 of every CTA waits, the CTA
// barrier orders the other threads' reads after its acquire; their reads go to L2 (__ldcg),
// never to a line this SM's L1 may hold from before the peers wrote it.
__device__ inline void wait_then_sync(const dev::DeviceCtx& c, uint64_t epoch_off, const OverlapWaits& w) {
  if (w.count == 0) return;
  if (threadIdx.x == 0) wait_all(c, epoch_off, w);
  __syncthreads();
}

template <class T>
__device__ __forceinline__ float load_cg(const T* p) {
  const unsigned short bits = __ldcg(reinterpret_cast<const unsigned short*>(p));
  return dev::to_float(*reinterpret_cast<const T*>(&bits));
}

template <class T>
__global__ void reduce_kernel(const __grid_constant__ dev::DeviceCtx c, uint64_t epoch_off,
                              const __grid_constant__ OverlapWaits w, const T* slots, uint64_t stride, int nslots,
                              T* out, uint64_t n) {
  wait_then_sync(c, epoch_off, w);
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    float acc = 0.f;
    for (int s = 0; s < nslots; ++s) acc += load_cg(slots + s * stride + i);
    out[i] = dev::from_float<T>(acc);
  }
}

template <class T>
__device__ __forceinline__ void add8(float* acc, const uint4& v) {
  const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
  for (int k = 0; k < 8; ++k) acc[k] += dev::to_float(e[k]);
}

template <class T>
__device__ __forceinline__ uint4 pack8(const float* acc) {
  uint4 r;
  T* o = reinterpret_cast<T*>(&r);
#pragma unroll
  for (int k = 0; k < 8; ++k) o[k] = dev::from_float<T>(acc[k]);
  return r;
}

// Eight 16-bit elements per vector when slots, stride, out and n allow 16-byte vectors; two
// vectors per thread and step (i and i + stride of the grid), so every slot has two loads in
// flight per thread.
template <class T>
__global__ void reduce_kernel_vec(const __grid_constant__ dev::DeviceCtx c, uint64_t epoch_off,
                                  const __grid_constant__ OverlapWaits w, const uint4* slots, uint64_t stride_vec,
                                  int nslots, uint4* out, uint64_t nvec) {
  wait_then_sync(c, epoch_off, w);
  const uint64_t grid = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < nvec; i += 2 * grid) {
    const uint64_t j = i + grid;
    const bool two = j < nvec;
    float a0[8] = {0, 0, 0, 0, 0, 0, 0, 0}, a1[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int s = 0; s < nslots; ++s) {
      const uint4* slot = slots + s * stride_vec;
      const uint4 v0 = __ldcg(slot + i);
      const uint4 v1 = two ? __ldcg(slot + j) : make_uint4(0, 0, 0, 0);
      add8<T>(a0, v0);
      add8<T>(a1, v1);
    }
    out[i] = pack8<T>(a0);
    if (two) out[j] = pack8<T>(a1);
  }
}

template <class T>
__global__ void copy_kernel(char* dst, size_t dpitch, const char* src, size_t spitch, size_t width, size_t rows) {
  const size_t per_row = width / sizeof(T), total = per_row * rows;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = i / per_row, c = i % per_row;
    reinterpret_cast<T*>(dst + r * dpitch)[c] = reinterpret_cast<const T*>(src + r * spitch)[c];
  }
}

template <class T>
__global__ void __launch_bounds__(coll::kCtaThreads)
    chain_kernel(const __grid_constant__ dev::DeviceCtx c, uint64_t epoch_off,
                 const __grid_constant__ OverlapChain ch) {
  wait_then_sync(c, epoch_off, ch.waits);
  uint64_t lo, hi;
  coll::split(ch.n, static_cast<int>(gridDim.x), static_cast<int>(blockIdx.x), lo, hi);
  const T* src[kOverlapListMax];
  T* dst[kOverlapListMax];
  for (int i = 0; i < ch.nsrc; ++i) src[i] = static_cast<const T*>(ch.src[i]) + lo;
  for (int i = 0; i < ch.ndst; ++i) dst[i] = static_cast<T*>(ch.dst[i]) + lo;
  coll::reduce_sum<T>(dev::CoopCta{}, dst, ch.ndst, src, ch.nsrc, hi - lo);
  if (ch.signals.count == 0) return;
  __syncthreads();
  if (threadIdx.x != 0) return;
  // This CTA's stores (its threads', through the barrier) before its arrival; the last
  // arrival's fence orders every arrival it follows, and so every CTA's stores, before the
  // release adds.
  dev::fence_acq_rel();
  if ((atomicAdd(ch.arrivals, 1ull) + 1) % gridDim.x != 0) return;
  dev::fence_acq_rel();
  for (int i = 0; i < ch.signals.count; ++i) dev::signal_add(c, ch.signals.peer[i], ch.signals.off[i], ch.signals.inc[i]);
}

template <class T>
cudaError_t reduce_typed(const dev::DeviceCtx& c, uint64_t epoch_off, const OverlapWaits& w, const void* slots,
                         uint64_t stride, int nslots, void* out, uint64_t n, cudaStream_t s) {
  const int threads = 256;
  const bool vec = (reinterpret_cast<uintptr_t>(slots) % 16 == 0) && (reinterpret_cast<uintptr_t>(out) % 16 == 0) &&
                   stride % 8 == 0 && n % 8 == 0;
  const uint64_t items = vec ? (n / 8 + 1) / 2 : n;  // threads' work items (two vectors each)
  const uint64_t want = (items + threads - 1) / threads;
  const int blocks = static_cast<int>(want < 1 ? 1 : want > 1056 ? 1056 : want);
  if (vec)
    reduce_kernel_vec<T><<<blocks, threads, 0, s>>>(c, epoch_off, w, static_cast<const uint4*>(slots), stride / 8,
                                                    nslots, static_cast<uint4*>(out), n / 8);
  else
    reduce_kernel<T><<<blocks, threads, 0, s>>>(c, epoch_off, w, static_cast<const T*>(slots), stride, nslots,
                                                static_cast<T*>(out), n);
  return cudaGetLastError();
}

}  // namespace

cudaError_t overlap_preload() {
  const void* fns[] = {reinterpret_cast<const void*>(epoch_bump_kernel),
                       reinterpret_cast<const void*>(signal_kernel),
                       reinterpret_cast<const void*>(wait_kernel),
                       reinterpret_cast<const void*>(peer_epochs_kernel),
                       reinterpret_cast<const void*>(copy_kernel<uint4>),
                       reinterpret_cast<const void*>(copy_kernel<uint2>),
                       reinterpret_cast<const void*>(copy_kernel<uint32_t>),
                       reinterpret_cast<const void*>(copy_kernel<uint16_t>),
                       reinterpret_cast<const void*>(copy_kernel<unsigned char>),
                       reinterpret_cast<const void*>(reduce_kernel<dev::bf16_t>),
                       reinterpret_cast<const void*>(reduce_kernel<dev::f16_t>),
                       reinterpret_cast<const void*>(reduce_kernel_vec<dev::bf16_t>),
                       reinterpret_cast<const void*>(reduce_kernel_vec<dev::f16_t>),
                       reinterpret_cast<const void*>(chain_kernel<dev::bf16_t>),
                       reinterpret_cast<const void*>(chain_kernel<dev::f16_t>)};
  return load_kernels(fns, sizeof fns / sizeof fns[0]);
}

cudaError_t overlap_epoch_bump(const dev::DeviceCtx& c, uint64_t epoch_off, cudaStream_t s) {
  epoch_bump_kernel<<<1, 1, 0, s>>>(c, epoch_off);
  return cudaGetLastError();
}

cudaError_t overlap_signal(const dev::DeviceCtx& c, const OverlapSignals& sig, cudaStream_t s) {
  signal_kernel<<<1, 1, 0, s>>>(c, sig);
  return cudaGetLastError();
}

cudaError_t overlap_wait(const dev::DeviceCtx& c, uint64_t epoch_off, const OverlapWaits& w, cudaStream_t s) {
  wait_kernel<<<1, 1, 0, s>>>(c, epoch_off, w);
  return cudaGetLastError();
}

cudaError_t overlap_peer_epochs(const dev::DeviceCtx& c, uint64_t epoch_off, uint64_t op, cudaStream_t s) {
  peer_epochs_kernel<<<1, dev::kMaxPeers, 0, s>>>(c, epoch_off, op);
  return cudaGetLastError();
}

cudaError_t overlap_copy(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows, int ctas,
                         cudaStream_t s) {
  if (width == 0 || rows == 0) return cudaSuccess;
  // The widest word that the pointers, pitches and width allow.
  const size_t all = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src) | dpitch | spitch | width;
  const int grid = ctas < 1 ? 1 : ctas;
  auto launch = [&](auto word) {
    copy_kernel<decltype(word)>
        <<<grid, 512, 0, s>>>(static_cast<char*>(dst), dpitch, static_cast<const char*>(src), spitch, width, rows);
    return cudaGetLastError();
  };
  if (all % 16 == 0) return launch(uint4{});
  if (all % 8 == 0) return launch(uint2{});
  if (all % 4 == 0) return launch(uint32_t{});
  if (all % 2 == 0) return launch(uint16_t{});
  return launch(static_cast<unsigned char>(0));
}

cudaError_t overlap_wait_reduce(const dev::DeviceCtx& c, uint64_t epoch_off, const OverlapWaits& w, const void* slots,
                                uint64_t slot_stride, int nslots, void* out, uint64_t n, dev::DType t, cudaStream_t s) {
  if (n == 0) return w.count == 0 ? cudaSuccess : overlap_wait(c, epoch_off, w, s);
  switch (t) {
    case dev::DType::kBF16:
      return reduce_typed<dev::bf16_t>(c, epoch_off, w, slots, slot_stride, nslots, out, n, s);
    case dev::DType::kF16:
      return reduce_typed<dev::f16_t>(c, epoch_off, w, slots, slot_stride, nslots, out, n, s);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t overlap_chain(const dev::DeviceCtx& c, uint64_t epoch_off, const OverlapChain& ch, dev::DType t, int ctas,
                          cudaStream_t s) {
  if (ch.nsrc < 1 || ch.nsrc > kOverlapListMax || ch.ndst < 1 || ch.ndst > kOverlapListMax || ctas < 1 ||
      (ch.signals.count > 0 && ch.arrivals == nullptr))
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(ctas)), block(coll::kCtaThreads);
  switch (t) {
    case dev::DType::kBF16:
      chain_kernel<dev::bf16_t><<<grid, block, 0, s>>>(c, epoch_off, ch);
      break;
    case dev::DType::kF16:
      chain_kernel<dev::f16_t><<<grid, block, 0, s>>>(c, epoch_off, ch);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace weft::kernels
