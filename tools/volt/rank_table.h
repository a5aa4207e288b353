// The ranks an sbatch job's srun would start, as Volt's own cluster detection sees them.
//
// For each task the SLURM variables srun sets are built into an Env and given to the real
// volt::detect_cluster, so the table shows what the Trainer will read, not a second opinion.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "volt/core/env.h"
#include "volt/environments/cluster_environment.h"
#include "volt/slurm/job_spec.h"

namespace volt::tool {

/// The made-up parts of the allocation a dry run shows.
///
///   RankTableOptions options{"4242", "gpu[07-08]"};
struct RankTableOptions {
  /// SLURM_JOB_ID; an array job's tasks see it as SLURM_ARRAY_JOB_ID with task 0.
  std::string job_id = "12345";
  /// SLURM_JOB_NODELIST; empty: "node1" for one node, "node[1-N]" for N nodes.
  std::string nodelist;
};

/// One task of the job: its host, the variables srun would give it, and what Volt detects.
struct RankRow {
  /// SLURMD_NODENAME: the host the task runs on.
  std::string host;
  /// The SLURM variables of the task.
  Env env;
  /// volt::detect_cluster(env).
  ClusterInfo info;
};

/// The environment srun sets for task `task` (0-based SLURM_PROCID) of `spec` on `hosts` (one
/// per node, the expansion of `nodelist`): SLURM_JOB_ID, SLURM_JOB_NAME, SLURM_NTASKS,
/// SLURM_NNODES, SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_JOB_NODELIST,
/// SLURM_NTASKS_PER_NODE, SLURMD_NODENAME, SLURM_CPUS_PER_TASK when set, the array variables
/// for task 0 of an array, and CUDA_VISIBLE_DEVICES listing every GPU of the node (what SLURM
/// sets for --gres=gpu:N) when the job asks for GPUs. Tasks fill nodes in order (block
/// distribution, srun's default).
Env slurm_task_env(const slurm::JobSpec& spec, const std::vector<std::string>& hosts, const std::string& nodelist,
                   const std::string& job_id, int64_t task);

/// One row per task of `spec` (nodes x ntasks_per_node), each from detect_cluster. Throws
/// volt::Error when the node list is malformed or names fewer or more hosts than spec.nodes.
std::vector<RankRow> build_rank_table(const slurm::JobSpec& spec, const RankTableOptions& options = {});

/// The rows as an aligned text table, one line per task, each line starting with "# " so the
/// table can follow a batch script without changing what it does.
std::string render_rank_table(const std::vector<RankRow>& rows);

}  // namespace volt::tool
