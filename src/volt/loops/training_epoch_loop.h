// One training epoch: batches (each trained by the automatic or the manual optimization loop),
// step metrics, validation between batches, and the epoch's end (epoch metrics, epoch-interval
// schedulers).
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "volt/callbacks/callback.h"
#include "volt/checkpoint/checkpoint_state.h"
#include "volt/loops/automatic_optimization_loop.h"
#include "volt/loops/manual_optimization_loop.h"
#include "volt/module/lightning_module.h"
#include "volt/module/result_collection.h"
#include "volt/options/option_enums.h"

namespace volt {

class MetricRouter;
class PrecisionPlugin;
class Profiler;
class ProgressBar;
class StopController;
class Strategy;

/// What the training epoch loop reads of the run plan (made by fit_loop_config; nothing "auto").
struct TrainingEpochConfig {
  /// Where batches go (the plan's root device).
  c10::Device device = c10::Device(c10::kCPU);
  /// Optimizer steps at which the fit stops; -1: no limit.
  int64_t max_steps = -1;
  /// Batches between step metrics sent to the loggers.
  int64_t log_every_n_steps = 50;
  /// Batches between straggler checks; unset: none.
  std::optional<int64_t> straggler_every_n_steps;
  /// Clipping after each accumulation (unset: none), by norm or by value.
  std::optional<double> gradient_clip_val;
  /// How gradient_clip_val clips.
  GradientClipAlgorithm gradient_clip_algorithm = GradientClipAlgorithm::kNorm;
  /// Batches per optimizer step; manual optimization refuses more than 1.
  int64_t accumulate_grad_batches = 1;
  /// The strategy's kind: manual optimization refuses dp's and ddp2's split steps.
  StrategyKind strategy = StrategyKind::kSingleDevice;
};

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
/// (callbacks', then the module's), the batch's optimization, on_train_batch_end, step metrics,
/// callbacks, stop checks, mid-epoch validation. The optimization is one of two loops, as in
/// Lightning: AutomaticOptimizationLoop (training_step, backward, at the accumulation boundary
/// the optimizer step) or, when the module's automatic_optimization() is false,
/// ManualOptimizationLoop (training_step does the backward passes and steps itself, and the loop
/// steps no optimizer or scheduler).
class TrainingEpochLoop {
 public:
  /// Borrows everything; `bar` may be nullptr (no progress shown).
  /// `profiler` times each step's parts (Action's kStepParts) and moves its trace's schedule.
  /// Throws volt::Error when `config` asks for what manual optimization refuses.
  TrainingEpochLoop(const TrainingEpochConfig& config, Strategy& strategy, PrecisionPlugin& precision,
                    MetricRouter& metrics, LightningModule& module, DataLoader& train,
                    const OptimizerConfig& optimization, ProgressBar* bar, Profiler& profiler);

  /// Trains `num_batches` batches (unset: until every process's stream is dry) of epoch
  /// `progress.epoch` from `progress.batches_done`, then finishes the epoch unless a signal
  /// interrupted it; `val_interval` batches between validations (unset: at the epoch's end
  /// only). Updates `progress` as it goes.
  void run(FitProgress& progress, StopController& stop, EpochHooks& hooks, std::optional<int64_t> num_batches,
           std::optional<int64_t> val_interval);

  /// The values logged during the current epoch (training_step's, on_train_epoch_*'s).
  ResultCollection& results() { return results_; }

 private:
  void finish_epoch(FitProgress& progress, EpochHooks& hooks, bool complete, bool validate_at_end);
  void show_progress(int64_t done, bool force);

  TrainingEpochConfig config_;
  Strategy& strategy_;
  PrecisionPlugin& precision_;
  MetricRouter& metrics_;
  LightningModule& module_;
  DataLoader& train_;
  ProgressBar* bar_;
  Profiler& profiler_;
  // Exactly one of the two: the module's automatic_optimization() chooses.
  std::optional<AutomaticOptimizationLoop> automatic_;
  std::optional<ManualOptimizationLoop> manual_;
  ResultCollection results_;
  std::map<std::string, double> bar_metrics_;  // epoch values kept on the bar
  std::chrono::steady_clock::time_point last_bar_update_{};
};

}  // namespace volt
