#include "weft/runtime/backend.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/device/dtype.hpp"
#include "weft/runtime/host_backend.hpp"

#ifdef WEFT_HAVE_CUDA
#include "weft/runtime/nccl_backend.hpp"
#endif

namespace weft {

const char* to_string(BackendKind k) { return k == BackendKind::kHost ? "host" : "nccl"; }

Backend::Backend(BackendKind kind, const World& w, std::unique_ptr<Bootstrap> bs)
    : kind_(kind), world_(w), bootstrap_(std::move(bs)), agree_every_call_(kind == BackendKind::kHost) {
  WEFT_REQUIRE(w.size <= dev::kMaxPeers,
               fmt::format("world of {} ranks: weft's load/store backends reach at most {} peers", w.size,
                           dev::kMaxPeers));
  ctx_.rank = w.rank;
  ctx_.world = w.size;
  // The process environment's; the backends replace it with their EnvMap's value.
  ctx_.timeout_ns = static_cast<uint64_t>(tunable_value(tunables::kTimeoutMs)) * 1000000ull;
}

Backend::~Backend() = default;

void Backend::init_heap(size_t capacity) {
  ctx_.heap_bytes = capacity;
  heap_ = std::make_unique<SymmetricHeap>(*this, capacity);
}

void Backend::check_error_slot() const {
  if (!ctx_.error || kind_ != BackendKind::kHost || !ctx_.error->claimed) return;
  // A refusal (all_to_all_v over capacity) is not a failure of the world: the call that met it
  // raised it already (its workers' exception) and wrote nothing, so the slot is cleared and
  // later calls run. A timeout stays: the world is broken.
  if (ctx_.error->kind == static_cast<uint32_t>(dev::WaitKind::kCapacity)) {
    __atomic_store_n(&ctx_.error->claimed, 0u, __ATOMIC_RELEASE);
    return;
  }
  raise_timeout(*ctx_.error, ctx_.timeout_ns);
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

// ---- the failure report ------------------------------------------------------------------
namespace {

// What one rank tells the others in the failure report: its wait and its current call. Plain
// data of one size on every rank (names copied into fixed arrays, never pointers).
struct FailureRecord {
  int32_t rank;
  int32_t waited_for;  // the peer its wait named (-1: several, or not known)
  uint32_t wait_kind;  // dev::WaitKind; 0: a bootstrap exchange
  int32_t chunk;       // -1: not a chunk wait
  uint64_t wait_op;    // dev::op_tag of the op that waited (0: not named)
  uint64_t seq;        // CallRecord
  uint64_t count;
  int32_t dtype;
  uint32_t count_is_rows;
  char op[24];
  char method[24];
};

void copy_name(char (&dst)[24], const char* src) {
  std::memset(dst, 0, sizeof dst);
  if (src) std::strncpy(dst, src, sizeof dst - 1);
}

// "all_reduce of 1000 bf16 elements (method one-shot)", "gemm_rs with M = 256 (bf16, method fused)".
std::string describe_call(const FailureRecord& f) {
  if (f.seq == 0) return "no op call yet";
  const char* dt = f.dtype >= 0 ? dev::dtype_name(static_cast<dev::DType>(f.dtype)) : "?";
  if (f.count_is_rows) return fmt::format("{} with M = {} ({}, method {})", f.op, f.count, dt, f.method);
  return fmt::format("{} of {} {} elements (method {})", f.op, f.count, dt, f.method);
}

bool same_call(const FailureRecord& a, const FailureRecord& b) {
  return a.seq == b.seq && a.count == b.count && a.dtype == b.dtype && a.count_is_rows == b.count_is_rows &&
         std::strcmp(a.op, b.op) == 0 && std::strcmp(a.method, b.method) == 0;
}

// "rank 0 waited for rank 3 (all_red chunk 2)".
std::string describe_wait(const FailureRecord& f) {
  std::string what;
  for (int i = 0; i < 8 && ((f.wait_op >> (8 * i)) & 0xff) != 0; ++i)
    what += static_cast<char>((f.wait_op >> (8 * i)) & 0xff);
  if (f.chunk >= 0) what += fmt::format("{}chunk {}", what.empty() ? "" : " ", f.chunk);
  if (f.wait_kind == static_cast<uint32_t>(dev::WaitKind::kBarrier)) what += what.empty() ? "barrier" : " barrier";
  if (f.wait_kind == 0) what += what.empty() ? "bootstrap exchange" : " bootstrap exchange";
  return fmt::format("rank {} waited for {}{}", f.rank,
                     f.waited_for >= 0 ? fmt::format("rank {}", f.waited_for) : std::string("several ranks"),
                     what.empty() ? std::string() : " (" + what + ")");
}

std::string rank_list(const std::vector<int>& rs) {
  return fmt::format("rank{} {}", rs.size() > 1 ? "s" : "", fmt::join(rs, ", "));
}

}  // namespace

void Backend::raise_failure(const TimeoutError& e) {
  if (failure_reported_ || size() == 1) throw e;
  failure_reported_ = true;
  const int me = rank();
  FailureRecord mine{};
  mine.rank = me;
  mine.waited_for = e.peer();
  mine.chunk = -1;
  // A wait of the device API recorded itself in the slot (the first one of this rank, which
  // is the one `e` reports unless a bootstrap exchange timed out: then e names its peer).
  if (host_slot_ && host_slot_->claimed && host_slot_->peer == e.peer()) {
    mine.wait_kind = host_slot_->kind;
    mine.wait_op = host_slot_->op;
    mine.chunk = host_slot_->chunk;
  }
  mine.seq = call_.seq;
  mine.count = call_.count;
  mine.dtype = call_.dtype;
  mine.count_is_rows = call_.count_is_rows;
  copy_name(mine.op, call_.op);
  copy_name(mine.method, call_.method);

  const int64_t timeout_ms = static_cast<int64_t>(ctx_.timeout_ns / 1000000);
  std::vector<FailureRecord> all(static_cast<size_t>(size()));
  std::vector<bool> present;
  bool exchanged = false;
  try {
    exchanged = bootstrap_->failure_exchange(&mine, sizeof mine, all.data(), present, timeout_ms);
  } catch (const std::exception&) {  // the report is a courtesy: the original error stands
  }
  if (!exchanged) throw e;

  std::vector<int> joined, absent;
  for (int r = 0; r < size(); ++r) (present[static_cast<size_t>(r)] ? joined : absent).push_back(r);
  bool calls_agree = true;
  for (int r : joined) calls_agree = calls_agree && same_call(all[static_cast<size_t>(r)], mine);
  std::vector<std::string> waits;
  for (int r : joined) {
    const FailureRecord& f = all[static_cast<size_t>(r)];
    waits.push_back(calls_agree ? describe_wait(f)
                                : fmt::format("{} in call {}: {}", describe_wait(f), f.seq, describe_call(f)));
  }
  const std::string report =
      calls_agree ? fmt::format("{}; all in call {}: {}", fmt::join(waits, ", "), mine.seq, describe_call(mine))
                  : fmt::format("{}", fmt::join(waits, "; "));
  auto why_absent = [&](int r) {
    if (bootstrap_->peer_exited(r))
      return fmt::format("its process exited: pid {}", bootstrap_->peers()[static_cast<size_t>(r)].pid);
    return fmt::format("it did not join the failure report within {} ms", timeout_ms);
  };

  // Follow "waited for" from this rank through the ranks that joined: the first one that did
  // not is the rank every wait on the way depends on.
  int cur = mine.waited_for;
  std::vector<int> chain{me};
  std::vector<bool> seen(static_cast<size_t>(size()), false);
  seen[static_cast<size_t>(me)] = true;
  while (cur >= 0 && cur < size() && present[static_cast<size_t>(cur)] && !seen[static_cast<size_t>(cur)]) {
    seen[static_cast<size_t>(cur)] = true;
    chain.push_back(cur);
    cur = all[static_cast<size_t>(cur)].waited_for;
  }
  std::vector<int> culprits;
  const bool by_chain = cur >= 0 && cur < size() && !present[static_cast<size_t>(cur)];
  if (by_chain) {
    culprits.push_back(cur);
  } else if (!calls_agree) {
    // Every wait leads to a rank that is there: the ranks wait for each other in different calls.
    int other = -1;
    for (int r : joined)
      if (!same_call(all[static_cast<size_t>(r)], all[static_cast<size_t>(joined.front())])) {
        other = r;
        break;
      }
    const FailureRecord& a = all[static_cast<size_t>(joined.front())];
    const FailureRecord& b = all[static_cast<size_t>(other)];
    const bool by_seq = a.seq != b.seq;
    auto call = [&](const FailureRecord& f) {
      return by_seq ? fmt::format("call {}: {}", f.seq, describe_call(f)) : describe_call(f);
    };
    throw InvalidArgument(fmt::format(
        "rank {}: ranks disagree on the call: rank {} runs {}, rank {} runs {} (found by the failure report after "
        "the waits timed out: {}; this rank's own error: {})",
        me, a.rank, call(a), b.rank, call(b), report, e.what()));
  } else {
    culprits = absent;
  }
  if (culprits.empty())  // everyone is there and in the same call: what each waited for
    throw TimeoutError(fmt::format("{} (failure report: {})", e.what(), report), me, e.peer());

  std::vector<std::string> named;
  for (int r : culprits) named.push_back(fmt::format("rank {} did not arrive ({})", r, why_absent(r)));
  std::string path;  // how this rank's wait leads to the culprit, where it does not name it
  if (by_chain && chain.size() > 1) {
    path = fmt::format("; rank {}", me);
    for (size_t i = 1; i < chain.size(); ++i) path += fmt::format(" waited for rank {}, which", chain[i]);
    path += fmt::format(" waited for rank {}", culprits.front());
  }
  std::vector<int> others;
  for (int r : absent)
    if (std::find(culprits.begin(), culprits.end(), r) == culprits.end()) others.push_back(r);
  const std::string also =
      others.empty() ? std::string()
                     : fmt::format("; {} did not join the report either (finished, or stuck elsewhere)", rank_list(others));
  std::vector<int> others_joined;
  for (int r : joined)
    if (r != me) others_joined.push_back(r);
  const std::string too =
      others_joined.empty() ? std::string() : fmt::format("; {} timed out waiting too", rank_list(others_joined));
  throw TimeoutError(fmt::format("rank {}: {}{}{}{} (failure report: {}). This rank's own wait: {}", me,
                                 fmt::join(named, "; "), path, too, also, report, e.what()),
                     me, culprits.front());
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
  return make_backend(w, env, make_bootstrap(w, env), kind);
}

std::unique_ptr<Backend> make_backend(const World& w, const EnvMap& env, std::unique_ptr<Bootstrap> bs,
                                      std::optional<BackendKind> kind, int device) {
  WEFT_REQUIRE(bs != nullptr, "make_backend: the bootstrap is null");
  WEFT_REQUIRE(bs->rank() == w.rank && bs->size() == w.size,
               fmt::format("make_backend: the bootstrap is rank {} of {}, the world rank {} of {}", bs->rank(),
                           bs->size(), w.rank, w.size));
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
  return make_nccl_backend(w, env, std::move(bs), device);
#else
  (void)device;
  throw_invalid(__FILE__, __LINE__, "the nccl backend needs a build with CUDA");
#endif
}

std::unique_ptr<Backend> make_backend() {
  EnvMap env = current_env();
  return make_backend(world_from_env(env), env);
}

}  // namespace weft
