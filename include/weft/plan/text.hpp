// The plan text format: a plan written by hand, ported from another system, or printed by
// weft. One declaration or transfer per line; `#` starts a comment. docs/plan.md has the
// grammar. print_plan(parse_plan(s)) is canonical, and parse_plan(print_plan(p)) == p.
//
//   plan all_gather.ring
//   world 2
//   tensor in 4x8 input elem=2
//   tensor out 8x8 output elem=2           # `sum`, `valid=8,6` are optional
//   signal 1.0 expect 1                     # signal 0 on rank 1: one notify per epoch
//   on 0 chunk 0 push sm 0:in[0:4,0:8] -> 1:out[0:4,0:8] signal 1.0+1 deps 3,4
#pragma once
#include <string>
#include <string_view>

#include "weft/plan/plan.hpp"

namespace weft::plan {

// Throws InvalidArgument "<source>:<line>:<column>: <what is wrong>" (line and column from 1).
// It checks the syntax and the names (tensors, ranks within the world); whether the plan is
// correct is the verifier's job.
CommPlan parse_plan(std::string_view text, std::string_view source = "plan");

// Throws InvalidArgument when a name cannot be printed (empty, or not [A-Za-z0-9_.-]).
std::string print_plan(const CommPlan& plan);

}  // namespace weft::plan
