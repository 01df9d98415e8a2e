// Private to src/ops/collectives: the collectives op in the op skeleton
// (docs/architecture.md, "Adding an op"): the op (collectives.cpp: arguments, method choice,
// dispatch), its methods, each a class owning its state (baseline.cpp: NCCL or the host
// reference; algorithms.cpp: weft's own algorithms from include/weft/kernels/collective_algos.hpp,
// one CUDA kernel per call or host worker teams), and its model (model.cpp: what `auto`
// picks, CTAs and threads per call).
#pragma once
#include <cstdint>
#include <map>
#include <tuple>

#include "../common/op_base.hpp"
#include "weft/device/dtype.hpp"
#include "weft/kernels/collective_algos.hpp"
#include "weft/ops/collectives.hpp"

namespace weft::ops::detail {

const char* algo_name(coll::Algo a);
bool is_ll(coll::Algo a);
bool is_all_reduce(coll::Algo a);

// ---- model (model.cpp) ---------------------------------------------------------------------
// What `auto` picks for an all-reduce of `bytes` per rank on `world` ranks.
Method auto_all_reduce(uint64_t bytes, int world);
// What `auto` picks for an all-gather, reduce-scatter or all-to-all in which every rank sends
// `bytes_to_peers` in all.
Method auto_exchange(uint64_t bytes_to_peers);
// CTAs a GPU call of this algorithm and size uses (`bytes`: all-reduce and LL methods: one
// rank's payload per peer; others: the whole call); `ctas_override` > 0 replaces the rule.
int coll_ctas(coll::Algo algo, uint64_t bytes, int ctas_override);
// GPU threads per CTA (LL: about one 16-byte line per thread; others kCtaThreads).
int coll_threads(coll::Algo algo, uint64_t bytes, int ctas);
// Elements of staging one (parity, source) slot holds.
uint64_t coll_staging_elems(coll::Algo a, uint64_t count, size_t elem, int ctas);

// ---- methods ---------------------------------------------------------------------------------
// `baseline`: NCCL on GPUs, a bootstrap reference on the host backend (every rank's whole
// input through the bootstrap, summed in rank order in fp32 -- the order weft's own kernels
// use, so results match bit for bit).
class BaselineCollective {
 public:
  explicit BaselineCollective(const OpBase& op) : op_(op) {}
  ~BaselineCollective();
  BaselineCollective(const BaselineCollective&) = delete;
  BaselineCollective& operator=(const BaselineCollective&) = delete;

  // algo names the collective (its protocol variants all map to the same NCCL call).
  void run(coll::Algo algo, const void* in, void* out, uint64_t count, dev::DType t, void* stream);
  // all-to-all into the symmetric output at out_off (NCCL into scratch, then a copy).
  void all_to_all_symmetric(const void* in, uint64_t out_off, uint64_t count, dev::DType t, void* stream);
  void all_to_all_v(const void* in, const uint64_t* send_counts, uint64_t out_off, uint64_t out_capacity,
                    uint64_t* recv_counts, dev::DType t, void* stream);

 private:
  const OpBase& op_;
  void* a2a_scratch_ = nullptr;  // device memory outside the NCCL window (all_to_all_symmetric, all_to_all_v)
  size_t a2a_scratch_bytes_ = 0;
};

// weft's own algorithms: per (algorithm, count, dtype) the call's symmetric state (staging,
// signals, epochs), allocated at the first call of that shape and reused, so later calls
// allocate, synchronise and memset nothing (CUDA-graph capturable).
class AlgoCollective {
 public:
  explicit AlgoCollective(const OpBase& op) : op_(op) {}
  // The call's arguments with its state filled in (allocated at the shape's first call).
  coll::Args args(coll::Algo algo, uint64_t count, dev::DType t, void* stream);
  void run(const coll::Args& a, dev::DType t, void* stream);

 private:
  const OpBase& op_;
  std::map<std::tuple<int, uint64_t, int>, coll::Args> instances_;
};

}  // namespace weft::ops::detail
