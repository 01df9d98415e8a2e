// The nccl backend: one NCCL communicator; the symmetric heap is one ncclMemAlloc buffer
// registered once as an NCCL_WIN_COLL_SYMMETRIC window; peers are reached by load/store
// through the window's LSA (NVLink) pointers. One process per GPU.
#pragma once
#include <memory>

#include "weft/runtime/backend.hpp"

namespace weft {

// device: the CUDA device of this rank (< 0: w.local_rank, one process per GPU of the node).
std::unique_ptr<Backend> make_nccl_backend(const World& w, const EnvMap& env, std::unique_ptr<Bootstrap> bs,
                                           int device = -1);

}  // namespace weft
