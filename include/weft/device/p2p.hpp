// put / get over load-store reachable memory (NVLink peers, or the host's shared heap).
// Granularity is the Coop: a thread, a warp, a CTA, or a host team. Bytes move 16 at a
// time when source and destination share 16-byte alignment; other bytes one at a time.
#pragma once
#include "weft/device/coop.hpp"
#include "weft/device/signal.hpp"

namespace weft::dev {

#if defined(__CUDACC__)
using Vec16 = uint4;
#else
struct alignas(16) Vec16 {
  uint64_t lo, hi;
};
#endif

// Copies `bytes` from src to dst with every member of g taking a strided share.
// Callers that need the copy complete for the whole group call g.sync() afterwards.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Coop>
WEFT_HD void copy_bytes(Coop g, void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  const size_t me = static_cast<size_t>(g.rank());
  const size_t n = static_cast<size_t>(g.size());
  const auto da = reinterpret_cast<uintptr_t>(d);
  const auto sa = reinterpret_cast<uintptr_t>(s);
  size_t head = 0, n16 = 0;
  if (((da ^ sa) & 15u) == 0) {
    head = (16u - (da & 15u)) & 15u;
    if (head > bytes) head = bytes;
    n16 = (bytes - head) / 16;
  }
  for (size_t i = me; i < head; i += n) d[i] = s[i];
  auto* dv = reinterpret_cast<Vec16*>(d + head);
  const auto* sv = reinterpret_cast<const Vec16*>(s + head);
  size_t i = me;
  // Four 16-byte loads in flight per thread before the first store: NVLink latency is
  // ~1 µs, so one outstanding load per thread leaves the link idle.
  for (; i + 3 * n < n16; i += 4 * n) {
    Vec16 v0 = sv[i], v1 = sv[i + n], v2 = sv[i + 2 * n], v3 = sv[i + 3 * n];
    dv[i] = v0;
    dv[i + n] = v1;
    dv[i + 2 * n] = v2;
    dv[i + 3 * n] = v3;
  }
  for (; i < n16; i += n) dv[i] = sv[i];
  for (size_t t = head + n16 * 16 + me; t < bytes; t += n) d[t] = s[t];
}

// Writes `bytes` from local memory `src` to heap offset `dst_off` on `peer`.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Coop>
WEFT_HD void put(Coop g, const DeviceCtx& c, int peer, uint64_t dst_off, const void* src, size_t bytes) {
  copy_bytes(g, c.ptr<unsigned char>(peer, dst_off), src, bytes);
}

// Reads `bytes` from heap offset `src_off` on `peer` into local memory `dst`.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Coop>
WEFT_HD void get(Coop g, const DeviceCtx& c, void* dst, int peer, uint64_t src_off, size_t bytes) {
  copy_bytes(g, dst, c.ptr<unsigned char>(peer, src_off), bytes);
}

// put, then one release-add of `inc` to signal `sig_off` on `peer` once the whole group's
// part of the data is written: the peer that sees the signal sees all the data.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Coop>
WEFT_HD void put_signal(Coop g, const DeviceCtx& c, int peer, uint64_t dst_off, const void* src, size_t bytes,
                        uint64_t sig_off, uint64_t inc = 1) {
  put(g, c, peer, dst_off, src, bytes);
  g.sync();
  if (g.rank() == 0) {
    // The group's other threads wrote part of the data; the barrier orders their writes
    // before this thread's, and the cumulative fence carries them to system scope.
    if (g.size() > 1) fence_acq_rel();
    signal_add(c, peer, sig_off, inc);
  }
}

}  // namespace weft::dev
