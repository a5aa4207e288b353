// Auto-requeue under SLURM: whether a job may requeue itself, with which id, on which signal.
//
// The decision is a pure function of an injected Env (unit-tested with fake SLURM variables);
// only requeue_slurm_job runs a command.
#pragma once

#include <chrono>
#include <string>

#include "volt/core/env.h"

namespace volt {

/// What a process does when its SLURM job is about to end (Lightning's SLURMEnvironment with
/// auto_requeue): the resolved form of TrainerOptions' requeue options.
struct RequeuePolicy {
  /// True when the requeue signal saves an HPC checkpoint and requeues the job.
  bool enabled = false;
  /// The signal number that asks for a requeue (SIGUSR1 by default).
  int signal = 0;
  /// The id `scontrol requeue` needs: "<array job id>_<task id>" for a job array task, else the job id.
  std::string job_id;
  /// Why requeueing is off ("auto_requeue=false", "not a SLURM job", ...); empty when enabled.
  std::string disabled_reason;
  /// True when SIGTERM (preemption, scancel) saves an HPC checkpoint before the process stops.
  bool checkpoint_on_sigterm = false;
};

/// Decides whether this process may requeue its job on `signal` (a signal number, e.g.
/// volt::signal_number(options.requeue_signal)). Requeueing needs a SLURM batch job: outside
/// SLURM (no SLURM_JOB_ID) and in interactive allocations (job name "bash" or "interactive", as
/// Lightning decides) nothing is requeued and no HPC checkpoint is written on SIGTERM, because
/// nobody would restart the program.
RequeuePolicy resolve_requeue_policy(const Env& env, bool auto_requeue, int signal, bool checkpoint_on_sigterm);

/// "SIGUSR1" for SIGUSR1 (and the other signals a job may requeue or stop on); "signal N" for
/// other numbers.
std::string signal_name(int signal);

/// What `scontrol requeue` answered.
struct RequeueOutcome {
  /// True when scontrol exited with 0.
  bool ok = false;
  /// The command as run, for messages ("scontrol requeue 123_4").
  std::string command;
  /// scontrol's stdout and stderr, or why it could not run.
  std::string output;
};

/// Runs `scontrol requeue <job_id>` (scontrol from PATH) and waits at most `timeout` for it; a
/// controller that does not answer must not keep the job alive past its time limit.
RequeueOutcome requeue_slurm_job(const std::string& job_id, std::chrono::seconds timeout = std::chrono::seconds(60));

}  // namespace volt
