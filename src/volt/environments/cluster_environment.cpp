#include "volt/environments/cluster_environment.h"

#include <algorithm>

#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/slurm/hostlist.h"

namespace volt {

const char* to_string(ClusterKind kind) {
  switch (kind) {
    case ClusterKind::kLocal:
      return "local";
    case ClusterKind::kTorchrun:
      return "torchrun";
    case ClusterKind::kSlurm:
      return "slurm";
    case ClusterKind::kMpi:
      return "mpi";
  }
  return "?";
}

ClusterKind parse_cluster_kind(const std::string& text) {
  const ClusterKind all[] = {ClusterKind::kLocal, ClusterKind::kTorchrun, ClusterKind::kSlurm, ClusterKind::kMpi};
  return parse_enum(text, all, "cluster environment");
}

namespace {

int64_t required_int(const Env& env, const char* name, int64_t min) {
  const auto value = env.get_int(name);
  VOLT_CHECK(value.has_value(),
             "environment variable {} is not set, but the launcher's other variables are. HINT: "
             "start the job with its launcher (srun, torchrun, mpirun) or set {} yourself.",
             name, name);
  VOLT_CHECK(*value >= min,
             "environment variable {}={} must be >= {}. HINT: check the job script or launcher that sets it.", name,
             *value, min);
  return *value;
}

std::optional<int64_t> optional_int(const Env& env, const char* name, int64_t min) {
  const auto value = env.get_int(name);
  if (value)
    VOLT_CHECK(*value >= min,
               "environment variable {}={} must be >= {}. HINT: check the job script or launcher that sets it.", name,
               *value, min);
  return value;
}

std::optional<int> port_from(const Env& env, const char* name) {
  const auto value = env.get_int(name);
  if (!value) return std::nullopt;
  VOLT_CHECK(*value >= 1 && *value <= 65535,
             "environment variable {}={} is not a TCP port (1-65535). HINT: set it to a free port, e.g. 29500, in the "
             "job script.",
             name, *value);
  return static_cast<int>(*value);
}

void check_ranks(const ClusterInfo& info, const char* rank_name, const char* size_name) {
  if (!info.world_size) return;
  VOLT_CHECK(info.global_rank < *info.world_size,
             "{}={} is outside the world size {}={}. HINT: the launcher's variables disagree; check the job script.",
             rank_name, info.global_rank, size_name, *info.world_size);
  if (info.local_world_size) {
    VOLT_CHECK(info.local_rank < *info.local_world_size,
               "local rank {} is outside the {} processes of this node. HINT: the launcher's variables disagree; check "
               "the job script.",
               info.local_rank, *info.local_world_size);
  }
}

/// "3 on node 0, 1 on node 1" (the first 8 nodes).
std::string describe_counts(const std::vector<int64_t>& counts) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < counts.size() && i < 8; ++i) parts.push_back(fmt::format("{} on node {}", counts[i], i));
  if (counts.size() > 8) parts.push_back("...");
  return join(parts, ", ");
}

}  // namespace

std::string slurm_node_list(const Env& env) {
  for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})
    if (const auto nodes = env.get(name); nodes && !nodes->empty()) return *nodes;
  return "";
}

int job_main_port(const std::string& job_id) {
  // Array jobs are "<array job id>_<task id>": both parts count, so tasks of one array differ.
  long long numeric = 0;
  for (char c : job_id) {
    if (c >= '0' && c <= '9') numeric = (numeric * 10 + (c - '0')) % 1000000007LL;
  }
  return 15000 + static_cast<int>(numeric % 20000);
}

std::optional<ClusterInfo> read_torchrun(const Env& env) {
  for (const char* name : {"RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"})
    if (!env.has(name)) return std::nullopt;
  ClusterInfo info;
  info.kind = ClusterKind::kTorchrun;
  info.creates_processes_externally = true;
  info.global_rank = required_int(env, "RANK", 0);
  info.node_rank = required_int(env, "GROUP_RANK", 0);
  info.local_rank = required_int(env, "LOCAL_RANK", 0);
  info.local_world_size = required_int(env, "LOCAL_WORLD_SIZE", 1);
  info.world_size = required_int(env, "WORLD_SIZE", 1);
  info.main_address = env.get_or("MASTER_ADDR", "127.0.0.1");
  info.main_port = port_from(env, "MASTER_PORT");
  VOLT_CHECK(info.main_port.has_value(),
             "torchrun set RANK but not MASTER_PORT. HINT: run under torchrun, which sets "
             "both, or export MASTER_PORT.");
  // torchrun writes Python's str(bool).
  info.launcher_serves_store = env.get_or("TORCHELASTIC_USE_AGENT_STORE", "False") == "True";
  info.attempt = env.has("TORCHELASTIC_RESTART_COUNT") ? required_int(env, "TORCHELASTIC_RESTART_COUNT", 0) : 0;
  check_ranks(info, "RANK", "WORLD_SIZE");
  return info;
}

int store_port_beside(int launcher_port) { return 15000 + (launcher_port + 7919) % 20000; }

Rendezvous resolve_rendezvous(const ClusterInfo& cluster, bool can_join_launcher_store) {
  Rendezvous r;
  r.address = cluster.main_address;
  r.port = cluster.main_port.value_or(0);
  if (!cluster.launcher_serves_store) return r;
  if (can_join_launcher_store) {
    r.join_launcher_store = true;
    r.key_prefix = fmt::format("volt/attempt_{}/", cluster.attempt);
  } else {
    r.port = store_port_beside(r.port);
  }
  return r;
}

std::optional<ClusterInfo> read_slurm(const Env& env) {
  if (!env.has("SLURM_NTASKS") || !env.has("SLURM_JOB_ID")) return std::nullopt;
  const std::string job_name = env.get_or("SLURM_JOB_NAME", "");
  if (job_name == "bash" || job_name == "interactive") return std::nullopt;
  ClusterInfo info;
  info.kind = ClusterKind::kSlurm;
  info.creates_processes_externally = true;
  // Inside a job step (srun) the step's variables describe this program's processes; the job's
  // describe the whole allocation, which a step may use only part of (srun -N2 on a 4-node job).
  const char* tasks_var = env.has("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
  const char* nodes_var = env.has("SLURM_STEP_NUM_NODES") ? "SLURM_STEP_NUM_NODES" : "SLURM_NNODES";
  info.world_size = required_int(env, tasks_var, 1);
  info.global_rank = required_int(env, "SLURM_PROCID", 0);
  info.local_rank = required_int(env, "SLURM_LOCALID", 0);
  info.node_rank = required_int(env, "SLURM_NODEID", 0);
  info.num_nodes = optional_int(env, nodes_var, 1);
  const char* tasks_name = env.has("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
  if (const auto tasks = env.get(tasks_name)) {
    const std::vector<int64_t> counts = slurm::expand_tasks_per_node(*tasks);
    const bool even = std::all_of(counts.begin(), counts.end(), [&](int64_t n) { return n == counts.front(); });
    VOLT_CHECK(even,
               "SLURM runs an uneven number of tasks per node ({}={}: {}), but the Trainer runs the same number "
               "of processes on every node. HINT: ask SLURM for --ntasks-per-node=N with --nodes=M (not --ntasks "
               "alone), so that every node runs N tasks.",
               tasks_name, *tasks, describe_counts(counts));
    if (info.node_rank < static_cast<int64_t>(counts.size())) info.local_world_size = counts[info.node_rank];
  }
  const std::string array_job = env.get_or("SLURM_ARRAY_JOB_ID", "");
  const std::string array_task = env.get_or("SLURM_ARRAY_TASK_ID", "");
  info.job_id =
      !array_job.empty() && !array_task.empty() ? array_job + "_" + array_task : env.get_or("SLURM_JOB_ID", "");
  if (const auto address = env.get("MASTER_ADDR")) {
    info.main_address = *address;
  } else {
    const std::string nodes = slurm_node_list(env);
    VOLT_CHECK(!nodes.empty(),
               "SLURM_JOB_NODELIST is not set inside a SLURM job, so the main address is unknown. "
               "HINT: export MASTER_ADDR in the job script.");
    info.main_address = slurm::first_host(nodes);
  }
  info.main_port = port_from(env, "MASTER_PORT");
  if (!info.main_port) info.main_port = job_main_port(info.job_id);
  check_ranks(info, "SLURM_PROCID", tasks_var);
  if (info.num_nodes) {
    VOLT_CHECK(info.node_rank < *info.num_nodes,
               "SLURM_NODEID={} is outside {}={}. HINT: the SLURM variables disagree; check that the job script does "
               "not overwrite them.",
               info.node_rank, nodes_var, *info.num_nodes);
  }
  return info;
}

std::optional<ClusterInfo> read_mpi(const Env& env) {
  ClusterInfo info;
  info.kind = ClusterKind::kMpi;
  info.creates_processes_externally = true;
  if (env.has("OMPI_COMM_WORLD_SIZE") && env.has("OMPI_COMM_WORLD_RANK")) {
    info.world_size = required_int(env, "OMPI_COMM_WORLD_SIZE", 1);
    info.global_rank = required_int(env, "OMPI_COMM_WORLD_RANK", 0);
    info.local_rank = optional_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0).value_or(0);
    info.local_world_size = optional_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1);
    // Not OMPI_COMM_WORLD_NODE_RANK: that is the process's rank among its node's processes, not
    // the node's index (one node, 2 processes: rank 1 has node rank 1).
  } else if (env.has("PMI_SIZE") && env.has("PMI_RANK")) {
    info.world_size = required_int(env, "PMI_SIZE", 1);
    info.global_rank = required_int(env, "PMI_RANK", 0);
    info.local_rank = optional_int(env, "MPI_LOCALRANKID", 0).value_or(0);
    info.local_world_size = optional_int(env, "MPI_LOCALNRANKS", 1);
  } else {
    return std::nullopt;
  }
  check_ranks(info, "the MPI rank", "the MPI world size");
  if (info.local_world_size) {
    // MPI names no node index: with ranks placed in blocks (Open MPI's default --map-by slot,
    // MPICH's -ppn) node k runs ranks k*N .. k*N+N-1, which the local rank must confirm.
    const int64_t per_node = *info.local_world_size;
    VOLT_CHECK(info.global_rank % per_node == info.local_rank,
               "mpirun placed rank {} as local rank {} of the {} on its node: not one block of consecutive ranks "
               "per node, which is how Volt numbers nodes. HINT: run mpirun with --map-by slot (Open MPI's "
               "default; not --map-by node) or MPICH's -ppn {}.",
               info.global_rank, info.local_rank, per_node, per_node);
    info.node_rank = info.global_rank / per_node;
    if (info.world_size) info.num_nodes = (*info.world_size + per_node - 1) / per_node;
  }
  info.main_port = port_from(env, "MASTER_PORT");
  if (!info.main_port) {
    // Every rank of one mpirun sees the same job id: a port derived from it needs no set-up.
    for (const char* job : {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"}) {
      if (const auto id = env.get(job); id && !id->empty()) {
        info.main_port = job_main_port(*id);
        break;
      }
    }
  }
  const bool several = info.world_size.value_or(1) > 1;
  const bool one_node = info.local_world_size && info.world_size && *info.local_world_size == *info.world_size;
  // mpirun tells the ranks nothing about where to meet: without a shared port every rank would
  // pick its own and wait for the others until the join timeout.
  VOLT_CHECK(!several || info.main_port.has_value(),
             "mpirun started {} processes but set no MASTER_PORT (nor a job id to derive one from: "
             "OMPI_MCA_ess_base_jobid, PMIX_NAMESPACE), so they have no common place to meet. HINT: "
             "pass the same MASTER_PORT (a free port) and, across nodes, MASTER_ADDR (rank 0's host) to every "
             "rank: mpirun -x MASTER_ADDR=$(hostname) -x MASTER_PORT=29500 ...",
             info.world_size.value_or(1));
  if (const auto address = env.get("MASTER_ADDR")) {
    info.main_address = *address;
  } else {
    VOLT_CHECK(!several || one_node,
               "mpirun started {} processes {} but set no MASTER_ADDR; 127.0.0.1 would be a different machine on "
               "each node. HINT: pass rank 0's host to every rank: mpirun -x MASTER_ADDR=$(hostname) -x "
               "MASTER_PORT=29500 ...",
               info.world_size.value_or(1),
               info.local_world_size ? "on more than one node" : "without saying how many share a node");
  }
  return info;
}

ClusterInfo read_local(const Env& env) {
  ClusterInfo info;
  info.kind = ClusterKind::kLocal;
  info.world_size = optional_int(env, "WORLD_SIZE", 1);
  info.local_rank = optional_int(env, "LOCAL_RANK", 0).value_or(0);
  info.node_rank = optional_int(env, "NODE_RANK", 0).value_or(0);
  info.global_rank = optional_int(env, "GLOBAL_RANK", 0).value_or(info.local_rank);
  info.main_address = env.get_or("MASTER_ADDR", "127.0.0.1");
  info.main_port = port_from(env, "MASTER_PORT");
  info.slurm_interactive = env.has("SLURM_JOB_ID") && (env.get_or("SLURM_JOB_NAME", "") == "bash" ||
                                                       env.get_or("SLURM_JOB_NAME", "") == "interactive");
  check_ranks(info, "GLOBAL_RANK", "WORLD_SIZE");
  return info;
}

ClusterInfo detect_cluster(const Env& env) {
  if (auto info = read_torchrun(env)) {
    // One of several tasks srun started, with torchrun's variables that torchrun did not set (its
    // workers always have TORCHELASTIC_RUN_ID): the shell that submitted the job exported them
    // and sbatch passed them on, so every task would claim the same rank and wait for the others.
    const bool srun_task = env.has("SLURM_STEP_ID") && env.has("SLURM_PROCID");
    const int64_t step_tasks = srun_task ? optional_int(env, "SLURM_STEP_NUM_TASKS", 1).value_or(1) : 1;
    VOLT_CHECK(step_tasks <= 1 || env.has("TORCHELASTIC_RUN_ID"),
               "this process is SLURM task {} of {} (srun), but torchrun's RANK={}, GROUP_RANK, LOCAL_RANK and "
               "LOCAL_WORLD_SIZE are set too, without TORCHELASTIC_RUN_ID, which torchrun sets: they came from the "
               "shell that submitted the job (sbatch passes its environment on), and every task would take rank {} "
               "from them. HINT: unset RANK GROUP_RANK LOCAL_RANK LOCAL_WORLD_SIZE WORLD_SIZE MASTER_ADDR MASTER_PORT "
               "before submitting (or submit with sbatch --export=NONE), or start torchrun inside the job step.",
               env.get_or("SLURM_PROCID", "?"), step_tasks, info->global_rank, info->global_rank);
    return *info;
  }
  if (auto info = read_slurm(env)) return *info;
  if (auto info = read_mpi(env)) return *info;
  return read_local(env);
}

}  // namespace volt
