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
  return GemmShape{m, k, n};
}

}  // namespace weft::bench
