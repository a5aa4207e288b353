// Logs the learning rates.
#pragma once

#include <optional>

#include "volt/callbacks/callback.h"

namespace volt {

/// Lightning's LearningRateMonitor: logs "lr-<Optimizer>" (and "/pg<i>" per extra param group).
///
/// By default (`logging_interval` unset, Lightning's None) each learning rate is logged when its
/// scheduler changes it: a step-interval scheduler's after optimizer steps, an epoch-interval
/// scheduler's at each epoch's start, and an optimizer's without a scheduler at both. Passing
/// Interval::kStep or Interval::kEpoch logs every learning rate at that interval instead. Step
/// logging follows the Trainer's log_every_n_steps (every that many optimizer steps), as the
/// step metrics and Lightning's monitor do.
///
/// Example: `options.callbacks.push_back(std::make_shared<volt::LearningRateMonitor>());`
class LearningRateMonitor : public Callback {
 public:
  /// Logs each learning rate at its scheduler's interval, or all of them at `logging_interval`.
  explicit LearningRateMonitor(std::optional<Interval> logging_interval = std::nullopt)
      : logging_interval_(logging_interval) {}

  std::string state_key() const override { return "LearningRateMonitor"; }
  void setup(const FitInfo& info) override;
  Decision on_train_epoch_start(const CallbackContext& context, CallbackServices& services) override;
  Decision on_train_batch_end(const CallbackContext& context, CallbackServices& services) override;

  /// The interval it logs every learning rate at; unset: each scheduler's own.
  std::optional<Interval> logging_interval() const { return logging_interval_; }

 private:
  /// Logs the learning rates due at `now` (Lightning's _extract_stats).
  void log(const CallbackContext& context, CallbackServices& services, Interval now) const;

  std::optional<Interval> logging_interval_;
  int64_t log_every_n_steps_ = 50;
  int64_t last_logged_step_ = -1;  // accumulating batches share a step: logged once
};

}  // namespace volt
