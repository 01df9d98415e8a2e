#include "weft/runtime/backend.hpp"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "weft/core/error.hpp"
#include "weft/runtime/host_backend.hpp"

#ifdef WEFT_HAVE_CUDA
#include "weft/runtime/nccl_backend.hpp"
#endif

namespace weft {

const char* to_string(BackendKind k) { return k == BackendKind::kHost ? "host" : "nccl"; }

Backend::Backend(BackendKind kind, const World& w, std::unique_ptr<Bootstrap> bs)
    : kind_(kind), world_(w), bootstrap_(std::move(bs)) {
  WEFT_REQUIRE(w.size <= dev::kMaxPeers,
               fmt::format("world of {} ranks: weft's load/store backends reach at most {} peers", w.size,
                           dev::kMaxPeers));
  ctx_.rank = w.rank;
  ctx_.world = w.size;
  ctx_.timeout_ns = static_cast<uint64_t>(tunable_value(tunables::kTimeoutMs)) * 1000000ull;
}

Backend::~Backend() = default;

void Backend::init_heap(size_t capacity) {
  ctx_.heap_bytes = capacity;
  heap_ = std::make_unique<SymmetricHeap>(*this, capacity);
}

void Backend::check_error_slot() const {
  if (ctx_.error && kind_ == BackendKind::kHost && ctx_.error->claimed) raise_timeout(*ctx_.error, ctx_.timeout_ns);
}

std::string describe_timeout(const dev::ErrorSlot& s, uint64_t timeout_ns) {
  const char* what = s.kind == static_cast<uint32_t>(dev::WaitKind::kBarrier) ? "barrier" : "signal";
  std::string who = s.peer >= 0 ? fmt::format("rank {} did not arrive", s.peer) : std::string("no peer arrived");
  // What the wait was for, where the waiter named it (dev::tile::wait_chunk): "gemm_rs chunk 5: ".
  std::string for_what;
  for (int i = 0; i < 8 && ((s.op >> (8 * i)) & 0xff) != 0; ++i)
    for_what += static_cast<char>((s.op >> (8 * i)) & 0xff);
  if (s.chunk >= 0) for_what += fmt::format("{}chunk {}", for_what.empty() ? "" : " ", s.chunk);
  if (!for_what.empty()) for_what += ": ";
  return fmt::format(
      "rank {}: {} wait timed out after {} ms (WEFT_TIMEOUT_MS={}): {} ({}signal at heap offset {} expected >= {}, "
      "observed {}; block {} thread {})",
      s.rank, what, s.waited_ns / 1000000, timeout_ns / 1000000, who, for_what, s.signal_off, s.expected, s.observed,
      s.block, s.thread);
}

void raise_timeout(const dev::ErrorSlot& slot, uint64_t timeout_ns) {
  if (slot.kind == static_cast<uint32_t>(dev::WaitKind::kCapacity))
    throw InvalidArgument(fmt::format("rank {}: all_to_all_v refused: rank {} would receive {} elements but the "
                                      "output holds {} (nothing was written; size it for the largest receive)",
                                      slot.rank, slot.peer, slot.observed, slot.expected));
  throw TimeoutError(describe_timeout(slot, timeout_ns), slot.rank, slot.peer);
}

#ifndef WEFT_HAVE_CUDA
int count_gpus() { return 0; }
#endif

int count_gpus_forked() {
  int fd[2];
  WEFT_SYSCHECK(pipe(fd));
  pid_t pid = fork();
  WEFT_SYSCHECK(pid);
  if (pid == 0) {
    ::close(fd[0]);
    int n = 0;
    try {
      n = count_gpus();
    } catch (...) {
      n = 0;
    }
    ssize_t w = ::write(fd[1], &n, sizeof n);
    _exit(w == sizeof n ? 0 : 1);
  }
  ::close(fd[1]);
  int n = 0;
  if (::read(fd[0], &n, sizeof n) != sizeof n) n = 0;
  ::close(fd[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  return n;
}

BackendKind resolve_backend(const EnvMap& env, int num_gpus) {
  std::string b = env_get(env, "WEFT_BACKEND").value_or("auto");
  if (b == "host") return BackendKind::kHost;
  if (b == "nccl") {
#ifndef WEFT_HAVE_CUDA
    throw_invalid(__FILE__, __LINE__, "WEFT_BACKEND=nccl, but weft was built without CUDA");
#endif
    WEFT_REQUIRE(num_gpus > 0, "WEFT_BACKEND=nccl, but no GPU is visible to this process");
    return BackendKind::kNccl;
  }
  WEFT_REQUIRE(b == "auto" || b.empty(), fmt::format("WEFT_BACKEND='{}': expected host, nccl or auto", b));
#ifdef WEFT_HAVE_CUDA
  if (num_gpus > 0) return BackendKind::kNccl;
#endif
  return BackendKind::kHost;
}

std::unique_ptr<Backend> make_backend(const World& w, const EnvMap& env, std::optional<BackendKind> kind) {
  auto bs = make_bootstrap(w, env);
  const BackendKind k = kind ? *kind : resolve_backend(env, count_gpus());
  // Every rank must pick the same backend and the same heap size: a mixed world would
  // deadlock at the first wait, and heaps of different sizes put rank p's heap at different
  // places (mis-addressed data, or SIGBUS past the end of a smaller segment). Every rank sees
  // every rank's values, so every rank reports the same disagreement.
  const Tunable& heap_var = k == BackendKind::kHost ? tunables::kHostHeapMiB : tunables::kGpuHeapMiB;
  struct StartInfo {
    int64_t kind;
    int64_t heap_mib;
  } mine{static_cast<int64_t>(k), tunable_value(heap_var, env)};
  std::vector<StartInfo> all(w.size);
  bs->allgather(&mine, sizeof mine, all.data());
  for (int r = 0; r < w.size; ++r)
    WEFT_REQUIRE(all[r].kind == mine.kind,
                 fmt::format("ranks disagree on the backend: rank {} uses {}, rank {} uses {}", w.rank, to_string(k), r,
                             to_string(static_cast<BackendKind>(all[r].kind))));
  for (int r = 0; r < w.size; ++r)
    WEFT_REQUIRE(all[r].heap_mib == mine.heap_mib,
                 fmt::format("ranks disagree on the symmetric heap size: rank {} has {}={}, rank {} has {}={} (every "
                             "rank needs the same value)",
                             w.rank, heap_var.env, mine.heap_mib, r, heap_var.env, all[r].heap_mib));
  if (k == BackendKind::kHost) return make_host_backend(w, env, std::move(bs));
#ifdef WEFT_HAVE_CUDA
  return make_nccl_backend(w, env, std::move(bs));
#else
  throw_invalid(__FILE__, __LINE__, "the nccl backend needs a build with CUDA");
#endif
}

std::unique_ptr<Backend> make_backend() {
  EnvMap env = current_env();
  return make_backend(world_from_env(env), env);
}

}  // namespace weft
