// Restarts under Volt's own launcher: a supervisor process that runs all of a node's ranks as
// children and starts them again after one fails (TrainerOptions::max_restarts, torchrun's
// --max-restarts). A restarted rank resumes from the newest snapshot by itself (docs/failures.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "volt/core/env.h"
#include "volt/distributed/topology.h"

namespace volt {

class Console;

/// What supervise_workers runs.
struct SupervisorOptions {
  /// The node's processes (world size, processes per node, rendezvous address). main_port 0: a
  /// free port for each attempt (the previous attempt's may still be held by its dying ranks).
  Topology topology;
  /// The program's command line (argv), run by every rank.
  std::vector<std::string> command;
  /// The program file run (LaunchOptions::executable).
  std::string executable = "/proc/self/exe";
  /// The workers' environment: this one, plus the rank variables, `child_env` and
  /// VOLT_RESTART_COUNT (the attempt: 0, 1, ...).
  Env env;
  /// Variables for the workers beyond their ranks (RunPlan::child_env: the GPUs they see).
  Env::Vars child_env;
  /// How many times the group is started again after a failure.
  int64_t max_restarts = 0;
  /// How long the other ranks get to stop after SIGTERM before SIGKILL, once one failed.
  std::chrono::milliseconds grace{5000};
  /// Polled while the workers run: a signal to pass on to them and stop supervising (SIGINT,
  /// SIGTERM), or 0. Unset: none.
  std::function<int()> stop_requested;
  /// Where the workers' snapshots are, for the messages.
  std::string snapshot_dir;
};

/// How supervising ended.
struct SupervisedRun {
  /// The restarts it took.
  int64_t restarts = 0;
  /// The signal that stopped it (passed on to the workers); 0 when the workers finished.
  int stopped_by = 0;
};

/// Starts local ranks 0..N-1 of `options.topology` running the program as attempt 0. When one
/// fails (exits non-zero or is killed), ends the others (SIGTERM, then SIGKILL after `grace`),
/// says which rank failed, on which host and why, and starts them all again as the next attempt,
/// up to max_restarts times. Returns once every rank of an attempt exited with 0, or when a stop
/// was requested. Throws volt::Error naming the last failure when no restart is left.
SupervisedRun supervise_workers(const SupervisorOptions& options, Console& console);

}  // namespace volt
