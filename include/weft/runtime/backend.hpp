// Backend: the runtime under every op. `nccl` on GPUs (NCCL symmetric windows, NVLink
// peer pointers), `host` everywhere else (POSIX shared memory, worker threads as SMs).
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "weft/core/env.hpp"
#include "weft/device/ctx.hpp"
#include "weft/runtime/bootstrap.hpp"
#include "weft/runtime/heap.hpp"
#include "weft/runtime/world.hpp"

namespace weft {

enum class BackendKind { kHost, kNccl };
const char* to_string(BackendKind k);

class Backend {
 public:
  virtual ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  BackendKind kind() const { return kind_; }
  const World& world() const { return world_; }
  int rank() const { return world_.rank; }
  int size() const { return world_.size; }
  Bootstrap& bootstrap() { return *bootstrap_; }
  SymmetricHeap& heap() { return *heap_; }
  // What kernels (or host workers) take by value to reach every peer.
  const dev::DeviceCtx& ctx() const { return ctx_; }

  virtual std::string device_name() const = 0;
  // This rank's heap at `offset` as host code passes it to the backend's copies and
  // libraries (a device pointer on nccl, a host pointer on host).
  virtual void* local_ptr(uint64_t offset) const = 0;
  // The NCCL communicator (ncclComm_t) on the nccl backend; nullptr on host.
  virtual void* nccl_comm() const { return nullptr; }
  // Zeroes `bytes` of this rank's heap at `offset`, complete on return.
  virtual void zero(uint64_t offset, size_t bytes) = 0;
  // Copies between host memory and this rank's heap, complete on return.
  virtual void copy_to_host(void* dst, uint64_t offset, size_t bytes) = 0;
  virtual void copy_from_host(uint64_t offset, const void* src, size_t bytes) = 0;
  // Waits for this rank's outstanding device work; throws TimeoutError when a wait in it
  // passed its deadline (naming the peer), Error for other device failures.
  virtual void synchronize() = 0;
  // Host-side barrier across ranks (through the bootstrap).
  void barrier() { bootstrap_->barrier(); }
  // Throws the TimeoutError recorded in the error slot, if any.
  void check_error_slot() const;

 protected:
  Backend(BackendKind kind, const World& w, std::unique_ptr<Bootstrap> bs);
  void init_heap(size_t capacity);

  BackendKind kind_;
  World world_;
  std::unique_ptr<Bootstrap> bootstrap_;
  std::unique_ptr<SymmetricHeap> heap_;
  dev::DeviceCtx ctx_{};
};

// GPUs visible to this process (0 in a build without CUDA). Initialises CUDA: call it in
// rank processes, or use count_gpus_forked() before forking.
int count_gpus();
// The same, counted in a short-lived child so that this process never touches CUDA.
int count_gpus_forked();

// WEFT_BACKEND=host|nccl, else nccl when GPUs are present and weft was built with CUDA.
BackendKind resolve_backend(const EnvMap& env, int num_gpus);

// Collective over the world's ranks: builds the bootstrap, the backend and its heap.
std::unique_ptr<Backend> make_backend(const World& w, const EnvMap& env, std::optional<BackendKind> kind = {});
std::unique_ptr<Backend> make_backend();

// Turns an error slot into a message that names the rank that did not arrive.
std::string describe_timeout(const dev::ErrorSlot& s, uint64_t timeout_ns);

}  // namespace weft
