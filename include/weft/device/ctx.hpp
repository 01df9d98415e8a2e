// DeviceCtx: what a kernel (or a host-backend worker) needs to reach every peer's
// symmetric heap. Passed by value; plain data.
#pragma once
#include "weft/device/config.hpp"

namespace weft::dev {

// What a failed wait was waiting for.
// (kCapacity is not a wait: a receive that would overflow its output; expected = capacity,
// observed = elements it would receive.)
enum class WaitKind : uint32_t { kNone = 0, kSignal = 1, kBarrier = 2, kCapacity = 3 };

// Written once, by the first thread whose wait passed its deadline; read by the host,
// which turns it into a TimeoutError naming the peer. On the GPU it lives in mapped
// pinned host memory so that it survives the trap that follows.
struct ErrorSlot {
  uint32_t claimed;     // 0 until a thread claims the slot
  int32_t rank;         // the rank that waited
  int32_t peer;         // the rank expected to signal (-1: any of several)
  uint32_t kind;        // WaitKind
  uint64_t signal_off;  // heap offset of the signal
  uint64_t expected;    // the wait was for signal >= expected
  uint64_t observed;    // the value at the deadline
  uint64_t waited_ns;
  uint32_t block;  // CUDA block / host worker that waited
  uint32_t thread;
  uint64_t op;    // op_tag of the op that waited (0: not named)
  int32_t chunk;  // the chunk it waited for (-1: not a chunk wait)
  uint32_t reserved;
};

// An op's name (up to 8 characters) packed into 8 bytes, first character lowest: it travels
// through kernel parameters and the error slot, where a pointer to a string could not be
// read back. op_tag("gemm_rs").
template <int N>
constexpr uint64_t op_tag(const char (&name)[N]) {
  static_assert(N - 1 <= 8, "an op tag holds at most 8 characters");
  uint64_t t = 0;
  for (int i = 0; i < N - 1; ++i) t |= static_cast<uint64_t>(static_cast<unsigned char>(name[i])) << (8 * i);
  return t;
}

// A kernel takes it as `const __grid_constant__ dev::DeviceCtx c` and passes it on by
// reference: peer_base is indexed at run time, so a by-value parameter would be copied whole
// (~600 bytes) into every thread's local memory at entry.
struct DeviceCtx {
  int rank;
  int world;
  uint64_t heap_bytes;  // bytes of each rank's heap; offsets are below this
  uint64_t timeout_ns;  // deadline of every wait (WEFT_TIMEOUT_MS)
  ErrorSlot* error;
  char* peer_base[kMaxPeers];  // peer p's heap as this rank addresses it (NVLink or shm)

  template <class T>
  WEFT_HD T* ptr(int peer, uint64_t offset) const {
    return reinterpret_cast<T*>(peer_base[peer] + offset);
  }
  template <class T>
  WEFT_HD T* local(uint64_t offset) const {
    return ptr<T>(rank, offset);
  }
};

}  // namespace weft::dev
