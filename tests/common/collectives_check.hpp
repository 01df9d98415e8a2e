// The collectives suite, shared by the host tests and the GPU tests: integer-valued inputs
// that encode (rank, index, call) so every sum is exact in bf16, fp16 and fp32; outputs
// poisoned before each call; byte-exact comparison; the first mismatches with coordinates.
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
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

// Host memory for the host backend's tests (16-byte aligned blocks).
class HostMemory final : public LocalMemory {
 public:
  void* alloc(size_t bytes) override {
    blocks_.emplace_back(new char[bytes + 16]);
    return reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(blocks_.back().get()) + 15) & ~uintptr_t{15});
  }
  // Empty vectors hand over null pointers: memcpy must not see them, even for 0 bytes.
  void to_device(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void to_host(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void sync() override {}

 private:
  std::vector<std::unique_ptr<char[]>> blocks_;
};

inline float input_value(int rank, uint64_t i, int call) {
  return static_cast<float>(static_cast<int>((rank * 7 + i * 3 + call * 5) % 16) - 4);
}

// Stores `vals` as dtype t into bytes.
inline std::vector<char> encode(const std::vector<float>& vals, dev::DType t) {
  std::vector<char> out(vals.size() * dev::dtype_size(t));
  for (size_t i = 0; i < vals.size(); ++i) {
    switch (t) {
      case dev::DType::kF32:
        reinterpret_cast<float*>(out.data())[i] = vals[i];
        break;
      case dev::DType::kF16:
        reinterpret_cast<dev::f16_t*>(out.data())[i] = dev::from_float<dev::f16_t>(vals[i]);
        break;
      case dev::DType::kBF16:
        reinterpret_cast<dev::bf16_t*>(out.data())[i] = dev::from_float<dev::bf16_t>(vals[i]);
        break;
    }
  }
  return out;
}

inline float decode(const std::vector<char>& bytes, uint64_t i, dev::DType t) {
  switch (t) {
    case dev::DType::kF32:
      return reinterpret_cast<const float*>(bytes.data())[i];
    case dev::DType::kF16:
      return dev::to_float(reinterpret_cast<const dev::f16_t*>(bytes.data())[i]);
    case dev::DType::kBF16:
      return dev::to_float(reinterpret_cast<const dev::bf16_t*>(bytes.data())[i]);
  }
  return 0;
}

enum class Coll { kAllReduce, kAllGather, kReduceScatter, kAllToAll };
inline const char* to_string(Coll c) {
  return c == Coll::kAllReduce       ? "all_reduce"
         : c == Coll::kAllGather     ? "all_gather"
         : c == Coll::kReduceScatter ? "reduce_scatter"
                                     : "all_to_all";
}

class CollectivesSuite {
 public:
  CollectivesSuite(Backend& b, ops::Collectives& ops, LocalMemory& mem) : b_(b), ops_(ops), mem_(mem) {}

  // One call of `coll` with `count` (see Collectives for its meaning per collective);
  // `skew` elements of offset on the local input/output pointers (unaligned vectors);
  // `in_place`: an all-reduce whose output is its input.
  void check(Coll coll, ops::Method m, dev::DType t, uint64_t count, int call, uint64_t skew = 0,
             bool in_place = false) {
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
        case Coll::kAllGather:
          want[i] = value(static_cast<int>(i / count), i % count);
          break;
        case Coll::kAllToAll:
          want[i] = value(static_cast<int>(i / count), me * count + i % count);
          break;
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
      if (coll == Coll::kAllGather)
        ops_.all_gather(d_in, out, count, t, m, mem_.stream());
      else
        ops_.all_to_all(d_in, out, count, t, m, mem_.stream());
      mem_.sync();
      b_.copy_to_host(got.data(), out, got.size());
    } else {
      char* d_out = in_place ? d_in : static_cast<char*>(mem_.alloc((out_elems + skew) * elem + 16)) + skew * elem;
      if (!in_place) mem_.to_device(d_out, poison.data(), poison.size());
      if (coll == Coll::kAllReduce)
        ops_.all_reduce(d_in, d_out, count, t, m, mem_.stream());
      else
        ops_.reduce_scatter(d_in, d_out, count, t, m, mem_.stream());
      mem_.sync();
      mem_.to_host(got.data(), d_out, got.size());
    }
    std::string bad;
    uint64_t nbad = 0;
    for (uint64_t i = 0; i < out_elems; ++i) {
      const float have = decode(got, i, t);
      if (have != want[i] && nbad++ < 5) bad += fmt::format("\n  element {}: got {}, want {}", i, have, want[i]);
    }
    WEFT_CHECK(nbad == 0,
               fmt::format("rank {}: {} {} {} count {} skew {} call {}{}: {} wrong elements:{}", me, to_string(coll),
                           ops::to_string(m), dev::dtype_name(t), count, skew, call, in_place ? " in place" : "", nbad,
                           bad));
    b_.barrier();  // the next call's handshake must not race this call's reads of `out`
    ++checks_;
  }

  // All-to-all by counts: counts(s, d) elements go from s to d (zeros included); values
  // encode (source, destination, index, call). `slack` elements of spare output capacity.
  static uint64_t a2av_count(int s, int d, int call) { return static_cast<uint64_t>((s * 3 + d * 5 + call) % 7) * 37; }
  static float a2av_value(int s, int d, uint64_t i, int call) {
    return static_cast<float>(static_cast<int>((s * 5 + d * 3 + i + call * 7) % 16) - 4);
  }
  static uint64_t a2av_capacity(int world, int call) {
    uint64_t cap = 1;
    for (int r = 0; r < world; ++r) {
      uint64_t need = 0;
      for (int s = 0; s < world; ++s) need += a2av_count(s, r, call);
      cap = std::max(cap, need);
    }
    return cap;
  }

  void check_a2av(ops::Method m, dev::DType t, int call, uint64_t capacity) {
    const int world = b_.size(), me = b_.rank();
    const size_t elem = dev::dtype_size(t);
    std::vector<float> in;
    std::vector<uint64_t> send(world);
    for (int d = 0; d < world; ++d) {
      send[d] = a2av_count(me, d, call);
      for (uint64_t i = 0; i < send[d]; ++i) in.push_back(a2av_value(me, d, i, call));
    }
    const auto in_bytes = encode(in, t);
    void* d_in = mem_.alloc(in_bytes.size() + 16);
    mem_.to_device(d_in, in_bytes.data(), in_bytes.size());
    auto* d_send = static_cast<uint64_t*>(mem_.alloc(8 * world));
    auto* d_recv = static_cast<uint64_t*>(mem_.alloc(8 * world));
    mem_.to_device(d_send, send.data(), 8 * world);
    auto& out = symmetric_out_for(capacity * elem);
    std::vector<char> poison(capacity * elem, static_cast<char>(0x7B));
    b_.copy_from_host(out, poison.data(), poison.size());
    b_.barrier();
    ops_.all_to_all_v(d_in, d_send, out, capacity, d_recv, t, m, mem_.stream());
    mem_.sync();
    std::vector<char> got(capacity * elem);
    b_.copy_to_host(got.data(), out, got.size());
    std::vector<uint64_t> recv(world);
    mem_.to_host(recv.data(), d_recv, 8 * world);
    uint64_t at = 0, nbad = 0;
    std::string bad;
    for (int s = 0; s < world; ++s) {
      if (recv[s] != a2av_count(s, me, call) && nbad++ < 5)
        bad += fmt::format("\n  recv_counts[{}] = {}, want {}", s, recv[s], a2av_count(s, me, call));
      for (uint64_t i = 0; i < a2av_count(s, me, call); ++i, ++at)
        if (decode(got, at, t) != a2av_value(s, me, i, call) && nbad++ < 5)
          bad += fmt::format("\n  element {} (from rank {}, index {}): got {}, want {}", at, s, i, decode(got, at, t),
                             a2av_value(s, me, i, call));
    }
    for (uint64_t i = at * elem; i < got.size(); ++i)
      if (got[i] != static_cast<char>(0x7B) && nbad++ < 5)
        bad += fmt::format("\n  byte {} past the data was written", i);
    WEFT_CHECK(nbad == 0, fmt::format("rank {}: all_to_all_v {} {} call {}: {} errors:{}", me, ops::to_string(m),
                                      dev::dtype_name(t), call, nbad, bad));
    b_.barrier();
    ++checks_;
  }

  // Every collective x method x dtype x count, each called three times (epochs advance).
  void run_all(const std::vector<uint64_t>& counts) {
    using M = ops::Method;
    for (dev::DType t : {dev::DType::kBF16, dev::DType::kF16, dev::DType::kF32})
      for (uint64_t n : counts)
        for (int call = 0; call < 3; ++call) {
          for (M m : {M::kBaseline, M::kOneShot, M::kTwoShot, M::kLowLatency, M::kLowLatency128, M::kAuto})
            check(Coll::kAllReduce, m, t, n, call);
          for (M m : {M::kBaseline, M::kDirect, M::kLowLatency, M::kAuto}) {
            check(Coll::kAllGather, m, t, n, call);
            check(Coll::kReduceScatter, m, t, n, call);
            check(Coll::kAllToAll, m, t, n, call);
          }
        }
    for (dev::DType t : {dev::DType::kBF16, dev::DType::kF16, dev::DType::kF32})
      for (int call = 0; call < 3; ++call)
        for (M m : {M::kBaseline, M::kDirect}) check_a2av(m, t, call, a2av_capacity(b_.size(), call) + 5);
    // Pointers aligned to the element but not to 16 bytes take the scalar paths.
    for (M m : {M::kOneShot, M::kTwoShot, M::kLowLatency, M::kLowLatency128})
      check(Coll::kAllReduce, m, dev::DType::kBF16, 1003, 0, 1);
    // In place (out == in): every method reads its input before it writes the same elements.
    for (M m : {M::kOneShot, M::kTwoShot, M::kLowLatency, M::kLowLatency128})
      for (uint64_t n : {uint64_t{777}, uint64_t{1} << 14}) check(Coll::kAllReduce, m, dev::DType::kBF16, n, 1, 0, true);
    // LL128 lines hold 15 words: pointers off 8 bytes, counts that end inside a line.
    check(Coll::kAllReduce, M::kLowLatency128, dev::DType::kF16, 61, 1, 3);
    check(Coll::kAllReduce, M::kLowLatency128, dev::DType::kF32, 30 * 128 + 7, 2, 1);
    check(Coll::kReduceScatter, M::kDirect, dev::DType::kF16, 515, 1, 3);
    check(Coll::kAllGather, M::kDirect, dev::DType::kF32, 77, 2, 1);
    // LL lines are 8 data bytes: inputs and outputs off 8-byte alignment, odd blocks.
    check(Coll::kReduceScatter, M::kLowLatency, dev::DType::kF16, 515, 1, 3);
    check(Coll::kAllGather, M::kLowLatency, dev::DType::kF32, 77, 2, 1);
    check(Coll::kAllToAll, M::kLowLatency, dev::DType::kBF16, 103, 0, 1);
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
