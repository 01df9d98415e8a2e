// Host side of the device-API semantics suite: allocates, poisons, runs each scenario
// through an Executor (GPU kernels or host teams), verifies exactly, and throws with the
// first mismatches' coordinates. Every rank runs it; all ranks call the same sequence.
#pragma once
#include <fmt/format.h>

#include <string>
#include <vector>

#include "devapi_scenarios.hpp"
#include "weft/core/error.hpp"
#include "weft/runtime/backend.hpp"

namespace weft::testing {

class Executor {
 public:
  virtual ~Executor() = default;
  // Each runs one group of the given granularity on this rank and returns once it is done
  // (throwing TimeoutError if a wait in it passed its deadline).
  virtual void put_signal(Gran g, const PutArgs& a) = 0;
  virtual void get(Gran g, const GetArgs& a) = 0;
  virtual void barrier_rounds(Gran g, const BarrierArgs& a) = 0;
  virtual void barrier_once(Gran g, const dev::BarrierHandle& b) = 0;
};

struct Case {
  uint64_t len, src_skew, dst_skew;
};

// Lengths and skews: empty, one byte, odd, aligned pages, vector body with head and tail,
// and mismatched alignment (byte path).
inline std::vector<Case> default_cases() {
  return {{0, 0, 0}, {1, 0, 0}, {13, 3, 5}, {4096, 0, 0}, {20000 + 7, 1, 1}, {1000, 4, 0}, {3 * 16 + 2, 15, 15}};
}

class DevapiSuite {
 public:
  static constexpr uint64_t kSlot = 32768;  // > largest case + skew

  DevapiSuite(Backend& b, Executor& x) : b_(b), x_(x) {
    auto& h = b.heap();
    const uint64_t n = static_cast<uint64_t>(b.size());
    src_ = h.alloc_bytes(kSlot, "suite.src");
    dst_ = h.alloc_bytes(kSlot * n, "suite.dst");
    sig_ = h.alloc_signals(static_cast<uint32_t>(n), "suite.sig");
    bar_ = h.alloc_barrier("suite.bar");
    slots_ = h.alloc_bytes(8 * n, "suite.slots");
    errors_ = h.alloc_bytes(8, "suite.errors");
  }

  void poison_dst() {
    std::vector<uint8_t> poison(kSlot * b_.size(), kPoison);
    b_.copy_from_host(dst_, poison.data(), poison.size());
    b_.barrier();
  }

  void check_dst(const char* what, Gran g, const Case& cs, uint64_t salt) {
    std::vector<uint8_t> got(kSlot * b_.size());
    b_.copy_to_host(got.data(), dst_, got.size());
    std::string bad;
    int nbad = 0;
    for (int p = 0; p < b_.size(); ++p) {
      for (uint64_t i = 0; i < kSlot; ++i) {
        const bool inside = i >= cs.dst_skew && i < cs.dst_skew + cs.len;
        const uint8_t want = inside ? payload(p, cs.src_skew + (i - cs.dst_skew), salt) : kPoison;
        const uint8_t have = got[kSlot * p + i];
        if (have != want && nbad++ < 5)
          bad += fmt::format("\n  slot of rank {} byte {}: got {:#04x}, want {:#04x}{}", p, i, have, want,
                             inside ? "" : " (outside the put: must stay untouched)");
      }
    }
    WEFT_CHECK(nbad == 0, fmt::format("rank {}: {} ({} granularity, len {}, src skew {}, dst skew {}, epoch {}): {} "
                                      "wrong bytes:{}",
                                      b_.rank(), what, to_string(g), cs.len, cs.src_skew, cs.dst_skew, salt, nbad, bad));
  }

  // Returns the number of checks run.
  int run_put_signal(Gran g) {
    int checks = 0;
    for (const Case& cs : default_cases()) {
      poison_dst();
      ++put_epoch_;
      x_.put_signal(g, PutArgs{src_, dst_, kSlot, cs.len, cs.src_skew, cs.dst_skew, put_epoch_, sig_});
      check_dst("put_signal", g, cs, put_epoch_);
      b_.barrier();  // nobody starts the next case's puts before everyone has checked
      ++checks;
    }
    return checks;
  }

  int run_get(Gran g) {
    int checks = 0;
    for (const Case& cs : default_cases()) {
      poison_dst();
      ++get_epoch_;
      x_.get(g, GetArgs{src_, dst_, kSlot, cs.len, cs.src_skew, cs.dst_skew, get_epoch_ + 1000, bar_});
      check_dst("get", g, cs, get_epoch_ + 1000);
      ++checks;
    }
    return checks;
  }

  int run_barrier(Gran g, uint64_t rounds) {
    uint64_t before = 0, after = 0;
    b_.copy_to_host(&before, errors_, 8);
    x_.barrier_rounds(g, BarrierArgs{slots_, errors_, next_value_, rounds, bar_});
    next_value_ += rounds;
    b_.copy_to_host(&after, errors_, 8);
    WEFT_CHECK(after == before, fmt::format("rank {}: barrier ({} granularity): {} of {} rounds saw a peer's slot "
                                            "without the value written before the barrier",
                                            b_.rank(), to_string(g), after - before, rounds));
    return 1;
  }

  int run_all() {
    int checks = 0;
    for (Gran g : {Gran::kThread, Gran::kWarp, Gran::kBlock}) {
      checks += run_put_signal(g);
      checks += run_get(g);
      checks += run_barrier(g, 25);
    }
    return checks;
  }

  const dev::BarrierHandle& barrier_handle() const { return bar_; }

 private:
  Backend& b_;
  Executor& x_;
  uint64_t src_ = 0, dst_ = 0, slots_ = 0, errors_ = 0;
  dev::SignalSlab sig_{};
  dev::BarrierHandle bar_{};
  uint64_t put_epoch_ = 0, get_epoch_ = 0, next_value_ = 1;
};

}  // namespace weft::testing
