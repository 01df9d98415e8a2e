// Errors: every failure is an exception that carries context (file:line, rank, what).
// The library never calls exit(); the CLI turns exceptions into exit codes.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

namespace weft {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  // what() is "<message> (<where>)": WEFT_REQUIRE and WEFT_CHECK record file:line this way.
  Error(const std::string& message, const std::string& where)
      : std::runtime_error(message + " (" + where + ")"), message_(message) {}
  // The message without the source location (a frontend shows this for user errors).
  const char* message() const noexcept { return message_.empty() ? what() : message_.c_str(); }

 private:
  std::string message_;
};

// Bad input from the user: shapes, sizes, environment, world sizes that disagree.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A wait that passed its deadline. `peer` is the rank that did not arrive (-1: unknown).
class TimeoutError : public Error {
 public:
  TimeoutError(const std::string& msg, int rank, int peer) : Error(msg), rank_(rank), peer_(peer) {}
  int rank() const { return rank_; }
  int peer() const { return peer_; }

 private:
  int rank_;
  int peer_;
};

[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
[[noreturn]] void throw_invalid(const char* file, int line, const std::string& msg);
[[noreturn]] void throw_errno(const char* file, int line, const std::string& what);
// Error "<call> failed: <status>" (plus " (<detail>)" when detail is not null) with file:line:
// the status checks of weft/core/cuda_check.hpp, kept out of line so that header needs no fmt.
[[noreturn]] void throw_call_failed(const char* file, int line, const char* call, const char* status,
                                    const char* detail = nullptr);

}  // namespace weft

// Check a condition that depends on user input; throws InvalidArgument with file:line.
#define WEFT_REQUIRE(cond, msg)                                         \
  do {                                                                  \
    if (!(cond)) ::weft::throw_invalid(__FILE__, __LINE__, (msg));      \
  } while (0)

// Check an internal invariant; throws Error with file:line.
#define WEFT_CHECK(cond, msg)                                           \
  do {                                                                  \
    if (!(cond)) ::weft::throw_error(__FILE__, __LINE__, (msg));        \
  } while (0)

// Check a POSIX call that returns -1 and sets errno.
#define WEFT_SYSCHECK(call)                                             \
  do {                                                                  \
    if ((call) == -1) ::weft::throw_errno(__FILE__, __LINE__, #call);   \
  } while (0)
