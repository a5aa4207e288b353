#include "volt/environments/cluster_environment.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "volt/core/error.h"

namespace volt {
namespace {

Env::Vars slurm_task(const std::string& procid, const std::string& localid, const std::string& nodeid) {
  return {{"SLURM_NTASKS", "4"},       {"SLURM_PROCID", procid},
          {"SLURM_LOCALID", localid},  {"SLURM_NODEID", nodeid},
          {"SLURM_NNODES", "2"},       {"SLURM_JOB_ID", "123456"},
          {"SLURM_JOB_NAME", "train"}, {"SLURM_JOB_NODELIST", "node[07-08]"}};
}

std::string error_of(const Env::Vars& vars) {
  try {
    detect_cluster(Env(vars));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ClusterEnvironment, PlainRunIsLocalRankZero) {
  const ClusterInfo info = detect_cluster(Env());
  EXPECT_EQ(info.kind, ClusterKind::kLocal);
  EXPECT_FALSE(info.creates_processes_externally);
  EXPECT_EQ(info.global_rank, 0);
  EXPECT_FALSE(info.world_size.has_value());
  EXPECT_FALSE(info.main_port.has_value());
}

TEST(ClusterEnvironment, SlurmRanksComeFromTheEnvironment) {
  const ClusterInfo info = detect_cluster(Env(slurm_task("3", "1", "1")));
  EXPECT_EQ(info.kind, ClusterKind::kSlurm);
  EXPECT_TRUE(info.creates_processes_externally);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.global_rank, 3);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.node_rank, 1);
  EXPECT_EQ(info.main_address, "node07");
  EXPECT_EQ(info.main_port, 15000 + 123456 % 20000);
  EXPECT_EQ(info.job_id, "123456");
}

TEST(ClusterEnvironment, AJobStepOnPartOfTheAllocationUsesTheStepsNodesAndCounts) {
  // srun -N2 -r2 -n2 inside a 4-node job: the step runs on node[09-10], the job spans node[07-10].
  auto vars = slurm_task("1", "0", "1");
  vars["SLURM_NTASKS"] = "4";
  vars["SLURM_NNODES"] = "4";
  vars["SLURM_JOB_NODELIST"] = "node[07-10]";
  vars["SLURM_TASKS_PER_NODE"] = "1(x4)";
  vars["SLURM_STEP_NUM_TASKS"] = "2";
  vars["SLURM_STEP_NUM_NODES"] = "2";
  vars["SLURM_STEP_NODELIST"] = "node[09-10]";
  vars["SLURM_STEP_TASKS_PER_NODE"] = "1(x2)";
  const ClusterInfo info = detect_cluster(Env(vars));
  EXPECT_EQ(info.main_address, "node09");
  EXPECT_EQ(info.world_size, 2);
  EXPECT_EQ(info.num_nodes, 2);
  EXPECT_EQ(info.local_world_size, 1);
  EXPECT_EQ(slurm_node_list(Env(vars)), "node[09-10]");
}

TEST(ClusterEnvironment, UnevenSlurmTasksPerNodeAreRefusedNamingTheLayout) {
  auto vars = slurm_task("2", "2", "0");
  vars["SLURM_TASKS_PER_NODE"] = "3,1";
  const std::string error = error_of(vars);
  EXPECT_NE(error.find("SLURM_TASKS_PER_NODE=3,1: 3 on node 0, 1 on node 1"), std::string::npos) << error;
  EXPECT_NE(error.find("HINT: ask SLURM for --ntasks-per-node"), std::string::npos) << error;
  vars["SLURM_TASKS_PER_NODE"] = "2(x2)";
  vars["SLURM_LOCALID"] = "1";
  EXPECT_EQ(detect_cluster(Env(vars)).local_world_size, 2);
}

TEST(ClusterEnvironment, SlurmArrayTasksGetTheirOwnIdAndPort) {
  auto vars = slurm_task("0", "0", "0");
  vars["SLURM_ARRAY_JOB_ID"] = "500";
  vars["SLURM_ARRAY_TASK_ID"] = "3";
  const ClusterInfo info = detect_cluster(Env(vars));
  EXPECT_EQ(info.job_id, "500_3");
  vars["SLURM_ARRAY_TASK_ID"] = "4";
  EXPECT_NE(detect_cluster(Env(vars)).main_port, info.main_port);
}

TEST(ClusterEnvironment, MasterVariablesOverrideSlurmsDefaults) {
  auto vars = slurm_task("0", "0", "0");
  vars["MASTER_ADDR"] = "10.0.0.5";
  vars["MASTER_PORT"] = "29500";
  const ClusterInfo info = detect_cluster(Env(vars));
  EXPECT_EQ(info.main_address, "10.0.0.5");
  EXPECT_EQ(info.main_port, 29500);
}

TEST(ClusterEnvironment, InteractiveSlurmAllocationsAreNotManaged) {
  for (const char* name : {"bash", "interactive"}) {
    auto vars = slurm_task("0", "0", "0");
    vars["SLURM_JOB_NAME"] = name;
    const ClusterInfo info = detect_cluster(Env(vars));
    EXPECT_EQ(info.kind, ClusterKind::kLocal) << name;
    EXPECT_TRUE(info.slurm_interactive);
  }
}

TEST(ClusterEnvironment, TorchrunComesBeforeSlurm) {
  auto vars = slurm_task("0", "0", "0");
  vars.insert({{"RANK", "1"},
               {"GROUP_RANK", "0"},
               {"LOCAL_RANK", "1"},
               {"LOCAL_WORLD_SIZE", "2"},
               {"WORLD_SIZE", "2"},
               {"MASTER_ADDR", "h"},
               {"MASTER_PORT", "1234"}});
  const ClusterInfo info = detect_cluster(Env(vars));
  EXPECT_EQ(info.kind, ClusterKind::kTorchrun);
  EXPECT_EQ(info.global_rank, 1);
  EXPECT_EQ(info.main_port, 1234);
  EXPECT_FALSE(info.launcher_serves_store);
}

TEST(ClusterEnvironment, TorchrunVariablesInheritedBySrunTasksAreRefusedNamingWhereTheyCameFrom) {
  auto vars = slurm_task("1", "1", "0");
  vars.insert({{"SLURM_STEP_ID", "0"},
               {"SLURM_STEP_NUM_TASKS", "2"},
               {"RANK", "0"},
               {"GROUP_RANK", "0"},
               {"LOCAL_RANK", "0"},
               {"LOCAL_WORLD_SIZE", "2"},
               {"WORLD_SIZE", "2"},
               {"MASTER_PORT", "29511"}});
  const std::string message = error_of(vars);
  EXPECT_NE(message.find("this process is SLURM task 1 of 2 (srun), but torchrun's RANK=0"), std::string::npos)
      << message;
  EXPECT_NE(message.find("HINT: unset RANK"), std::string::npos) << message;
  // torchrun started inside the step: its workers carry TORCHELASTIC_RUN_ID.
  vars["TORCHELASTIC_RUN_ID"] = "job123";
  EXPECT_EQ(detect_cluster(Env(vars)).kind, ClusterKind::kTorchrun);
}

Env::Vars torchrun_2_worker(const std::string& rank) {
  return {{"RANK", rank},
          {"GROUP_RANK", "0"},
          {"LOCAL_RANK", rank},
          {"LOCAL_WORLD_SIZE", "2"},
          {"WORLD_SIZE", "2"},
          {"MASTER_ADDR", "node0"},
          {"MASTER_PORT", "29500"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"},
          {"TORCHELASTIC_RESTART_COUNT", "2"}};
}

TEST(ClusterEnvironment, TorchrunAgentStoreIsJoinedWhereTheClientSpeaksItsProtocol) {
  const ClusterInfo info = detect_cluster(Env(torchrun_2_worker("1")));
  EXPECT_TRUE(info.launcher_serves_store);
  EXPECT_EQ(info.attempt, 2);

  const Rendezvous joined = resolve_rendezvous(info, /*can_join_launcher_store=*/true);
  EXPECT_TRUE(joined.join_launcher_store);
  EXPECT_EQ(joined.address, "node0");
  EXPECT_EQ(joined.port, 29500);
  EXPECT_EQ(joined.key_prefix, "volt/attempt_2/");

  // LibTorch 1.13: Volt's own store on rank 0's host (torchrun puts group rank 0 at MASTER_ADDR),
  // on a port that is not the agent's, the same for every rank.
  const Rendezvous own = resolve_rendezvous(info, /*can_join_launcher_store=*/false);
  EXPECT_FALSE(own.join_launcher_store);
  EXPECT_EQ(own.address, "node0");
  EXPECT_EQ(own.port, store_port_beside(29500));
  EXPECT_EQ(own.port, resolve_rendezvous(detect_cluster(Env(torchrun_2_worker("0"))), false).port);
  EXPECT_TRUE(own.key_prefix.empty());
}

TEST(ClusterEnvironment, StorePortBesideIsNeverTheLaunchersNorItsNeighbours) {
  for (int port = 1; port < 65536; ++port) {
    const int beside = store_port_beside(port);
    ASSERT_GE(beside, 15000) << port;
    ASSERT_LT(beside, 35000) << port;
    ASSERT_GT(std::abs(beside - port), 100) << port;
  }
}

TEST(ClusterEnvironment, RendezvousWithoutALauncherStoreIsTheMainPort) {
  Env::Vars vars = torchrun_2_worker("0");
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "False";  // torchrun 1.x's c10d rendezvous
  for (bool can_join : {true, false}) {
    const Rendezvous r = resolve_rendezvous(detect_cluster(Env(vars)), can_join);
    EXPECT_FALSE(r.join_launcher_store);
    EXPECT_EQ(r.port, 29500);
  }
  EXPECT_EQ(resolve_rendezvous(detect_cluster(Env(Env::Vars{})), true).port, 0);
}

TEST(ClusterEnvironment, OpenMpiAndMpichVariables) {
  const ClusterInfo ompi = detect_cluster(Env(Env::Vars{{"OMPI_COMM_WORLD_SIZE", "4"},
                                                        {"OMPI_COMM_WORLD_RANK", "3"},
                                                        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                                        {"MASTER_ADDR", "n1"},
                                                        {"MASTER_PORT", "29500"}}));
  EXPECT_EQ(ompi.kind, ClusterKind::kMpi);
  EXPECT_EQ(ompi.node_rank, 1);
  EXPECT_EQ(ompi.num_nodes, 2);
  EXPECT_EQ(ompi.main_address, "n1");
  const ClusterInfo mpich = detect_cluster(Env(Env::Vars{{"PMI_SIZE", "2"},
                                                         {"PMI_RANK", "1"},
                                                         {"MPI_LOCALRANKID", "1"},
                                                         {"MPI_LOCALNRANKS", "2"},
                                                         {"MASTER_PORT", "29500"}}));
  EXPECT_EQ(mpich.kind, ClusterKind::kMpi);
  EXPECT_EQ(mpich.global_rank, 1);
  EXPECT_EQ(mpich.node_rank, 0);
}

Env::Vars open_mpi_rank(const std::string& rank, const std::string& local_rank, const std::string& local_size) {
  return {{"OMPI_COMM_WORLD_SIZE", "2"},
          {"OMPI_COMM_WORLD_RANK", rank},
          {"OMPI_COMM_WORLD_LOCAL_RANK", local_rank},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", local_size},
          // The process's rank among its node's processes: never the node's index.
          {"OMPI_COMM_WORLD_NODE_RANK", local_rank}};
}

TEST(ClusterEnvironment, OpenMpisNodeRankIsNotTheNodesIndex) {
  auto vars = open_mpi_rank("1", "1", "2");
  vars["MASTER_PORT"] = "29500";
  const ClusterInfo info = detect_cluster(Env(vars));
  EXPECT_EQ(info.node_rank, 0);
  EXPECT_EQ(info.num_nodes, 1);
  EXPECT_EQ(info.main_address, "127.0.0.1");  // one node: loopback is right
}

TEST(ClusterEnvironment, MpirunWithoutARendezvousIsAnErrorSayingWhatToSet) {
  const std::string no_port = error_of(open_mpi_rank("1", "1", "2"));
  EXPECT_NE(no_port.find("set no MASTER_PORT"), std::string::npos) << no_port;
  EXPECT_NE(no_port.find("HINT: pass the same MASTER_PORT"), std::string::npos) << no_port;
  // What Open MPI 4.1 sets for every rank of one mpirun: the port follows from it.
  auto with_job = open_mpi_rank("1", "1", "2");
  with_job["OMPI_MCA_ess_base_jobid"] = "324075521";
  EXPECT_EQ(detect_cluster(Env(with_job)).main_port, job_main_port("324075521"));
  auto two_nodes = open_mpi_rank("1", "0", "1");
  two_nodes["MASTER_PORT"] = "29500";
  const std::string no_address = error_of(two_nodes);
  EXPECT_NE(no_address.find("more than one node but set no MASTER_ADDR"), std::string::npos) << no_address;
  two_nodes["MASTER_ADDR"] = "n1";
  EXPECT_EQ(detect_cluster(Env(two_nodes)).node_rank, 1);
}

TEST(ClusterEnvironment, MpiRanksOutOfBlocksAreRefused) {
  // --map-by node over 2 nodes x 2: rank 1 is local rank 0 of the second node.
  Env::Vars vars{
      {"OMPI_COMM_WORLD_SIZE", "4"},       {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"MASTER_ADDR", "n1"},         {"MASTER_PORT", "29500"}};
  const std::string error = error_of(vars);
  EXPECT_NE(error.find("HINT: run mpirun with --map-by slot"), std::string::npos) << error;
}

TEST(ClusterEnvironment, VoltLauncherVariablesAreRead) {
  const ClusterInfo info = detect_cluster(Env(Env::Vars{
      {"LOCAL_RANK", "1"}, {"NODE_RANK", "1"}, {"GLOBAL_RANK", "3"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "4000"}}));
  EXPECT_EQ(info.kind, ClusterKind::kLocal);
  EXPECT_EQ(info.global_rank, 3);
  EXPECT_EQ(info.node_rank, 1);
  EXPECT_EQ(info.main_port, 4000);
}

TEST(ClusterEnvironment, MalformedValuesNameTheVariable) {
  auto vars = slurm_task("x", "0", "0");
  EXPECT_NE(error_of(vars).find("SLURM_PROCID='x'"), std::string::npos);
  vars = slurm_task("4", "0", "0");
  EXPECT_NE(error_of(vars).find("SLURM_PROCID=4 is outside"), std::string::npos);
  vars = slurm_task("0", "0", "0");
  vars["SLURM_JOB_NODELIST"] = "node[1-";
  EXPECT_NE(error_of(vars).find("malformed SLURM hostlist"), std::string::npos);
  vars = slurm_task("0", "0", "0");
  vars["MASTER_PORT"] = "70000";
  EXPECT_NE(error_of(vars).find("MASTER_PORT=70000"), std::string::npos);
  vars = slurm_task("0", "0", "5");
  EXPECT_NE(error_of(vars).find("SLURM_NODEID=5"), std::string::npos);
}

TEST(ClusterEnvironment, KindsRoundTripThroughTheirNames) {
  for (ClusterKind kind : {ClusterKind::kLocal, ClusterKind::kTorchrun, ClusterKind::kSlurm, ClusterKind::kMpi})
    EXPECT_EQ(parse_cluster_kind(to_string(kind)), kind);
  EXPECT_THROW(parse_cluster_kind("pbs"), Error);
}

}  // namespace
}  // namespace volt
