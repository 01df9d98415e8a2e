// weft's own collectives, as __host__ __device__ templates over the device API: one CUDA
// kernel per call on the GPU (one CTA per slice), host worker teams on the host backend.
//
// Protocol, per CTA slice k (every rank partitions the elements the same way):
// - Epoch e = completed calls + 1, a counter per CTA in the heap: nothing is reset, so a
//   CUDA graph can replay a call any number of times.
// - Staging (all-reduce, reduce-scatter) is double-buffered by e's parity: a rank writes
//   call e+1's data into a peer's slot only after that peer signalled call e, which it
//   does after it finished reading call e-1 from the same slot.
// - Outputs written in place on peers (all-gather, all-to-all into a symmetric output)
//   start with a handshake: nobody writes into a peer's output before that peer has
//   entered the call, i.e. finished with the previous contents.
// - Signals: [cta][phase][source rank], one per source, so a timeout names the peer.
// - LL (low-latency) methods have no signals: every 16-byte line carries 8 bytes of data and
//   the call's epoch twice, one flag per 8-byte half, so a receiver that sees both flags has
//   the data (8-byte single-copy atomicity). One NVLink crossing per call.
#pragma once
#include "weft/device/api.hpp"
#include "weft/device/dtype.hpp"

namespace weft::coll {

enum class Algo : uint32_t {
  kAllReduceOneShot,
  kAllReduceTwoShot,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kAllReduceLL,
  kAllToAllV,
  kAllGatherLL,
  kReduceScatterLL,
  kAllToAllLL,
  kAllReduceLL128
};

// Threads of a CTA (the most a launch uses; LL calls may use fewer, Args::threads).
inline constexpr int kCtaThreads = 512;

struct Args {
  Algo algo;
  const void* in;          // local
  void* out;               // local (all-reduce, reduce-scatter)
  uint64_t count;          // all-reduce: elements; all-gather, reduce-scatter: per rank; all-to-all: per peer
  uint64_t out_off;        // symmetric output (all-gather, all-to-all)
  uint64_t staging_off;    // symmetric [2 parities][world][staging_elems]
  uint64_t staging_elems;  // elements of one (parity, source) slot (LL: 16-byte lines; LL128: 128-byte lines)
  uint64_t sig_off;        // symmetric signals [ctas][2 phases][world]
  uint64_t epoch_off;      // this rank's completed calls, one counter per CTA
  int ctas;
  int threads;  // GPU threads per CTA (0: kCollThreads); host teams ignore it
  // all-to-all by counts: local counts (elements) this rank sends to each rank; where the
  // counts every rank received go (CTA 0 writes them); the output's capacity (elements);
  // the symmetric counts matrix [2 parities][ctas][world src][world dst].
  const uint64_t* send_counts;
  uint64_t* recv_counts;
  uint64_t out_capacity;
  uint64_t matrix_off;
};

// Elements of slice k of n over `parts`, in multiples of 8 (16 bytes of bf16/fp16).
WEFT_HD void split(uint64_t n, int parts, int k, uint64_t& lo, uint64_t& hi) {
  uint64_t per = (n + static_cast<uint64_t>(parts) - 1) / static_cast<uint64_t>(parts);
  per = (per + 7) & ~7ull;
  lo = per * static_cast<uint64_t>(k);
  if (lo > n) lo = n;
  hi = lo + per > n ? n : lo + per;
}

WEFT_HD uint64_t slot_off(const Args& a, int world, uint64_t parity, int src, size_t elem) {
  return a.staging_off +
         ((parity * static_cast<uint64_t>(world) + static_cast<uint64_t>(src)) * a.staging_elems) * elem;
}
WEFT_HD uint64_t sig_at(const Args& a, int world, int k, int phase, int src) {
  return a.sig_off + 8ull * ((static_cast<uint64_t>(k) * 2 + static_cast<uint64_t>(phase)) * world + src);
}

// The group's writes so far reach every peer before its signal of `phase`.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Coop>
WEFT_HD void signal_peers(Coop g, const dev::DeviceCtx& c, const Args& a, int k, int phase) {
  g.sync();
  if (g.rank() == 0) {
    dev::fence_acq_rel();
    for (int d = 1; d < c.world; ++d) {
      const int p = (c.rank + d) % c.world;
      dev::signal_add(c, p, sig_at(a, c.world, k, phase, c.rank), 1);
    }
  }
}

#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Coop>
WEFT_HD void wait_peers(Coop g, const dev::DeviceCtx& c, const Args& a, int k, int phase, uint64_t e) {
  if (g.rank() == 0)
    for (int d = 1; d < c.world; ++d) {
      const int p = (c.rank + d) % c.world;
      dev::wait_ge(c, sig_at(a, c.world, k, phase, p), e, p);
    }
  g.sync();
}

// dst[d][i] = sum over s (in order) of src[s][i], for every d: every rank sums in rank
// order, so all ranks get bitwise the same result. fp32 accumulation. Each thread keeps
// kReduceUnroll 16-byte vectors of every source in flight (HBM latency ~1 µs: one vector
// per thread left the large reduce-scatter HBM-latency bound).
inline constexpr int kReduceUnroll = 4;
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class T, class Coop>
WEFT_HD void reduce_sum(Coop g, T* const* dst, int ndst, const T* const* src, int nsrc, uint64_t n) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  constexpr int U = kReduceUnroll;
  bool aligned = true;
  for (int s = 0; s < nsrc; ++s) aligned &= (reinterpret_cast<uintptr_t>(src[s]) & 15u) == 0;
  for (int d = 0; d < ndst; ++d) aligned &= (reinterpret_cast<uintptr_t>(dst[d]) & 15u) == 0;
  const uint64_t nvec = aligned ? n / kVec : 0;
  const uint64_t me = static_cast<uint64_t>(g.rank()), step = static_cast<uint64_t>(g.size());
  for (uint64_t i0 = me; i0 < nvec; i0 += U * step) {
    float acc[U][kVec];
    for (int u = 0; u < U; ++u)
      for (int j = 0; j < kVec; ++j) acc[u][j] = 0.f;
    for (int s = 0; s < nsrc; ++s) {
      dev::Vec16 v[U];
      for (int u = 0; u < U; ++u)
        if (i0 + u * step < nvec) v[u] = reinterpret_cast<const dev::Vec16*>(src[s])[i0 + u * step];
      for (int u = 0; u < U; ++u) {
        if (i0 + u * step >= nvec) continue;
        T e[kVec];
        __builtin_memcpy(e, &v[u], 16);
        for (int j = 0; j < kVec; ++j) acc[u][j] += dev::to_float(e[j]);
      }
    }
    for (int u = 0; u < U; ++u) {
      if (i0 + u * step >= nvec) continue;
      T r[kVec];
      for (int j = 0; j < kVec; ++j) r[j] = dev::from_float<T>(acc[u][j]);
      dev::Vec16 o;
      __builtin_memcpy(&o, r, 16);
      for (int d = 0; d < ndst; ++d) reinterpret_cast<dev::Vec16*>(dst[d])[i0 + u * step] = o;
    }
  }
  for (uint64_t i = nvec * kVec + me; i < n; i += step) {
    float acc = 0.f;
    for (int s = 0; s < nsrc; ++s) acc += dev::to_float(src[s][i]);
    const T r = dev::from_float<T>(acc);
    for (int d = 0; d < ndst; ++d) dst[d][i] = r;
  }
}

// dst[d] = src[d] (bytes each) for every d, all in one loop: 16-byte vectors when every
// pointer is 16-byte aligned, kReduceUnroll of them in flight per thread and source. When
// every source is the same (all-gather), each vector is loaded once and stored nd times, so
// the local copy rides along with the NVLink pushes instead of following them.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Coop>
WEFT_HD void copy_multi(Coop g, unsigned char* const* dst, const unsigned char* const* src, int nd, size_t bytes) {
  bool aligned = true, same = true;
  for (int d = 0; d < nd; ++d) {
    aligned &= ((reinterpret_cast<uintptr_t>(dst[d]) | reinterpret_cast<uintptr_t>(src[d])) & 15u) == 0;
    same &= src[d] == src[0];
  }
  if (!aligned) {
    for (int d = 0; d < nd; ++d) dev::copy_bytes(g, dst[d], src[d], bytes);
    return;
  }
  constexpr int U = kReduceUnroll;
  const uint64_t n16 = bytes / 16;
  const uint64_t me = static_cast<uint64_t>(g.rank()), step = static_cast<uint64_t>(g.size());
  for (uint64_t i0 = me; i0 < n16; i0 += U * step) {
    dev::Vec16 v[U];
    for (int d = 0; d < nd; ++d) {
      if (d == 0 || !same)
        for (int u = 0; u < U; ++u)
          if (i0 + u * step < n16) v[u] = reinterpret_cast<const dev::Vec16*>(src[d])[i0 + u * step];
      for (int u = 0; u < U; ++u)
        if (i0 + u * step < n16) reinterpret_cast<dev::Vec16*>(dst[d])[i0 + u * step] = v[u];
    }
  }
  for (uint64_t t = n16 * 16 + me; t < bytes; t += step)
    for (int d = 0; d < nd; ++d) dst[d][t] = src[d][t];
}

// ---- the algorithms: slice k of call e, run by one group ------------------------------
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class T, class Coop>
WEFT_HD void all_reduce_one_shot(Coop g, const dev::DeviceCtx& c, const Args& a, int k, uint64_t e) {
  uint64_t lo, hi;
  split(a.count, a.ctas, k, lo, hi);
  const uint64_t par = e & 1;
  const T* in = static_cast<const T*>(a.in);
  for (int d = 1; d < c.world; ++d) {
    const int p = (c.rank + d) % c.world;
    dev::put(g, c, p, slot_off(a, c.world, par, c.rank, sizeof(T)) + lo * sizeof(T), in + lo, (hi - lo) * sizeof(T));
  }
  signal_peers(g, c, a, k, 0);
  wait_peers(g, c, a, k, 0, e);
  const T* src[dev::kMaxPeers];
  for (int p = 0; p < c.world; ++p)
    src[p] = p == c.rank ? in + lo : c.local<const T>(slot_off(a, c.world, par, p, sizeof(T))) + lo;
  T* dst = static_cast<T*>(a.out) + lo;
  reduce_sum<T>(g, &dst, 1, src, c.world, hi - lo);
}

// Reduce-scatter inside the slice (each rank owns one sub-slice), then all-gather of the
// reduced sub-slices: each element crosses the links twice instead of world-1 times.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class T, class Coop>
WEFT_HD void all_reduce_two_shot(Coop g, const dev::DeviceCtx& c, const Args& a, int k, uint64_t e) {
  uint64_t lo, hi;
  split(a.count, a.ctas, k, lo, hi);
  const uint64_t par = e & 1;
  const T* in = static_cast<const T*>(a.in);
  T* out = static_cast<T*>(a.out);
  auto sub = [&](int j, uint64_t& slo, uint64_t& shi) {
    split(hi - lo, c.world, j, slo, shi);
    slo += lo;
    shi += lo;
  };
  for (int d = 1; d < c.world; ++d) {  // phase 0: sub-slice p of my input to its owner p
    const int p = (c.rank + d) % c.world;
    uint64_t slo, shi;
    sub(p, slo, shi);
    dev::put(g, c, p, slot_off(a, c.world, par, c.rank, sizeof(T)) + slo * sizeof(T), in + slo,
             (shi - slo) * sizeof(T));
  }
  signal_peers(g, c, a, k, 0);
  wait_peers(g, c, a, k, 0, e);
  uint64_t mlo, mhi;
  sub(c.rank, mlo, mhi);
  const T* src[dev::kMaxPeers];
  T* dst[dev::kMaxPeers];
  for (int p = 0; p < c.world; ++p) {
    src[p] = p == c.rank ? in + mlo : c.local<const T>(slot_off(a, c.world, par, p, sizeof(T))) + mlo;
    // My reduced sub-slice goes to my output and into slot `rank` of every peer: at a peer,
    // phase 0 used the peer's own sub-slice of every slot, so the ranges never overlap.
    dst[p] = p == c.rank ? out + mlo : c.ptr<T>(p, slot_off(a, c.world, par, c.rank, sizeof(T))) + mlo;
  }
  reduce_sum<T>(g, dst, c.world, src, c.world, mhi - mlo);
  signal_peers(g, c, a, k, 1);
  wait_peers(g, c, a, k, 1, e);
  for (int d = 1; d < c.world; ++d) {  // phase 1: the peers' reduced sub-slices
    const int p = (c.rank + d) % c.world;
    uint64_t slo, shi;
    sub(p, slo, shi);
    dev::copy_bytes(g, out + slo, c.local<const T>(slot_off(a, c.world, par, p, sizeof(T))) + slo,
                    (shi - slo) * sizeof(T));
  }
}

// All-gather and all-to-all: block `rank` of every peer's symmetric output receives this
// rank's data, pushed in place after a handshake. The source for peer p is in + p * stride:
// stride 0 sends one block to everyone (all-gather), stride count sends block p to rank p
// (all-to-all). My own block is copied in the same loop as the pushes (copy_multi).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class T, class Coop>
WEFT_HD void direct_exchange(Coop g, const dev::DeviceCtx& c, const Args& a, int k, uint64_t e, uint64_t stride) {
  uint64_t lo, hi;
  split(a.count, a.ctas, k, lo, hi);
  const T* in = static_cast<const T*>(a.in);
  signal_peers(g, c, a, k, 0);  // handshake: I have entered call e
  wait_peers(g, c, a, k, 0, e);
  const uint64_t mine = a.out_off + (static_cast<uint64_t>(c.rank) * a.count + lo) * sizeof(T);
  unsigned char* dst[dev::kMaxPeers];
  const unsigned char* src[dev::kMaxPeers];
  for (int d = 0; d < c.world; ++d) {  // d = 0: my own block, copied locally
    const int p = (c.rank + d) % c.world;
    dst[d] = c.ptr<unsigned char>(p, mine);
    src[d] = reinterpret_cast<const unsigned char*>(in + static_cast<uint64_t>(p) * stride + lo);
  }
  copy_multi(g, dst, src, c.world, (hi - lo) * sizeof(T));
  signal_peers(g, c, a, k, 1);
  wait_peers(g, c, a, k, 1, e);
}

#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class T, class Coop>
WEFT_HD void reduce_scatter(Coop g, const dev::DeviceCtx& c, const Args& a, int k, uint64_t e) {
  uint64_t lo, hi;
  split(a.count, a.ctas, k, lo, hi);
  const uint64_t par = e & 1;
  const T* in = static_cast<const T*>(a.in);
  for (int d = 1; d < c.world; ++d) {
    const int p = (c.rank + d) % c.world;
    dev::put(g, c, p, slot_off(a, c.world, par, c.rank, sizeof(T)) + lo * sizeof(T), in + p * a.count + lo,
             (hi - lo) * sizeof(T));
  }
  signal_peers(g, c, a, k, 0);
  wait_peers(g, c, a, k, 0, e);
  const T* src[dev::kMaxPeers];
  for (int p = 0; p < c.world; ++p)
    src[p] = p == c.rank ? in + static_cast<uint64_t>(c.rank) * a.count + lo
                         : c.local<const T>(slot_off(a, c.world, par, p, sizeof(T))) + lo;
  T* dst = static_cast<T*>(a.out) + lo;
  reduce_sum<T>(g, &dst, 1, src, c.world, hi - lo);
}

// ---- LL (low-latency) exchanges ----------------------------------------------------------
// A line is 16 bytes: {data lo32, flag, data hi32, flag}, written with one 16-byte store and
// read with one 16-byte load; each 8-byte half is single-copy atomic, so a line whose two
// flags equal the call's epoch holds that call's 8 data bytes. Lines are never reset: stale
// lines carry an older epoch. Staging is [2 parities][world src][lines] (the parity argument
// of the signalled methods holds through kernel boundaries: a rank writes call e+1's lines
// only after its call e read the peer's call-e lines, which the peer wrote after its whole
// call e-1, the last reader of that parity, had finished).
//
// Why not 8-byte lines with one 4-byte word each, one word per loop step (the first
// version): that put 16 dependent steps per thread in a row at 32 KiB per CTA (load input,
// store; then poll one line, wait, sum), each ~1.3 µs, and it measured 22.6 µs flat from
// 32 KiB to 1 MiB (2.0 µs + 1.3 µs x words per thread fits 8, 16, 32 KiB-1 MiB). Here every
// thread owns at most a few lines, issues all its input loads before its stores and all its
// polls before it checks any, and the CTA count gives ~one line per thread up to 256 KiB.
WEFT_HD void ll_store(uint64_t* line, uint64_t data, uint32_t flag) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(line), "r"(static_cast<uint32_t>(data)),
               "r"(flag), "r"(static_cast<uint32_t>(data >> 32)), "r"(flag)
               : "memory");
#else
  __atomic_store_n(line, (static_cast<uint64_t>(flag) << 32) | (data & 0xFFFFFFFFull), __ATOMIC_RELAXED);
  __atomic_store_n(line + 1, (static_cast<uint64_t>(flag) << 32) | (data >> 32), __ATOMIC_RELAXED);
#endif
}

// One read of a line: true (and its data) when both halves carry `flag`.
WEFT_HD bool ll_try(const uint64_t* line, uint32_t flag, uint64_t& data) {
#if defined(__CUDA_ARCH__)
  uint32_t d0, f0, d1, f1;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(d0), "=r"(f0), "=r"(d1), "=r"(f1)
               : "l"(line));
#else
  const uint64_t h0 = __atomic_load_n(line, __ATOMIC_RELAXED), h1 = __atomic_load_n(line + 1, __ATOMIC_RELAXED);
  const uint32_t d0 = static_cast<uint32_t>(h0), f0 = static_cast<uint32_t>(h0 >> 32);
  const uint32_t d1 = static_cast<uint32_t>(h1), f1 = static_cast<uint32_t>(h1 >> 32);
#endif
  data = (static_cast<uint64_t>(d1) << 32) | d0;
  return f0 == flag && f1 == flag;
}

// Spins until the line carries `flag` (under the deadline; a timeout report names `op`, an
// op_tag, where given); returns its data. kPrint: dev::fail_wait's (false in WGMMA kernels).
template <bool kPrint = true>
WEFT_HD uint64_t ll_wait(const dev::DeviceCtx& c, const uint64_t* line, uint32_t flag, int from_peer, uint64_t off,
                         uint64_t op = 0) {
  uint64_t data;
  if (ll_try(line, flag, data)) return data;  // landed already: no clock read on the common path
  const uint64_t t0 = dev::now_ns();
  uint32_t spins = 0;
  while (!ll_try(line, flag, data)) {
    dev::spin_pause(++spins);
    if ((spins & 63u) == 0u) {
      const uint64_t waited = dev::now_ns() - t0;
      if (waited > c.timeout_ns) {
#if defined(__CUDA_ARCH__)
        const uint64_t seen = line[0] >> 32;
#else
        const uint64_t seen = __atomic_load_n(line, __ATOMIC_RELAXED) >> 32;
#endif
        dev::fail_wait<kPrint>(c, dev::WaitKind::kSignal, from_peer, off, flag, seen, waited, op);
      }
    }
  }
  return data;
}

// The 8 bytes of line w of a `bytes`-long buffer (zero past the end).
WEFT_HD uint64_t ll_load8(const unsigned char* p, bool aligned8, uint64_t bytes, uint64_t w) {
  if (aligned8 && 8 * w + 8 <= bytes) return reinterpret_cast<const uint64_t*>(p)[w];
  uint64_t v = 0;
  for (uint64_t b = 0; b < 8 && 8 * w + b < bytes; ++b) v |= static_cast<uint64_t>(p[8 * w + b]) << (8 * b);
  return v;
}
WEFT_HD void ll_store8(unsigned char* p, bool aligned8, uint64_t bytes, uint64_t w, uint64_t v) {
  if (aligned8 && 8 * w + 8 <= bytes) {
    reinterpret_cast<uint64_t*>(p)[w] = v;
    return;
  }
  for (uint64_t b = 0; b < 8 && 8 * w + b < bytes; ++b) p[8 * w + b] = static_cast<unsigned char>(v >> (8 * b));
}

WEFT_HD bool aligned8(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 7u) == 0; }

// Lines each thread keeps in flight per batch (stores, then polls).
inline constexpr int kLLUnroll = 4;

// Slice k of every rank's per-peer payload travels as lines into slot `rank` of the peer's
// staging; the receiver then reads the world's lines in rank order and either sums them
// with its own payload into `out` (all-reduce, reduce-scatter) or copies each source's
// lines into block `source` of its symmetric output (all-gather, all-to-all). The payload
// for peer p is in + p * stride (stride 0: the same data to everyone).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class T, class Coop>
WEFT_HD void ll_exchange(Coop g, const dev::DeviceCtx& c, const Args& a, int k, uint64_t e, uint64_t stride,
                         bool reduce) {
  constexpr int U = kLLUnroll;
  constexpr int kPer = 8 / static_cast<int>(sizeof(T));
  uint64_t lo, hi;
  split(a.count, a.ctas, k, lo, hi);
  const uint64_t bytes = (hi - lo) * sizeof(T);
  const uint64_t lines = (bytes + 7) / 8;
  if (lines == 0) return;
  const uint64_t first = lo * sizeof(T) / 8;  // slices start at multiples of 8 elements
  const uint64_t world = static_cast<uint64_t>(c.world);
  const uint64_t par = e & 1;
  const uint32_t flag = static_cast<uint32_t>(e);
  const auto* in = static_cast<const unsigned char*>(a.in);
  auto payload = [&](int p) { return in + (static_cast<uint64_t>(p) * stride + lo) * sizeof(T); };
  auto line_off = [&](int src, uint64_t w) {
    return a.staging_off + 16ull * ((par * world + static_cast<uint64_t>(src)) * a.staging_elems + first + w);
  };
  const bool in8 = aligned8(in) && (stride * sizeof(T)) % 8 == 0;
  unsigned char* copy_out = reduce ? nullptr : c.local<unsigned char>(a.out_off) + lo * sizeof(T);
  auto block_out = [&](int p) { return copy_out + static_cast<uint64_t>(p) * a.count * sizeof(T); };
  const bool out8 = reduce ? aligned8(static_cast<unsigned char*>(a.out) + lo * sizeof(T))
                           : aligned8(copy_out) && (a.count * sizeof(T)) % 8 == 0;
  const uint64_t me = static_cast<uint64_t>(g.rank()), step = static_cast<uint64_t>(g.size());

  // Send: every input load of a batch before its stores; my own block of a copy (all-gather,
  // all-to-all) goes straight to my output.
  for (uint64_t w0 = me; w0 < lines; w0 += U * step) {
    uint64_t v[U] = {};
    for (int d = 0; d < c.world; ++d) {
      const int p = (c.rank + d) % c.world;
      if (d == 0 || stride != 0)
        for (int u = 0; u < U; ++u) {
          const uint64_t w = w0 + static_cast<uint64_t>(u) * step;
          if (w < lines) v[u] = ll_load8(payload(p), in8, bytes, w);
        }
      for (int u = 0; u < U; ++u) {
        const uint64_t w = w0 + static_cast<uint64_t>(u) * step;
        if (w >= lines) continue;
        if (p != c.rank)
          ll_store(c.ptr<uint64_t>(p, line_off(c.rank, w)), v[u], flag);
        else if (!reduce)
          ll_store8(block_out(p), out8, bytes, w, v[u]);
      }
    }
  }

  // Receive: a batch's polls are all issued before any is waited on.
  auto recv = [&](int p, uint64_t w0, uint64_t* v) {
    bool ok[U];
    for (int u = 0; u < U; ++u) {
      const uint64_t w = w0 + static_cast<uint64_t>(u) * step;
      ok[u] = w >= lines || ll_try(c.local<const uint64_t>(line_off(p, w)), flag, v[u]);
    }
    for (int u = 0; u < U; ++u)
      if (!ok[u]) {
        const uint64_t w = w0 + static_cast<uint64_t>(u) * step;
        v[u] = ll_wait(c, c.local<const uint64_t>(line_off(p, w)), flag, p, line_off(p, w));
      }
  };
  for (uint64_t w0 = me; w0 < lines; w0 += U * step) {
    if (!reduce) {
      for (int d = 1; d < c.world; ++d) {
        const int p = (c.rank + d) % c.world;
        uint64_t v[U] = {};
        recv(p, w0, v);
        for (int u = 0; u < U; ++u) {
          const uint64_t w = w0 + static_cast<uint64_t>(u) * step;
          if (w < lines) ll_store8(block_out(p), out8, bytes, w, v[u]);
        }
      }
      continue;
    }
    float acc[U][kPer];
    for (int u = 0; u < U; ++u)
      for (int j = 0; j < kPer; ++j) acc[u][j] = 0.f;
    for (int p = 0; p < c.world; ++p) {  // rank order: every rank gets bitwise the same sums
      uint64_t v[U] = {};
      if (p == c.rank) {
        for (int u = 0; u < U; ++u) {
          const uint64_t w = w0 + static_cast<uint64_t>(u) * step;
          if (w < lines) v[u] = ll_load8(payload(p), in8, bytes, w);
        }
      } else {
        recv(p, w0, v);
      }
      for (int u = 0; u < U; ++u) {
        if (w0 + static_cast<uint64_t>(u) * step >= lines) continue;
        T el[kPer];
        __builtin_memcpy(el, &v[u], 8);
        for (int j = 0; j < kPer; ++j) acc[u][j] += dev::to_float(el[j]);
      }
    }
    auto* out = static_cast<unsigned char*>(a.out) + lo * sizeof(T);
    for (int u = 0; u < U; ++u) {
      const uint64_t w = w0 + static_cast<uint64_t>(u) * step;
      if (w >= lines) continue;
      T r[kPer];
      for (int j = 0; j < kPer; ++j) r[j] = dev::from_float<T>(acc[u][j]);
      uint64_t o;
      __builtin_memcpy(&o, r, 8);
      ll_store8(out, out8, bytes, w, o);  // a partial last line writes only its elements
    }
  }
}

// ---- LL128: 128-byte lines of 120 data bytes and one 8-byte flag ---------------------------
// LL spends half of every line on flags, so from ~128 KiB an all-reduce is bound by twice its
// bytes on NVLink. LL128 (NCCL's protocol of the same name) packs 15 data words and the
// call's epoch into each 128-byte line. On the GPU the 8 lanes of a warp that own a line
// write it with one warp store (16 bytes each, lane 7: word 14 and the flag) and read it with
// one warp load; the line is trusted when lane 7 sees the flag. This relies on NVLink
// delivering a warp's whole 128-byte store at once and on a 128-byte load seeing it whole --
// NCCL's assumption for LL128 on NVLink, not a PTX memory-model guarantee (LL's 8-byte halves
// are). The host backend writes the data words, then the flag with release, and reads the
// flag with acquire. Staging: [2 parities][world src][ctas x lines per CTA] 128-byte lines;
// the parity argument is LL's.
inline constexpr uint64_t kLL128Words = 15;  // data words (8 bytes) of a 128-byte line

// 128-byte lines of one CTA's slice of `count` elements (every slice gets as many).
WEFT_HD uint64_t ll128_lines_per_cta(uint64_t count, int ctas, size_t elem) {
  uint64_t per = (count + static_cast<uint64_t>(ctas) - 1) / static_cast<uint64_t>(ctas);
  per = (per + 7) & ~7ull;  // split()'s slice
  return ((per * elem + 7) / 8 + kLL128Words - 1) / kLL128Words;
}

#if defined(__CUDA_ARCH__)
__device__ __forceinline__ void ll128_store(uint64_t* p, uint64_t v0, uint64_t v1) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(v0), "l"(v1) : "memory");
}
__device__ __forceinline__ void ll128_load(const uint64_t* p, uint64_t& v0, uint64_t& v1) {
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(v0), "=l"(v1) : "l"(p) : "memory");
}
#endif

template <class T>
WEFT_HD void ll128_add(float* acc, uint64_t w) {
  constexpr int kPer = 8 / static_cast<int>(sizeof(T));
  T el[kPer];
  __builtin_memcpy(el, &w, 8);
  for (int j = 0; j < kPer; ++j) acc[j] += dev::to_float(el[j]);
}
template <class T>
WEFT_HD uint64_t ll128_pack(const float* acc) {
  constexpr int kPer = 8 / static_cast<int>(sizeof(T));
  T r[kPer];
  for (int j = 0; j < kPer; ++j) r[j] = dev::from_float<T>(acc[j]);
  uint64_t o;
  __builtin_memcpy(&o, r, 8);
  return o;
}

// All-reduce, slice k: every rank's slice goes to every peer as LL128 lines; the receiver
// sums the world's words in rank order (bitwise the same on every rank). A lane sends and
// later sums the same words, so in place (in == out) is safe.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class T, class Coop>
WEFT_HD void all_reduce_ll128(Coop g, const dev::DeviceCtx& c, const Args& a, int k, uint64_t e) {
  constexpr int kPer = 8 / static_cast<int>(sizeof(T));
  uint64_t lo, hi;
  split(a.count, a.ctas, k, lo, hi);
  const uint64_t bytes = (hi - lo) * sizeof(T);
  const uint64_t words = (bytes + 7) / 8;
  const uint64_t lines = (words + kLL128Words - 1) / kLL128Words;
  if (lines == 0) return;
  const uint64_t per_cta = ll128_lines_per_cta(a.count, a.ctas, sizeof(T));
  const uint64_t world = static_cast<uint64_t>(c.world), par = e & 1;
  auto line_off = [&](int src, uint64_t line) {
    return a.staging_off +
           128ull * ((par * world + static_cast<uint64_t>(src)) * a.staging_elems + static_cast<uint64_t>(k) * per_cta + line);
  };
  const auto* in = static_cast<const unsigned char*>(a.in) + lo * sizeof(T);
  auto* out = static_cast<unsigned char*>(a.out) + lo * sizeof(T);
  const bool in8 = aligned8(in), out8 = aligned8(out);
#if defined(__CUDA_ARCH__)
  // Warp w owns lines 4w + (lane / 8), stepping by 4 x warps; lane t = lane % 8 holds words
  // 15 L + 2t and 15 L + 2t + 1 (lane 7: word 15 L + 14 and the flag). Loops are uniform
  // per warp, so the warp-wide votes below see every lane.
  const int lane = g.rank() & 31, t = lane & 7;
  const uint64_t warp = static_cast<uint64_t>(g.rank() >> 5), warps = static_cast<uint64_t>(g.size() >> 5);
  for (uint64_t l0 = 4 * warp; l0 < lines; l0 += 4 * warps) {
    const uint64_t line = l0 + static_cast<uint64_t>(lane >> 3);
    const bool act = line < lines;
    const uint64_t w0 = kLL128Words * line + 2 * static_cast<uint64_t>(t);
    uint64_t v0 = 0, v1 = e;
    if (act && w0 < words) v0 = ll_load8(in, in8, bytes, w0);
    if (t < 7) v1 = act && w0 + 1 < words ? ll_load8(in, in8, bytes, w0 + 1) : 0;
    if (act)
      for (int d = 1; d < c.world; ++d) {
        const int p = (c.rank + d) % c.world;
        ll128_store(c.ptr<uint64_t>(p, line_off(c.rank, line)) + 2 * t, v0, v1);
      }
  }
  for (uint64_t l0 = 4 * warp; l0 < lines; l0 += 4 * warps) {
    const uint64_t line = l0 + static_cast<uint64_t>(lane >> 3);
    const bool act = line < lines;
    const uint64_t w0 = kLL128Words * line + 2 * static_cast<uint64_t>(t);
    float acc0[kPer] = {}, acc1[kPer] = {};
    for (int p = 0; p < c.world; ++p) {
      uint64_t v0 = 0, v1 = 0;
      if (p == c.rank) {
        if (act && w0 < words) v0 = ll_load8(in, in8, bytes, w0);
        if (act && t < 7 && w0 + 1 < words) v1 = ll_load8(in, in8, bytes, w0 + 1);
      } else {
        const uint64_t off = line_off(p, line);
        const uint64_t* src = c.local<const uint64_t>(off) + 2 * t;
        uint64_t t_start = 0;  // read at the first miss: no clock read where the line has landed
        for (uint32_t spins = 0;;) {
          if (act) ll128_load(src, v0, v1);
          const bool here = !act || t != 7 || v1 == e;
          if (__all_sync(0xffffffffu, __shfl_sync(0xffffffffu, here, lane | 7))) break;
          if (spins == 0) t_start = dev::now_ns();
          dev::spin_pause(++spins);
          if ((spins & 63u) == 0u && dev::now_ns() - t_start > c.timeout_ns && t == 7 && !here)
            dev::fail_wait(c, dev::WaitKind::kSignal, p, off + 120, e, v1, dev::now_ns() - t_start);
        }
        if (t == 7) v1 = 0;
      }
      ll128_add<T>(acc0, v0);
      ll128_add<T>(acc1, v1);
    }
    if (act && w0 < words) ll_store8(out, out8, bytes, w0, ll128_pack<T>(acc0));
    if (act && t < 7 && w0 + 1 < words) ll_store8(out, out8, bytes, w0 + 1, ll128_pack<T>(acc1));
  }
#else
  // Host teams: a worker owns whole lines; data words relaxed, the flag released last.
  const uint64_t me = static_cast<uint64_t>(g.rank()), step = static_cast<uint64_t>(g.size());
  for (uint64_t line = me; line < lines; line += step)
    for (int d = 1; d < c.world; ++d) {
      const int p = (c.rank + d) % c.world;
      uint64_t* dst = c.ptr<uint64_t>(p, line_off(c.rank, line));
      for (uint64_t j = 0; j < kLL128Words; ++j) {
        const uint64_t w = kLL128Words * line + j;
        __atomic_store_n(dst + j, w < words ? ll_load8(in, in8, bytes, w) : 0, __ATOMIC_RELAXED);
      }
      __atomic_store_n(dst + kLL128Words, e, __ATOMIC_RELEASE);
    }
  for (uint64_t line = me; line < lines; line += step) {
    float acc[kLL128Words][kPer] = {};
    for (int p = 0; p < c.world; ++p) {
      if (p == c.rank) {
        for (uint64_t j = 0; j < kLL128Words; ++j)
          if (kLL128Words * line + j < words) ll128_add<T>(acc[j], ll_load8(in, in8, bytes, kLL128Words * line + j));
        continue;
      }
      const uint64_t off = line_off(p, line);
      const uint64_t* src = c.local<const uint64_t>(off);
      const uint64_t t_start = dev::now_ns();
      for (uint32_t spins = 0; __atomic_load_n(src + kLL128Words, __ATOMIC_ACQUIRE) != e;) {
        dev::spin_pause(++spins);
        const uint64_t waited = dev::now_ns() - t_start;
        if ((spins & 63u) == 0u && waited > c.timeout_ns)
          dev::fail_wait(c, dev::WaitKind::kSignal, p, off + 120, e, __atomic_load_n(src + kLL128Words, __ATOMIC_RELAXED),
                         waited);
      }
      for (uint64_t j = 0; j < kLL128Words; ++j) ll128_add<T>(acc[j], __atomic_load_n(src + j, __ATOMIC_RELAXED));
    }
    for (uint64_t j = 0; j < kLL128Words; ++j)
      if (kLL128Words * line + j < words) ll_store8(out, out8, bytes, kLL128Words * line + j, ll128_pack<T>(acc[j]));
  }
#endif
}

// ---- all-to-all by counts ---------------------------------------------------------------
// in is packed by destination (block p at the sum of the counts before p); out receives the
// blocks packed by source. Phase 0 sends this rank's row of counts to every rank (which is
// also the handshake: a rank that has entered the call is done with its old output); then
// every rank knows where its block lands in each peer's output. The matrix is
// double-buffered by epoch parity, like staging.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class T, class Coop>
WEFT_HD void all_to_all_v(Coop g, const dev::DeviceCtx& c, const Args& a, int k, uint64_t e) {
  const uint64_t par = e & 1, world = static_cast<uint64_t>(c.world);
  auto mat = [&](int src, int dst) {
    return a.matrix_off +
           8ull * (((par * static_cast<uint64_t>(a.ctas) + static_cast<uint64_t>(k)) * world + src) * world + dst);
  };
  for (uint64_t i = static_cast<uint64_t>(g.rank()); i < world * world; i += static_cast<uint64_t>(g.size())) {
    const int p = static_cast<int>(i / world), d = static_cast<int>(i % world);
    *c.ptr<uint64_t>(p, mat(c.rank, d)) = a.send_counts[d];
  }
  signal_peers(g, c, a, k, 0);
  wait_peers(g, c, a, k, 0, e);
  auto m = [&](int src, int dst) { return *c.local<const uint64_t>(mat(src, dst)); };
  // Every rank sees the same matrix, so every rank refuses the call when any receiver
  // would overflow: nobody writes, nobody waits for a rank that stopped.
  for (int r = 0; r < c.world; ++r) {
    uint64_t need = 0;
    for (int s = 0; s < c.world; ++s) need += m(s, r);
    if (need > a.out_capacity) {
      if (g.rank() == 0) dev::fail_wait(c, dev::WaitKind::kCapacity, r, a.out_off, a.out_capacity, need, 0);
      return;
    }
  }
  const T* in = static_cast<const T*>(a.in);
  uint64_t sdispl = 0;
  for (int p = 0; p < c.world; ++p) {
    const uint64_t cnt = a.send_counts[p];
    uint64_t rdispl = 0;
    for (int s = 0; s < c.rank; ++s) rdispl += m(s, p);
    uint64_t lo, hi;
    split(cnt, a.ctas, k, lo, hi);
    if (hi > lo) {
      const uint64_t dst = a.out_off + (rdispl + lo) * sizeof(T);
      if (p == c.rank)
        dev::copy_bytes(g, c.local<T>(dst), in + sdispl + lo, (hi - lo) * sizeof(T));
      else
        dev::put(g, c, p, dst, in + sdispl + lo, (hi - lo) * sizeof(T));
    }
    sdispl += cnt;
  }
  signal_peers(g, c, a, k, 1);
  wait_peers(g, c, a, k, 1, e);
  if (k == 0)
    for (uint64_t s = static_cast<uint64_t>(g.rank()); s < world; s += static_cast<uint64_t>(g.size()))
      a.recv_counts[s] = m(static_cast<int>(s), c.rank);
}

// One call's slice k: reads and advances this CTA's epoch. `algo` is a.algo, or a constant
// (the GPU compiles one kernel per algorithm, so each gets only the registers it needs).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class T, class Coop>
WEFT_HD void run_slice_as(Coop g, const dev::DeviceCtx& c, const Args& a, int k, Algo algo) {
  uint64_t* epoch = c.local<uint64_t>(a.epoch_off + 8ull * k);
  const uint64_t e = *epoch + 1;
  switch (algo) {
    case Algo::kAllReduceOneShot:
      all_reduce_one_shot<T>(g, c, a, k, e);
      break;
    case Algo::kAllReduceTwoShot:
      all_reduce_two_shot<T>(g, c, a, k, e);
      break;
    case Algo::kAllGather:
      direct_exchange<T>(g, c, a, k, e, 0);
      break;
    case Algo::kReduceScatter:
      reduce_scatter<T>(g, c, a, k, e);
      break;
    case Algo::kAllToAll:
      direct_exchange<T>(g, c, a, k, e, a.count);
      break;
    case Algo::kAllReduceLL:
      ll_exchange<T>(g, c, a, k, e, 0, true);
      break;
    case Algo::kAllToAllV:
      all_to_all_v<T>(g, c, a, k, e);
      break;
    case Algo::kAllGatherLL:
      ll_exchange<T>(g, c, a, k, e, 0, false);
      break;
    case Algo::kReduceScatterLL:
      ll_exchange<T>(g, c, a, k, e, a.count, true);
      break;
    case Algo::kAllToAllLL:
      ll_exchange<T>(g, c, a, k, e, a.count, false);
      break;
    case Algo::kAllReduceLL128:
      all_reduce_ll128<T>(g, c, a, k, e);
      break;
  }
  g.sync();  // every thread has read the epoch before the leader advances it
  if (g.rank() == 0) *epoch = e;
}

#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class T, class Coop>
WEFT_HD void run_slice(Coop g, const dev::DeviceCtx& c, const Args& a, int k) {
  run_slice_as<T>(g, c, a, k, a.algo);
}

}  // namespace weft::coll
