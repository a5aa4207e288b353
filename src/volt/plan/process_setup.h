// Per-process settings a run needs before its first tensor operation.
#pragma once

#include <signal.h>

#include <atomic>

#include "volt/plan/run_plan.h"

namespace volt::internal {

/// Applies the plan's per-process settings for one stage and undoes what can be undone when the
/// stage ends: the intra-op thread count and the deterministic-algorithms switch come back as
/// they were, so a program's own LibTorch code after fit() or test() runs as before. The seed
/// (fit only: evaluation does not reseed the program's generator), the current CUDA device and
/// the malloc thresholds stay, as Lightning's seed_everything and device placement do.
class ProcessSettingsScope {
 public:
  /// Applies `plan`'s settings; seeds LibTorch's generators when `seed` and the plan has one.
  ProcessSettingsScope(const RunPlan& plan, bool seed);
  ~ProcessSettingsScope();
  ProcessSettingsScope(const ProcessSettingsScope&) = delete;
  ProcessSettingsScope& operator=(const ProcessSettingsScope&) = delete;

 private:
  int threads_;
  bool deterministic_;
  bool deterministic_warn_only_;
};

/// Runs autograd in anomaly mode while alive when `enable` (TrainerOptions::detect_anomaly): a
/// backward that produces NaN throws and names the forward operation behind it. The mode is
/// global to the process, so the previous setting (on or off, with its NaN check) comes back on
/// destruction, also on exceptions.
class AnomalyModeScope {
 public:
  /// Switches anomaly mode on when `enable`; otherwise leaves it as it is.
  explicit AnomalyModeScope(bool enable);
  ~AnomalyModeScope();
  AnomalyModeScope(const AnomalyModeScope&) = delete;
  AnomalyModeScope& operator=(const AnomalyModeScope&) = delete;

 private:
  bool enabled_;
  bool check_nan_;
};

/// Pins glibc malloc's mmap and trim thresholds so LibTorch's per-step buffers are reused
/// instead of being returned to the OS and faulted back in every step. Idempotent.
void tune_allocator();

/// Catches SIGINT and SIGTERM while alive: the first one only sets a flag that the training
/// loop polls at batch boundaries (a clean stop with loggers flushed); a second one gets the
/// default action. Restores the handlers it replaced on destruction (each guard keeps its own,
/// so guards nest).
class StopSignalGuard {
 public:
  StopSignalGuard();
  ~StopSignalGuard();
  StopSignalGuard(const StopSignalGuard&) = delete;
  StopSignalGuard& operator=(const StopSignalGuard&) = delete;
  /// The signal received, or 0.
  static int received();
  /// On destruction, ignore SIGTERM instead of restoring the previous handler: after a requeue
  /// SLURM sends SIGTERM to a process that only has to return from main, and dying of it would
  /// turn a clean exit into a failed step.
  void ignore_sigterm_after() { ignore_sigterm_after_ = true; }

 private:
  bool ignore_sigterm_after_ = false;
  struct sigaction previous_int_ {};
  struct sigaction previous_term_ {};
};

/// Records SLURM's requeue signal (SIGUSR1 by default) while alive. The Trainer installs it when
/// it is built, before data loading, because the signal's default action kills the process and
/// a wall-time signal may come at any moment of the job. The fit loop polls the flag at step
/// boundaries. Restores the previous handler on destruction.
class RequeueSignalGuard {
 public:
  /// Catches `signal`.
  explicit RequeueSignalGuard(int signal);
  ~RequeueSignalGuard();
  RequeueSignalGuard(const RequeueSignalGuard&) = delete;
  RequeueSignalGuard& operator=(const RequeueSignalGuard&) = delete;
  /// True once the signal arrived.
  static bool received();
  /// Forgets a received signal (a fit that acted on it, or a new fit).
  static void clear();

 private:
  int signal_;
  struct sigaction previous_ {};
};

}  // namespace volt::internal
