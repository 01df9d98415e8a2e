#include "weft/core/error.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

namespace weft {

static const char* basename_of(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

void throw_error(const char* file, int line, const std::string& msg) {
  throw Error(msg, fmt::format("{}:{}", basename_of(file), line));
}

void throw_invalid(const char* file, int line, const std::string& msg) {
  throw InvalidArgument(msg, fmt::format("{}:{}", basename_of(file), line));
}

void throw_errno(const char* file, int line, const std::string& what) {
  int e = errno;
  throw Error(fmt::format("{} failed: {} ({}:{})", what, std::strerror(e), basename_of(file), line));
}

void throw_call_failed(const char* file, int line, const char* call, const char* status, const char* detail) {
  const std::string msg =
      detail ? fmt::format("{} failed: {} ({})", call, status, detail) : fmt::format("{} failed: {}", call, status);
  throw_error(file, line, msg);
}

}  // namespace weft
