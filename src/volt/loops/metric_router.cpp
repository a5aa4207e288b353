#include "volt/loops/metric_router.h"

#include "volt/loggers/logger.h"
#include "volt/module/result_collection.h"

namespace volt {

MetricRouter::MetricRouter(std::map<std::string, double>& callback_metrics,
                           std::vector<std::shared_ptr<Logger>> loggers)
    : callback_metrics_(callback_metrics), loggers_(std::move(loggers)) {}

std::string MetricRouter::log_dir() const { return loggers_.empty() ? "" : loggers_.front()->log_dir(); }

void MetricRouter::publish_step(const ResultCollection& results, int64_t epoch, int64_t step, bool log_now) {
  for (const auto& [name, value] : results.step_metrics(MetricTarget::kCallback)) callback_metrics_[name] = value;
  if (log_now) log(results.step_metrics(MetricTarget::kLogger), epoch, step);
}

void MetricRouter::publish_epoch(const ResultCollection& results, int64_t epoch, int64_t step) {
  for (const auto& [name, value] : results.epoch_metrics(MetricTarget::kCallback)) callback_metrics_[name] = value;
  log(results.epoch_metrics(MetricTarget::kLogger), epoch, step);
}

void MetricRouter::log(const std::map<std::string, double>& metrics, int64_t epoch, int64_t step) {
  if (metrics.empty() || loggers_.empty()) return;
  auto with_epoch = metrics;
  with_epoch["epoch"] = static_cast<double>(epoch);
  for (const auto& logger : loggers_) logger->log_metrics(with_epoch, step);
}

void MetricRouter::after_save_checkpoint(const std::string& path) {
  for (const auto& logger : loggers_) logger->after_save_checkpoint(path);
}

void MetricRouter::save() {
  for (const auto& logger : loggers_) logger->save();
}

void MetricRouter::finalize(const std::string& status) {
  for (const auto& logger : loggers_) logger->finalize(status);
}

void MetricRouter::finalize_failed() noexcept {
  for (const auto& logger : loggers_) {
    try {
      logger->finalize("failed");
    } catch (...) {
      // The error on its way up is the one to report; a logger that cannot close adds nothing.
    }
  }
}

}  // namespace volt
