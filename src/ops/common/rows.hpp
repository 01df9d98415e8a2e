// Private to src/ops (moe, embedding_a2a): element i of a host row of t's type as fp32 (f32, or a 16-bit type
// through dtype.hpp's bit helpers), and the store back (rounded once).
#pragma once
#include <cstdint>
#include <cstring>

#include "weft/device/dtype.hpp"

namespace weft::ops::moe_rows {

inline float load(const unsigned char* row, int64_t i, dev::DType t) {
  if (t == dev::DType::kF32) {
    float f;
    std::memcpy(&f, row + 4 * i, 4);
    return f;
  }
  uint16_t b;
  std::memcpy(&b, row + 2 * i, 2);
  return dev::from_bits16(b, t);
}
inline void store(unsigned char* row, int64_t i, float f, dev::DType t) {
  if (t == dev::DType::kF32) {
    std::memcpy(row + 4 * i, &f, 4);
    return;
  }
  const uint16_t b = dev::to_bits16(f, t);
  std::memcpy(row + 2 * i, &b, 2);
}

}  // namespace weft::ops::moe_rows
