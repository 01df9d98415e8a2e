#include "cli_util.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <string_view>

extern char** environ;

namespace weft::cli {

int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t out = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &out))
    throw UsageError(fmt::format("{}: the product {} x {} does not fit in 64 bits", what, a, b));
  return out;
}

std::string error_text(const std::exception& e, bool location) {
  const auto* w = dynamic_cast<const Error*>(&e);
  std::string s = w && !location ? w->message() : e.what();
  static constexpr std::string_view kId = "[json.exception.";
  for (size_t at = s.find(kId); at != std::string::npos; at = s.find(kId, at)) {
    const size_t close = s.find("] ", at);
    if (close == std::string::npos) break;
    s.erase(at, close + 2 - at);
  }
  return s;
}

std::string read_input(const std::string& path, const std::string& what, size_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InvalidArgument(fmt::format("{} '{}': cannot read it: {}", what, path, std::strerror(errno)));
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      throw InvalidArgument(fmt::format("{} '{}': cannot read it: {}", what, path, std::strerror(e)));
    }
    if (n == 0) break;
    if (text.size() + static_cast<size_t>(n) > max_bytes) {
      ::close(fd);
      throw InvalidArgument(fmt::format("{} '{}': more than {} MiB; is it the right file?", what, path, max_bytes >> 20));
    }
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

void write_file(const std::string& path, const std::string& text) {
  auto fail = [&](int e) { throw Error(fmt::format("cannot write '{}': {}", path, std::strerror(e))); };
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(errno);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      fail(e);
    }
    done += static_cast<size_t>(n);
  }
  // A full disk or a network file system may only report the failure here.
  if (::close(fd) != 0) fail(errno);
}

int run_program(const std::vector<std::string>& argv, bool quiet) {
  WEFT_CHECK(!argv.empty(), "run_program: no program");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (quiet) {
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  }
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw Error(fmt::format("cannot run '{}': {}", argv[0], std::strerror(rc)));
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) throw Error(fmt::format("waiting for '{}': {}", argv[0], std::strerror(errno)));
  if (WIFSIGNALED(st)) throw Error(fmt::format("'{}' was killed by signal {}", argv[0], WTERMSIG(st)));
  return WEXITSTATUS(st);
}

}  // namespace weft::cli
