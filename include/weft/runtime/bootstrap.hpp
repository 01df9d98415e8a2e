// Bootstrap: small host-side exchanges between ranks before (and beside) the GPU
// communicator: the NCCL unique id, allocation records, shared-memory names.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "weft/core/env.hpp"
#include "weft/runtime/world.hpp"

namespace weft {

// What every rank tells every other at start; used to reject worlds that disagree and to
// name ranks whose process has exited.
struct PeerInfo {
  int world_size;
  int local_size;
  int pid;
  uint64_t host_hash;
};

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Collective: every rank contributes `bytes` bytes; `out` receives size()*bytes, rank-major.
  // Throws TimeoutError naming the missing rank(s) after WEFT_TIMEOUT_MS.
  virtual void allgather(const void* in, size_t bytes, void* out) = 0;

  void broadcast(void* buf, size_t bytes, int root);
  void barrier();
  const std::vector<PeerInfo>& peers() const { return peers_; }
  // True if `peer` is known to have exited (same host only; false when unknown).
  bool peer_exited(int peer) const;

 protected:
  Bootstrap(int rank, int size) : rank_(rank), size_(size) {}
  // Exchanges PeerInfo; throws InvalidArgument when ranks disagree on the world's size.
  void handshake(const World& w);

  int rank_;
  int size_;
  std::vector<PeerInfo> peers_;

 public:
  // The failure report's exchange (Backend::raise_failure): out of band, beside the
  // allgather rounds (which it never disturbs: ranks reach it from different rounds). Every
  // rank contributes `bytes` (the same on every rank); all[r * bytes ...] receives rank r's,
  // present[r] says whether it came. Returns when every rank has joined, every rank missing
  // has exited (peer_exited), or after timeout_ms. Returns false where the bootstrap has no
  // such exchange (MPI: a rank that timed out cannot count on a collective): then only this
  // rank is present. One exchange per world.
  virtual bool failure_exchange(const void* mine, size_t bytes, void* all, std::vector<bool>& present,
                                int64_t timeout_ms);
};

// Ranks of one node rendezvous through files in a directory they share (weft launch makes
// one and sets WEFT_BOOTSTRAP_DIR). Every exchange is a round of files `<round>.<rank>`.
class FileBootstrap final : public Bootstrap {
 public:
  FileBootstrap(const World& w, std::string dir, int64_t timeout_ms);
  ~FileBootstrap() override;
  void allgather(const void* in, size_t bytes, void* out) override;

 private:
  std::string path(uint64_t round, int rank) const;
  std::string dir_;
  int64_t timeout_ms_;
  uint64_t round_ = 0;

 public:
  // Files `failure.<rank>` in the directory (write-then-rename), each headed by its writer's
  // pid, so that a file left by an earlier run in the same directory is not read as a join.
  bool failure_exchange(const void* mine, size_t bytes, void* all, std::vector<bool>& present,
                        int64_t timeout_ms) override;
};

// The bootstrap for this world: a single rank needs none; WEFT_BOOTSTRAP_DIR (set by
// weft launch) or a directory derived from torchrun's run id on one node; MPI where weft
// was built with it and the world came from Open MPI. Throws InvalidArgument otherwise.
std::unique_ptr<Bootstrap> make_bootstrap(const World& w, const EnvMap& env);

// The caller's exchange (the C API's weft_world_create with an allgather: a framework's store
// or process group): `fn` does the allgather; it returns 0, or non-zero with a message in
// err (NUL-terminated, at most errlen bytes), and timed_out = 1 when a peer did not arrive
// (missing_rank names it, or -1). A failure becomes Error, a timeout TimeoutError naming the
// missing rank. The callback's own deadline applies (WEFT_TIMEOUT_MS does not). No failure
// exchange (the default's: only this rank reports): a second exchange beside the caller's
// rounds could not be told apart from them.
using AllgatherCallback = int (*)(void* user, const void* in, size_t bytes, void* out, int* timed_out,
                                  int* missing_rank, char* err, size_t errlen);
class CallbackBootstrap final : public Bootstrap {
 public:
  CallbackBootstrap(const World& w, AllgatherCallback fn, void* user);
  void allgather(const void* in, size_t bytes, void* out) override;

 private:
  AllgatherCallback fn_;
  void* user_;
  uint64_t round_ = 0;
};

uint64_t this_host_hash();
// True when a process with this pid is gone or a zombie (exited, not yet reaped).
bool process_exited(int pid);

}  // namespace weft
