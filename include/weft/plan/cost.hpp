// The cost model: device constants (measured on the device, kept in a JSON file) and an
// event simulation of a lowered plan and schedule that predicts its time.
//
// The model, deliberately small (every term is a constant one can measure):
//  - a remote transfer takes bytes / link_gbps[engine]; transfers that one rank issues on one
//    engine share it, so they run one after another (the constants are whole-GPU bandwidths);
//  - a local copy takes 2 * bytes / hbm_gbps (read and write) on the rank's HBM;
//  - a signal bumped on another rank is seen signal_latency_us later;
//  - a tile of r x c outputs with depth K takes 2*r*c*K / (gemm_tflops / sm_count): one
//    worker is one SM running at its share of the measured GEMM rate;
//  - workers take items in queue order and stay busy while they wait, as in the verifier.
#pragma once
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "weft/plan/plan.hpp"
#include "weft/plan/schedule.hpp"

namespace weft::plan {

struct DeviceConstants {
  std::string device;                  // e.g. "H200 (2x, NV18)"
  double gemm_tflops = 0;              // dense bf16, fp32 accumulate, large GEMM
  double hbm_gbps = 0;                 // HBM bandwidth, GB/s (1e9 bytes/s)
  std::map<Engine, double> link_gbps;  // one-way bandwidth to peers, whole GPU, per engine
  double signal_latency_us = 0;        // one-way flag latency to a peer
  int sm_count = 0;
};

// JSON: {"device": "...", "gemm_tflops": 761, "hbm_gbps": 4800, "sm_count": 132,
//        "signal_latency_us": 1.3, "link_gbps": {"sm": 360, "tma": 360, "copy_engine": 395, ...}}
// Every key is required; link_gbps needs at least one engine. Throws InvalidArgument that
// names the source and the key.
DeviceConstants device_constants_from_json(std::string_view json_text, std::string_view source = "device constants");
DeviceConstants load_device_constants(const std::string& path);
std::string device_constants_to_json(const DeviceConstants& d);

// The 2xH200 (NV18) figures measured on 2026-11-21 (DESIGN.md, Benchmarks): copy engine
// 395 GB/s, SM push 360 GB/s, one-way flag 1.3 us, cuBLAS bf16 761 TFLOP/s. HBM (4800 GB/s)
// and the SM count (132) are the data-sheet values, not measurements.
DeviceConstants h200_constants();

struct SimOptions {
  int64_t gemm_k = 0;    // depth of each tile's GEMM; 0: tiles cost nothing
  int comm_workers = 0;  // per rank; 0: unlimited
  int tile_workers = 0;  // per rank; 0: the device's SM count
};

struct SimEvent {
  int rank = 0;
  bool tile = false;
  int64_t id = 0;       // chunk id, or the tile's position in its rank's order
  double take_us = 0;   // a worker took it (and began waiting)
  double start_us = 0;  // its waits were satisfied and its engine free
  double end_us = 0;
};

struct Prediction {
  double total_us = 0;           // last event's end
  std::vector<double> rank_us;   // per rank: its last event's end
  double comm_us = 0;            // last transfer's end
  double compute_us = 0;         // last tile's end
  std::vector<SimEvent> events;  // every transfer and tile, in simulation order
};

// Throws Error on a deadlock (verify with the same worker counts first) and InvalidArgument
// when a transfer's engine has no bandwidth in `dev`.
Prediction simulate(const CommPlan& plan, const TileSchedule& s, const Lowered& lowered, const DeviceConstants& dev,
                    const SimOptions& opt = {});

}  // namespace weft::plan
