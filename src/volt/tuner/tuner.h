// The tuner (Lightning's Tuner): the learning-rate finder and the batch-size finder. Each runs
// short fits of the module with the Trainer's options, then puts the module back as it was.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "volt/core/env.h"
#include "volt/options/trainer_options.h"
#include "volt/plan/run_plan.h"

namespace volt {

class LightningModule;

/// How the learning-rate finder raises the rate from step to step.
enum class LrFindMode {
  kExponential,  ///< "exponential": min_lr * (max_lr / min_lr)^(i / num_training); even in log scale
  kLinear,       ///< "linear": min_lr + (max_lr - min_lr) * i / num_training
};
/// "exponential" or "linear".
const char* to_string(LrFindMode mode);
/// Parses "exponential" or "linear", in any case.
LrFindMode parse_lr_find_mode(const std::string& text);

/// Options of the learning-rate finder (Lightning's Tuner.lr_find).
struct LrFindOptions {
  double min_lr = 1e-8;        ///< the first step's rate (> 0)
  double max_lr = 1.0;         ///< the rate the sweep approaches (> min_lr)
  int64_t num_training = 100;  ///< training steps of the sweep (>= 2)
  LrFindMode mode = LrFindMode::kExponential;
  /// Stop once the smoothed loss exceeds this many times the best so far (diverged); unset:
  /// run all num_training steps.
  std::optional<double> early_stop_threshold = 4.0;
  /// Steps left out of the suggestion at the start (the loss is still settling) and at the end.
  int64_t skip_begin = 10;
  int64_t skip_end = 1;  ///< see skip_begin
};

/// What the learning-rate finder measured: the rate and the smoothed loss of every step.
struct LrFindResult {
  std::vector<double> lr;    ///< the rate of each step
  std::vector<double> loss;  ///< the loss after each step, smoothed (exponential average, bias-corrected)
  /// The step whose rate is suggested: the steepest descent of the loss; unset when too few
  /// steps had a finite loss.
  std::optional<size_t> suggestion_index;
  /// The suggested rate (lr[suggestion_index]); unset like suggestion_index.
  std::optional<double> suggestion() const;
  /// "step,lr,loss" rows with a last column "suggested" (1 on the suggested step), for `volt plot`.
  std::string to_csv() const;
};

/// The rate of step `step` of the sweep (0-based).
double lr_at(const LrFindOptions& options, int64_t step);
/// The index of the steepest descent of `loss` (the most negative central difference, as
/// numpy.gradient), skipping `skip_begin` steps at the start and `skip_end` at the end and any
/// non-finite loss; unset when fewer than 2 steps remain.
std::optional<size_t> steepest_descent(const std::vector<double>& loss, int64_t skip_begin, int64_t skip_end);

/// How the batch-size finder searches (Lightning's scale_batch_size mode).
enum class BatchSizeMode {
  kPower,      ///< "power": doubles until a trial fails; the last size that worked
  kBinsearch,  ///< "binsearch": doubles until a trial fails, then bisects between the last two
};
/// "power" or "binsearch".
const char* to_string(BatchSizeMode mode);
/// Parses "power" or "binsearch", in any case.
BatchSizeMode parse_batch_size_mode(const std::string& text);

/// Options of the batch-size finder (Lightning's Tuner.scale_batch_size).
struct BatchSizeOptions {
  BatchSizeMode mode = BatchSizeMode::kPower;
  int64_t init_val = 2;         ///< the first size tried (>= 1)
  int64_t max_trials = 25;      ///< sizes tried at most (>= 1)
  int64_t steps_per_trial = 3;  ///< training steps of each trial (>= 1)
  /// The hyperparameter the module's train_dataloader reads its batch size from
  /// (`hparams()[batch_arg_name]`); the finder sets it for each trial and leaves the result.
  std::string batch_arg_name = "batch_size";
  /// Sets the batch size the module's next train_dataloader() uses, instead of the hyperparameter
  /// (a field of the module's own options, say).
  std::function<void(int64_t)> set_batch_size;
  /// A trial whose peak memory (the process's resident set on the CPU, the allocator's peak on a
  /// GPU) grows by more than this many MiB over what it started with fails, like one that runs out
  /// of memory; unset: only running out of memory fails a trial.
  std::optional<double> max_memory_mb;
};

/// What a trial of one batch size found.
enum class TrialOutcome {
  kFits,         ///< trained its steps within the limits
  kTooLarge,     ///< ran out of memory, or over max_memory_mb
  kDataTooSmall  ///< the loader had fewer batches than steps_per_trial: larger sizes cannot tell more
};

/// The search alone: `trial(size)` says whether a size fits. Returns the largest size found to
/// fit (at least init_val's trial must fit, else volt::Error with a HINT).
int64_t search_batch_size(const BatchSizeOptions& options, const std::function<TrialOutcome(int64_t)>& trial);

/// Lightning's Tuner: `Tuner tuner(options); auto found = tuner.lr_find(module);`.
///
/// Each method runs short fits of `module` with the Trainer's options, adjusted for the search
/// (no validation, checkpoints, loggers, progress bar or the options' callbacks; a fresh run, not a
/// resume), then restores the module's parameters and buffers and the global random generator, so
/// that a fit after tuning starts where it would have without it. The optimizers are the ones
/// configure_optimizers makes for each fit. One process only: a multi-process run is refused with
/// a HINT (tune on one device, then pass the values to the distributed run).
class Tuner {
 public:
  /// Tunes for `options` in this process's environment.
  explicit Tuner(TrainerOptions options);
  /// Like above with an explicit environment and machine (tests).
  Tuner(TrainerOptions options, Env env, MachineInfo machine);

  /// Sweeps the learning rate from min_lr up over num_training steps and suggests the rate of the
  /// loss's steepest descent. Set it yourself (LibTorch modules have no attribute to update):
  /// `options.lr = *tuner.lr_find(module).suggestion();`.
  LrFindResult lr_find(LightningModule& module, const LrFindOptions& options = {});
  /// The largest batch size (powers of two from init_val, or bisected) that trains
  /// steps_per_trial steps without running out of memory (or over max_memory_mb). Leaves the
  /// module's batch size (the hyperparameter or the setter's) at the result.
  int64_t scale_batch_size(LightningModule& module, const BatchSizeOptions& options = {});

 private:
  /// The options of a search fit of `max_steps` steps with `callbacks` only.
  TrainerOptions search_options(int64_t max_steps) const;
  /// Refuses what the tuner cannot run (several processes), naming `what`.
  void check_single_process(const char* what) const;

  TrainerOptions options_;
  Env env_;
  MachineInfo machine_;
};

}  // namespace volt
