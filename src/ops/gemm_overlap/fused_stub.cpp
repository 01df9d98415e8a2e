// The fused method's hook (src/ops/gemm_overlap/fused.hpp) in builds WITHOUT CUDA:
// the fused method needs weft's sm_90a GEMM, so it is unavailable here (the host backend's
// `fused` runs the plan executor instead; see src/ops/gemm_overlap/host_plan.cpp). CUDA builds link
// src/ops/gemm_overlap/fused.cpp.
#include "weft/core/error.hpp"
#include "fused.hpp"

namespace weft::ops::fused {

bool fused_available() { return false; }
bool fused_supports(Op) { return false; }

struct State {};

void StateDeleter::operator()(State* state) const { delete state; }

StatePtr make_state(const FusedArgs&) { throw Error("fused method on GPUs: this build has no CUDA"); }

bool own_rows_in_place(const State&) { return false; }
void run_fused(const FusedArgs&, State&) { throw Error("fused method on GPUs: this build has no CUDA"); }

}  // namespace weft::ops::fused
