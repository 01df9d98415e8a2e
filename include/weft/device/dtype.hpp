// Element types of the collectives and their float conversions, identical on the GPU and
// on the host backend: bf16 and fp16 are stored as 16-bit patterns; arithmetic is fp32.
#pragma once
#include "weft/device/config.hpp"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

namespace weft::dev {

struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

WEFT_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
#endif
}
WEFT_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
#endif
}

WEFT_HD float to_float(float x) { return x; }
WEFT_HD float to_float(bf16_t x) { return f32_from_bits(static_cast<uint32_t>(x.bits) << 16); }
WEFT_HD float to_float(f16_t x) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(x.bits));
#else
  const uint32_t sign = (x.bits & 0x8000u) << 16, exp = (x.bits >> 10) & 0x1Fu, man = x.bits & 0x3FFu;
  if (exp == 0x1F) return f32_from_bits(sign | 0x7F800000u | (man << 13));  // inf / nan
  if (exp != 0) return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
  if (man == 0) return f32_from_bits(sign);
  const float sub = static_cast<float>(man) * (1.0f / 16777216.0f);  // man × 2^-24
  return sign ? -sub : sub;
#endif
}

template <class T>
WEFT_HD T from_float(float f);
template <>
WEFT_HD float from_float<float>(float f) {
  return f;
}
template <>
WEFT_HD bf16_t from_float<bf16_t>(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x40u)};  // quiet nan
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even
  return bf16_t{static_cast<uint16_t>(u >> 16)};
}
template <>
WEFT_HD f16_t from_float<f16_t>(float f) {
#if defined(__CUDA_ARCH__)
  return f16_t{__half_as_ushort(__float2half_rn(f))};
#else
  const uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return f16_t{static_cast<uint16_t>(sign | 0x7E00u)};
  if (a >= 0x477FF000u) return f16_t{static_cast<uint16_t>(sign | 0x7C00u)};  // rounds to inf
  if (a < 0x38800000u) {  // subnormal half: value / 2^-24, rounded to nearest even
    const float v = f32_from_bits(a) * 16777216.0f;
    uint32_t m = static_cast<uint32_t>(v);
    const float rem = v - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return f16_t{static_cast<uint16_t>(sign | m)};
  }
  uint32_t h = ((a - 0x38000000u) >> 13);  // rebias exponent 127 -> 15
  const uint32_t rest = a & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return f16_t{static_cast<uint16_t>(sign | h)};
#endif
}

enum class DType : uint32_t { kF32 = 0, kF16 = 1, kBF16 = 2 };
inline constexpr size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : 2; }
inline constexpr const char* dtype_name(DType t) {
  return t == DType::kF32 ? "f32" : t == DType::kF16 ? "f16" : "bf16";
}

// A 16-bit element chosen at run time (t: kBF16 or kF16), as its bit pattern.
WEFT_HD uint16_t to_bits16(float f, DType t) {
  return t == DType::kBF16 ? from_float<bf16_t>(f).bits : from_float<f16_t>(f).bits;
}
WEFT_HD float from_bits16(uint16_t bits, DType t) {
  return t == DType::kBF16 ? to_float(bf16_t{bits}) : to_float(f16_t{bits});
}

}  // namespace weft::dev
