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
// - LL all-reduce has no signals: every 8-byte word carries 4 bytes of data and the call's
//   epoch as a flag, so a receiver that sees the flag has the data (single-copy atomicity).
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
  kAllToAllV
};

struct Args {
  Algo algo;
  const void* in;  // local
  void* out;       // local (all-reduce, reduce-scatter)
  uint64_t count;  // all-reduce: elements; all-gather, reduce-scatter: per rank; all-to-all: per peer
  uint64_t out_off;        // symmetric output (all-gather, all-to-all)
  uint64_t staging_off;    // symmetric [2 parities][world][staging_elems]
  uint64_t staging_elems;  // elements of one (parity, source) slot (LL: 8-byte lines)
  uint64_t sig_off;        // symmetric signals [ctas][2 phases][world]
  uint64_t epoch_off;      // this rank's completed calls, one counter per CTA
  int ctas;
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
  return a.staging_off + ((parity * static_cast<uint64_t>(world) + static_cast<uint64_t>(src)) * a.staging_elems) * elem;
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
// order, so all ranks get bitwise the same result. fp32 accumulation.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class T, class Coop>
WEFT_HD void reduce_sum(Coop g, T* const* dst, int ndst, const T* const* src, int nsrc, uint64_t n) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  bool aligned = true;
  for (int s = 0; s < nsrc; ++s) aligned &= (reinterpret_cast<uintptr_t>(src[s]) & 15u) == 0;
  for (int d = 0; d < ndst; ++d) aligned &= (reinterpret_cast<uintptr_t>(dst[d]) & 15u) == 0;
  const uint64_t nvec = aligned ? n / kVec : 0;
  const uint64_t me = static_cast<uint64_t>(g.rank()), step = static_cast<uint64_t>(g.size());
  for (uint64_t i = me; i < nvec; i += step) {
    float acc[kVec];
    for (int j = 0; j < kVec; ++j) acc[j] = 0.f;
    for (int s = 0; s < nsrc; ++s) {
      const dev::Vec16 v = reinterpret_cast<const dev::Vec16*>(src[s])[i];
      T e[kVec];
      __builtin_memcpy(e, &v, 16);
      for (int j = 0; j < kVec; ++j) acc[j] += dev::to_float(e[j]);
    }
    T r[kVec];
    for (int j = 0; j < kVec; ++j) r[j] = dev::from_float<T>(acc[j]);
    dev::Vec16 o;
    __builtin_memcpy(&o, r, 16);
    for (int d = 0; d < ndst; ++d) reinterpret_cast<dev::Vec16*>(dst[d])[i] = o;
  }
  for (uint64_t i = nvec * kVec + me; i < n; i += step) {
    float acc = 0.f;
    for (int s = 0; s < nsrc; ++s) acc += dev::to_float(src[s][i]);
    const T r = dev::from_float<T>(acc);
    for (int d = 0; d < ndst; ++d) dst[d][i] = r;
  }
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
    dev::put(g, c, p, slot_off(a, c.world, par, c.rank, sizeof(T)) + slo * sizeof(T), in + slo, (shi - slo) * sizeof(T));
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
// (all-to-all).
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
  for (int d = 1; d < c.world; ++d) {
    const int p = (c.rank + d) % c.world;
    dev::put(g, c, p, mine, in + static_cast<uint64_t>(p) * stride + lo, (hi - lo) * sizeof(T));
  }
  dev::copy_bytes(g, c.local<T>(mine), in + static_cast<uint64_t>(c.rank) * stride + lo, (hi - lo) * sizeof(T));
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

// ---- LL (low-latency) one-shot all-reduce ----------------------------------------------
// Word w of a slice: 4 bytes of the input, zero-padded past `bytes` (only the last slice
// of an odd-sized call has a partial word).
WEFT_HD uint32_t load_word(const unsigned char* p, uint64_t bytes, uint64_t w) {
  uint32_t v = 0;
  for (uint64_t b = 0; b < 4 && 4 * w + b < bytes; ++b) v |= static_cast<uint32_t>(p[4 * w + b]) << (8 * b);
  return v;
}

// Spins until line `off` (this rank's heap) carries `flag`; returns its data word.
WEFT_HD uint32_t wait_line(const dev::DeviceCtx& c, uint64_t off, uint32_t flag, int from_peer) {
  const uint64_t* p = c.local<const uint64_t>(off);
  uint64_t line = dev::load_relaxed(p);
  if (static_cast<uint32_t>(line >> 32) == flag) return static_cast<uint32_t>(line);
  const uint64_t t0 = dev::now_ns();
  uint32_t spins = 0;
  while (static_cast<uint32_t>((line = dev::load_relaxed(p)) >> 32) != flag) {
    dev::spin_pause(++spins);
    if ((spins & 63u) == 0u) {
      const uint64_t waited = dev::now_ns() - t0;
      if (waited > c.timeout_ns) dev::fail_wait(c, dev::WaitKind::kSignal, from_peer, off, flag, line >> 32, waited);
    }
  }
  return static_cast<uint32_t>(line);
}

// Each rank writes (data word, epoch) lines of its slice into slot `rank` of every peer's
// LL buffer, then every rank reads the world's lines as their flags turn up and sums in
// rank order. No fence, no signal, no handshake: one NVLink crossing per call. Lines are
// double-buffered by epoch parity (the staging argument above) and never reset: a stale
// line carries an older epoch. Costs twice the bytes on the wire: for small calls.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class T, class Coop>
WEFT_HD void all_reduce_ll(Coop g, const dev::DeviceCtx& c, const Args& a, int k, uint64_t e) {
  constexpr int kPerWord = 4 / static_cast<int>(sizeof(T));
  uint64_t lo, hi;
  split(a.count, a.ctas, k, lo, hi);
  const uint64_t bytes = (hi - lo) * sizeof(T);
  const uint64_t words = (bytes + 3) / 4;
  const uint64_t first_word = lo * sizeof(T) / 4;  // slices start at multiples of 8 elements
  const uint64_t par = e & 1;
  const uint32_t flag = static_cast<uint32_t>(e);
  const auto* in = static_cast<const unsigned char*>(a.in) + lo * sizeof(T);
  auto line_off = [&](int src, uint64_t w) {
    return a.staging_off + 8ull * ((par * static_cast<uint64_t>(c.world) + static_cast<uint64_t>(src)) * a.staging_elems +
                                   first_word + w);
  };
  const uint64_t me = static_cast<uint64_t>(g.rank()), step = static_cast<uint64_t>(g.size());
  for (uint64_t w = me; w < words; w += step) {
    const uint64_t line = (static_cast<uint64_t>(flag) << 32) | load_word(in, bytes, w);
    for (int d = 1; d < c.world; ++d) {
      const int p = (c.rank + d) % c.world;
      dev::store_relaxed(c.ptr<uint64_t>(p, line_off(c.rank, w)), line);
    }
  }
  T* out = static_cast<T*>(a.out) + lo;
  for (uint64_t w = me; w < words; w += step) {
    float acc[kPerWord];
    for (int j = 0; j < kPerWord; ++j) acc[j] = 0.f;
    for (int p = 0; p < c.world; ++p) {
      const uint32_t v = p == c.rank ? load_word(in, bytes, w) : wait_line(c, line_off(p, w), flag, p);
      T el[kPerWord];
      __builtin_memcpy(el, &v, 4);
      for (int j = 0; j < kPerWord; ++j) acc[j] += dev::to_float(el[j]);
    }
    for (int j = 0; j < kPerWord; ++j)
      if (w * kPerWord + j < hi - lo) out[w * kPerWord + j] = dev::from_float<T>(acc[j]);
  }
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
      if (p == c.rank) dev::copy_bytes(g, c.local<T>(dst), in + sdispl + lo, (hi - lo) * sizeof(T));
      else dev::put(g, c, p, dst, in + sdispl + lo, (hi - lo) * sizeof(T));
    }
    sdispl += cnt;
  }
  signal_peers(g, c, a, k, 1);
  wait_peers(g, c, a, k, 1, e);
  if (k == 0)
    for (uint64_t s = static_cast<uint64_t>(g.rank()); s < world; s += static_cast<uint64_t>(g.size()))
      a.recv_counts[s] = m(static_cast<int>(s), c.rank);
}

// One call's slice k: reads and advances this CTA's epoch.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class T, class Coop>
WEFT_HD void run_slice(Coop g, const dev::DeviceCtx& c, const Args& a, int k) {
  uint64_t* epoch = c.local<uint64_t>(a.epoch_off + 8ull * k);
  const uint64_t e = *epoch + 1;
  switch (a.algo) {
    case Algo::kAllReduceOneShot: all_reduce_one_shot<T>(g, c, a, k, e); break;
    case Algo::kAllReduceTwoShot: all_reduce_two_shot<T>(g, c, a, k, e); break;
    case Algo::kAllGather: direct_exchange<T>(g, c, a, k, e, 0); break;
    case Algo::kReduceScatter: reduce_scatter<T>(g, c, a, k, e); break;
    case Algo::kAllToAll: direct_exchange<T>(g, c, a, k, e, a.count); break;
    case Algo::kAllReduceLL: all_reduce_ll<T>(g, c, a, k, e); break;
    case Algo::kAllToAllV: all_to_all_v<T>(g, c, a, k, e); break;
  }
  g.sync();  // every thread has read the epoch before the leader advances it
  if (g.rank() == 0) *epoch = e;
}

}  // namespace weft::coll
