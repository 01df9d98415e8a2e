// Helpers shared by the CLI's commands: usage errors, checked arithmetic on sizes a user
// gives, file writes that report failure, and running a program without a shell.
#pragma once
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "weft/core/error.hpp"

namespace weft::cli {

// A bad command line (an option's value out of range, an unknown command): the CLI prints
// the message alone and exits with status 2.
class UsageError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// a * b for sizes that come from the command line; throws UsageError naming `what` (e.g.
// "--nodes 65536 x --gpus 65536") when the product does not fit in int64_t. a, b >= 0.
int64_t checked_mul(int64_t a, int64_t b, const std::string& what);

// An error's text as the CLI prints it: message() of weft's errors (without the source
// location) unless `location`, else what(); nlohmann::json's exception ids ("[json.exception.parse_error.101] ")
// removed wherever they occur, leaving the parser's own words ("parse error at line 1, ...").
std::string error_text(const std::exception& e, bool location = false);

// The contents of the file `path` that the user named as `what` ("trace", "--file"), up to
// `max_bytes`; throws InvalidArgument naming both when it cannot be read or holds more (a
// device such as /dev/zero never ends: it would be read until memory runs out).
std::string read_input(const std::string& path, const std::string& what, size_t max_bytes);

// Writes `text` to `path` (created or truncated); throws Error "cannot write '<path>': <OS
// error>" when opening, writing or closing fails, so "wrote <path>" is printed only after it.
void write_file(const std::string& path, const std::string& text);

// Runs argv[0] (searched in PATH) with `argv` as its argument vector: no shell, so nothing
// in an argument is interpreted. Returns its exit status; throws Error when it cannot start
// or is killed by a signal.
int run_program(const std::vector<std::string>& argv, bool quiet = false);

}  // namespace weft::cli
