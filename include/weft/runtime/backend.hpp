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

class TimeoutError;

enum class BackendKind { kHost, kNccl };

// The op call this rank was last asked to make: set by every op call before it launches (a
// few stores: no formatting, no allocation), read only by the failure report. `op` and
// `method` point to static text (the ops' name tables).
struct CallRecord {
  uint64_t seq = 0;              // op calls recorded on this backend (0: none yet)
  const char* op = nullptr;      // "all_reduce", "gemm_rs"
  const char* method = nullptr;  // as the caller asked for it ("auto" included)
  uint64_t count = 0;            // elements (collectives) or rows M (GEMM ops)
  int32_t dtype = -1;            // dev::DType (-1: none)
  bool count_is_rows = false;    // count is M
};
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

  // Every op call, before it launches anything (see CallRecord).
  void record_call(const char* op, const char* method, uint64_t count, int32_t dtype, bool count_is_rows) {
    call_.op = op;
    call_.method = method;
    call_.count = count;
    call_.dtype = dtype;
    call_.count_is_rows = count_is_rows;
    ++call_.seq;
  }
  const CallRecord& current_call() const { return call_; }

  // Whether ops agree across ranks on every call (a host exchange per call: the host backend)
  // or on set-up and the first call of each shape only (GPUs: a per-call exchange would cost
  // a host round trip and break CUDA-graph capture). A test seam sets it off on the host
  // backend to reproduce what GPUs do with a mismatch after set-up.
  bool agrees_every_call() const { return agree_every_call_; }
  void set_agree_every_call(bool on) { agree_every_call_ = on; }

  // The failure report (docs/failure.md, "A rank dies"): what a TimeoutError of this rank
  // becomes before it leaves an op (host backend: where the op rethrows its workers'
  // exceptions; nccl: synchronize(), where the error slot becomes an exception). Every rank
  // that times out joins a bounded exchange through the bootstrap, out of band
  // (Bootstrap::failure_exchange), telling what it waited for and its current call. Then:
  //  - following "waited for" from this rank through the ranks that joined ends at one that
  //    did not (dead, or hung past WEFT_TIMEOUT_MS more): a TimeoutError naming that one
  //    (peer()), not this rank's own peer (a ring's predecessor, waiting itself);
  //  - else the ranks' calls differ: InvalidArgument "ranks disagree on the call", naming
  //    both calls (what GPUs' per-call agreement does not catch);
  //  - else `e`'s message with every joined rank's wait added.
  // Once per backend: after a failure the world is broken, later failures throw `e` as is.
  [[noreturn]] void raise_failure(const TimeoutError& e);

 protected:
  Backend(BackendKind kind, const World& w, std::unique_ptr<Bootstrap> bs);
  void init_heap(size_t capacity);

  BackendKind kind_;
  World world_;
  std::unique_ptr<Bootstrap> bootstrap_;
  std::unique_ptr<SymmetricHeap> heap_;
  dev::DeviceCtx ctx_{};
  // The error slot as host code reads it (ctx_.error is the device's address on nccl).
  const dev::ErrorSlot* host_slot_ = nullptr;
  CallRecord call_{};
  bool agree_every_call_ = false;
  bool failure_reported_ = false;
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
// The same with the caller's bootstrap (the C API: a framework's store), e.g. a
// CallbackBootstrap; the world may be any group of ranks (several in one process). env gives
// the tunables (WEFT_BACKEND, the heap size, WEFT_TIMEOUT_MS), not the process environment.
// device: the nccl backend's CUDA device (< 0: w.local_rank).
std::unique_ptr<Backend> make_backend(const World& w, const EnvMap& env, std::unique_ptr<Bootstrap> bs,
                                      std::optional<BackendKind> kind = {}, int device = -1);

// Turns an error slot into a message that names the rank that did not arrive.
std::string describe_timeout(const dev::ErrorSlot& s, uint64_t timeout_ns);

}  // namespace weft
