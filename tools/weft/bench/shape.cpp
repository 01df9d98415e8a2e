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
    throw InvalidArgument(
        fmt::format("shape {}x{}x{}: its operands' size does not fit in 64 bits", d.m, d.k, d.n));
  return bytes;
}

}  // namespace weft::bench
