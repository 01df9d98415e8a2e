#include "weft/plan/progress.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace weft::plan {

std::string simulate_progress(const ProgressGraph& g, const std::function<std::string(int)>& name,
                              const std::string& pool) {
  const size_t n = g.deps.size();
  const size_t ranks = g.queues.size();
  std::vector<char> done(n, 0);
  std::vector<int> owner(n, -1), pos(n, -1);
  for (size_t r = 0; r < ranks; ++r)
    for (size_t k = 0; k < g.queues[r].size(); ++k) {
      owner[static_cast<size_t>(g.queues[r][k])] = static_cast<int>(r);
      pos[static_cast<size_t>(g.queues[r][k])] = static_cast<int>(k);
    }
  // held[r][w]: the item worker w of rank r holds, -1 when free.
  std::vector<std::vector<int>> held(ranks);
  std::vector<size_t> next(ranks, 0);
  size_t completed = 0;
  auto ready = [&](int i) {
    for (int d : g.deps[static_cast<size_t>(i)])
      if (d < 0 || static_cast<size_t>(d) >= n || !done[static_cast<size_t>(d)]) return false;
    return true;
  };
  for (;;) {
    bool progress = false;
    for (size_t r = 0; r < ranks; ++r) {
      const int w = r < g.workers.size() ? g.workers[r] : 0;
      const auto& q = g.queues[r];
      if (w <= 0) {
        while (next[r] < q.size()) held[r].push_back(q[next[r]++]);
      } else {
        // Workers beyond the queue's length never hold an item: a pool of 10^9 (a user's
        // --workers) costs what one of the queue's length does.
        const size_t slots = std::min(static_cast<size_t>(w), q.size());
        if (held[r].size() < slots) held[r].resize(slots, -1);
        for (auto& h : held[r])
          if (h < 0 && next[r] < q.size()) h = q[next[r]++];
      }
    }
    for (size_t r = 0; r < ranks; ++r)
      for (auto& h : held[r])
        if (h >= 0 && ready(h)) {
          done[static_cast<size_t>(h)] = 1;
          h = -1;
          ++completed;
          progress = true;
        }
    for (size_t r = 0; r < ranks; ++r)
      if (g.workers.size() <= r || g.workers[r] <= 0)
        held[r].erase(std::remove(held[r].begin(), held[r].end(), -1), held[r].end());
    if (completed == n) return "";
    if (!progress) break;
  }

  auto qname = [&](size_t r) { return r < g.names.size() ? g.names[r] : fmt::format("rank {}", r); };
  // Deadlock: describe up to kShown blocked workers.
  constexpr int kShown = 4;
  std::string msg = fmt::format("deadlock with {}:", pool);
  int shown = 0, blocked = 0;
  for (size_t r = 0; r < ranks; ++r)
    for (size_t w = 0; w < held[r].size(); ++w) {
      const int h = held[r][w];
      if (h < 0) continue;
      ++blocked;
      if (shown >= kShown) continue;
      int missing = -1;
      for (int d : g.deps[static_cast<size_t>(h)])
        if (d < 0 || static_cast<size_t>(d) >= n || !done[static_cast<size_t>(d)]) {
          missing = d;
          break;
        }
      std::string why;
      if (missing < 0 || static_cast<size_t>(missing) >= n) {
        why = "which does not exist";
      } else {
        const int mr = owner[static_cast<size_t>(missing)];
        bool is_held = false;
        if (mr >= 0)
          for (int x : held[static_cast<size_t>(mr)]) is_held |= (x == missing);
        if (mr < 0)
          why = "in no queue";
        else if (is_held)
          why = fmt::format("{}, held by a worker that is blocked itself", qname(static_cast<size_t>(mr)));
        else if (mr == static_cast<int>(r) && pos[static_cast<size_t>(missing)] > pos[static_cast<size_t>(h)])
          why = fmt::format("{}, queued behind it, and every worker of {} is blocked", qname(static_cast<size_t>(mr)),
                            qname(static_cast<size_t>(mr)));
        else
          why = fmt::format("{}, not yet taken: every worker of {} is blocked", qname(static_cast<size_t>(mr)),
                            qname(static_cast<size_t>(mr)));
      }
      msg += fmt::format(
          "{} {} worker {} holds {}, waiting for {} ({})", shown ? ";" : "", qname(r), w, name(h),
          missing >= 0 && static_cast<size_t>(missing) < n ? name(missing) : fmt::format("item {}", missing), why);
      ++shown;
    }
  if (blocked > shown) msg += fmt::format("; {} more blocked workers", blocked - shown);
  const size_t untaken = n - completed - static_cast<size_t>(blocked);
  if (untaken) msg += fmt::format("; {} items never taken", untaken);
  return msg;
}

std::vector<int> find_cycle(const std::vector<std::vector<int>>& deps) {
  const size_t n = deps.size();
  // 0: unvisited, 1: on the DFS stack, 2: finished.
  std::vector<char> color(n, 0);
  std::vector<std::pair<int, size_t>> stack;  // (item, next dep to look at)
  for (size_t s = 0; s < n; ++s) {
    if (color[s]) continue;
    stack.push_back({static_cast<int>(s), 0});
    color[s] = 1;
    while (!stack.empty()) {
      auto& [v, k] = stack.back();
      const auto& dv = deps[static_cast<size_t>(v)];
      if (k == dv.size()) {
        color[static_cast<size_t>(v)] = 2;
        stack.pop_back();
        continue;
      }
      const int u = dv[k++];
      if (u < 0 || static_cast<size_t>(u) >= n) continue;
      if (color[static_cast<size_t>(u)] == 1) {
        std::vector<int> cyc;
        size_t i = stack.size();
        while (i > 0 && stack[i - 1].first != u) --i;
        for (size_t j = i - 1; j < stack.size(); ++j) cyc.push_back(stack[j].first);
        cyc.push_back(u);
        return cyc;
      }
      if (color[static_cast<size_t>(u)] == 0) {
        color[static_cast<size_t>(u)] = 1;
        stack.push_back({u, 0});
      }
    }
  }
  return {};
}

}  // namespace weft::plan
