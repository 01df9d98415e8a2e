// Compile-time switches shared by every device header. Device headers are pure CUDA (or
// plain C++ for the host backend): they include no host framework.
#pragma once
#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define WEFT_HD __host__ __device__ __forceinline__
#define WEFT_DEV __device__ __forceinline__
#else
#define WEFT_HD inline
#endif

namespace weft::dev {

// Peers reachable by load/store in one DeviceCtx (an NVLink domain; the host backend's
// ranks). Sized for an NVL72 rack; the runtime refuses larger worlds with a clear error.
inline constexpr int kMaxPeers = 72;

}  // namespace weft::dev
