// Where a process sits in a job, read from the environment of whoever launched it.
//
// Every function here is pure: it reads an injected Env, so torchrun, SLURM, MPI and local runs
// are unit-tested without a cluster. Detection follows one explicit order: torchrun (elastic),
// then SLURM, then MPI, then local.
#pragma once

#include <optional>
#include <string>

#include "volt/core/env.h"

namespace volt {

/// Who made the processes and set the rank variables.
enum class ClusterKind {
  kLocal,     ///< a plain run, or processes Volt launched itself (Lightning's names: LOCAL_RANK, NODE_RANK, ...)
  kTorchrun,  ///< torchrun / torch.distributed.elastic
  kSlurm,     ///< srun inside a SLURM allocation (not an interactive one)
  kMpi,       ///< mpirun (Open MPI or MPICH/Intel MPI variables)
};
/// "local", "torchrun", "slurm", "mpi".
const char* to_string(ClusterKind kind);
/// Parses those names; throws volt::Error listing them.
ClusterKind parse_cluster_kind(const std::string& text);

/// A process's place in the job, as its launcher describes it.
struct ClusterInfo {
  /// Who set the variables.
  ClusterKind kind = ClusterKind::kLocal;
  /// True when someone else started every process (srun, torchrun, mpirun); false when the
  /// trainer must start the local processes itself.
  bool creates_processes_externally = false;
  /// Processes in the job; unset when the launcher does not say (local runs: the Trainer's devices x nodes).
  std::optional<int64_t> world_size;
  /// This process's rank in the job.
  int64_t global_rank = 0;
  /// This process's rank on its node.
  int64_t local_rank = 0;
  /// This process's node.
  int64_t node_rank = 0;
  /// Processes on this node, when the launcher says.
  std::optional<int64_t> local_world_size;
  /// Nodes in the job, when the launcher says.
  std::optional<int64_t> num_nodes;
  /// The rendezvous host (rank 0's node).
  std::string main_address = "127.0.0.1";
  /// The rendezvous port; unset for local runs, where rank 0 picks a free one.
  std::optional<int> main_port;
  /// True when the launcher already serves a TCPStore at main_address:main_port for its workers
  /// (torchrun's agent store, TORCHELASTIC_USE_AGENT_STORE=True): rank 0 cannot open one there.
  bool launcher_serves_store = false;
  /// The launcher's restart count (TORCHELASTIC_RESTART_COUNT): a restarted group must not read
  /// the keys its previous attempt left in the launcher's store.
  int64_t attempt = 0;
  /// The SLURM job id (array jobs: "<array job id>_<task id>"), empty elsewhere.
  std::string job_id;
  /// True in an interactive SLURM allocation (job name "bash" or "interactive"): treated as local.
  bool slurm_interactive = false;
};

/// The hosts of this program's processes as a SLURM hostlist: the job step's
/// (SLURM_STEP_NODELIST, which srun sets for the nodes the step runs on), else the job's
/// (SLURM_JOB_NODELIST, SLURM_NODELIST); "" outside SLURM.
std::string slurm_node_list(const Env& env);

/// Reads torchrun's variables (RANK, LOCAL_RANK, GROUP_RANK, LOCAL_WORLD_SIZE, WORLD_SIZE,
/// MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RESTART_COUNT), or
/// nullopt when they are not all there.
std::optional<ClusterInfo> read_torchrun(const Env& env);
/// Reads SLURM's task variables (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_JOB_ID, and
/// the job step's task count, node count, nodes and tasks per node where srun set them, else the
/// job's); nullopt outside SLURM or in an interactive allocation. Uneven tasks per node
/// (SLURM_TASKS_PER_NODE=3,1) are an error naming the layout: the Trainer runs the same number of
/// processes on every node.
std::optional<ClusterInfo> read_slurm(const Env& env);
/// Reads Open MPI's (OMPI_COMM_WORLD_*) or MPICH's (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID) variables.
/// Nodes are numbered from the rank and the local size (ranks placed in blocks, else an error);
/// the port is MASTER_PORT or derived from the job id (OMPI_MCA_ess_base_jobid, PMIX_NAMESPACE);
/// the address is MASTER_ADDR, or 127.0.0.1 when every rank runs on one node (else an error).
std::optional<ClusterInfo> read_mpi(const Env& env);
/// Reads Volt's own launcher variables (LOCAL_RANK, NODE_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT);
/// all optional: a plain run is rank 0 of 1.
ClusterInfo read_local(const Env& env);

/// Detects the environment in the order torchrun, SLURM, MPI, local. Malformed values (a rank
/// that is not a number, a rank outside the world size, a bad hostlist) are volt::Errors that
/// name the variable.
ClusterInfo detect_cluster(const Env& env);

/// The rendezvous port of a job that sets no MASTER_PORT (a SLURM job, an mpirun): 15000 + (the
/// digits of `job_id` as a number mod 20000), the same on every rank of the job. Two jobs sharing a
/// node collide only when their ids differ by a multiple of 20000 (Lightning's last-4-digits
/// scheme collides every 10000 ids).
int job_main_port(const std::string& job_id);

/// Where the ranks of a run meet: a TCPStore at `address`:`port`.
struct Rendezvous {
  /// The store's host.
  std::string address = "127.0.0.1";
  /// The store's port; 0: rank 0 picks a free one (local runs).
  int port = 0;
  /// True when the store already exists (the launcher's) and every rank joins it as a client;
  /// false when rank 0 serves it.
  bool join_launcher_store = false;
  /// The prefix of Volt's keys in a launcher's store (empty in a store of Volt's own).
  std::string key_prefix;
};

/// The rendezvous of `cluster`. Where the launcher serves a store at MASTER_PORT (torchrun's agent
/// store), a client that speaks its protocol (`can_join_launcher_store`: LibTorch 2.x, like
/// torchrun 2.x) joins it under a prefix per attempt; otherwise (LibTorch 1.13, whose client hangs
/// against torchrun 2.x's libuv server) rank 0 serves Volt's own store on MASTER_ADDR at
/// store_port_beside(MASTER_PORT), which torchrun places on group rank 0's node, as it does rank 0.
Rendezvous resolve_rendezvous(const ClusterInfo& cluster, bool can_join_launcher_store);

/// The port of Volt's own store beside a launcher's store on `launcher_port`: 15000 + (`launcher_port`
/// + 7919) mod 20000, the same on every rank; never `launcher_port` itself, nor the next ports
/// that people give a second job by hand.
int store_port_beside(int launcher_port);

}  // namespace volt
