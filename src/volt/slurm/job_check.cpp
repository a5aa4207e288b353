#include "volt/slurm/job_check.h"

#include <fmt/format.h>

namespace volt::slurm {

namespace {

void check_layout(std::vector<std::string>& problems, const JobSpec& spec, const TrainerShape& shape) {
  if (spec.nodes != shape.num_nodes) {
    problems.push_back(
        fmt::format("the job asks for --nodes={} but the Trainer runs num_nodes={}. HINT: set nodes={} (volt slurm: "
                    "--nodes) or num_nodes={}.",
                    spec.nodes, shape.num_nodes, shape.num_nodes, spec.nodes));
  }
  // srun starts one process per task: one per device under ddp, one per node under dp and ddp2.
  const int64_t processes = shape.processes_per_node.value_or(shape.devices);
  if (spec.ntasks_per_node != processes && processes == shape.devices) {
    problems.push_back(
        fmt::format("the job asks for --ntasks-per-node={} but the Trainer runs devices={} per node. HINT: set "
                    "ntasks_per_node={} (volt slurm: --ntasks-per-node) or devices={}.",
                    spec.ntasks_per_node, shape.devices, shape.devices, spec.ntasks_per_node));
  } else if (spec.ntasks_per_node != processes) {
    problems.push_back(fmt::format(
        "the job asks for --ntasks-per-node={} but the Trainer runs {} process{} per node{}, which drive{} the "
        "node's devices={}. HINT: set ntasks_per_node={} (volt slurm: --ntasks-per-node).",
        spec.ntasks_per_node, processes, processes == 1 ? "" : "es",
        shape.strategy.empty() ? "" : fmt::format(" (strategy={})", shape.strategy), processes == 1 ? "s" : "",
        shape.devices, processes));
  }
  if (shape.uses_gpus && spec.gpus_per_node < shape.devices) {
    problems.push_back(
        fmt::format("the job asks for {} GPUs per node (--gres=gpu:{}) but the Trainer uses devices={} GPUs per node. "
                    "HINT: set gpus_per_node={} (volt slurm: --gpus-per-node) or devices={}.",
                    spec.gpus_per_node, spec.gpus_per_node, shape.devices, shape.devices, spec.gpus_per_node));
  }
  if (!shape.uses_gpus && spec.gpus_per_node > 0) {
    problems.push_back(
        fmt::format("the job reserves {} GPUs per node but the Trainer runs on CPUs. HINT: set gpus_per_node=0 (leave "
                    "out --gpus-per-node), or use "
                    "the GPUs (accelerator=gpu).",
                    spec.gpus_per_node));
  }
}

void check_requeue(std::vector<std::string>& problems, const JobSpec& spec, const TrainerShape& shape) {
  if (!shape.auto_requeue) return;
  if (spec.signal.empty() || spec.signal_lead_seconds <= 0) {
    problems.push_back(fmt::format(
        "the Trainer requeues itself on SIG{} (auto_requeue) but the job asks SLURM for no signal before the "
        "time limit. HINT: set signal=\"{}\" and signal_lead_seconds=90 (volt slurm: --signal {} --signal-lead 90), or "
        "turn auto_requeue off.",
        shape.requeue_signal, shape.requeue_signal, shape.requeue_signal));
  } else if (spec.signal != shape.requeue_signal) {
    problems.push_back(fmt::format(
        "the job sends --signal={}@{} but the Trainer's auto_requeue listens for {}. HINT: set signal=\"{}\".",
        spec.signal, spec.signal_lead_seconds, shape.requeue_signal, shape.requeue_signal));
  }
  if (!spec.signal.empty() && spec.signal_to_batch_shell_only) {
    problems.push_back(fmt::format(
        "the job sends --signal=B:{}@{}, which reaches only the batch shell, but the Trainer runs as srun "
        "steps and would never see it (auto_requeue). HINT: set signal_to_batch_shell_only=false (volt slurm: leave "
        "out --signal-batch-only).",
        spec.signal, spec.signal_lead_seconds));
  }
  if (!spec.requeue) {
    problems.push_back(
        "the job sets requeue=false but the Trainer requeues it before the time limit (auto_requeue), and "
        "SLURM may refuse to requeue a job without --requeue. HINT: set requeue=true (volt slurm: leave out "
        "--no-requeue), or turn "
        "auto_requeue off.");
  }
  if (spec.time.empty()) {
    problems.push_back(
        "the job sets no --time but the Trainer's auto_requeue acts on the signal SLURM sends before the time "
        "limit. HINT: set time, e.g. '02:00:00', or turn auto_requeue off.");
  }
}

}  // namespace

std::vector<std::string> check_job_against_trainer(const JobSpec& spec, const TrainerShape& shape) {
  std::vector<std::string> problems;
  check_layout(problems, spec, shape);
  check_requeue(problems, spec, shape);
  return problems;
}

}  // namespace volt::slurm
