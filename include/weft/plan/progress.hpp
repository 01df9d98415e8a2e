// Persistent-worker progress simulation, shared by the plan verifier and the tile-schedule
// verifier. A rank owns `workers` resident workers; they take that rank's items strictly in
// queue order and hold an item until every item it depends on has completed (a spinning
// wait occupies its worker). If no held item can complete and no worker is free, the ranks
// are deadlocked: a real kernel would hang there (and time out on the GPU).
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace weft::plan {

struct ProgressGraph {
  // queues[r]: item ids rank r's workers take, in order. Every item is in exactly one queue.
  std::vector<std::vector<int>> queues;
  // deps[i]: items that must complete before item i can (indices into the same id space).
  std::vector<std::vector<int>> deps;
  // workers[r]: resident workers on rank r; 0: unlimited.
  std::vector<int> workers;
  // names[r]: how messages name queue r's workers ("rank 0", "rank 0 tiles"); empty: "rank r".
  std::vector<std::string> names;
};

// Empty when every item completes; otherwise a message that starts "deadlock with ..." and
// names, for blocked workers, the item each holds and the item it waits for. `name(i)` names
// an item ("chunk 4", "tile (2,3)"); `pool` names the workers ("1 worker per rank").
std::string simulate_progress(const ProgressGraph& g, const std::function<std::string(int)>& name,
                              const std::string& pool);

// Finds a cycle in deps (i -> j: i waits for j). Returns the items of one cycle, first item
// repeated at the end (a -> b -> a), or an empty vector when the graph is acyclic.
std::vector<int> find_cycle(const std::vector<std::vector<int>>& deps);

}  // namespace weft::plan
