#include "volt/callbacks/lr_monitor.h"

#include <algorithm>

namespace volt {

void LearningRateMonitor::setup(const FitInfo& info) {
  log_every_n_steps_ = info.log_every_n_steps;
  last_logged_step_ = -1;
}

Decision LearningRateMonitor::on_train_epoch_start(const CallbackContext& context, CallbackServices& services) {
  if (logging_interval_ != Interval::kStep) log(context, services, Interval::kEpoch);
  return {};
}

Decision LearningRateMonitor::on_train_batch_end(const CallbackContext& context, CallbackServices& services) {
  if (logging_interval_ == Interval::kEpoch) return {};
  // After an optimizer step, at the cadence of the step metrics (a batch that only accumulated
  // did not step: its step was logged already).
  const bool due = context.global_step > 0 && context.global_step != last_logged_step_ &&
                   context.global_step % std::max<int64_t>(1, log_every_n_steps_) == 0;
  if (!due) return {};
  last_logged_step_ = context.global_step;
  log(context, services, Interval::kStep);
  return {};
}

void LearningRateMonitor::log(const CallbackContext& context, CallbackServices& services, Interval now) const {
  std::map<std::string, double> metrics;
  for (const auto& lr : context.learning_rates) {
    // An explicit interval logs everything then; by default a scheduled rate waits for its own
    // interval, and one no scheduler changes is logged at both, as in Lightning.
    if (!logging_interval_ && lr.interval && *lr.interval != now) continue;
    metrics[lr.name] = lr.lr;
  }
  if (!metrics.empty()) services.log_metrics(metrics);
}

}  // namespace volt
