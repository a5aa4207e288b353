// One training epoch: batches, forward and backward, optimizer steps, step metrics, and the
// epoch's end (epoch metrics, epoch-interval schedulers).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "volt/callbacks/callback.h"
#include "volt/checkpoint/checkpoint_state.h"
#include "volt/module/lightning_module.h"
#include "volt/module/manual_optimization.h"
#include "volt/module/result_collection.h"

namespace volt {

class MetricRouter;
class PrecisionPlugin;
class Profiler;
class ProgressBar;
class StopController;
class Strategy;
struct RunPlan;
struct StepInput;

/// What the epoch loop asks of the loop that runs it (the fit loop): callbacks, validation and
/// the agreement on stopping live there, since they outlast one epoch. Its dispatch calls a hook
/// on every callback; a stop it returns becomes a proposal.
class EpochHooks : public CallbackDispatcher {
 public:
  /// Runs a validation between two batches of the epoch (val_check_interval).
  virtual void validate_mid_epoch() = 0;
  /// Runs the validation due at the end of the epoch; returns its progress-bar values.
  virtual std::map<std::string, double> validate_end_of_epoch() = 0;
  /// At a step boundary: polls signals and agrees on stopping (without waiting under ddp).
  virtual void at_step_boundary() = 0;
  /// At the end of an epoch: agrees on stopping, waiting for every process.
  virtual void at_epoch_end() = 0;
  /// Whether validation runs during epoch `epoch` at all (check_val_every_n_epoch, val data).
  virtual bool validates_in_epoch(int64_t epoch) const = 0;
  /// How many batches epoch `epoch` accumulates before each optimizer step: a callback's schedule
  /// (GradientAccumulationScheduler), else the plan's accumulate_grad_batches.
  virtual int64_t accumulate_grad_batches(int64_t epoch) const = 0;
  /// Called by every process right before a dispatch at which a callback may save a checkpoint:
  /// gathers the module's registered metrics' states from every process (a collective, so it
  /// cannot wait for a save that only some processes make). `train_batch_end`: before
  /// on_train_batch_end, where it gathers only when a callback says it may save at this step.
  virtual void prepare_metric_states(bool train_batch_end) = 0;
  /// Every straggler_every_n_steps batches, on every process: exchanges the window's step times
  /// and names a process persistently slower than the others (a collective).
  virtual void check_stragglers() = 0;
};

/// Runs the training batches of one epoch from a FitProgress position.
///
/// Lightning's order per batch (docs/hooks.md): the batch transfer hooks, on_train_batch_start
/// (callbacks', then the module's), training_step (under autocast), on_before_backward, backward
/// (scaled by 1/accumulate_grad_batches), on_after_backward, at the accumulation boundary the
/// optimizer step (unscale, configure_gradient_clipping, on_before_optimizer_step, step or skip,
/// on_before_zero_grad, zero_grad, step-interval schedulers through lr_scheduler_step),
/// on_train_batch_end, step metrics, callbacks, stop checks, mid-epoch validation.
/// Under manual optimization (the module's automatic_optimization() false) training_step does
/// the backward passes and steps itself, through this loop's ManualOptimization, and the loop
/// steps no optimizer or scheduler.
class TrainingEpochLoop : private ManualOptimization {
 public:
  /// Borrows everything; `bar` may be nullptr (no progress shown).
  /// `profiler` times each step's parts (Action's kStepParts) and moves its trace's schedule.
  TrainingEpochLoop(const RunPlan& plan, Strategy& strategy, PrecisionPlugin& precision, MetricRouter& metrics,
                    LightningModule& module, DataLoader& train, const OptimizerConfig& optimization, ProgressBar* bar,
                    Profiler& profiler);

  /// Trains `num_batches` batches (unset: until every process's stream is dry) of epoch
  /// `progress.epoch` from `progress.batches_done`, then finishes the epoch unless a signal
  /// interrupted it; `val_interval` batches between validations (unset: at the epoch's end
  /// only). Updates `progress` as it goes.
  void run(FitProgress& progress, StopController& stop, EpochHooks& hooks, std::optional<int64_t> num_batches,
           std::optional<int64_t> val_interval);

  /// The values logged during the current epoch (training_step's, on_train_epoch_*'s).
  ResultCollection& results() { return results_; }

 private:
  // ManualOptimization: what a module with automatic_optimization() false calls.
  const OptimizerConfig& optimization() const override { return optimization_; }
  void backward(const torch::Tensor& loss) override;
  void step(size_t index) override;
  void clip_gradients(size_t index, double value, GradientClipAlgorithm algorithm) override;

  torch::Tensor training_step(const Batch& batch, int64_t index);
  torch::Tensor zero_loss() const;
  void optimizer_step(FitProgress& progress);
  void step_schedulers(Interval interval, int64_t count);
  /// The backward pass of `loss` between on_before_backward and on_after_backward (`hooks`:
  /// false on a replayed batch, whose loss is not the module's).
  void backward_with_hooks(const torch::Tensor& loss, bool synchronize, bool hooks);
  /// on_before_optimizer_step of the callbacks, then of the module.
  void before_optimizer_step(size_t index);
  /// Calls `hook` on the callbacks during run() (a step outside it has none to call).
  void dispatch(const CallbackHook& hook);
  void finish_epoch(FitProgress& progress, EpochHooks& hooks, bool complete, bool validate_at_end);
  void show_progress(int64_t done, bool force);

  const RunPlan& plan_;
  Strategy& strategy_;
  PrecisionPlugin& precision_;
  MetricRouter& metrics_;
  LightningModule& module_;
  DataLoader& train_;
  const OptimizerConfig& optimization_;
  ProgressBar* bar_;
  Profiler& profiler_;
  // Seconds of backward passes and optimizer steps run inside the current training_step (manual
  // optimization): "forward" is training_step less these.
  double inner_seconds_ = 0;
  bool manual_;                       // the module optimizes itself (automatic_optimization() false)
  FitProgress* progress_ = nullptr;   // during run(): where manual steps count
  EpochHooks* hooks_ = nullptr;       // during run(): the callbacks of optimizer steps
  const StepInput* input_ = nullptr;  // during a step: its weight, for manual_backward
  struct Clip {
    double value;
    GradientClipAlgorithm algorithm;
  };
  std::vector<std::optional<Clip>> clips_;  // per optimizer: the clip its next manual step applies
  ResultCollection results_;
  std::map<std::string, double> bar_metrics_;  // epoch values kept on the bar
  std::chrono::steady_clock::time_point last_bar_update_{};
};

}  // namespace volt
