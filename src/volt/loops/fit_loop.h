// The fit loop: epochs, validation, callbacks, checkpoints and stopping, from a fresh start or a
// restored position to a FitResult.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "volt/callbacks/callback.h"
#include "volt/checkpoint/checkpointer.h"
#include "volt/checkpoint/hpc_checkpoints.h"
#include "volt/loops/fit_checkpoints.h"
#include "volt/loops/fit_loop_config.h"
#include "volt/loops/fit_result.h"
#include "volt/loops/stop_controller.h"
#include "volt/loops/training_epoch_loop.h"

namespace volt {

class Console;
class MetricRouter;
class PrecisionPlugin;
class ProgressBar;
class Profiler;
class StragglerDetector;
class Strategy;

/// What a fit runs with, borrowed from the Trainer for one fit() call.
struct FitLoopParts {
  /// How processes cooperate (reductions, collectives, who writes).
  Strategy& strategy;
  /// Autocast, loss scaling, casts.
  PrecisionPlugin& precision;
  /// Where checkpoints are built and written.
  Checkpointer& checkpointer;
  /// Where logged values go.
  MetricRouter& metrics;
  /// Where notes go (silent on every rank but global rank 0).
  Console& console;
  /// The callbacks, set up, in Lightning's order (checkpointing callbacks last).
  const std::vector<std::shared_ptr<Callback>>& callbacks;
  /// Times the fit's actions (its stage started by the caller) and feeds the straggler report.
  Profiler& profiler;
  /// The program's configuration for hyper_parameters["config"]; nullptr: none.
  const nlohmann::json* config = nullptr;
};

/// How many batches a fit's loaders give, and when validation runs within an epoch.
struct FitLoaderCounts {
  /// Training batches per epoch (after limit_train_batches); unset: until the stream ends.
  std::optional<int64_t> num_train_batches;
  /// Validation batches per run of each loader (after limit_val_batches); unset: until the
  /// stream ends.
  std::vector<std::optional<int64_t>> num_val_batches;
  /// Whether there is validation at all (data, and a limit above 0).
  bool has_validation = false;
  /// Training batches between validations within an epoch (val_check_interval); unset: only at
  /// the end of the epoch (a stream whose length is unknown).
  std::optional<int64_t> val_interval;
};

/// The module and data of one fit, prepared by the Trainer: loaders configured, the module on
/// its device, optimizers configured and validated, gradient synchronization armed.
struct FitData {
  /// The module being trained.
  LightningModule& module;
  /// Training batches.
  DataLoader& train;
  /// The validation loaders, run one after another (none: no validation).
  std::vector<DataLoader>& val;
  /// The module's optimizers and schedulers.
  const OptimizerConfig& optimization;
  /// How many batches `train` and `val` give.
  FitLoaderCounts counts;
  /// Asks for new loaders (reload_dataloaders_every_n_epochs): replaces `train` and `val` with
  /// their sources' new ones (loaders passed to fit() stay) and returns the new counts; unset:
  /// the loaders cannot be reloaded.
  std::function<FitLoaderCounts()> reload;
};

/// Global rank 0's `decision` on every process (CallbackServices::broadcast_decision for fit and
/// for validate, test and predict): the maximum of rank 0's vote and everyone else's 0. One
/// process: `decision`, with no collective.
bool rank_zero_decision(Strategy& strategy, bool decision);

/// Runs a fit as Lightning's fit loop does, and implements the services callbacks use.
///
/// Every process runs the same loop; they leave it at the same step because stopping is agreed
/// through the StopController (limits at once; signals and callbacks one step later under ddp,
/// with no wait on the critical path; at every epoch end with a blocking agreement).
class FitLoop : public CallbackServices, private EpochHooks {
 public:
  /// Runs as `config` says; borrows `parts` and `data` for the loop's lifetime.
  FitLoop(FitLoopConfig config, FitLoopParts parts, FitData data);
  ~FitLoop() override;

  /// Restores module, optimizers, callbacks and progress from `checkpoint`, so that run() goes on
  /// from there. Throws volt::CheckpointError when it does not fit: called before the run writes
  /// anything, a refused checkpoint leaves no log folder behind.
  void restore(const LoadedCheckpoint& checkpoint);
  /// Trains (from where restore() left it, else from the start) until a limit, a callback or a
  /// signal stops it; returns why, where, and the checkpoints. Saves an HPC checkpoint first when
  /// SLURM is ending the run (requeue signal, or SIGTERM with checkpoint_on_sigterm).
  FitResult run();
  /// Where the loop stands (the module's current_epoch and global_step read it).
  const FitProgress& progress() const { return progress_; }

  void save_checkpoint(const std::string& path) override;
  void save_weights_checkpoint(const std::string& path) override;
  bool broadcast_decision(bool decision) override;
  void remove_checkpoint(const std::string& path) override;
  void log_metrics(const std::map<std::string, double>& metrics) override;

 private:
  // EpochHooks
  void dispatch(const CallbackHook& hook, const HookPoint& point) override;
  void validate_mid_epoch() override;
  std::map<std::string, double> validate_end_of_epoch() override;
  void at_step_boundary() override;
  void at_epoch_end() override;
  bool validates_in_epoch(int64_t epoch) const override;
  int64_t accumulate_grad_batches(int64_t epoch) const override;
  void prepare_metric_states(bool train_batch_end) override;
  void check_stragglers() override;

  void name_learning_rates();
  CallbackContext context(const HookPoint& point) const;
  void sanity_check();
  void run_validation();
  void poll_signals();
  /// Once per optimizer step boundary: moves a sharded write in the background towards its commit
  /// (FitCheckpoints::advance_sharded_write), and saves a snapshot when one is due: once per
  /// snapshot_every_n_steps optimizer steps and/or at the step agree_time_due_step set, at the
  /// boundary of the batch that took the step, unless the fit is stopping there.
  void snapshot_if_due();
  /// Global rank 0, at the start of the fit, before any process can save: removes what snapshot and
  /// HPC writes killed half-way left in hpc_checkpoint_dir (volt::remove_interrupted_writes), and
  /// says so. Only when this run saves snapshots or HPC checkpoints there.
  void remove_interrupted_writes();
  /// Global rank 0, once the fit's files are complete: records in hpc_checkpoint_dir that the run
  /// finished (mark_run_finished), unless it stopped to go on later (interrupted, requeued), so
  /// a new launch there does not resume from its snapshots and HPC checkpoints.
  void mark_finished(StopReason reason);
  /// Kills this process when the injected fault strikes here (config_.fault at `point`).
  void inject_fault(FaultPoint point);
  /// Waits for the snapshot being written and says what the fit's snapshots cost.
  SnapshotStats finish_snapshots();
  /// Collective (snapshot_every_n_seconds), at the fit's first step boundary and after each
  /// snapshot: the step the next time-due snapshot comes at, as rank 0's pace makes it.
  int64_t agree_time_due_step();
  /// Refuses to go on inside an epoch under another stream layout than the one it began with
  /// (`source` names where that position came from); records the current layout.
  void check_stream_layout(const std::string& source);
  /// Asks for new loaders at the epochs reload_dataloaders_every_n_epochs names.
  void reload_dataloaders_if_due();

  FitLoopConfig config_;
  FitLoopParts parts_;
  FitData data_;
  std::unique_ptr<ProgressBar> bar_;       // training epochs
  std::unique_ptr<ProgressBar> eval_bar_;  // sanity check and validation
  TrainingEpochLoop epoch_loop_;
  ResultCollection val_results_;
  FitProgress progress_;
  FitCheckpoints checkpoints_;         // reads progress_
  std::string resumed_from_;           // the checkpoint restore() read, if any
  int64_t loaders_epoch_ = 0;          // the epoch the current loaders were asked for at
  bool past_first_epoch_ = false;      // whether this run's first epoch has started
  int64_t snapshot_checked_step_ = 0;  // the global step snapshot_if_due last looked at
  // snapshot_every_n_seconds: the step the next snapshot is due at (agreed), and where and when
  // rank 0's clock last started counting.
  std::optional<int64_t> time_due_step_;
  std::chrono::steady_clock::time_point snapshot_clock_;
  int64_t snapshot_clock_step_ = 0;
  std::optional<ProgressMarker> progress_marker_;  // rank 0 with snapshots: the step reached
  bool fault_armed_ = false;                       // an injected fault's step has come: it strikes at its point
  StopController stop_;
  struct LearningRateName {
    std::string name;
    size_t optimizer;
    size_t group;
    std::optional<Interval> interval;  // when its schedulers step; unset: none does
  };
  std::vector<LearningRateName> lr_names_;         // LearningRateMonitor's names, fixed per run
  std::unique_ptr<StragglerDetector> stragglers_;  // under ddp with detect_stragglers
  std::string straggler_note_;                     // the stragglers named now, "" when none
};

}  // namespace volt
