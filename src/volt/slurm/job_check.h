// Checks that an sbatch job fits the Trainer it will run, before it waits in the queue.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "volt/slurm/job_spec.h"

namespace volt::slurm {

/// What the Trainer inside a job will run: the parts of its options a JobSpec must match.
///
/// For `Trainer` options devices=4, num_nodes=2, accelerator=gpu with auto-requeue on:
///   TrainerShape shape{4, 2, true, true};
/// The `volt` tool fills it from a program's flags with volt::resolve_run_layout, the function
/// the program's Trainer lays its processes out with.
struct TrainerShape {
  /// Devices per node (GPUs per node when uses_gpus): one process each under ddp, all of them
  /// driven by one process under dp and ddp2.
  int64_t devices = 1;
  /// Nodes.
  int64_t num_nodes = 1;
  /// True when each process drives one GPU.
  bool uses_gpus = false;
  /// True when the Trainer saves and requeues the job when SLURM signals the time limit.
  bool auto_requeue = true;
  /// The signal the Trainer's auto-requeue listens for, as JobSpec::signal names it.
  std::string requeue_signal = "USR1";
  /// Processes per node, which `--ntasks-per-node` must equal; unset: one per device (ddp).
  std::optional<int64_t> processes_per_node;
  /// The Trainer's strategy ("ddp2"), for messages; empty when not known.
  std::string strategy;
};

/// Every mismatch between `spec` and `shape`, each a sentence naming both sides and a `HINT:`;
/// empty when they fit. Checks nodes, tasks and GPUs per node, and with auto-requeue the
/// signal, its target (srun steps, not only the batch shell), `requeue` and the time limit.
/// It does not repeat `validate(spec)`, which callers run as well.
std::vector<std::string> check_job_against_trainer(const JobSpec& spec, const TrainerShape& shape);

}  // namespace volt::slurm
