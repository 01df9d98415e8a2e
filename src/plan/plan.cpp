#include "weft/plan/plan.hpp"

#include <fmt/format.h>

#include <map>

#include "weft/core/error.hpp"

namespace weft::plan {

std::string_view to_string(Kind k) {
  switch (k) {
    case Kind::kPush:
      return "push";
    case Kind::kPull:
      return "pull";
    case Kind::kReduce:
      return "reduce";
    case Kind::kCopy:
      return "copy";
  }
  return "?";
}

std::string_view to_string(Engine e) {
  switch (e) {
    case Engine::kSm:
      return "sm";
    case Engine::kTma:
      return "tma";
    case Engine::kCopyEngine:
      return "copy_engine";
    case Engine::kNccl:
      return "nccl";
    case Engine::kNet:
      return "net";
  }
  return "?";
}

std::string_view to_string(Role r) {
  switch (r) {
    case Role::kInput:
      return "input";
    case Role::kOutput:
      return "output";
    case Role::kScratch:
      return "scratch";
  }
  return "?";
}

int CommPlan::tensor_id(std::string_view n) const {
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].name == n) return static_cast<int>(i);
  return -1;
}

size_t CommPlan::num_transfers() const {
  size_t n = 0;
  for (const auto& q : queues) n += q.size();
  return n;
}

const Transfer* CommPlan::find(int64_t chunk, int* rank) const {
  for (size_t r = 0; r < queues.size(); ++r)
    for (const auto& t : queues[r])
      if (t.chunk == chunk) {
        if (rank) *rank = static_cast<int>(r);
        return &t;
      }
  return nullptr;
}

const Signal* CommPlan::find_signal(int rank, int index) const {
  for (const auto& s : signals)
    if (s.rank == rank && s.index == index) return &s;
  return nullptr;
}

std::vector<std::pair<int64_t, int64_t>> split_range(int64_t begin, int64_t end, int parts) {
  WEFT_REQUIRE(parts >= 1, fmt::format("split into {} parts: need at least 1", parts));
  std::vector<std::pair<int64_t, int64_t>> out;
  const int64_t n = end - begin;
  if (n <= 0) return out;
  const int64_t step = (n + parts - 1) / parts;
  for (int64_t b = begin; b < end; b += step) out.emplace_back(b, std::min(end, b + step));
  return out;
}

PlanBuilder::PlanBuilder(std::string name, int world) {
  WEFT_REQUIRE(world >= 1, fmt::format("plan {}: world size {} (need >= 1)", name, world));
  plan_.name = std::move(name);
  plan_.world = world;
  plan_.queues.resize(static_cast<size_t>(world));
  next_signal_.assign(static_cast<size_t>(world), 0);
}

int PlanBuilder::add_tensor(Tensor t) {
  plan_.tensors.push_back(std::move(t));
  return static_cast<int>(plan_.tensors.size() - 1);
}

SignalRef PlanBuilder::new_signal(int rank) {
  WEFT_CHECK(rank >= 0 && rank < plan_.world, fmt::format("signal on rank {} of {}", rank, plan_.world));
  SignalRef s{rank, next_signal_[static_cast<size_t>(rank)]++};
  plan_.signals.push_back(Signal{s.rank, s.index, 0});
  return s;
}

int64_t PlanBuilder::add(int exec_rank, Transfer t) {
  WEFT_CHECK(exec_rank >= 0 && exec_rank < plan_.world, fmt::format("transfer on rank {}", exec_rank));
  t.chunk = next_chunk_++;
  plan_.queues[static_cast<size_t>(exec_rank)].push_back(std::move(t));
  return plan_.queues[static_cast<size_t>(exec_rank)].back().chunk;
}

CommPlan PlanBuilder::finish() {
  recount_signals(plan_);
  return std::move(plan_);
}

void recount_signals(CommPlan& plan) {
  std::map<std::pair<int, int>, int64_t> total;
  for (const auto& s : plan.signals) total[{s.rank, s.index}] = 0;
  for (const auto& q : plan.queues)
    for (const auto& t : q)
      if (t.signal.rank >= 0) total[{t.signal.rank, t.signal.index}] += t.increment;
  plan.signals.clear();
  for (const auto& [key, n] : total) plan.signals.push_back(Signal{key.first, key.second, n});
}

}  // namespace weft::plan
