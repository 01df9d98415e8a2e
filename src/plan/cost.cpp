#include "weft/plan/cost.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "weft/core/error.hpp"

namespace weft::plan {

namespace {

// CallCosts' keys in JSON, each with its field.
constexpr std::pair<const char*, double CallCosts::*> kCallCostKeys[] = {
    {"gemm_launch_us", &CallCosts::gemm_launch_us},
    {"copy_us", &CallCosts::copy_us},
    {"wait_us", &CallCosts::wait_us},
    {"collective_us", &CallCosts::collective_us},
    {"collective_world_exp", &CallCosts::collective_world_exp},
    {"nccl_all_gather_efficiency", &CallCosts::nccl_all_gather_efficiency},
    {"nccl_reduce_scatter_efficiency", &CallCosts::nccl_reduce_scatter_efficiency},
    {"ag_piece_us", &CallCosts::ag_piece_us},
    {"rs_piece_us", &CallCosts::rs_piece_us},
    {"fused_gemm_efficiency", &CallCosts::fused_gemm_efficiency},
    {"fused_us", &CallCosts::fused_us},
    {"sm_all_reduce_efficiency", &CallCosts::sm_all_reduce_efficiency},
    {"sm_all_reduce_us", &CallCosts::sm_all_reduce_us},
};

double* call_cost_field(CallCosts& c, std::string_view name) {
  for (const auto& [key, field] : kCallCostKeys)
    if (name == key) return &(c.*field);
  return nullptr;
}

std::string call_cost_keys() {
  std::string out;
  for (const auto& [key, field] : kCallCostKeys) out += (out.empty() ? "" : ", ") + std::string(key);
  return out;
}

}  // namespace

DeviceConstants device_constants_from_json(std::string_view text, std::string_view source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(fmt::format("{}: not JSON: {}", source, e.what()));
  }
  if (!j.is_object()) throw InvalidArgument(fmt::format("{}: expected a JSON object", source));
  // A required number: > 0, or >= 0 where zero makes sense (a latency a device may not have).
  auto read = [&](const char* key, bool zero_ok) {
    if (!j.contains(key)) throw InvalidArgument(fmt::format("{}: missing key '{}'", source, key));
    if (!j[key].is_number()) throw InvalidArgument(fmt::format("{}: '{}' is not a number", source, key));
    const double v = j[key].get<double>();
    if (!(zero_ok ? v >= 0 : v > 0))
      throw InvalidArgument(fmt::format("{}: '{}' is {} (need {} 0)", source, key, v, zero_ok ? ">=" : ">"));
    return v;
  };
  auto number = [&](const char* key) { return read(key, false); };
  auto non_negative = [&](const char* key) { return read(key, true); };
  DeviceConstants d;
  if (!j.contains("device") || !j["device"].is_string())
    throw InvalidArgument(fmt::format("{}: missing key 'device' (a string)", source));
  d.device = j["device"].get<std::string>();
  d.gemm_tflops = number("gemm_tflops");
  d.hbm_gbps = number("hbm_gbps");
  d.signal_latency_us = number("signal_latency_us");
  const double sms = number("sm_count");
  if (sms != static_cast<int>(sms)) throw InvalidArgument(fmt::format("{}: 'sm_count' is not an integer", source));
  d.sm_count = static_cast<int>(sms);
  d.launch_us = non_negative("launch_us");
  d.write_ack_us = non_negative("write_ack_us");
  d.cta_link_gbps = number("cta_link_gbps");
  d.cta_copy_gbps = number("cta_copy_gbps");
  d.cta_reduce_gbps = number("cta_reduce_gbps");
  if (j.contains("call_costs")) {
    const auto& c = j["call_costs"];
    if (!c.is_object()) throw InvalidArgument(fmt::format("{}: 'call_costs' is not an object", source));
    for (const auto& [name, v] : c.items()) {
      double* field = call_cost_field(d.calls, name);
      if (!field)
        throw InvalidArgument(fmt::format("{}: call_costs.{}: unknown key ({})", source, name, call_cost_keys()));
      // An efficiency divides a rate: > 0; a fixed cost or an exponent may be 0.
      const bool positive = name.ends_with("_efficiency");
      if (!v.is_number() || !(positive ? v.get<double>() > 0 : v.get<double>() >= 0))
        throw InvalidArgument(
            fmt::format("{}: call_costs.{} must be a number {} 0", source, name, positive ? ">" : ">="));
      *field = v.get<double>();
    }
  }
  if (!j.contains("link_gbps") || !j["link_gbps"].is_object() || j["link_gbps"].empty())
    throw InvalidArgument(fmt::format("{}: missing key 'link_gbps' (an object: engine -> GB/s)", source));
  for (const auto& [name, v] : j["link_gbps"].items()) {
    bool known = false;
    for (Engine e : {Engine::kSm, Engine::kTma, Engine::kCopyEngine, Engine::kNccl, Engine::kNet})
      if (name == to_string(e)) {
        if (!v.is_number() || !(v.get<double>() > 0))
          throw InvalidArgument(fmt::format("{}: link_gbps.{} must be a positive number", source, name));
        d.link_gbps[e] = v.get<double>();
        known = true;
      }
    if (!known)
      throw InvalidArgument(
          fmt::format("{}: link_gbps.{}: unknown engine (sm, tma, copy_engine, nccl, net)", source, name));
  }
  return d;
}

DeviceConstants load_device_constants(const std::string& path) {
  // A small JSON file: a device, FIFO or directory, or one over 64 MiB, is refused by name
  // rather than read without end.
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::exists(st)) {
    WEFT_REQUIRE(std::filesystem::is_regular_file(st),
                 fmt::format("device constants file {} is not a regular file", path));
    WEFT_REQUIRE(std::filesystem::file_size(path, ec) <= (64ull << 20) && !ec,
                 fmt::format("device constants file {} is larger than 64 MiB", path));
  }
  std::ifstream f(path);
  if (!f) throw InvalidArgument(fmt::format("cannot open device constants file {}", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return device_constants_from_json(ss.str(), path);
}

std::string device_constants_to_json(const DeviceConstants& d) {
  nlohmann::json j;
  j["device"] = d.device;
  j["gemm_tflops"] = d.gemm_tflops;
  j["hbm_gbps"] = d.hbm_gbps;
  j["signal_latency_us"] = d.signal_latency_us;
  j["sm_count"] = d.sm_count;
  j["launch_us"] = d.launch_us;
  j["write_ack_us"] = d.write_ack_us;
  j["cta_link_gbps"] = d.cta_link_gbps;
  j["cta_copy_gbps"] = d.cta_copy_gbps;
  j["cta_reduce_gbps"] = d.cta_reduce_gbps;
  nlohmann::json links = nlohmann::json::object();
  for (const auto& [e, v] : d.link_gbps) links[std::string(to_string(e))] = v;
  j["link_gbps"] = links;
  nlohmann::json calls = nlohmann::json::object();
  for (const auto& [key, field] : kCallCostKeys) calls[key] = d.calls.*field;
  j["call_costs"] = calls;
  return j.dump(2);
}

DeviceConstants h200_constants() {
  // bench/constants/h200x2.json, the source of record (it says where each value comes from);
  // tests/unit/plan_cost_test.cpp checks that the two agree.
  DeviceConstants d;
  d.device = "H200 (2x, NV18), measured 2026-11-21";
  d.gemm_tflops = 761;
  d.hbm_gbps = 4300;
  d.sm_count = 132;
  d.signal_latency_us = 1.25;
  d.link_gbps = {{Engine::kSm, 362.8},       {Engine::kTma, 362.8}, {Engine::kCopyEngine, 395},
                 {Engine::kNccl, 262},       {Engine::kNet, 50}};
  d.launch_us = 1.35;
  d.write_ack_us = 2.5;
  d.cta_link_gbps = 21.5;
  d.cta_copy_gbps = 43.0;
  d.cta_reduce_gbps = 40.73;
  return d;
}

// ---- the formulas ---------------------------------------------------------------------

namespace {
// A whole-GPU rate in bytes/us; SM-engine work on `ctas` > 0 CTAs runs at most ctas times the
// per-CTA rate. Other engines (copy engine, NCCL, network) do not run on the op's CTAs.
double rate(double whole_gbps, double per_cta_gbps, Engine e, int ctas) {
  WEFT_REQUIRE(ctas >= 0, fmt::format("cost model: {} CTAs", ctas));
  const bool on_ctas = ctas > 0 && per_cta_gbps > 0 && e == Engine::kSm;
  return (on_ctas ? std::min(whole_gbps, ctas * per_cta_gbps) : whole_gbps) * 1e3;
}
}  // namespace

double link_gbps(const DeviceConstants& d, Engine e) {
  const auto bw = d.link_gbps.find(e);
  WEFT_REQUIRE(bw != d.link_gbps.end(),
               fmt::format("cost model: device '{}' has no bandwidth for engine {}", d.device, to_string(e)));
  return bw->second;
}

double transfer_us(const DeviceConstants& d, Engine e, double bytes, int ctas) {
  return bytes / rate(link_gbps(d, e), d.cta_link_gbps, e, ctas);
}

double local_copy_us(const DeviceConstants& d, Engine e, double bytes, int ctas) {
  return 2 * bytes / rate(d.hbm_gbps, d.cta_copy_gbps, e, ctas);
}

double local_reduce_us(const DeviceConstants& d, Engine e, double bytes, int ctas) {
  return 3 * bytes / rate(d.hbm_gbps, d.cta_reduce_gbps, e, ctas);
}

double reduce_rmw_us(const DeviceConstants& d, Engine e, double bytes, int ctas) {
  return 2 * bytes / rate(d.hbm_gbps, d.cta_reduce_gbps, e, ctas);
}

double hbm_us(const DeviceConstants& d, double bytes) { return bytes / (d.hbm_gbps * 1e3); }

double tile_us(const DeviceConstants& d, double rows, double cols, double k) {
  // FLOP / (FLOP/us of one SM).
  return 2 * rows * cols * k / (d.gemm_tflops * 1e6 / d.sm_count);
}

double gemm_us(const DeviceConstants& d, double rows, double cols, double k, double out_elem_bytes) {
  return 2 * rows * cols * k / (d.gemm_tflops * 1e6) + hbm_us(d, rows * cols * out_elem_bytes) + d.calls.gemm_launch_us;
}

double copy_call_us(const DeviceConstants& d, double bytes) {
  return transfer_us(d, Engine::kCopyEngine, bytes) + d.calls.copy_us;
}

double collective_us(const DeviceConstants& d, Collective c, int world, double bytes) {
  if (world < 2) return 0;
  const double w = world, f = (w - 1) / w;
  const double bus = (c == Collective::kAllReduce ? 2 : 1) * f * bytes;
  const double grow = std::pow(2 * f, d.calls.collective_world_exp);
  const double eff = c == Collective::kAllGather       ? d.calls.nccl_all_gather_efficiency
                     : c == Collective::kReduceScatter ? d.calls.nccl_reduce_scatter_efficiency
                                                       : 1.0;
  return bus / (link_gbps(d, Engine::kNccl) * grow * eff * 1e3) + d.calls.collective_us;
}

double sm_all_reduce_us(const DeviceConstants& d, int world, double bytes) {
  if (world < 2) return 0;
  const double f = (world - 1.0) / world;
  return 2 * f * bytes / (link_gbps(d, Engine::kCopyEngine) * d.calls.sm_all_reduce_efficiency * 1e3) +
         d.calls.sm_all_reduce_us;
}

// ---- the event simulation ---------------------------------------------------------------

namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

struct Item {
  int rank;
  bool tile;
  int index;                                   // into the rank's transfers or tiles
  std::vector<std::pair<int, int64_t>> waits;  // (lowered signal on `rank`, threshold)
  double dur_us;
  int resource;  // engine queue it occupies, -1: none (tiles run on their own worker)
  int signal_rank = -1, signal = -1;
  int64_t increment = 0;
  bool writes_remote = false;  // its destination is on another rank: a signal after it waits for the acks
  double take = kNever, start = kNever, end = kNever;
};

struct Pool {
  std::vector<int> queue;  // items in take order
  size_t next = 0;
  int workers = 0;  // 0: unlimited
  int busy = 0;
  double last_take = 0;
};

}  // namespace

Prediction simulate(const CommPlan& plan, const TileSchedule& s, const Lowered& L, const DeviceConstants& dev,
                    const SimOptions& opt) {
  WEFT_REQUIRE(
      L.world == plan.world && L.ranks.size() == static_cast<size_t>(plan.world),
      fmt::format("simulate: lowered tables for {} ranks, plan {} for {}", L.ranks.size(), plan.name, plan.world));
  WEFT_REQUIRE(dev.gemm_tflops > 0 && dev.hbm_gbps > 0 && dev.sm_count > 0,
               fmt::format("simulate: device constants of '{}' are incomplete", dev.device));
  WEFT_REQUIRE(opt.ctas >= 0, fmt::format("simulate: {} CTAs", opt.ctas));
  const int W = plan.world;
  constexpr int kEngines = 5;
  // Resource ids: rank * (kEngines + 1) + engine; the last slot of each rank is its HBM.
  auto resource_of = [&](int rank, int engine) { return rank * (kEngines + 1) + engine; };
  // Everything starts after the launch (and, with an entry barrier, after the peers' entry flags).
  const double t0 = dev.launch_us + (opt.entry_barrier ? dev.signal_latency_us : 0.0);
  std::vector<double> resource_free(static_cast<size_t>(W) * (kEngines + 1), t0);

  std::vector<Item> items;
  std::vector<Pool> pools(2 * static_cast<size_t>(W));  // [0, W): transfers; [W, 2W): tiles
  for (int r = 0; r < W; ++r) {
    const LoweredRank& lr = L.ranks[static_cast<size_t>(r)];
    Pool& comm = pools[static_cast<size_t>(r)];
    comm.workers = opt.comm_workers;
    for (size_t k = 0; k < lr.transfers.size(); ++k) {
      const TransferDesc& d = lr.transfers[k];
      WEFT_REQUIRE(d.src_tensor >= 0 && static_cast<size_t>(d.src_tensor) < plan.tensors.size(),
                   fmt::format("simulate: chunk {} reads tensor {}", d.chunk, d.src_tensor));
      const double bytes = static_cast<double>(d.rows) * static_cast<double>(d.cols) *
                           plan.tensors[static_cast<size_t>(d.src_tensor)].elem_bytes;
      const bool reduce = d.kind == static_cast<int32_t>(Kind::kReduce);
      const auto engine = static_cast<Engine>(d.engine);
      Item it{r, false, static_cast<int>(k), {}, 0, 0};
      if (d.src_rank == d.dst_rank) {
        it.dur_us = reduce ? local_reduce_us(dev, engine, bytes, opt.ctas) : local_copy_us(dev, engine, bytes, opt.ctas);
        it.resource = resource_of(r, kEngines);
      } else {
        WEFT_REQUIRE(dev.link_gbps.count(engine),
                     fmt::format("simulate: chunk {} uses engine {}, which device '{}' has no bandwidth for", d.chunk,
                                 to_string(engine), dev.device));
        it.dur_us = transfer_us(dev, engine, bytes, opt.ctas);
        // A remote reduce also reads and writes its destination; both stream at once.
        if (reduce) it.dur_us = std::max(it.dur_us, reduce_rmw_us(dev, engine, bytes, opt.ctas));
        it.resource = resource_of(r, d.engine);
        it.writes_remote = d.dst_rank != r;
      }
      for (int j = 0; j < d.wait_count; ++j) {
        const WaitEntry& w = lr.transfer_waits[static_cast<size_t>(d.wait_begin + j)];
        it.waits.emplace_back(w.signal, w.threshold);
      }
      it.signal_rank = d.signal_rank;
      it.signal = d.signal;
      it.increment = d.increment;
      comm.queue.push_back(static_cast<int>(items.size()));
      items.push_back(std::move(it));
    }
    Pool& tiles = pools[static_cast<size_t>(W + r)];
    tiles.workers = opt.tile_workers > 0 ? opt.tile_workers : dev.sm_count;
    for (size_t k = 0; k < lr.tiles.size(); ++k) {
      const TileEntry& e = lr.tiles[k];
      const auto [r0, r1] = s.block_rows(e.m);
      const double rows = static_cast<double>(r1 - r0);
      const double cols = static_cast<double>(std::min(s.tile_cols, s.cols - int64_t{e.n} * s.tile_cols));
      Item it{r, true, static_cast<int>(k), {}, tile_us(dev, rows, cols, static_cast<double>(opt.gemm_k)), -1};
      for (int j = 0; j < e.wait_count; ++j) {
        const WaitEntry& w = lr.tile_waits[static_cast<size_t>(e.wait_begin + j)];
        it.waits.emplace_back(w.signal, w.threshold);
      }
      tiles.queue.push_back(static_cast<int>(items.size()));
      items.push_back(std::move(it));
    }
  }

  // Bumpers of each (rank, lowered signal), and how many have not been simulated yet.
  std::map<std::pair<int, int>, std::vector<int>> bumpers;
  for (size_t i = 0; i < items.size(); ++i)
    if (!items[i].tile && items[i].signal_rank >= 0)
      bumpers[{items[i].signal_rank, items[i].signal}].push_back(static_cast<int>(i));
  // When a wait (signal on `rank` reaching `threshold`) is satisfied; kNever while unknown.
  auto satisfied_at = [&](int rank, int sig, int64_t threshold) {
    if (threshold <= 0) return 0.0;
    std::vector<std::pair<double, int64_t>> arrivals;
    for (int b : bumpers[{rank, sig}]) {
      const Item& x = items[static_cast<size_t>(b)];
      if (x.end == kNever) return kNever;
      arrivals.emplace_back(
          x.end + (x.writes_remote ? dev.write_ack_us : 0.0) + (x.signal_rank != x.rank ? dev.signal_latency_us : 0.0),
          x.increment);
    }
    std::sort(arrivals.begin(), arrivals.end());
    int64_t sum = 0;
    for (const auto& [t, inc] : arrivals)
      if ((sum += inc) >= threshold) return t;
    return kNever;  // never reached: the verifier's threshold check rejects this
  };

  std::vector<int> held;  // items taken and not yet started
  auto take = [&](Pool& p, double now) {
    while (p.next < p.queue.size() && (p.workers == 0 || p.busy < p.workers)) {
      Item& it = items[static_cast<size_t>(p.queue[p.next++])];
      p.last_take = std::max(p.last_take, now);
      it.take = p.last_take;
      ++p.busy;
      held.push_back(static_cast<int>(&it - items.data()));
    }
  };
  for (auto& p : pools) take(p, t0);

  Prediction out;
  out.rank_us.assign(static_cast<size_t>(W), 0.0);
  size_t done = 0;
  while (done < items.size()) {
    // Start the held item that can start first; its waits must be known.
    int best = -1;
    double best_start = kNever;
    for (int h : held) {
      const Item& it = items[static_cast<size_t>(h)];
      double ready = it.take;
      for (const auto& [sig, thr] : it.waits) ready = std::max(ready, satisfied_at(it.rank, sig, thr));
      if (ready == kNever) continue;
      if (it.resource >= 0) ready = std::max(ready, resource_free[static_cast<size_t>(it.resource)]);
      if (ready < best_start) {
        best_start = ready;
        best = h;
      }
    }
    if (best < 0)
      throw Error(
          fmt::format("simulate: plan {} deadlocks with {} transfer and {} tile workers per rank (verify it "
                      "with these worker counts)",
                      plan.name, opt.comm_workers, opt.tile_workers));
    Item& it = items[static_cast<size_t>(best)];
    it.start = best_start;
    it.end = best_start + it.dur_us;
    if (it.resource >= 0) resource_free[static_cast<size_t>(it.resource)] = it.end;
    held.erase(std::find(held.begin(), held.end(), best));
    ++done;
    SimEvent ev;
    ev.rank = it.rank;
    ev.tile = it.tile;
    ev.id = it.tile ? it.index : L.ranks[static_cast<size_t>(it.rank)].transfers[static_cast<size_t>(it.index)].chunk;
    ev.take_us = it.take;
    ev.start_us = it.start;
    ev.end_us = it.end;
    out.events.push_back(ev);
    out.total_us = std::max(out.total_us, it.end);
    out.rank_us[static_cast<size_t>(it.rank)] = std::max(out.rank_us[static_cast<size_t>(it.rank)], it.end);
    (it.tile ? out.compute_us : out.comm_us) = std::max(it.tile ? out.compute_us : out.comm_us, it.end);
    // Its worker is free when it ends and takes the next item of its queue then.
    Pool& p = pools[static_cast<size_t>(it.tile ? W + it.rank : it.rank)];
    --p.busy;
    take(p, it.end);
  }
  return out;
}

}  // namespace weft::plan
