#include "weft/runtime/bootstrap.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
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
FileBootstrap::FileBootstrap(const World& w, std::string dir, int64_t timeout_ms)
    : Bootstrap(w.rank, w.size), dir_(std::move(dir)), timeout_ms_(timeout_ms) {
  struct stat st{};
  WEFT_REQUIRE(::stat(dir_.c_str(), &st) == 0 && S_ISDIR(st.st_mode),
               fmt::format("bootstrap directory '{}' does not exist", dir_));
  handshake(w);
}

FileBootstrap::~FileBootstrap() {
  // Our last file may still be read by a slower rank; unlink only older rounds' files,
  // which every rank has read by the time we finished the last round.
  if (round_ >= 2) ::unlink(path(round_ - 2, rank_).c_str());
}

std::string FileBootstrap::path(uint64_t round, int rank) const {
  return fmt::format("{}/{}.{}", dir_, round, rank);
}

void FileBootstrap::allgather(const void* in, size_t bytes, void* out) {
  const uint64_t round = round_++;
  {  // write-then-rename: a reader sees the whole file or none of it
    std::string tmp = path(round, rank_) + ".tmp";
    int fd = ::open(tmp.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    WEFT_SYSCHECK(fd);
    const char* p = static_cast<const char*>(in);
    size_t left = bytes;
    while (left > 0) {
      ssize_t n = ::write(fd, p, left);
      if (n < 0) {
        ::close(fd);
        throw_errno(__FILE__, __LINE__, "write " + tmp);
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
    WEFT_SYSCHECK(::close(fd));
    WEFT_SYSCHECK(::rename(tmp.c_str(), path(round, rank_).c_str()));
  }
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

std::unique_ptr<Bootstrap> make_bootstrap(const World& w, const EnvMap& env) {
  const int64_t timeout_ms = tunable_value(tunables::kTimeoutMs, env);
  if (w.size == 1) return std::make_unique<SelfBootstrap>(w);
  if (auto dir = env_get(env, "WEFT_BOOTSTRAP_DIR")) return std::make_unique<FileBootstrap>(w, *dir, timeout_ms);
#ifdef WEFT_HAVE_MPI
  if (w.source == "Open MPI") return std::make_unique<MpiBootstrap>(w);
#endif
  if (w.source == "torchrun" && w.num_nodes() == 1) {
    auto run_id = env_get(env, "TORCHELASTIC_RUN_ID").value_or("none");
    auto port = env_get(env, "MASTER_PORT").value_or("0");
    // torchrun's agent is the parent of every local worker: its pid makes the directory
    // unique to this run, so files of an earlier run are never read.
    std::string dir = fmt::format("/tmp/weft-torchrun-{}-{}-{}", getppid(), run_id, port);
    ::mkdir(dir.c_str(), 0700);  // every rank tries; EEXIST is fine
    return std::make_unique<FileBootstrap>(w, dir, timeout_ms);
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
