// The collectives suite, shared by the host tests and the GPU tests: integer-valued inputs
// that encode (rank, index, call) so every sum is exact in bf16, fp16 and fp32; outputs
// poisoned before each call; byte-exact comparison; the first mismatches with coordinates.
#pragma once
#include <fmt/format.h>

#include <functional>
#include <string>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/ops/collectives.hpp"

namespace weft::testing {

// Local (non-symmetric) memory of the backend: host memory, or device memory on GPUs.
class LocalMemory {
 public:
  virtual ~LocalMemory() = default;
  virtual void* alloc(size_t bytes) = 0;  // freed with the object
  virtual void to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void sync() = 0;  // waits for the stream the ops run on
  virtual void* stream() { return nullptr; }
};

inline float input_value(int rank, uint64_t i, int call) {
  return static_cast<float>(static_cast<int>((rank * 7 + i * 3 + call * 5) % 16) - 4);
}

// Stores `vals` as dtype t into bytes.
inline std::vector<char> encode(const std::vector<float>& vals, dev::DType t) {
  std::vector<char> out(vals.size() * dev::dtype_size(t));
  for (size_t i = 0; i < vals.size(); ++i) {
    switch (t) {
      case dev::DType::kF32: reinterpret_cast<float*>(out.data())[i] = vals[i]; break;
      case dev::DType::kF16: reinterpret_cast<dev::f16_t*>(out.data())[i] = dev::from_float<dev::f16_t>(vals[i]); break;
      case dev::DType::kBF16: reinterpret_cast<dev::bf16_t*>(out.data())[i] = dev::from_float<dev::bf16_t>(vals[i]); break;
    }
  }
  return out;
}

inline float decode(const std::vector<char>& bytes, uint64_t i, dev::DType t) {
  switch (t) {
    case dev::DType::kF32: return reinterpret_cast<const float*>(bytes.data())[i];
    case dev::DType::kF16: return dev::to_float(reinterpret_cast<const dev::f16_t*>(bytes.data())[i]);
    case dev::DType::kBF16: return dev::to_float(reinterpret_cast<const dev::bf16_t*>(bytes.data())[i]);
  }
  return 0;
}

enum class Coll { kAllReduce, kAllGather, kReduceScatter, kAllToAll };
inline const char* to_string(Coll c) {
  return c == Coll::kAllReduce ? "all_reduce" : c == Coll::kAllGather ? "all_gather" : c == Coll::kReduceScatter ? "reduce_scatter" : "all_to_all";
}

class CollectivesSuite {
 public:
  CollectivesSuite(Backend& b, ops::Collectives& ops, LocalMemory& mem) : b_(b), ops_(ops), mem_(mem) {}

  // One call of `coll` with `count` (see Collectives for its meaning per collective);
  // `skew` elements of offset on the local input/output pointers (unaligned vectors).
  void check(Coll coll, ops::Method m, dev::DType t, uint64_t count, int call, uint64_t skew = 0) {
    const int world = b_.size(), me = b_.rank();
    const size_t elem = dev::dtype_size(t);
    const uint64_t in_elems = coll == Coll::kAllReduce || coll == Coll::kAllGather ? count : count * world;
    const uint64_t out_elems = coll == Coll::kAllReduce || coll == Coll::kReduceScatter ? count : count * world;
    auto value = [&](int r, uint64_t i) { return input_value(r, i, call); };
    std::vector<float> in(in_elems), want(out_elems, 0.f);
    for (uint64_t i = 0; i < in_elems; ++i) in[i] = value(me, i);
    for (uint64_t i = 0; i < out_elems; ++i) {
      switch (coll) {
        case Coll::kAllReduce:
          for (int p = 0; p < world; ++p) want[i] += value(p, i);
          break;
        case Coll::kReduceScatter:
          for (int p = 0; p < world; ++p) want[i] += value(p, me * count + i);
          break;
        case Coll::kAllGather: want[i] = value(static_cast<int>(i / count), i % count); break;
        case Coll::kAllToAll: want[i] = value(static_cast<int>(i / count), me * count + i % count); break;
      }
    }
    const auto in_bytes = encode(in, t);
    char* d_in = static_cast<char*>(mem_.alloc((in_elems + skew) * elem + 16)) + skew * elem;
    mem_.to_device(d_in, in_bytes.data(), in_bytes.size());
    std::vector<char> poison(out_elems * elem, static_cast<char>(0x7B));
    std::vector<char> got(out_elems * elem);
    const bool symmetric_out = coll == Coll::kAllGather || coll == Coll::kAllToAll;
    if (symmetric_out) {
      auto& out = symmetric_out_for(out_elems * elem);
      b_.copy_from_host(out, poison.data(), poison.size());
      b_.barrier();  // nobody writes into a peer's output before the peer poisoned it
      if (coll == Coll::kAllGather) ops_.all_gather(d_in, out, count, t, m, mem_.stream());
      else ops_.all_to_all(d_in, out, count, t, m, mem_.stream());
      mem_.sync();
      b_.copy_to_host(got.data(), out, got.size());
    } else {
      char* d_out = static_cast<char*>(mem_.alloc((out_elems + skew) * elem + 16)) + skew * elem;
      mem_.to_device(d_out, poison.data(), poison.size());
      if (coll == Coll::kAllReduce) ops_.all_reduce(d_in, d_out, count, t, m, mem_.stream());
      else ops_.reduce_scatter(d_in, d_out, count, t, m, mem_.stream());
      mem_.sync();
      mem_.to_host(got.data(), d_out, got.size());
    }
    std::string bad;
    uint64_t nbad = 0;
    for (uint64_t i = 0; i < out_elems; ++i) {
      const float have = decode(got, i, t);
      if (have != want[i] && nbad++ < 5) bad += fmt::format("\n  element {}: got {}, want {}", i, have, want[i]);
    }
    WEFT_CHECK(nbad == 0, fmt::format("rank {}: {} {} {} count {} skew {} call {}: {} wrong elements:{}", me,
                                      to_string(coll), ops::to_string(m), dev::dtype_name(t), count, skew, call, nbad,
                                      bad));
    b_.barrier();  // the next call's handshake must not race this call's reads of `out`
    ++checks_;
  }

  // Every collective x method x dtype x count, each called three times (epochs advance).
  void run_all(const std::vector<uint64_t>& counts) {
    using M = ops::Method;
    for (dev::DType t : {dev::DType::kBF16, dev::DType::kF16, dev::DType::kF32})
      for (uint64_t n : counts)
        for (int call = 0; call < 3; ++call) {
          for (M m : {M::kBaseline, M::kOneShot, M::kTwoShot, M::kLowLatency, M::kAuto})
            check(Coll::kAllReduce, m, t, n, call);
          for (M m : {M::kBaseline, M::kDirect}) {
            check(Coll::kAllGather, m, t, n, call);
            check(Coll::kReduceScatter, m, t, n, call);
            check(Coll::kAllToAll, m, t, n, call);
          }
        }
    // Pointers aligned to the element but not to 16 bytes take the scalar paths.
    for (M m : {M::kOneShot, M::kTwoShot, M::kLowLatency}) check(Coll::kAllReduce, m, dev::DType::kBF16, 1003, 0, 1);
    check(Coll::kReduceScatter, M::kDirect, dev::DType::kF16, 515, 1, 3);
    check(Coll::kAllGather, M::kDirect, dev::DType::kF32, 77, 2, 1);
  }

  int checks() const { return checks_; }

 private:
  // One symmetric output per size, allocated collectively on first use and reused.
  uint64_t& symmetric_out_for(size_t bytes) {
    for (auto& [sz, off] : outs_)
      if (sz == bytes) return off;
    outs_.emplace_back(bytes, b_.heap().alloc_bytes(bytes, fmt::format("test.out.{}", bytes)));
    return outs_.back().second;
  }

  Backend& b_;
  ops::Collectives& ops_;
  LocalMemory& mem_;
  std::vector<std::pair<size_t, uint64_t>> outs_;
  int checks_ = 0;
};

}  // namespace weft::testing
