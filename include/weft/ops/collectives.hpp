// Latency-optimised collectives: all-reduce (one-shot, two-shot), all-gather,
// reduce-scatter, all-to-all; sum; f32, f16, bf16. Methods: `baseline` (NCCL on GPUs; a
// bootstrap reference on the host backend), weft's own, and `auto`.
//
// Calls are collective and must be made in the same order with the same shapes on every
// rank. Per-shape state (staging, signals, epochs) is allocated from the symmetric heap at
// the first call of a shape and reused: later calls allocate, synchronise and memset
// nothing, so they can be captured in a CUDA graph (make the first call before capture).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "weft/device/dtype.hpp"
#include "weft/ops/names.hpp"
#include "weft/runtime/backend.hpp"

namespace weft::ops {

// The collectives' methods. kOneShot, kTwoShot, kLowLatency128: all-reduce only; kDirect:
// all-gather, reduce-scatter, all-to-all (and all-to-all by counts); kLowLatency: every one
// but all-to-all by counts.
enum class Method { kAuto, kBaseline, kOneShot, kTwoShot, kDirect, kLowLatency, kLowLatency128 };
inline constexpr Named<Method> kMethodNames[] = {{Method::kAuto, "auto"},          {Method::kBaseline, "baseline"},
                                                 {Method::kOneShot, "one-shot"},   {Method::kTwoShot, "two-shot"},
                                                 {Method::kDirect, "direct"},      {Method::kLowLatency, "ll"},
                                                 {Method::kLowLatency128, "ll128"}};
inline const char* to_string(Method m) { return name_in(kMethodNames, m); }
inline Method parse_method(const std::string& s) { return parse_in(kMethodNames, s, "method"); }

class Collectives {
 public:
  explicit Collectives(Backend& b);
  ~Collectives();
  Collectives(const Collectives&) = delete;
  Collectives& operator=(const Collectives&) = delete;

  // Pointers are this rank's: device memory on the nccl backend, host memory on host.
  // `stream` is a cudaStream_t on the nccl backend (nullptr: the default stream).
  // out[i] = sum over ranks of in[i], count elements. In place (in == out) is allowed.
  // Methods: one-shot, two-shot, ll (one-shot with data and flags in 16-byte lines), ll128
  // (one-shot in 128-byte lines of 120 data bytes: NVLink's whole warp stores, as NCCL's LL128).
  void all_reduce(const void* in, void* out, uint64_t count, dev::DType t, Method m = Method::kAuto,
                  void* stream = nullptr);
  // Collective: allocates the state an all_reduce of `count` elements by `m` will use, so
  // that its first call can be captured into a CUDA graph (the baseline needs none).
  void prepare_all_reduce(uint64_t count, dev::DType t, Method m = Method::kAuto);
  // The same for the other collectives (all_to_all_v: count is out_capacity). The baseline
  // needs none (except all_to_all's into a symmetric output on GPUs: its scratch comes with
  // its first call).
  void prepare_all_gather(uint64_t count, dev::DType t, Method m = Method::kAuto);
  void prepare_reduce_scatter(uint64_t count, dev::DType t, Method m = Method::kAuto);
  void prepare_all_to_all(uint64_t count, dev::DType t, Method m = Method::kAuto);
  void prepare_all_to_all_v(uint64_t out_capacity, dev::DType t, Method m = Method::kAuto);
  // Symmetric out (heap offset) [world][count] receives every rank's count elements.
  // all-gather, reduce-scatter, all-to-all: methods direct and ll; auto picks ll for small calls.
  void all_gather(const void* in, uint64_t out_off, uint64_t count, dev::DType t, Method m = Method::kAuto,
                  void* stream = nullptr);
  // in [world][count]; out[count] = sum over ranks of their in[rank].
  void reduce_scatter(const void* in, void* out, uint64_t count, dev::DType t, Method m = Method::kAuto,
                      void* stream = nullptr);
  // in [world][count]: block p goes to rank p; symmetric out [world][count] receives block
  // `rank` of every rank.
  void all_to_all(const void* in, uint64_t out_off, uint64_t count, dev::DType t, Method m = Method::kAuto,
                  void* stream = nullptr);

  // All-to-all by counts: in is packed by destination (send_counts[p] elements for rank p,
  // in rank order); the symmetric out (out_capacity elements) receives the blocks packed by
  // source; recv_counts[s] is set to what rank s sent here. send_counts and recv_counts are
  // world-long arrays in the backend's memory (device memory on GPUs), so the counts can
  // change every call without the host (graph-capturable). A call in which any rank would
  // receive more than out_capacity is refused on every rank with InvalidArgument.
  // Baseline: NCCL send/recv after a host exchange of the counts (not capturable).
  void all_to_all_v(const void* in, const uint64_t* send_counts, uint64_t out_off, uint64_t out_capacity,
                    uint64_t* recv_counts, dev::DType t, Method m = Method::kAuto, void* stream = nullptr);

  // The baseline (NCCL; host reference) into plain, non-symmetric output memory: what a
  // user of NCCL does, and what the benchmarks compare against.
  void baseline_all_gather(const void* in, void* out, uint64_t count, dev::DType t, void* stream = nullptr);
  void baseline_all_to_all(const void* in, void* out, uint64_t count, dev::DType t, void* stream = nullptr);

  // What `auto` picks for an all-reduce of `bytes`.
  Method auto_all_reduce(uint64_t bytes) const;
  // What `auto` picks for an all-gather, reduce-scatter or all-to-all in which every rank
  // sends `bytes_to_peers` in all (ll for small calls, else direct).
  Method auto_exchange(uint64_t bytes_to_peers) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace weft::ops
