// Stops training when a monitored metric stops improving.
#pragma once

#include <limits>
#include <optional>

#include "volt/callbacks/callback.h"

namespace volt {

/// Options of EarlyStopping, with Lightning's defaults.
///
/// Example: `EarlyStopping({.monitor = "val/loss", .patience = 2})`.
struct EarlyStoppingOptions {
  /// The metric to watch (required).
  std::string monitor;
  /// The smallest change that counts as an improvement.
  double min_delta = 0.0;
  /// Checks without improvement before stopping.
  int64_t patience = 3;
  /// Whether lower or higher is better.
  Mode mode = Mode::kMin;
  /// Stop at once when the metric is at least this good.
  std::optional<double> stopping_threshold;
  /// Stop at once when the metric is this bad or worse.
  std::optional<double> divergence_threshold;
  /// Stop when the metric becomes NaN or infinite.
  bool check_finite = true;
  /// Check at the end of each training epoch instead of after validation; unset: only when
  /// there is no validation.
  std::optional<bool> check_on_train_epoch_end;
};

/// Lightning's EarlyStopping: returns Decision::stop_training when patience runs out.
class EarlyStopping : public Callback {
 public:
  /// Throws volt::Error when the options are invalid (no monitor, negative patience).
  explicit EarlyStopping(EarlyStoppingOptions options);

  std::string state_key() const override;
  void setup(const FitInfo& info) override;
  Decision on_train_epoch_end(const CallbackContext& context, CallbackServices& services) override;
  Decision on_validation_end(const CallbackContext& context, CallbackServices& services) override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

  /// Checks without improvement so far.
  int64_t wait_count() const { return wait_count_; }
  /// The best value seen.
  double best_score() const { return best_score_; }

 private:
  Decision evaluate(const CallbackContext& context);

  EarlyStoppingOptions options_;
  bool check_on_train_epoch_end_ = false;
  int64_t wait_count_ = 0;
  int64_t stopped_epoch_ = 0;
  double best_score_;
};

}  // namespace volt
