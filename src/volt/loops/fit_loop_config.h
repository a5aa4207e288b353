// What the fit loop and the training epoch loop read of the run plan, made once from it: the
// loops get these values, not the whole RunPlan.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "volt/callbacks/callback.h"
#include "volt/distributed/topology.h"
#include "volt/environments/requeue.h"
#include "volt/environments/restarts.h"
#include "volt/loops/fit_checkpoints.h"
#include "volt/loops/training_epoch_loop.h"

namespace volt {

struct RunPlan;

/// When the fit loop saves snapshots (FitCheckpoints::save_snapshot).
struct SnapshotSchedule {
  /// Optimizer steps between snapshots; unset: none.
  std::optional<int64_t> every_n_steps;
  /// About this many seconds between snapshots (rank 0's pace, turned into steps); unset: none.
  std::optional<double> every_n_seconds;
  /// Whether any snapshot is saved.
  bool enabled() const { return every_n_steps || every_n_seconds; }
  /// A snapshot due while the previous one is still being written: skipped (true) or waited for.
  bool skip_when_busy = false;
};

/// What the fit loop reads of the run plan: limits, intervals, where it runs. Made by
/// fit_loop_config from the resolved plan, so nothing in it is "auto".
struct FitLoopConfig {
  /// What each training epoch reads.
  TrainingEpochConfig epoch;
  /// How checkpoints are saved (state_dict_type, the HPC directory and how many it keeps).
  FitCheckpointsOptions checkpoints;
  /// When snapshots are saved.
  SnapshotSchedule snapshots;
  /// This process's place (world size, rank, host).
  Topology topology;
  /// Epochs at which the fit stops; -1: no limit.
  int64_t max_epochs = 1000;
  /// Epochs before a callback may stop the fit.
  int64_t min_epochs = 0;
  /// Optimizer steps before a callback may stop the fit.
  int64_t min_steps = 0;
  /// Validate every this many epochs.
  int64_t check_val_every_n_epoch = 1;
  /// Validation batches run before training (-1: all of them).
  int64_t num_sanity_val_steps = 2;
  /// Ask for new loaders every this many epochs; 0: never.
  int64_t reload_dataloaders_every_n_epochs = 0;
  /// Whether this process draws progress bars.
  bool show_progress = false;
  /// Whether the model summary is printed, and how many submodule levels it lists (-1: all).
  bool enable_model_summary = true;
  int64_t model_summary_max_depth = 1;
  /// Slower than the others' median by more than this: a straggler (checks: epoch's
  /// straggler_every_n_steps).
  double straggler_threshold = 0.2;
  /// SLURM's requeue signal and the SIGTERM checkpoint.
  RequeuePolicy requeue;
  /// A fault to inject (VOLT_INJECT_FAULT), to prove that a restarted run recovers.
  std::optional<FaultInjection> fault;
  /// Which attempt of a restarted run this is (0: the first).
  int64_t restart_attempt = 0;
  /// A fast_dev_run: it resumes from no HPC checkpoint or snapshot, so it marks none finished.
  bool fast_dev_run = false;
};

/// The fit loop's part of `plan` (a pure function).
FitLoopConfig fit_loop_config(const RunPlan& plan);

/// The batches epoch `epoch` accumulates per optimizer step: the first of `callbacks` that
/// schedules it (GradientAccumulationScheduler), else `configured` (the plan's
/// accumulate_grad_batches). Throws volt::Error when both are set: the factor would be ambiguous.
int64_t accumulate_grad_batches(const std::vector<std::shared_ptr<Callback>>& callbacks, int64_t configured,
                                int64_t epoch);

/// The optimizer steps a fit with `config` takes when nothing stops it early (Lightning's
/// estimated_stepping_batches): per epoch, `num_train_batches` over that epoch's
/// `accumulation(epoch)` rounded up (the epoch's last, partial accumulation steps too), summed
/// over max_epochs and capped at max_steps. Unset when unbounded: max_epochs -1 without
/// max_steps, or a stream of unknown length (`num_train_batches` unset) without max_steps.
std::optional<int64_t> estimated_stepping_batches(const FitLoopConfig& config, std::optional<int64_t> num_train_batches,
                                                  const std::function<int64_t(int64_t epoch)>& accumulation);

}  // namespace volt
