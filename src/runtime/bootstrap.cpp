#include "weft/runtime/bootstrap.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "weft/core/error.hpp"

#ifdef WEFT_HAVE_MPI
#include <mpi.h>
#endif

namespace weft {

uint64_t this_host_hash() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return std::hash<std::string>{}(name);
}

bool process_exited(int pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0) return errno == ESRCH;
  // Alive or a zombie: /proc/<pid>/stat's third field is the state.
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(f, line)) return false;
  auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

void Bootstrap::broadcast(void* buf, size_t bytes, int root) {
  std::vector<char> all(bytes * size_);
  allgather(buf, bytes, all.data());
  std::memcpy(buf, all.data() + bytes * root, bytes);
}

void Bootstrap::barrier() {
  char c = 0;
  std::vector<char> all(size_);
  allgather(&c, 1, all.data());
}

bool Bootstrap::peer_exited(int peer) const {
  if (peer < 0 || peer >= static_cast<int>(peers_.size()) || peer == rank_) return false;
  if (peers_[peer].host_hash != this_host_hash()) return false;
  return process_exited(peers_[peer].pid);
}

void Bootstrap::handshake(const World& w) {
  PeerInfo me{w.size, w.local_size, static_cast<int>(getpid()), this_host_hash()};
  std::vector<PeerInfo> all(size_);
  allgather(&me, sizeof me, all.data());
  for (int r = 0; r < size_; ++r) {
    WEFT_REQUIRE(all[r].world_size == w.size,
                 fmt::format("world sizes disagree: rank {} says {}, rank {} says {}", rank_, w.size, r,
                             all[r].world_size));
  }
  peers_ = std::move(all);
}

// ---------------------------------------------------------------------------------------
namespace {

// The start time of a process (clock ticks after boot, /proc/<pid>/stat's 22nd field): with
// the pid it names one process, whatever reuses the pid later. Empty when unknown.
std::optional<uint64_t> process_start_ticks(int pid) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(f, line)) return std::nullopt;
  const auto close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(line.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i)  // fields 3 (state) to 22 (starttime)
    if (!(fields >> field)) return std::nullopt;
  char* end = nullptr;
  const uint64_t v = std::strtoull(field.c_str(), &end, 10);
  if (!end || *end != '\0') return std::nullopt;
  return v;
}

// What rank 0 writes to <dir>/session.
struct Session {
  int pid = 0;
  uint64_t start_ticks = 0;
  uint64_t host = 0;
  std::string nonce;
};

std::optional<Session> read_session(const std::string& file) {
  std::ifstream f(file);
  Session s;
  if (!(f >> s.pid >> s.start_ticks >> s.host >> s.nonce)) return std::nullopt;
  if (s.nonce.size() != 16 || s.nonce.find_first_not_of("0123456789abcdef") != std::string::npos) return std::nullopt;
  return s;
}

// Still running: same host, its pid alive and started when the session says. A session of
// another host cannot be checked and counts as live.
bool session_live(const Session& s) {
  if (s.host != this_host_hash()) return true;
  if (process_exited(s.pid)) return false;
  const auto ticks = process_start_ticks(s.pid);
  return ticks && *ticks == s.start_ticks;
}

// Nonces of the sessions this process has taken part in: a later FileBootstrap in the same
// directory (a second backend of the same ranks) must wait for rank 0's new session rather
// than adopt the last one, whose rank 0 is this same live process.
std::mutex g_used_mutex;
std::set<std::string> g_used_nonces;

bool nonce_used(const std::string& n) {
  std::lock_guard<std::mutex> lock(g_used_mutex);
  return g_used_nonces.count(n) != 0;
}
void mark_nonce_used(const std::string& n) {
  std::lock_guard<std::mutex> lock(g_used_mutex);
  g_used_nonces.insert(n);
}

// Writes `data` to `file` whole or not at all (write a temporary, then rename).
void write_file_atomically(const std::string& file, const void* data, size_t bytes) {
  const std::string tmp = fmt::format("{}.tmp.{}", file, getpid());
  int fd = ::open(tmp.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  if (fd < 0) throw_errno(__FILE__, __LINE__, "open " + tmp);
  const char* p = static_cast<const char*>(data);
  size_t left = bytes;
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      ::unlink(tmp.c_str());
      throw_errno(__FILE__, __LINE__, "write " + tmp);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  WEFT_SYSCHECK(::close(fd));
  if (::rename(tmp.c_str(), file.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw_errno(__FILE__, __LINE__, "rename " + tmp);
  }
}

std::string random_nonce() {
  std::random_device rd;
  const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                     static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                     (static_cast<uint64_t>(getpid()) << 17);
  return fmt::format("{:016x}", r);
}

}  // namespace

FileBootstrap::FileBootstrap(const World& w, std::string dir, int64_t timeout_ms, bool owns_dir)
    : Bootstrap(w.rank, w.size), dir_(std::move(dir)), timeout_ms_(timeout_ms), owns_dir_(owns_dir) {
  struct stat st{};
  WEFT_REQUIRE(::stat(dir_.c_str(), &st) == 0 && S_ISDIR(st.st_mode),
               fmt::format("bootstrap directory '{}' does not exist", dir_));
  open_session();
  try {
    handshake(w);
  } catch (...) {
    leave();  // the destructor does not run for a constructor that throws
    throw;
  }
}

FileBootstrap::~FileBootstrap() {
  // Our last file may still be read by a slower rank; unlink only older rounds' files,
  // which every rank has read by the time we finished the last round.
  if (round_ >= 2) ::unlink(path(round_ - 2, rank_).c_str());
  leave();
}

void FileBootstrap::open_session() {
  const std::string file = dir_ + "/session";
  if (rank_ == 0) {
    // An existing session is either stale (its rank 0 has exited: replaced) or another
    // bootstrap's that is still running in this directory (refused: two worlds would read
    // each other's files). rename() replaces a stale file whole; O_EXCL could not, and which
    // file is stale needs the liveness check either way.
    if (auto old = read_session(file); old && old->pid != static_cast<int>(getpid()) && session_live(*old))
      throw_invalid(__FILE__, __LINE__,
                    fmt::format("rank 0: bootstrap directory '{}' is in use by another run (its rank 0, pid {}, is "
                                "still running): give each run a directory of its own",
                                dir_, old->pid));
    const int pid = static_cast<int>(getpid());
    Session s{pid, process_start_ticks(pid).value_or(0), this_host_hash(), random_nonce()};
    const std::string text = fmt::format("{} {} {} {}\n", s.pid, s.start_ticks, s.host, s.nonce);
    write_file_atomically(file, text.data(), text.size());
    nonce_ = s.nonce;
  } else {
    const auto start = std::chrono::steady_clock::now();
    auto sleep = std::chrono::microseconds(20);
    while (true) {
      if (auto s = read_session(file); s && !nonce_used(s->nonce) && session_live(*s)) {
        nonce_ = s->nonce;
        break;
      }
      const auto waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
      if (waited.count() >= timeout_ms_)
        throw TimeoutError(fmt::format("rank {}: bootstrap timed out after {} ms waiting for rank 0 to open a "
                                       "session in '{}' (WEFT_TIMEOUT_MS; did it start, or exit early?)",
                                       rank_, waited.count(), dir_),
                           rank_, 0);
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(2000));
    }
  }
  mark_nonce_used(nonce_);
}

void FileBootstrap::leave() noexcept {
  if (!owns_dir_ || nonce_.empty()) return;
  try {
    const char mark = 1;
    try {
      write_file_atomically(fmt::format("{}/{}.leave.{}", dir_, nonce_, rank_), &mark, 1);
    } catch (...) {
      // Without its mark this rank cannot be counted by the others; it still counts itself
      // as left below (it is done with the directory).
    }
    // The last rank to leave sees every mark (a rank writes its own before it looks): it
    // removes the directory. A mark missing for a rank whose process has exited (it died)
    // is not waited for, so after a failure the last survivor removes it. Two ranks that
    // both see every mark both remove it; the second finds nothing to do.
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      if (::access(fmt::format("{}/{}.leave.{}", dir_, nonce_, r).c_str(), F_OK) == 0) continue;
      if (!peer_exited(r)) return;  // it will leave later, and remove the directory then
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  } catch (...) {
    // Nothing may escape a destructor; a directory left behind is removed by a later
    // make_bootstrap once its agent or attempt is gone.
  }
}

std::string FileBootstrap::path(uint64_t round, int rank) const {
  return fmt::format("{}/{}.{}.{}", dir_, nonce_, round, rank);
}

void FileBootstrap::allgather(const void* in, size_t bytes, void* out) {
  const uint64_t round = round_++;
  write_file_atomically(path(round, rank_), in, bytes);  // a reader sees the whole file or none of it
  auto start = std::chrono::steady_clock::now();
  auto sleep = std::chrono::microseconds(20);
  std::vector<bool> have(size_, false);
  int missing = size_;
  while (true) {
    for (int r = 0; r < size_; ++r) {
      if (have[r]) continue;
      int fd = ::open(path(round, r).c_str(), O_RDONLY);
      if (fd < 0) continue;
      char* dst = static_cast<char*>(out) + bytes * r;
      size_t got = 0;
      while (got < bytes) {
        ssize_t n = ::read(fd, dst + got, bytes - got);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
      }
      ::close(fd);
      WEFT_REQUIRE(got == bytes, fmt::format("bootstrap round {}: rank {} sent {} bytes, rank {} expected {} "
                                             "(ranks disagree on what they exchange)",
                                             round, r, got, rank_, bytes));
      have[r] = true;
      --missing;
    }
    if (missing == 0) break;
    auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    std::vector<int> absent;
    for (int r = 0; r < size_; ++r)
      if (!have[r]) absent.push_back(r);
    for (int r : absent) {
      // A rank may write its file and exit between our look for the file and this check:
      // only a file still missing after the exit was seen means it never arrived.
      if (peer_exited(r) && ::access(path(round, r).c_str(), F_OK) != 0)
        throw TimeoutError(fmt::format("rank {}: bootstrap round {}: rank {} (pid {}) exited before arriving",
                                       rank_, round, r, peers_[r].pid),
                           rank_, r);
    }
    if (waited.count() >= timeout_ms_)
      throw TimeoutError(fmt::format("rank {}: bootstrap round {} timed out after {} ms waiting for rank{} {} "
                                     "(WEFT_TIMEOUT_MS; did {} start, or exit early?)",
                                     rank_, round, waited.count(), absent.size() > 1 ? "s" : "",
                                     fmt::join(absent, ", "), absent.size() > 1 ? "they" : "it"),
                         rank_, absent.front());
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(2000));
  }
  if (round >= 2) ::unlink(path(round - 2, rank_).c_str());
}

// ---------------------------------------------------------------------------------------
namespace {

class SelfBootstrap final : public Bootstrap {
 public:
  explicit SelfBootstrap(const World& w) : Bootstrap(0, 1) { handshake(w); }
  void allgather(const void* in, size_t bytes, void* out) override {
    if (bytes) std::memcpy(out, in, bytes);  // empty exchanges may come with null pointers
  }
};

#ifdef WEFT_HAVE_MPI
class MpiBootstrap final : public Bootstrap {
 public:
  explicit MpiBootstrap(const World& w) : Bootstrap(w.rank, w.size) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      WEFT_CHECK(MPI_Init(nullptr, nullptr) == MPI_SUCCESS, "MPI_Init failed");
      owns_ = true;
    }
    int r = -1, n = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    WEFT_REQUIRE(r == w.rank && n == w.size,
                 fmt::format("MPI says rank {} of {}, the environment says rank {} of {}", r, n, w.rank, w.size));
    handshake(w);
  }
  ~MpiBootstrap() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_ && !finalized) MPI_Finalize();
  }
  void allgather(const void* in, size_t bytes, void* out) override {
    WEFT_CHECK(MPI_Allgather(in, static_cast<int>(bytes), MPI_BYTE, out, static_cast<int>(bytes), MPI_BYTE,
                             MPI_COMM_WORLD) == MPI_SUCCESS,
               "MPI_Allgather failed");
  }

 private:
  bool owns_ = false;
};
#endif

}  // namespace

// ---------------------------------------------------------------------------------------
// torchrun's bootstrap directories.
namespace {

// A launcher's value as part of a file name: [A-Za-z0-9._] kept, anything else (a '/', a
// '-', which separates the name's fields) becomes '_', at most 64 characters.
std::string path_safe(const std::string& v) {
  std::string out;
  for (char c : v.substr(0, 64)) out += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ? c : '_';
  return out.empty() ? std::string("_") : out;
}

// TORCHELASTIC_RESTART_COUNT: 0 for the first attempt, +1 for each elastic restart.
uint64_t restart_count(const EnvMap& env) {
  const std::string v = env_get(env, "TORCHELASTIC_RESTART_COUNT").value_or("0");
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  WEFT_REQUIRE(!v.empty() && end && *end == '\0' && errno != ERANGE && v[0] != '-',
               fmt::format("TORCHELASTIC_RESTART_COUNT='{}' is not a non-negative integer", v));
  return n;
}

// Removes this user's torchrun directories under `base` that no rank can use any more: whose
// agent (the first number of the name) has exited, and earlier attempts (`attempt` with a
// smaller restart count) of this agent's run. Ranks killed by a signal (SIGKILL, or the
// agent's SIGTERM before a restart) never remove theirs; this is the clean-up of last resort.
void remove_stale_torchrun_dirs(const std::string& base, int agent, const std::string& attempt, uint64_t restart) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(base, ec)) {
    const std::string name = e.path().filename().string();
    static const std::string kPrefix = "weft-torchrun-";
    if (name.rfind(kPrefix, 0) != 0) continue;
    struct stat st{};
    if (::lstat(e.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid()) continue;
    bool stale = false;
    const int pid = std::atoi(name.c_str() + kPrefix.size());
    if (pid > 0 && pid != agent && process_exited(pid)) stale = true;
    if (name.rfind(attempt, 0) == 0) {  // <attempt><restart>-<n>: an attempt of this run
      const char* rest = name.c_str() + attempt.size();
      char* end = nullptr;
      const unsigned long long r = std::strtoull(rest, &end, 10);
      if (end != rest && *end == '-' && r < restart) stale = true;
    }
    if (stale) std::filesystem::remove_all(e.path(), ec);
  }
}

}  // namespace

std::unique_ptr<Bootstrap> make_bootstrap(const World& w, const EnvMap& env) {
  const int64_t timeout_ms = tunable_value(tunables::kTimeoutMs, env);
  if (w.size == 1) return std::make_unique<SelfBootstrap>(w);
  if (auto dir = env_get(env, "WEFT_BOOTSTRAP_DIR")) return std::make_unique<FileBootstrap>(w, *dir, timeout_ms);
#ifdef WEFT_HAVE_MPI
  if (w.source == "Open MPI") return std::make_unique<MpiBootstrap>(w);
#endif
  if (w.source == "torchrun" && w.num_nodes() == 1) {
    std::string base = env_get(env, "TMPDIR").value_or("");
    if (base.empty()) base = "/tmp";
    // torchrun's agent is the parent of every local worker: its pid, the run id, the port and
    // the restart count make the directory unique to one attempt of one run; the count of
    // this process's torchrun bootstraps (the same on every rank: bootstraps are collective)
    // gives each bootstrap a directory of its own, which its last rank removes whole.
    const int agent = static_cast<int>(getppid());
    const std::string attempt =
        fmt::format("weft-torchrun-{}-{}-{}-", agent, path_safe(env_get(env, "TORCHELASTIC_RUN_ID").value_or("none")),
                    path_safe(env_get(env, "MASTER_PORT").value_or("0")));
    const auto restart = restart_count(env);
    remove_stale_torchrun_dirs(base, agent, attempt, restart);
    static std::atomic<uint64_t> bootstraps{0};
    const std::string dir = fmt::format("{}/{}{}-{}", base, attempt, restart, bootstraps++);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) throw_errno(__FILE__, __LINE__, "mkdir " + dir);
    // Every rank tries mkdir; EEXIST is fine when the directory is ours (not another user's,
    // not a link planted in a shared /tmp).
    struct stat st{};
    WEFT_REQUIRE(::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid(),
                 fmt::format("torchrun bootstrap directory '{}' is not a directory of this user", dir));
    return std::make_unique<FileBootstrap>(w, dir, timeout_ms, /*owns_dir=*/true);
  }
  throw_invalid(__FILE__, __LINE__,
                fmt::format("no way to bootstrap {} ranks from the {} environment: run under `weft launch`, set "
                            "WEFT_BOOTSTRAP_DIR to a directory all ranks share{}",
                            w.size, w.source,
#ifdef WEFT_HAVE_MPI
                            ""
#else
                            ", or rebuild weft with MPI for multi-node runs"
#endif
                            ));
}

// ---------------------------------------------------------------------------------------
// The failure report's exchange (Backend::raise_failure).

bool Bootstrap::failure_exchange(const void* mine, size_t bytes, void* all, std::vector<bool>& present,
                                 int64_t timeout_ms) {
  (void)timeout_ms;
  present.assign(static_cast<size_t>(size_), false);
  present[static_cast<size_t>(rank_)] = true;
  if (bytes) std::memcpy(static_cast<char*>(all) + bytes * static_cast<size_t>(rank_), mine, bytes);
  return size_ == 1;
}

namespace {
struct FailureFileHeader {
  uint64_t magic;  // "weftfail"
  int64_t pid;     // the writer's: a file of an earlier run in the same directory is not a join
  uint64_t bytes;
};
constexpr uint64_t kFailureMagic = 0x6c69616674666577ull;
}  // namespace

bool FileBootstrap::failure_exchange(const void* mine, size_t bytes, void* all, std::vector<bool>& present,
                                     int64_t timeout_ms) {
  present.assign(static_cast<size_t>(size_), false);
  char* out = static_cast<char*>(all);
  if (bytes) std::memcpy(out + bytes * static_cast<size_t>(rank_), mine, bytes);
  present[static_cast<size_t>(rank_)] = true;
  auto file = [&](int r) { return fmt::format("{}/failure.{}", dir_, r); };
  {  // write-then-rename: a reader sees the whole file or none of it
    std::string body(sizeof(FailureFileHeader) + bytes, '\0');
    const FailureFileHeader h{kFailureMagic, static_cast<int64_t>(getpid()), bytes};
    std::memcpy(body.data(), &h, sizeof h);
    if (bytes) std::memcpy(body.data() + sizeof h, mine, bytes);
    const std::string tmp = file(rank_) + ".tmp";
    int fd = ::open(tmp.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    bool ok = fd >= 0;
    for (size_t done = 0; ok && done < body.size();) {
      const ssize_t n = ::write(fd, body.data() + done, body.size() - done);
      ok = n > 0;
      if (ok) done += static_cast<size_t>(n);
    }
    if (fd >= 0) ok = ::close(fd) == 0 && ok;
    ok = ok && ::rename(tmp.c_str(), file(rank_).c_str()) == 0;
    if (!ok) {  // the report is a courtesy on the way to an error: never a new error of its own
      ::unlink(tmp.c_str());
      return false;
    }
  }
  // Whether rank r's file is there, whole and of this run; reads it into its place.
  auto read_one = [&](int r) {
    const int fd = ::open(file(r).c_str(), O_RDONLY);
    if (fd < 0) return false;
    std::string body(sizeof(FailureFileHeader) + bytes, '\0');
    size_t got = 0;
    while (got < body.size()) {
      const ssize_t n = ::read(fd, body.data() + got, body.size() - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    ::close(fd);
    FailureFileHeader h{};
    if (got != body.size()) return false;
    std::memcpy(&h, body.data(), sizeof h);
    if (h.magic != kFailureMagic || h.bytes != bytes || h.pid != peers_[static_cast<size_t>(r)].pid) return false;
    if (bytes) std::memcpy(out + bytes * static_cast<size_t>(r), body.data() + sizeof h, bytes);
    return true;
  };
  const auto start = std::chrono::steady_clock::now();
  auto sleep = std::chrono::microseconds(50);
  while (true) {
    bool waiting = false;
    for (int r = 0; r < size_; ++r) {
      if (present[static_cast<size_t>(r)]) continue;
      if (read_one(r)) {
        present[static_cast<size_t>(r)] = true;
        continue;
      }
      // Gone: it will not come. It may have written its file and exited between the look and
      // this check: read once more.
      if (peer_exited(r)) {
        present[static_cast<size_t>(r)] = read_one(r);
        continue;
      }
      waiting = true;
    }
    if (!waiting) return true;
    if (std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(timeout_ms)) return true;
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(5000));
  }
}


// ---------------------------------------------------------------------------------------
// The caller's exchange (the C API).

CallbackBootstrap::CallbackBootstrap(const World& w, AllgatherCallback fn, void* user)
    : Bootstrap(w.rank, w.size), fn_(fn), user_(user) {
  WEFT_REQUIRE(fn_ != nullptr, "CallbackBootstrap: the allgather callback is null");
  handshake(w);
}

void CallbackBootstrap::allgather(const void* in, size_t bytes, void* out) {
  const uint64_t round = round_++;
  char err[512] = {};
  int timed_out = 0, missing = -1;
  const int rc = fn_(user_, in, bytes, out, &timed_out, &missing, err, sizeof err);
  if (rc == 0) return;
  err[sizeof err - 1] = '\0';
  const std::string why = err[0] ? std::string(err) : fmt::format("status {}", rc);
  if (timed_out) {
    const int peer = missing >= 0 && missing < size_ ? missing : -1;
    throw TimeoutError(fmt::format("rank {}: bootstrap round {} ({} bytes) timed out in the caller's allgather{}: {}",
                                   rank_, round, bytes,
                                   peer >= 0 ? fmt::format(" waiting for rank {}", peer) : std::string(), why),
                       rank_, peer);
  }
  throw_error(__FILE__, __LINE__,
              fmt::format("rank {}: bootstrap round {} ({} bytes): the caller's allgather failed: {}", rank_, round,
                          bytes, why));
}

}  // namespace weft
