#include "rank_table.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/slurm/hostlist.h"

namespace volt::tool {
namespace {

std::string default_nodelist(int64_t nodes) { return nodes == 1 ? "node1" : fmt::format("node[1-{}]", nodes); }

std::string gpu_list(int64_t gpus) {
  std::vector<std::string> ids;
  for (int64_t i = 0; i < gpus; ++i) ids.push_back(std::to_string(i));
  return join(ids, ",");
}

std::string optional_text(const std::optional<int64_t>& value) { return value ? std::to_string(*value) : "-"; }

}  // namespace

Env slurm_task_env(const slurm::JobSpec& spec, const std::vector<std::string>& hosts, const std::string& nodelist,
                   const std::string& job_id, int64_t task) {
  const int64_t node = task / spec.ntasks_per_node;
  VOLT_INTERNAL_ASSERT(node < static_cast<int64_t>(hosts.size()), "task {} is on node {} of {}", task, node,
                       hosts.size());
  Env::Vars vars{
      {"SLURM_JOB_ID", job_id},
      {"SLURM_JOBID", job_id},
      {"SLURM_JOB_NAME", spec.job_name},
      {"SLURM_NTASKS", std::to_string(spec.nodes * spec.ntasks_per_node)},
      {"SLURM_NPROCS", std::to_string(spec.nodes * spec.ntasks_per_node)},
      {"SLURM_NNODES", std::to_string(spec.nodes)},
      {"SLURM_JOB_NUM_NODES", std::to_string(spec.nodes)},
      {"SLURM_PROCID", std::to_string(task)},
      {"SLURM_LOCALID", std::to_string(task % spec.ntasks_per_node)},
      {"SLURM_NODEID", std::to_string(node)},
      {"SLURM_JOB_NODELIST", nodelist},
      {"SLURM_NODELIST", nodelist},
      {"SLURM_NTASKS_PER_NODE", std::to_string(spec.ntasks_per_node)},
      {"SLURMD_NODENAME", hosts[static_cast<std::size_t>(node)]},
  };
  if (spec.cpus_per_task) vars["SLURM_CPUS_PER_TASK"] = std::to_string(*spec.cpus_per_task);
  if (spec.array) {
    vars["SLURM_ARRAY_JOB_ID"] = job_id;
    vars["SLURM_ARRAY_TASK_ID"] = "0";
    vars["SLURM_ARRAY_TASK_COUNT"] = std::to_string(spec.array->size);
  }
  if (spec.gpus_per_node > 0) vars["CUDA_VISIBLE_DEVICES"] = gpu_list(spec.gpus_per_node);
  return Env(std::move(vars));
}

std::vector<RankRow> build_rank_table(const slurm::JobSpec& spec, const RankTableOptions& options) {
  VOLT_CHECK(spec.nodes >= 1 && spec.ntasks_per_node >= 1,
             "the job has nodes={} and ntasks-per-node={}; expected 1 or more of each. HINT: set --nodes and "
             "--ntasks-per-node.",
             spec.nodes, spec.ntasks_per_node);
  VOLT_CHECK(!options.job_id.empty() && std::all_of(options.job_id.begin(), options.job_id.end(),
                                                    [](unsigned char c) { return std::isdigit(c) != 0; }),
             "--job-id '{}' is not a SLURM job id; expected digits, e.g. 12345. HINT: leave it out for 12345.",
             options.job_id);
  const std::string nodelist = options.nodelist.empty() ? default_nodelist(spec.nodes) : options.nodelist;
  const std::vector<std::string> hosts = slurm::expand_hostlist(nodelist);
  VOLT_CHECK(static_cast<int64_t>(hosts.size()) == spec.nodes,
             "--nodelist '{}' names {} host(s) but the job asks for --nodes={}; expected one host per node. HINT: "
             "give {} hosts, e.g. --nodelist {}.",
             nodelist, hosts.size(), spec.nodes, spec.nodes, default_nodelist(spec.nodes));
  std::vector<RankRow> rows;
  for (int64_t task = 0; task < spec.nodes * spec.ntasks_per_node; ++task) {
    RankRow row;
    row.env = slurm_task_env(spec, hosts, nodelist, options.job_id, task);
    row.host = row.env.get_or("SLURMD_NODENAME", "");
    row.info = detect_cluster(row.env);
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string render_rank_table(const std::vector<RankRow>& rows) {
  std::vector<std::vector<std::string>> cells{{"host", "SLURM_PROCID", "LOCALID", "NODEID", "detected", "global_rank",
                                               "local_rank", "node_rank", "world_size", "main_address:port", "job_id",
                                               "CUDA_VISIBLE_DEVICES"}};
  for (const auto& row : rows) {
    const ClusterInfo& info = row.info;
    cells.push_back({row.host, row.env.get_or("SLURM_PROCID", "-"), row.env.get_or("SLURM_LOCALID", "-"),
                     row.env.get_or("SLURM_NODEID", "-"), to_string(info.kind), std::to_string(info.global_rank),
                     std::to_string(info.local_rank), std::to_string(info.node_rank), optional_text(info.world_size),
                     info.main_address + ":" + (info.main_port ? std::to_string(*info.main_port) : "-"),
                     info.job_id.empty() ? "-" : info.job_id, row.env.get_or("CUDA_VISIBLE_DEVICES", "-")});
  }
  std::vector<std::size_t> widths(cells[0].size(), 0);
  for (const auto& line : cells) {
    for (std::size_t i = 0; i < line.size(); ++i) widths[i] = std::max(widths[i], line[i].size());
  }
  std::string out;
  for (const auto& line : cells) {
    std::string text = "#";
    for (std::size_t i = 0; i < line.size(); ++i) text += fmt::format(" {:<{}}", line[i], widths[i] + 1);
    while (!text.empty() && text.back() == ' ') text.pop_back();
    out += text + "\n";
  }
  return out;
}

}  // namespace volt::tool
