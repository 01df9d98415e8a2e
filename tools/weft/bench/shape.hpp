// A GEMM shape as the benchmarks take it on the command line: "MxKxN" (docs/anchors.md's
// order: M rows, K depth, N columns).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

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

// `weft bench ag_gemm|gemm_rs|gemm_ar --random n --seed s` (issue 26): n shapes whose M, K and N
// are each a multiple of `multiple` in lo ... hi, uniform, from a 64-bit LCG seeded with `seed`
// (the same shapes on every machine and standard library). Throws InvalidArgument for n < 0 or
// an empty range.
std::vector<GemmShape> random_gemm_shapes(int n, uint64_t seed, int64_t lo = 256, int64_t hi = 8192,
                                          int64_t multiple = 16);

}  // namespace weft::bench
