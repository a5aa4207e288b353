// Weight averaging: Lightning's StochasticWeightAveraging and EMAWeightAveraging.
//
// Both keep an averaged copy of the module's weights beside the trained ones and put it into
// the module when training ends. Their whole state (the averaged tensors and the counters that
// say which steps or epochs were averaged) goes into checkpoints, so a resumed run, even one
// resumed inside an epoch, ends bit-identical to one that never stopped.
#pragma once

#include <torch/types.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "volt/callbacks/callback.h"

namespace volt {

/// Averages `averaged` (already holding `num_averaged` values) with `current`; returns the new average.
using AverageFn =
    std::function<torch::Tensor(const torch::Tensor& averaged, const torch::Tensor& current, int64_t num_averaged)>;

/// When SWA starts: an epoch (1-based, as Lightning counts it) or a fraction of max_epochs.
struct SwaEpochStart {
  /// Start at epoch `epoch` (1-based: 1 is the first epoch).
  SwaEpochStart(int epoch) : epoch(epoch) {}  // NOLINT: implicit so that `.swa_epoch_start = 2` reads naturally
  /// Start at epoch `epoch` (1-based).
  SwaEpochStart(int64_t epoch) : epoch(epoch) {}  // NOLINT: implicit, as above
  /// Start after `fraction` of max_epochs (Lightning: int(max_epochs * fraction)).
  SwaEpochStart(double fraction) : fraction(fraction) {}  // NOLINT: implicit, as above
  /// The epoch, when one was given.
  std::optional<int64_t> epoch;
  /// The fraction, when one was given.
  std::optional<double> fraction;
};

/// Options of StochasticWeightAveraging, with Lightning's defaults.
///
/// Example: `StochasticWeightAveraging({.swa_lrs = {0.05}, .swa_epoch_start = 3})`.
struct StochasticWeightAveragingOptions {
  /// The learning rates SWA anneals to: one for every param group, or one per param group of
  /// the optimizer (required; each > 0).
  std::vector<double> swa_lrs;
  /// When averaging starts: an int epoch (>= 1) or a fraction of max_epochs in [0, 1].
  SwaEpochStart swa_epoch_start = 0.8;
  /// Epochs over which the learning rates go from their value to swa_lrs (0: at once).
  int64_t annealing_epochs = 10;
  /// "cos" or "linear" (torch's SWALR anneal_strategy).
  std::string annealing_strategy = "cos";
  /// How to average; unset (empty): the running mean `averaged + (current - averaged) / (n + 1)`.
  AverageFn avg_fn;
};

/// Lightning's StochasticWeightAveraging: from swa_epoch_start, anneals the learning rates to
/// swa_lrs (torch's SWALR, stepped once an epoch) and averages the weights at the start of each
/// epoch from then on (Lightning's points: the weights every epoch from swa_epoch_start ends
/// with, except the last); the module gets the average when the last epoch (max_epochs) ends.
///
/// Refused, with Lightning's reasons: more than one optimizer; and, beyond Lightning, any
/// learning-rate scheduler (Lightning swaps a single one for SWALR; Volt's callbacks cannot
/// replace the Trainer's schedulers) and modules with BatchNorm running statistics (Lightning
/// recomputes them in an extra pass over the training data, which a callback cannot run).
class StochasticWeightAveraging : public Callback {
 public:
  /// Throws volt::Error when the options are invalid.
  explicit StochasticWeightAveraging(StochasticWeightAveragingOptions options);

  std::string state_key() const override;
  void setup(const FitInfo& info) override;
  Decision on_fit_start(const CallbackContext& context, CallbackServices& services) override;
  Decision on_train_epoch_start(const CallbackContext& context, CallbackServices& services) override;
  Decision on_train_end(const CallbackContext& context, CallbackServices& services) override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

  /// How many weight sets the average holds.
  int64_t n_averaged() const { return n_averaged_; }
  /// The first averaged epoch, 0-based (known after on_fit_start).
  int64_t swa_start() const { return swa_start_; }
  /// The averaged parameters by name (empty before the first average).
  const std::map<std::string, torch::Tensor>& average() const { return average_; }

 private:
  void step_swalr(torch::optim::Optimizer& optimizer);

  StochasticWeightAveragingOptions options_;
  std::optional<int64_t> max_epochs_;
  size_t num_lr_schedulers_ = 0;
  int64_t swa_start_ = 0;
  int64_t swa_end_ = 0;
  std::map<std::string, torch::Tensor> average_;
  int64_t n_averaged_ = 0;
  int64_t latest_update_epoch_ = -1;
  // SWALR's _step_count (0: not started) and the epoch at whose start it last stepped.
  int64_t scheduler_step_count_ = 0;
  int64_t scheduler_epoch_ = -1;
};

/// Options of EMAWeightAveraging, with Lightning's defaults.
///
/// Example: `EMAWeightAveraging({.decay = 0.99, .update_starting_at_step = 100})`.
struct EMAWeightAveragingOptions {
  /// The weight of the old average at each update: average = decay * average + (1 - decay) * current.
  double decay = 0.999;
  /// Update after every n-th optimizer step (counting from step index 0); 0: never after steps.
  int64_t update_every_n_steps = 1;
  /// Update after steps from this 0-based step index on; unset: from the first.
  std::optional<int64_t> update_starting_at_step;
  /// Also update at the end of every epoch from this 0-based epoch on; unset: never at epoch ends.
  std::optional<int64_t> update_starting_at_epoch;
  /// Average the buffers too (BatchNorm's running statistics); false: copy them.
  bool use_buffers = true;
  /// Validate with the average (swapped in for each validation pass, swapped back after), as
  /// Lightning's WeightAveraging always does.
  bool use_average_for_validation = true;
};

/// Lightning's EMAWeightAveraging (a WeightAveraging over an exponential moving average): after
/// each optimizer step that should_update picks, the average moves toward the current weights;
/// validation runs on the average; checkpoints hold it as their weights; the module gets the
/// average when training ends.
class EMAWeightAveraging : public Callback {
 public:
  /// Throws volt::Error when the options are invalid.
  explicit EMAWeightAveraging(EMAWeightAveragingOptions options = {});

  std::string state_key() const override;
  void setup(const FitInfo& info) override;
  Decision on_fit_start(const CallbackContext& context, CallbackServices& services) override;
  Decision on_train_batch_end(const CallbackContext& context, CallbackServices& services) override;
  Decision on_train_epoch_end(const CallbackContext& context, CallbackServices& services) override;
  Decision on_train_end(const CallbackContext& context, CallbackServices& services) override;
  Decision on_validation_epoch_start(const CallbackContext& context, CallbackServices& services) override;
  Decision on_validation_epoch_end(const CallbackContext& context, CallbackServices& services) override;
  /// Swaps the trained weights back when a validation pass threw while the average was in.
  void on_exception(const CallbackContext& context, const std::exception& error, CallbackServices& services) override;
  /// Lightning's layout: the average becomes the checkpoint's "state_dict" (what validate, test,
  /// predict and load_weights read: the weights that were validated), the trained weights move
  /// to "current_model_state", and "averaging_state" holds n_averaged.
  void on_save_checkpoint(const CallbackContext& context, StateDict& checkpoint) override;
  /// Reads that layout back: the average from "state_dict", the module's trained weights from
  /// "current_model_state" (a checkpoint without it leaves both as "state_dict", as Lightning).
  void on_load_checkpoint(const CallbackContext& context, const StateDict& checkpoint) override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

  /// Whether to update after step `step_idx` (0-based) or at the end of epoch `epoch_idx`
  /// (exactly one is set); Lightning's should_update.
  bool should_update(std::optional<int64_t> step_idx, std::optional<int64_t> epoch_idx) const;
  /// How many updates the average has had.
  int64_t n_averaged() const { return n_averaged_; }
  /// The averaged parameters (and buffers with use_buffers) by name.
  const std::map<std::string, torch::Tensor>& average() const { return average_; }

 private:
  void update(LightningModule& module);
  void swap(LightningModule& module);

  EMAWeightAveragingOptions options_;
  std::map<std::string, torch::Tensor> average_;
  int64_t n_averaged_ = 0;
  // Lightning's counters: the global step and epoch of the latest update.
  int64_t latest_update_step_ = 0;
  int64_t latest_update_epoch_ = -1;
  bool swapped_ = false;
};

}  // namespace volt
