#include <gtest/gtest.h>

#include "weft/core/error.hpp"
#include "weft/runtime/backend.hpp"
#include "weft/runtime/world.hpp"

using weft::EnvMap;
using weft::world_from_env;

TEST(World, NoLauncherIsAWorldOfOne) {
  auto w = world_from_env(EnvMap{{"HOME", "/root"}});
  EXPECT_EQ(w.rank, 0);
  EXPECT_EQ(w.size, 1);
  EXPECT_EQ(w.source, "single");
}

TEST(World, WeftLauncher) {
  auto w = world_from_env(
      EnvMap{{"WEFT_RANK", "3"}, {"WEFT_WORLD_SIZE", "8"}, {"WEFT_LOCAL_RANK", "3"}, {"WEFT_LOCAL_SIZE", "4"}});
  EXPECT_EQ(w.rank, 3);
  EXPECT_EQ(w.size, 8);
  EXPECT_EQ(w.local_rank, 3);
  EXPECT_EQ(w.local_size, 4);
  EXPECT_EQ(w.node, 0);
  EXPECT_EQ(w.num_nodes(), 2);
}

TEST(World, Torchrun) {
  auto w = world_from_env(EnvMap{{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}});
  EXPECT_EQ(w.rank, 5);
  EXPECT_EQ(w.node, 1);
  EXPECT_EQ(w.source, "torchrun");
}

TEST(World, OpenMpi) {
  auto w = world_from_env(EnvMap{{"OMPI_COMM_WORLD_RANK", "1"},
                                 {"OMPI_COMM_WORLD_SIZE", "2"},
                                 {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(w.rank, 1);
  EXPECT_EQ(w.size, 2);
  EXPECT_EQ(w.source, "Open MPI");
}

TEST(World, SlurmTasksPerNodeWithRepeatCount) {
  auto w = world_from_env(
      EnvMap{{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "2"}, {"SLURM_NTASKS_PER_NODE", "4(x2)"}});
  EXPECT_EQ(w.local_size, 4);
  EXPECT_EQ(w.node, 1);
}

TEST(World, WeftLauncherWinsOverAnEnclosingSlurmJob) {
  auto w = world_from_env(EnvMap{{"WEFT_RANK", "1"},
                                 {"WEFT_WORLD_SIZE", "2"},
                                 {"WEFT_LOCAL_RANK", "1"},
                                 {"SLURM_PROCID", "0"},
                                 {"SLURM_NTASKS", "1"},
                                 {"SLURM_LOCALID", "0"}});
  EXPECT_EQ(w.size, 2);
  EXPECT_EQ(w.source, "weft launch");
}

static std::string error_of(const EnvMap& env) {
  try {
    world_from_env(env);
  } catch (const weft::InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(World, HalfSetEnvironmentNamesTheMissingVariables) {
  auto msg = error_of(EnvMap{{"RANK", "0"}, {"LOCAL_RANK", "0"}});
  EXPECT_NE(msg.find("half-set torchrun environment"), std::string::npos) << msg;
  EXPECT_NE(msg.find("WORLD_SIZE missing"), std::string::npos) << msg;
}

TEST(World, RejectsBadValues) {
  EXPECT_NE(error_of(EnvMap{{"RANK", "x"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}}).find("not a non-negative"),
            std::string::npos);
  EXPECT_NE(error_of(EnvMap{{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}}).find("is not below world size"),
            std::string::npos);
  EXPECT_NE(error_of(EnvMap{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "2"}})
                .find("local rank 3 is not below local size 2"),
            std::string::npos);
}

TEST(World, MoreLocalRanksThanGpusIsRefused) {
  weft::World w;
  w.size = 4;
  w.local_size = 4;
  EXPECT_NO_THROW(weft::check_local_ranks_fit(w, 4));
  try {
    weft::check_local_ranks_fit(w, 2);
    FAIL() << "expected an error";
  } catch (const weft::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("4 ranks on this node but only 2 GPU(s)"), std::string::npos) << e.what();
  }
}

TEST(Backend, ResolveBackend) {
  EXPECT_EQ(weft::resolve_backend(EnvMap{{"WEFT_BACKEND", "host"}}, 8), weft::BackendKind::kHost);
  EXPECT_EQ(weft::resolve_backend(EnvMap{}, 0), weft::BackendKind::kHost);
  EXPECT_THROW(weft::resolve_backend(EnvMap{{"WEFT_BACKEND", "nccl"}}, 0), weft::InvalidArgument);
  EXPECT_THROW(weft::resolve_backend(EnvMap{{"WEFT_BACKEND", "gloo"}}, 0), weft::InvalidArgument);
}

TEST(Tunables, RejectNonIntegers) {
  EXPECT_EQ(weft::tunable_value(weft::tunables::kTimeoutMs, EnvMap{}), 30000);
  EXPECT_EQ(weft::tunable_value(weft::tunables::kTimeoutMs, EnvMap{{"WEFT_TIMEOUT_MS", "250"}}), 250);
  EXPECT_THROW(weft::tunable_value(weft::tunables::kTimeoutMs, EnvMap{{"WEFT_TIMEOUT_MS", "30s"}}),
               weft::InvalidArgument);
}
