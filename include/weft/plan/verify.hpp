// The plan verifier. It proves, for one epoch of a plan, that
//  1. the plan is well formed (ranks, tensors, regions in bounds, shapes that match, the
//     executing rank is an end of each transfer, ids unique, deps that exist);
//  2. every signal's declared total equals the notifies that reach it, and every dependency
//     is something the dependent can wait on (a signal on its own rank, whose whole total it
//     waits for: a transfer's effective deps are all chunks that bump the signals it waits on);
//  3. the cross-rank dependency graph is acyclic;
//  4. the plan makes progress with the given number of resident persistent workers per rank:
//     workers take transfers in queue order and hold them while they wait;
//  5. data flow: every valid element of an output tensor is overwritten exactly once; reads
//     and adds see defined data; every element of a `sum` output holds every rank's
//     contribution exactly once (any other output: exactly one contribution); and any two
//     accesses to one element, one of them a write or an add, are ordered by dependencies.
// Element checks run on the coarsest grid of cells that every region respects, so their cost
// depends on the number of chunks, not on tensor sizes.
//
// Messages name the chunk, rank (and tile) at fault and say what is wrong, e.g.
//   "missing chunk: rank 1 tensor 'out' rows [4,8) cols [0,16) is never written"
//   "element written twice: rank 1 tensor 'out' rows [4,8) cols [0,16) by chunk 3 and chunk 9"
//   "cycle through chunks 3 -> 5 -> 3 (ranks 0 -> 1 -> 0; each waits for the next)"
//   "threshold 3 but 2 notifies reach signal 4 on rank 1 (from chunks 2, 6)"
//   "deadlock with 1 worker per rank: rank 0 worker 0 holds chunk 4, waiting for chunk 6 ..."
#pragma once
#include <string>
#include <vector>

#include "weft/plan/plan.hpp"

namespace weft::plan {

struct VerifyOptions {
  // Resident persistent workers per rank that execute transfers; 0: unlimited.
  int workers_per_rank = 0;
  // Stop collecting after this many messages (a broken plan can produce thousands).
  size_t max_messages = 32;
};

struct VerifyResult {
  bool ok = true;
  std::vector<std::string> messages;
  // Checks that were skipped (plans too large for the element checks); not failures.
  std::vector<std::string> notes;
  // All messages, one per line.
  std::string text() const;
};

// Never throws for any plan, however malformed; problems become messages.
VerifyResult verify(const CommPlan& plan, const VerifyOptions& opt = {});
// Throws InvalidArgument whose text starts "plan <name> is invalid:" and lists the messages.
void verify_or_throw(const CommPlan& plan, const VerifyOptions& opt = {});

}  // namespace weft::plan
