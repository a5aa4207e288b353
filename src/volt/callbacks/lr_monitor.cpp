#include "volt/callbacks/lr_monitor.h"

namespace volt {

Decision LearningRateMonitor::on_train_epoch_start(const CallbackContext& context, CallbackServices& services) {
  if (interval_ == Interval::kEpoch) log(context, services);
  return {};
}

Decision LearningRateMonitor::on_train_batch_end(const CallbackContext& context, CallbackServices& services) {
  if (interval_ == Interval::kStep) log(context, services);
  return {};
}

void LearningRateMonitor::log(const CallbackContext& context, CallbackServices& services) const {
  std::map<std::string, double> metrics;
  for (const auto& lr : context.learning_rates) metrics[lr.name] = lr.lr;
  if (!metrics.empty()) services.log_metrics(metrics);
}

}  // namespace volt
