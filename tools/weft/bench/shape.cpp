#include "weft/bench/shape.hpp"

#include <fmt/format.h>

#include <cstdio>

#include "weft/core/error.hpp"

namespace weft::bench {

GemmShape parse_gemm_shape(const std::string& s) {
  char x1 = 0, x2 = 0, tail = 0;
  long long m = 0, k = 0, n = 0;
  const int got = std::sscanf(s.c_str(), "%lld%c%lld%c%lld%c", &m, &x1, &k, &x2, &n, &tail);
  WEFT_REQUIRE(got == 5 && x1 == 'x' && x2 == 'x' && m > 0 && k > 0 && n > 0,
               fmt::format("shape '{}': expected MxKxN, e.g. 8192x8192x14336", s));
  const GemmShape d{m, k, n};
  operand_bytes(d);
  return d;
}

int64_t operand_bytes(const GemmShape& d, int elem_bytes) {
  int64_t mk = 0, kn = 0, mn = 0, sum = 0, bytes = 0;
  if (__builtin_mul_overflow(d.m, d.k, &mk) || __builtin_mul_overflow(d.k, d.n, &kn) ||
      __builtin_mul_overflow(d.m, d.n, &mn) || __builtin_add_overflow(mk, kn, &sum) ||
      __builtin_add_overflow(sum, mn, &sum) || __builtin_mul_overflow(sum, int64_t{elem_bytes}, &bytes))
    throw InvalidArgument(fmt::format("shape {}x{}x{}: its operands' size does not fit in 64 bits", d.m, d.k, d.n));
  return bytes;
}

std::vector<GemmShape> random_gemm_shapes(int n, uint64_t seed, int64_t lo, int64_t hi, int64_t multiple) {
  WEFT_REQUIRE(n >= 0, fmt::format("--random {}: expected a count >= 0", n));
  WEFT_REQUIRE(
      multiple > 0 && lo > 0 && hi >= lo && (hi / multiple) * multiple >= ((lo + multiple - 1) / multiple) * multiple,
      fmt::format("random shapes: no multiple of {} in {} ... {}", multiple, lo, hi));
  const uint64_t first = static_cast<uint64_t>((lo + multiple - 1) / multiple),
                 count = static_cast<uint64_t>(hi / multiple) - first + 1;
  uint64_t s = 0x9E3779B97F4A7C15ull * (seed + 1);
  auto next = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return (s >> 33) % count;  // the high bits: the LCG's low bits have short periods
  };
  std::vector<GemmShape> out;
  for (int i = 0; i < n; ++i) {
    GemmShape d;
    d.m = static_cast<int64_t>(first + next()) * multiple;
    d.k = static_cast<int64_t>(first + next()) * multiple;
    d.n = static_cast<int64_t>(first + next()) * multiple;
    out.push_back(d);
  }
  return out;
}

}  // namespace weft::bench
