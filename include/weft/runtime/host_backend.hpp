// The host backend: every rank is a process; the symmetric heap is one POSIX shared-memory
// segment that every rank maps (rank p's heap at p * heap_bytes); signals are atomics in
// it; host_launch's worker threads stand in for SMs.
#pragma once
#include <memory>

#include "weft/runtime/backend.hpp"

namespace weft {

std::unique_ptr<Backend> make_host_backend(const World& w, const EnvMap& env, std::unique_ptr<Bootstrap> bs);

}  // namespace weft
