// What the Trainer inside a job will run, read from the Volt Trainer flags of its command.
#pragma once

#include <string>
#include <vector>

#include "volt/slurm/job_check.h"
#include "volt/slurm/job_spec.h"

namespace volt::tool {

/// The TrainerShape that `command` (a program and its arguments) asks its Volt Trainer for, so
/// the job can be checked against it before it waits in the queue.
///
/// Reads, as `--flag value` or `--flag=value` (the last one wins):
///   --devices N | -1 | auto | 0,1   processes per node (default 1; -1 and auto take the job's
///                                   --ntasks-per-node, a list counts its entries)
///   --num-nodes N (also --num_nodes, --nb-gpu-nodes, --nb_gpu_nodes)   nodes (default 1)
///   --accelerator gpu|cuda|cpu|auto   gpu and cuda use GPUs; auto uses them when the job has some
///   --auto-requeue / --no-auto-requeue   auto_requeue (default on)
///   --requeue-signal SIGUSR2 | USR2   the requeue signal, without "SIG" (default USR1)
/// Other arguments are ignored. Throws volt::Error naming the flag and value when malformed.
slurm::TrainerShape trainer_shape_from_command(const std::vector<std::string>& command, const slurm::JobSpec& spec);

/// A signal name as JobSpec::signal writes it: upper case without "SIG" ("sigusr2" -> "USR2").
std::string normalize_signal(const std::string& name);

/// Every problem with `spec` (validate) and with running the Trainer of `program` (a command
/// line, as for trainer_shape_from_command) in it (check_job_against_trainer), each with its
/// HINT; empty when the job fits. `program` is not always spec.command: a sweep's srun runs
/// `volt sweep run-trial ... -- <program>`.
std::vector<std::string> check_job(const slurm::JobSpec& spec, const std::vector<std::string>& program);

}  // namespace volt::tool
