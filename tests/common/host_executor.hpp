// Runs the device-API scenarios on the host backend: a "thread" is one worker, a "warp"
// a team of 3 workers, a "block" a team of 4 (odd sizes catch stride bugs).
#pragma once
#include "devapi_driver.hpp"
#include "weft/runtime/host_exec.hpp"

namespace weft::testing {

class HostExecutor final : public Executor {
 public:
  explicit HostExecutor(Backend& b) : b_(b) {}
  void put_signal(Gran g, const PutArgs& a) override {
    launch(g, [&](auto coop) { scenario_put_signal(coop, b_.ctx(), a); });
  }
  void get(Gran g, const GetArgs& a) override {
    launch(g, [&](auto coop) { scenario_get(coop, b_.ctx(), a); });
  }
  void barrier_rounds(Gran g, const BarrierArgs& a) override {
    launch(g, [&](auto coop) { scenario_barrier(coop, b_.ctx(), a); });
  }
  void barrier_once(Gran g, const dev::BarrierHandle& bar) override {
    launch(g, [&](auto coop) { scenario_barrier_once(coop, b_.ctx(), bar); });
  }

 private:
  template <class F>
  void launch(Gran g, F&& f) {
    if (g == Gran::kThread) {
      host_launch(1, 1, [&](CoopHostTeam, int) { f(dev::CoopThread{}); });
    } else {
      host_launch(1, g == Gran::kWarp ? 3 : 4, [&](CoopHostTeam t, int) { f(t); });
    }
    b_.synchronize();
  }
  Backend& b_;
};

}  // namespace weft::testing
