// A program that uses weft as a dependency (find_package or add_subdirectory): it builds a
// collective's plan from a template, verifies it and round-trips it through the text format
// (host C++, no backend), and counts GPUs (zero without any), which links the runtime and,
// in CUDA builds, the CUDA runtime and NCCL. Exit status 0 only when the plan holds.
#include <cstdio>

#include "weft/plan/templates.hpp"
#include "weft/plan/text.hpp"
#include "weft/plan/verify.hpp"
#include "weft/runtime/backend.hpp"
#include "weft/version.hpp"

int main() {
  namespace plan = weft::plan;
  const plan::CommPlan p = plan::all_gather(plan::AllGatherAlgo::kRing, 4, 64, 128, {.splits = 2});
  const plan::VerifyResult r = plan::verify(p, {.workers_per_rank = 1});
  if (!r.ok) {
    std::fprintf(stderr, "consumer: plan %s is invalid:\n%s\n", p.name.c_str(), r.text().c_str());
    return 1;
  }
  if (plan::parse_plan(plan::print_plan(p)) != p) {
    std::fprintf(stderr, "consumer: plan %s does not survive print/parse\n", p.name.c_str());
    return 1;
  }
  std::printf("consumer: weft %s, plan %s verified (%zu transfers on %d ranks), %d GPU(s) visible\n", weft::kVersion,
              p.name.c_str(), p.num_transfers(), p.world, weft::count_gpus_forked());
  return 0;
}
