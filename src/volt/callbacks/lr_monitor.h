// Logs the learning rates.
#pragma once

#include <optional>

#include "volt/callbacks/callback.h"
#include "volt/module/lightning_module.h"

namespace volt {

/// Lightning's LearningRateMonitor: logs "lr-<Optimizer>" (and "/pg<i>" per extra param group).
class LearningRateMonitor : public Callback {
 public:
  /// Log every step or every epoch; unset: every epoch (step-interval schedulers change lr
  /// inside the epoch, so pass Interval::kStep for them).
  explicit LearningRateMonitor(std::optional<Interval> logging_interval = std::nullopt)
      : interval_(logging_interval.value_or(Interval::kEpoch)) {}

  std::string state_key() const override { return "LearningRateMonitor"; }
  Decision on_train_epoch_start(const CallbackContext& context, CallbackServices& services) override;
  Decision on_train_batch_end(const CallbackContext& context, CallbackServices& services) override;

 private:
  void log(const CallbackContext& context, CallbackServices& services) const;
  Interval interval_;
};

}  // namespace volt
