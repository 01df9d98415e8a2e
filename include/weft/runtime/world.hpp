// World: who this process is among the ranks. One process per GPU (or per host rank), always.
#pragma once
#include <string>

#include "weft/core/env.hpp"

namespace weft {

struct World {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int node = 0;
  std::string source = "single";  // which launcher's environment it came from

  int num_nodes() const { return (size + local_size - 1) / local_size; }
};

// Builds the World from the environment of weft's own launcher (WEFT_RANK, WEFT_WORLD_SIZE,
// WEFT_LOCAL_RANK, WEFT_LOCAL_SIZE), torchrun (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE), Open MPI (OMPI_COMM_WORLD_*) or Slurm (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID, SLURM_NTASKS_PER_NODE). With none of them set: a world of one.
// Throws InvalidArgument for a half-set environment (some variables of a launcher but not
// all), and values that are not integers or out of range.
World world_from_env(const EnvMap& env);
World world_from_env();

// Throws InvalidArgument when more ranks share this node than it has GPUs.
void check_local_ranks_fit(const World& w, int num_gpus);

}  // namespace weft
