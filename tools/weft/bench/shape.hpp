// A GEMM shape as the benchmarks take it on the command line: "MxKxN" (docs/anchors.md's
// order: M rows, K depth, N columns).
#pragma once
#include <cstdint>
#include <string>

namespace weft::bench {

struct GemmShape {
  int64_t m = 0, k = 0, n = 0;
};

// Throws InvalidArgument naming `s` unless it is three positive integers joined by 'x'.
GemmShape parse_gemm_shape(const std::string& s);

}  // namespace weft::bench
