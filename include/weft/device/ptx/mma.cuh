// Warp-level MMA, sm_80+ (PTX ISA, warp level matrix multiply-accumulate instructions:
// mma.sync.aligned.m16n8k16, "Matrix Fragments for mma.m16n8k16 with floating point type").
// The warpgroup MMA of sm_90a: ptx/wgmma.cuh.
#pragma once
#if defined(__CUDACC__)
#include <cstdint>

namespace weft::ptx {

// D (16 x 8, fp32) += A (16 x 16) * B (16 x 8), bf16 or f16 operands (kBF16), all 32 lanes.
// g = lane / 4, q = lane % 4; each register holds 2 elements, the lower k (or column) in the
// low half. A (row-major): a0 = row g, k 2q..2q+1; a1 = row g+8, same k; a2 = row g, k
// 2q+8..2q+9; a3 = row g+8, k 2q+8... B ("col": K-contiguous per column): b0 = k 2q..2q+1 of
// column g; b1 = k 2q+8..2q+9. D: d0, d1 = row g, columns 2q, 2q+1; d2, d3 = row g+8.
template <bool kBF16>
__device__ __forceinline__ void mma_m16n8k16_f32(float* d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                 uint32_t b0, uint32_t b1) {
  if constexpr (kBF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// 16 bytes of shared memory at a 32-bit .shared address.
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

}  // namespace weft::ptx
#endif
