#include "weft/ops/trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "weft/core/error.hpp"

namespace weft::ops {
namespace {

nlohmann::json event_to_json(const TraceEvent& e) {
  return {{"r", e.rank},       {"k", e.kind == TraceKind::kTile ? 0 : 1},
          {"i", e.id},         {"l", e.lane},
          {"ln", e.lane_name}, {"n", e.name},
          {"s", e.start_ns},   {"e", e.end_ns}};
}

TraceEvent event_from_json(const nlohmann::json& j) {
  TraceEvent e;
  e.rank = j.at("r").get<int>();
  e.kind = j.at("k").get<int>() == 0 ? TraceKind::kTile : TraceKind::kChunk;
  e.id = j.at("i").get<int64_t>();
  e.lane = j.at("l").get<int>();
  e.lane_name = j.at("ln").get<std::string>();
  e.name = j.at("n").get<std::string>();
  e.start_ns = j.at("s").get<int64_t>();
  e.end_ns = j.at("e").get<int64_t>();
  return e;
}

// JSON text given by a caller: InvalidArgument (naming `what`) when it does not parse.
nlohmann::json parse_json(std::string_view text, const char* what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(fmt::format("{} is not JSON: {}", what, e.what()));
  }
}

using Intervals = std::vector<std::pair<double, double>>;

Intervals merged(Intervals v) {
  std::sort(v.begin(), v.end());
  Intervals out;
  for (const auto& [a, b] : v) {
    if (b <= a) continue;
    if (!out.empty() && a <= out.back().second)
      out.back().second = std::max(out.back().second, b);
    else
      out.emplace_back(a, b);
  }
  return out;
}

double length(const Intervals& v) {
  double s = 0;
  for (const auto& [a, b] : v) s += b - a;
  return s;
}

// Both merged (sorted, disjoint).
double intersection(const Intervals& x, const Intervals& y) {
  double s = 0;
  size_t i = 0, j = 0;
  while (i < x.size() && j < y.size()) {
    const double a = std::max(x[i].first, y[j].first), b = std::min(x[i].second, y[j].second);
    if (b > a) s += b - a;
    if (x[i].second < y[j].second)
      ++i;
    else
      ++j;
  }
  return s;
}

}  // namespace

std::vector<TraceEvent> gather_trace(Backend& b, const std::vector<TraceEvent>& mine) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& e : mine) arr.push_back(event_to_json(e));
  const std::string text = arr.dump();
  const uint64_t len = text.size();
  std::vector<uint64_t> lens(static_cast<size_t>(b.size()));
  b.bootstrap().allgather(&len, sizeof len, lens.data());
  const uint64_t max_len = *std::max_element(lens.begin(), lens.end());
  std::string padded = text;
  padded.resize(max_len, ' ');
  std::string all(max_len * static_cast<uint64_t>(b.size()), ' ');
  b.bootstrap().allgather(padded.data(), max_len, all.data());
  std::vector<TraceEvent> out;
  for (int r = 0; r < b.size(); ++r) {
    const auto j = nlohmann::json::parse(all.substr(max_len * static_cast<uint64_t>(r), lens[static_cast<size_t>(r)]));
    for (const auto& e : j) out.push_back(event_from_json(e));
  }
  return out;
}

std::string to_chrome_trace(const std::vector<TraceEvent>& events, std::string_view meta_json) {
  nlohmann::json ev = nlohmann::json::array();
  int64_t t0 = INT64_MAX;
  for (const auto& e : events) t0 = std::min(t0, e.start_ns);
  std::set<int> ranks;
  std::map<std::pair<int, int>, std::string> lanes;
  for (const auto& e : events) {
    ranks.insert(e.rank);
    lanes.emplace(std::make_pair(e.rank, e.lane), e.lane_name);
  }
  for (int r : ranks)
    ev.push_back({{"ph", "M"},
                  {"name", "process_name"},
                  {"pid", r},
                  {"tid", 0},
                  {"args", {{"name", fmt::format("rank {}", r)}}}});
  for (const auto& [k, name] : lanes) {
    ev.push_back(
        {{"ph", "M"}, {"name", "thread_name"}, {"pid", k.first}, {"tid", k.second}, {"args", {{"name", name}}}});
    ev.push_back({{"ph", "M"},
                  {"name", "thread_sort_index"},
                  {"pid", k.first},
                  {"tid", k.second},
                  {"args", {{"sort_index", k.second}}}});
  }
  for (const auto& e : events)
    ev.push_back(
        {{"ph", "X"},
         {"name", e.name.empty() ? fmt::format("{} {}", e.kind == TraceKind::kTile ? "tile" : "chunk", e.id) : e.name},
         {"cat", e.kind == TraceKind::kTile ? "compute" : "comm"},
         {"pid", e.rank},
         {"tid", e.lane},
         {"ts", static_cast<double>(e.start_ns - t0) / 1e3},
         {"dur", static_cast<double>(e.end_ns - e.start_ns) / 1e3},
         {"args", {{"rank", e.rank}, {"id", e.id}}}});
  nlohmann::json j{{"traceEvents", ev}, {"displayTimeUnit", "ns"}};
  if (!meta_json.empty()) j["weft"] = parse_json(meta_json, "trace metadata");
  return j.dump();
}

void write_chrome_trace(const std::string& path, const std::vector<TraceEvent>& events, std::string_view meta_json) {
  const std::string text = to_chrome_trace(events, meta_json);
  std::ofstream f(path);
  WEFT_REQUIRE(f.good(), fmt::format("cannot write trace '{}'", path));
  f << text << "\n";
}

std::vector<RankTraceSummary> summarize_trace(std::string_view chrome_json) {
  const nlohmann::json chrome = parse_json(chrome_json, "trace");
  WEFT_REQUIRE(chrome.is_object() && chrome.contains("traceEvents") && chrome["traceEvents"].is_array(),
               "not a Chrome trace: no \"traceEvents\" array");
  struct Acc {
    Intervals comm, compute;
    double first = 1e300, last = -1e300;
    int chunks = 0, tiles = 0;
  };
  std::map<int, Acc> by_rank;
  for (const auto& e : chrome["traceEvents"]) {
    if (!e.is_object() || e.value("ph", "") != "X") continue;
    WEFT_REQUIRE(e.contains("pid") && e.contains("ts") && e.contains("dur"),
                 "a trace event of phase X lacks pid, ts or dur");
    const int pid = e["pid"].get<int>();
    const double ts = e["ts"].get<double>(), dur = e["dur"].get<double>();
    bool compute;
    if (e.contains("cat"))
      compute = e["cat"].get<std::string>() == "compute";
    else
      compute = e.value("tid", 0) == 1;  // `weft plan --trace`: tid 0 chunks, tid 1 tiles
    Acc& a = by_rank[pid];
    (compute ? a.compute : a.comm).emplace_back(ts, ts + dur);
    (compute ? a.tiles : a.chunks) += 1;
    a.first = std::min(a.first, ts);
    a.last = std::max(a.last, ts + dur);
  }
  std::vector<RankTraceSummary> out;
  for (auto& [r, a] : by_rank) {
    RankTraceSummary s;
    s.rank = r;
    s.span_us = a.last - a.first;
    const Intervals cm = merged(a.comm), cp = merged(a.compute);
    s.comm_us = length(cm);
    s.compute_us = length(cp);
    s.overlap_us = intersection(cm, cp);
    s.hidden = s.comm_us > 0 ? s.overlap_us / s.comm_us : 0;
    s.chunks = a.chunks;
    s.tiles = a.tiles;
    out.push_back(s);
  }
  return out;
}

std::string format_trace_summary(const std::vector<RankTraceSummary>& s) {
  std::string out = fmt::format("{:>5} {:>12} {:>12} {:>12} {:>12} {:>8} {:>8} {:>8}\n", "rank", "span us", "comm us",
                                "compute us", "overlap us", "hidden", "chunks", "tiles");
  double comm = 0, overlap = 0;
  for (const auto& r : s) {
    out += fmt::format("{:>5} {:>12.1f} {:>12.1f} {:>12.1f} {:>12.1f} {:>7.1f}% {:>8} {:>8}\n", r.rank, r.span_us,
                       r.comm_us, r.compute_us, r.overlap_us, 100 * r.hidden, r.chunks, r.tiles);
    comm += r.comm_us;
    overlap += r.overlap_us;
  }
  out += fmt::format(
      "communication hidden behind computation: {:.1f}% (all ranks: overlap / communication time; "
      "communication = union of chunk intervals, computation = union of tile intervals)\n",
      comm > 0 ? 100 * overlap / comm : 0.0);
  return out;
}

}  // namespace weft::ops
