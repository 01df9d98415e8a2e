// `weft plan` and `weft simulate`: the plan compiler from the command line.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>

namespace weft::cli {

// Adds the two subcommands to `app`; the returned function runs whichever was chosen and
// returns its exit code, or -1 when neither was.
std::function<int()> add_plan_commands(CLI::App& app);

}  // namespace weft::cli
