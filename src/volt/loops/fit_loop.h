// The fit loop: epochs, validation, callbacks, checkpoints and stopping, from a fresh start or a
// restored position to a FitResult.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "volt/callbacks/callback.h"
#include "volt/checkpoint/checkpointer.h"
#include "volt/checkpoint/sharded_checkpoint.h"
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
struct RunPlan;

/// What a fit runs with, borrowed from the Trainer for one fit() call.
struct FitLoopParts {
  /// The resolved plan (limits, intervals, who writes).
  const RunPlan& plan;
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
  /// Borrows `parts` and `data` for the loop's lifetime.
  FitLoop(FitLoopParts parts, FitData data);
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
  TrainingParts training_parts() const;
  /// The registered metrics' states for a checkpoint saved now, in `local` or metric_states_;
  /// nullptr when the module registered none, or (with a warning) when they were not gathered.
  const StateDict* metric_states_for_save(std::optional<StateDict>& local);
  /// Gathers what a checkpoint saved before the next optimizer step needs from every process: the
  /// registered metrics' states and, when the strategy shards them (fsdp), the optimizers'.
  void gather_checkpoint_states();
  /// The optimizers' gathered states for a checkpoint saved now (nullptr when the strategy does
  /// not shard them); throws volt::Error when they were not gathered at this point.
  const std::vector<c10::IValue>* optimizer_states_for_save(const std::string& path) const;
  /// What a checkpoint saved now to `path` holds: the training parts with the registered
  /// metrics' states (in `local` or metric_states_) and the gathered optimizer states (none when
  /// they are sharded into files).
  TrainingParts parts_for_save(const std::string& path, std::optional<StateDict>& local);
  /// Rank 0, sharded checkpoints: builds the checkpoint of `parts` for `path`, without optimizer
  /// states and the parameters the strategy keeps in pieces, to be committed by
  /// commit_sharded_saves.
  void defer_sharded_save(const std::string& path, TrainingParts parts,
                          CheckpointContents contents = CheckpointContents::kFull);
  /// Throws volt::Error naming `path` when a checkpoint saved now would need states that the
  /// strategy gathers (or takes for the shards) only at a gather point, and none came before it.
  void check_gathered_for_save(const std::string& path) const;
  /// Whether checkpoints are sharded (strategy='fsdp' with state_dict_type='sharded').
  bool sharded_checkpoints() const;
  /// Under sharded checkpoints, after the dispatch a gather point prepared (and after an HPC
  /// save): every process writes its shard for each checkpoint rank 0 built since, then rank 0
  /// commits each by writing its file with the shard index. A collective at the same points on
  /// every process; a no-op when nothing was gathered.
  void commit_sharded_saves();
  /// Records that `path` was saved now (last_saved_, and train_end_saves_ while the train end runs).
  void note_saved(const std::string& path);
  /// Loads the registered metrics' states from `checkpoint` (see restore()).
  void restore_metric_states(const c10::IValue& checkpoint, const std::string& path);
  /// Refuses to go on inside an epoch under another stream layout than the one it began with
  /// (`source` names where that position came from); records the current layout.
  void check_stream_layout(const std::string& source);
  /// Asks for new loaders at the epochs reload_dataloaders_every_n_epochs names.
  void reload_dataloaders_if_due();

  FitLoopParts parts_;
  FitData data_;
  std::unique_ptr<ProgressBar> bar_;       // training epochs
  std::unique_ptr<ProgressBar> eval_bar_;  // sanity check and validation
  TrainingEpochLoop epoch_loop_;
  ResultCollection val_results_;
  FitProgress progress_;
  std::string resumed_from_;       // the checkpoint restore() read, if any
  int64_t loaders_epoch_ = 0;      // the epoch the current loaders were asked for at
  bool past_first_epoch_ = false;  // whether this run's first epoch has started
  StopController stop_;
  std::string last_saved_;
  // The checkpoints saved during on_train_end, printed with where the fit stopped; unset outside it.
  std::optional<std::vector<std::string>> train_end_saves_;
  // Every process's metric states, gathered by prepare_metric_states for the dispatch that follows.
  std::optional<StateDict> metric_states_;
  bool warned_metric_states_ = false;
  // The optimizers' whole states (fsdp), gathered with metric_states_; reset at the next gather
  // point, so a checkpoint never holds the state of an earlier step.
  std::optional<std::vector<c10::IValue>> optimizer_states_;
  // Sharded checkpoints: this process's shard, taken at the gather point for the saves that follow.
  struct LocalShard {
    std::vector<c10::IValue> optimizer_states;
    ParameterPieces parameters;
  };
  std::optional<LocalShard> local_shard_;
  // Rank 0, sharded checkpoints: the saves since the gather point, built but not yet committed.
  struct PendingSave {
    std::string path;
    StateDict checkpoint;
    bool weights_only = false;  // its shards hold only the parameters' pieces
  };
  std::vector<PendingSave> pending_saves_;
  // Rank 0, sharded checkpoints: checkpoints to remove once pending_saves_ are committed.
  std::vector<std::string> pending_removals_;
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
