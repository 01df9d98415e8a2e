// A GEMM shape as the benchmarks take it on the command line: "MxKxN" (docs/anchors.md's
// order: M rows, K depth, N columns).
#pragma once
#include <cstdint>
#include <string>

namespace weft::bench {

struct GemmShape {
  int64_t m = 0, k = 0, n = 0;
};

// Throws InvalidArgument naming `s` unless it is three positive integers joined by 'x'
// whose operands' bytes (operand_bytes) fit in 64 bits.
GemmShape parse_gemm_shape(const std::string& s);

// Bytes of A (M x K), B (K x N) and C (M x N) together at `elem_bytes` each; throws
// InvalidArgument naming the shape when that does not fit in 64 bits.
int64_t operand_bytes(const GemmShape& d, int elem_bytes = 2);

}  // namespace weft::bench
