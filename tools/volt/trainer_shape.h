// What the Trainer inside a job will run, read from its command with the Trainer flags every Volt
// program defines (volt::add_trainer_flags) and laid out on the job's nodes by
// volt::resolve_run_layout, the function the program's own resolve_run_plan calls.
#pragma once

#include <string>
#include <vector>

#include "volt/options/run_layout.h"
#include "volt/options/trainer_options.h"
#include "volt/slurm/job_check.h"
#include "volt/slurm/job_spec.h"

namespace volt::tool {

/// The TrainerOptions that `command` (a program and its arguments) gives its Trainer, read as
/// the program reads them: every Trainer flag as `--flag value` or `--flag=value` (the last one
/// wins), and `--config FILE` (opened from the working directory) under the flags. The program's
/// own flags and arguments, its `--help` and `--print-config`, and its config's other sections
/// are left to it. Throws volt::Error naming the flag or config key, what was given and a HINT.
TrainerOptions trainer_options_from_command(const std::vector<std::string>& command);

/// What each process on a node of `spec` sees, as resolve_run_layout needs it: the job's GPUs per
/// node, and its tasks per node as the cores (a compute node's cores cannot be seen from here, so
/// devices=-1 on the CPU is taken to fill the job's tasks).
NodeResources node_resources(const slurm::JobSpec& spec);

/// The TrainerShape that `command` asks its Volt Trainer for on the nodes of `spec`, so the job
/// can be checked against it before it waits in the queue: processes and devices per node, nodes
/// and GPUs from resolve_run_layout (so ddp2 with devices=2 is one task per node), auto_requeue
/// and its signal. Throws volt::Error as trainer_options_from_command does, or when the options
/// do not lay out (e.g. strategy 'dp' on two nodes), with the library's message and HINT.
slurm::TrainerShape trainer_shape_from_command(const std::vector<std::string>& command, const slurm::JobSpec& spec);

/// Every problem with `spec` (validate) and with running the Trainer of `program` (a command
/// line, as for trainer_shape_from_command) in it (check_job_against_trainer), each with its
/// HINT; empty when the job fits. `program` is not always spec.command: a sweep's srun runs
/// `volt sweep run-trial ... -- <program>`.
std::vector<std::string> check_job(const slurm::JobSpec& spec, const std::vector<std::string>& program);

}  // namespace volt::tool
