// The host backend's stand-in for a kernel launch: `blocks` teams of `threads` worker
// threads run the same function, each team a Coop with rank/size/sync like a CTA.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>

namespace weft {

// A spinning, abortable barrier for one team: when any worker fails, the others leave
// their barrier with an exception instead of waiting forever.
class HostTeamBarrier {
 public:
  HostTeamBarrier(int n, const std::atomic<bool>* aborted) : n_(n), aborted_(aborted) {}
  void arrive_and_wait();

 private:
  const int n_;
  const std::atomic<bool>* aborted_;
  std::atomic<int> count_{0};
  std::atomic<uint64_t> generation_{0};
};

struct CoopHostTeam {
  int thread;
  int threads;
  HostTeamBarrier* bar;
  int rank() const { return thread; }
  int size() const { return threads; }
  void sync() const {
    if (threads > 1) bar->arrive_and_wait();
  }
};

// Runs fn(team, block) on blocks*threads workers and joins them. Rethrows the first
// exception (a TimeoutError in preference to the aborts it caused in other workers).
void host_launch(int blocks, int threads, const std::function<void(CoopHostTeam, int)>& fn);

}  // namespace weft
