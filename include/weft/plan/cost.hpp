// The cost model, the project's only one: device constants (measured on the device, kept in a
// JSON file), the formulas that turn them into times, and an event simulation of a lowered plan
// and schedule built on those formulas. `weft plan` / `weft simulate` run the simulation; the
// ops' `auto` (ops::predict_overlap) steps its methods' pipelines through the same formulas.
//
// The formulas, deliberately small (every term is a constant one can measure, or one fitted from
// named measurements; bench/constants/h200x2.json and docs/gemm_overlap.md say which):
//  - a call starts launch_us after it is launched (kernel launch inside a CUDA graph, the
//    kernel's entry and exit); with SimOptions::entry_barrier every rank also waits one
//    signal_latency_us for its peers' entry flags (the epoch guard of a kernel that writes
//    into its peers' outputs in place);
//  - a remote push or pull takes bytes / link bandwidth (transfer_us); transfers that one rank
//    issues on one engine share it, so they run one after another (the constants are whole-GPU
//    bandwidths);
//  - a local copy moves 2 * bytes (read and write), a local reduce (dst += src) 3 * bytes (read
//    both, write dst) through the rank's HBM, one after another; a remote reduce takes the
//    longer of its link time and its 2 * bytes of read-modify-write of the local end;
//  - SimOptions::ctas: the op runs on that many CTAs, each SM-engine phase spread over all of
//    them, so a bandwidth is min(whole GPU, ctas * per-CTA rate) (cta_link_gbps for NVLink,
//    cta_copy_gbps for copies, cta_reduce_gbps for reductions); 0: whole-GPU rates;
//  - a signal bumped on another rank is seen signal_latency_us later; a transfer that wrote
//    another rank's memory first waits write_ack_us (the release fence before the signal
//    waits for the remote stores to be acknowledged);
//  - a tile of r x c outputs with depth K takes 2*r*c*K / (gemm_tflops / sm_count): one
//    worker is one SM running at its share of the measured GEMM rate (tile_us); a library GEMM
//    call takes the whole GPU: 2*r*c*K / gemm_tflops, then its r x c output written at hbm_gbps
//    (the epilogue's stores are not hidden behind the main loop of a call of one or two waves),
//    + CallCosts::gemm_launch_us (gemm_us);
//  - host-issued calls pay their CallCosts: a copy-engine copy copy_us, a stream wait on a flag
//    wait_us, an NCCL collective collective_us on top of its bus bytes at link_gbps[nccl]
//    growing with the world as (2(W-1)/W)^collective_world_exp (collective_us());
//  - workers take items in queue order and stay busy while they wait, as in the verifier.
#pragma once
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "weft/plan/plan.hpp"
#include "weft/plan/schedule.hpp"

namespace weft::plan {

// Fixed costs of the host-issued calls the ops' methods make, and of the pieces of their
// pipelines: fitted on H200s against the measured GEMM-op runs (docs/gemm_overlap.md, "auto",
// says from which). Optional in a constants file (an object "call_costs" with any of these
// keys); a key left out keeps its default, the H200 fit.
struct CallCosts {
  double gemm_launch_us = 4.0;         // one library (cuBLAS) GEMM call, beyond its FLOPs
  double copy_us = 2.0;                // one copy-engine copy, beyond its bytes
  double wait_us = 2.0;                // a stream waiting on a flag, beyond the flag's latency
  double collective_us = 12.0;         // one NCCL collective, beyond its bus bytes
  double collective_world_exp = 0.44;  // NCCL's rate grows with the world as (2(W-1)/W)^this
  // NCCL's all-gather and reduce-scatter: their bus rates relative to the all-reduce's (the
  // nccl link rate). Fitted to the GEMM+communication benches' baselines minus their GEMMs
  // alone (H200s; docs/gemm_overlap.md, "auto"): against the rates without these the
  // all-gathers took 1.23x the prediction on 2 and 4 ranks (anchor shapes) and 1.37x (random
  // shapes), the reduce-scatters 1.21x / 1.09x / 1.09x on 2 / 4 / 8 ranks (anchor) and 1.25x /
  // 1.14x (random), the all-reduces 0.94-1.02x.
  double nccl_all_gather_efficiency = 0.8;
  double nccl_reduce_scatter_efficiency = 0.85;
  // Per peer piece of a decomposed pipeline (a library GEMM on few rows, an event, a copy, a
  // signal, a wait): ag_gemm's; gemm_rs's (its GEMM writes the piece that is then sent).
  double ag_piece_us = 10.5;
  double rs_piece_us = 15.7;
  // The fused ag_gemm kernel: its GEMM's rate relative to gemm_tflops, and its fixed cost.
  double fused_gemm_efficiency = 0.95;
  double fused_us = 10.0;
  // weft's all-reduce kernel of one gemm_ar chunk, next to a GEMM that keeps the SMs: its rate
  // relative to the copy engine's link, and its fixed cost.
  double sm_all_reduce_efficiency = 0.8;
  double sm_all_reduce_us = 8.0;
  bool operator==(const CallCosts&) const = default;
};

struct DeviceConstants {
  std::string device;                  // e.g. "H200 (2x, NV18)"
  double gemm_tflops = 0;              // dense bf16, fp32 accumulate, large GEMM
  double hbm_gbps = 0;                 // HBM bandwidth, GB/s (1e9 bytes/s), read + write counted
  std::map<Engine, double> link_gbps;  // one-way bandwidth to peers, whole GPU, per engine
  double signal_latency_us = 0;        // one-way flag latency to a peer
  int sm_count = 0;
  // Fixed cost of one call: launch inside a CUDA graph, entry and exit of the kernel.
  double launch_us = 0;
  // From the end of a transfer that wrote another rank's memory until a signal after it can
  // leave: the release fence waits for the remote stores' acknowledgements (a round trip).
  double write_ack_us = 0;
  // Per-CTA rates of SM-engine work, used when SimOptions::ctas > 0 (0 here: no per-CTA
  // limit; the JSON loader requires them):
  double cta_link_gbps = 0;    // NVLink push of one CTA (engine sm)
  double cta_copy_gbps = 0;    // local copy of one CTA, read + write counted
  double cta_reduce_gbps = 0;  // local reduction of one CTA, reads + write counted
  CallCosts calls;             // host-issued calls (optional in JSON; defaults: the H200 fit)
};

// JSON: {"device": "...", "gemm_tflops": 761, "hbm_gbps": 4800, "sm_count": 132,
//        "signal_latency_us": 1.3, "link_gbps": {"sm": 360, "tma": 360, "copy_engine": 395, ...},
//        "launch_us": 1.55, "write_ack_us": 2.5,
//        "cta_link_gbps": 21.5, "cta_copy_gbps": 43, "cta_reduce_gbps": 31.9}
//        "call_costs": {"gemm_launch_us": 4, ...}   (optional, any subset of CallCosts' keys)
// Every key but call_costs is required; link_gbps needs at least one engine. Rates, gemm_tflops, sm_count
// and signal_latency_us must be > 0; launch_us and write_ack_us >= 0. Other keys (e.g. a
// "sources" object that says where each value comes from) are ignored. Throws
// InvalidArgument that names the source and the key.
DeviceConstants device_constants_from_json(std::string_view json_text, std::string_view source = "device constants");
DeviceConstants load_device_constants(const std::string& path);
std::string device_constants_to_json(const DeviceConstants& d);

// The 2xH200 (NV18) constants compiled into the library: the values of
// bench/constants/h200x2.json (the source of record, which says where each comes from: copy
// engine and SM push measured, HBM and SM count from the data sheet, nccl and net planning
// figures). The cost model's default where no constants file is given.
DeviceConstants h200_constants();

// ---- the formulas (times in us; bytes as moved, not counting read + write twice) ----------

// The whole-GPU bandwidth of `e` in GB/s. Throws InvalidArgument when `d` has none for it.
double link_gbps(const DeviceConstants& d, Engine e);
// A remote push or pull of `bytes` on engine `e`; ctas > 0 caps an SM-engine transfer at ctas *
// cta_link_gbps.
double transfer_us(const DeviceConstants& d, Engine e, double bytes, int ctas = 0);
// Through the rank's HBM on engine `e` (ctas as transfer_us): a copy reads and writes `bytes`
// (2x); a reduce dst += src reads both and writes dst (3x); the read-modify-write of a remote
// reduce's local end (2x, at the reduction rate).
double local_copy_us(const DeviceConstants& d, Engine e, double bytes, int ctas = 0);
double local_reduce_us(const DeviceConstants& d, Engine e, double bytes, int ctas = 0);
double reduce_rmw_us(const DeviceConstants& d, Engine e, double bytes, int ctas = 0);
// `bytes` of traffic (reads and writes counted) through the rank's HBM at the whole-GPU rate.
double hbm_us(const DeviceConstants& d, double bytes);
// One tile of rows x cols outputs, depth k, on one SM at its share of gemm_tflops.
double tile_us(const DeviceConstants& d, double rows, double cols, double k);
// One library GEMM call of rows x cols outputs of out_elem_bytes each, depth k, on the whole
// GPU: its FLOPs, its output's write through HBM and its launch (the write term: 84 GEMM-alone
// points of recorded bf16 runs, K 264 ... 8192, worst predicted/measured 0.60 -> 0.87;
// docs/gemm_overlap.md, "The GEMM's time").
double gemm_us(const DeviceConstants& d, double rows, double cols, double k, double out_elem_bytes = 2);
// One copy-engine copy call of `bytes` to a peer (its fixed cost included).
double copy_call_us(const DeviceConstants& d, double bytes);

enum class Collective { kAllGather, kReduceScatter, kAllReduce };
// One NCCL collective on `world` ranks of one node. `bytes`: the gathered output (all-gather),
// one rank's input (reduce-scatter) or the buffer (all-reduce); bus bytes (W-1)/W of it, twice
// for an all-reduce, at link_gbps[nccl] x (2(W-1)/W)^collective_world_exp (x the all-gather's
// or reduce-scatter's efficiency), plus the call's fixed cost. 0 on one rank.
double collective_us(const DeviceConstants& d, Collective c, int world, double bytes);
// weft's all-reduce kernel of `bytes` on `world` ranks beside a GEMM that holds the SMs
// (gemm_ar decomposed's per-chunk all-reduce). 0 on one rank.
double sm_all_reduce_us(const DeviceConstants& d, int world, double bytes);

struct SimOptions {
  int64_t gemm_k = 0;          // depth of each tile's GEMM; 0: tiles cost nothing
  int comm_workers = 0;        // per rank; 0: unlimited
  int tile_workers = 0;        // per rank; 0: the device's SM count
  int ctas = 0;                // CTAs that run the SM-engine transfers, per rank; 0: whole-GPU rates
  bool entry_barrier = false;  // ranks wait for every peer's entry flag before they start
};

struct SimEvent {
  int rank = 0;
  bool tile = false;
  int64_t id = 0;       // chunk id, or the tile's position in its rank's order
  double take_us = 0;   // a worker took it (and began waiting)
  double start_us = 0;  // its waits were satisfied and its engine free
  double end_us = 0;
};

// Times are measured from the call's launch (they include launch_us).
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
