#include "weft/runtime/host_exec.hpp"

#include <sched.h>

#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "weft/core/error.hpp"

namespace weft {

void HostTeamBarrier::arrive_and_wait() {
  const uint64_t gen = generation_.load(std::memory_order_acquire);
  if (count_.fetch_add(1, std::memory_order_acq_rel) == n_ - 1) {
    count_.store(0, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    return;
  }
  uint32_t spins = 0;
  while (generation_.load(std::memory_order_acquire) == gen) {
    if (aborted_ && aborted_->load(std::memory_order_relaxed))
      throw Error("host team aborted: another worker of this launch failed");
    if (++spins > 16) sched_yield();
  }
}

void host_launch(int blocks, int threads, const std::function<void(CoopHostTeam, int)>& fn) {
  WEFT_REQUIRE(blocks >= 1 && threads >= 1, "host_launch needs at least one block of one thread");
  std::atomic<bool> aborted{false};
  std::vector<std::unique_ptr<HostTeamBarrier>> bars;
  for (int b = 0; b < blocks; ++b) bars.push_back(std::make_unique<HostTeamBarrier>(threads, &aborted));
  std::mutex mu;
  std::exception_ptr first, first_timeout;
  auto body = [&](int b, int t) {
    try {
      fn(CoopHostTeam{t, threads, bars[b].get()}, b);
    } catch (const TimeoutError&) {
      std::lock_guard<std::mutex> g(mu);
      if (!first_timeout) first_timeout = std::current_exception();
      aborted = true;
    } catch (...) {
      std::lock_guard<std::mutex> g(mu);
      if (!first) first = std::current_exception();
      aborted = true;
    }
  };
  if (blocks * threads == 1) {
    body(0, 0);
  } else {
    std::vector<std::thread> workers;
    workers.reserve(static_cast<size_t>(blocks) * threads);
    for (int b = 0; b < blocks; ++b)
      for (int t = 0; t < threads; ++t) workers.emplace_back(body, b, t);
    for (auto& w : workers) w.join();
  }
  if (first_timeout) std::rethrow_exception(first_timeout);
  if (first) std::rethrow_exception(first);
}

}  // namespace weft
