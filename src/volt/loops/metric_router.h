// Where a stage's logged values go: callbacks and schedulers, the loggers, the progress bar.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace volt {

class Logger;
class ResultCollection;

/// Routes metrics from the module's result collections to their readers.
///
/// One router per Trainer stage; the callback metrics it writes belong to the Trainer, so the
/// values of an earlier fit stay visible to a later validate() or test().
class MetricRouter {
 public:
  /// Writes callback values into `callback_metrics` and logger values to `loggers`.
  MetricRouter(std::map<std::string, double>& callback_metrics, std::vector<std::shared_ptr<Logger>> loggers = {});

  /// The values callbacks and schedulers read (ModelCheckpoint's and ReduceLROnPlateau's monitors).
  const std::map<std::string, double>& callback_metrics() const { return callback_metrics_; }
  /// The loggers in use (empty on every rank but global rank 0).
  const std::vector<std::shared_ptr<Logger>>& loggers() const { return loggers_; }
  /// The first logger's folder, or "" without loggers.
  std::string log_dir() const;

  /// A batch's values: to the callbacks always, to the loggers when `log_now` (log_every_n_steps).
  void publish_step(const ResultCollection& results, int64_t epoch, int64_t step, bool log_now);
  /// An epoch's (or an evaluation's) aggregated values, to the callbacks and the loggers.
  void publish_epoch(const ResultCollection& results, int64_t epoch, int64_t step);
  /// Values a callback logs itself (LearningRateMonitor), tagged with `epoch` as Lightning does.
  void log(const std::map<std::string, double>& metrics, int64_t epoch, int64_t step);

  /// Tells the loggers a checkpoint file is complete at `path` (MLFlowLogger uploads it).
  void after_save_checkpoint(const std::string& path);
  /// Flushes the loggers (end of an epoch).
  void save();
  /// Tells the loggers how the run ended: "success", "interrupted", "requeued" or "failed".
  void finalize(const std::string& status);
  /// finalize("failed") that never throws, for unwinding from an error.
  void finalize_failed() noexcept;

 private:
  std::map<std::string, double>& callback_metrics_;
  std::vector<std::shared_ptr<Logger>> loggers_;
};

}  // namespace volt
