// Collects what a module logs during one stage and turns it into step and epoch metrics.
#pragma once

#include <map>
#include <string>

#include "volt/base/collectives.h"
#include "volt/module/lightning_module.h"

namespace volt {

/// Where a metric value is headed.
enum class MetricTarget {
  kLogger,    ///< values with LogOptions::logger
  kProgBar,   ///< values with LogOptions::prog_bar
  kCallback,  ///< every value (what ModelCheckpoint and EarlyStopping monitor)
};

/// The metrics logged in one stage (training, validation, test), Lightning's `_ResultCollection`.
///
/// A name logged with both on_step and on_epoch appears as `<name>_step` per step and
/// `<name>_epoch` per epoch, as in Lightning; the callback metrics also carry the plain name.
class ResultCollection : public MetricSink {
 public:
  /// `training` picks the on_step/on_epoch defaults (training_step: step; evaluation: epoch).
  /// Values logged on_step with sync_dist are reduced over `step_sync` as they are logged
  /// (training, where every process runs the same steps); nullptr: they stay this process's
  /// (evaluation, whose processes may run different numbers of batches). Borrowed.
  explicit ResultCollection(bool training, Collectives* step_sync = nullptr);

  /// The weight of the next logged means (the current batch's example count).
  void set_batch_size(int64_t batch_size) { batch_size_ = batch_size; }
  /// Appended to every name logged from now on ("/dataloader_idx_1" while a stage's second
  /// loader runs; empty: none).
  void set_name_suffix(std::string suffix) { suffix_ = std::move(suffix); }
  void log(const std::string& name, const torch::Tensor& value, const LogOptions& options) override;
  /// Records `metric` under `name`; sync_epoch computes it (see LightningModule::log).
  void log_metric(const std::string& name, Metric& metric, const LogOptions& options) override;
  /// Takes over the metrics logged into `other` that this collection lacks: a step repeated only
  /// to keep a process's collectives in line restores the values from before it, but the metrics
  /// it logged must still be computed with everyone else's at the end of the epoch.
  void keep_metrics_from(const ResultCollection& other);

  /// Values logged with on_step since the last step_metrics call for `target`.
  std::map<std::string, double> step_metrics(MetricTarget target) const;
  /// The epoch aggregates of values logged with on_epoch, for `target`.
  std::map<std::string, double> epoch_metrics(MetricTarget target) const;
  /// Reduces the epoch aggregates of sync_dist values across processes: weighted means become
  /// means over every process's examples (so padding-free validation accuracy is the same for
  /// 1, 2 or 3 processes), sums add up, max/min take the extreme, all over `collectives`; every
  /// process must call this at the same point and must have logged the same sync_dist names.
  /// Each logged Metric is computed through `collectives` and reset; with several processes, one
  /// small collective first checks that every process logged the same metrics (each throws
  /// volt::Error if not, rather than wait for a collective the others never start).
  void sync_epoch(Collectives& collectives = local_collectives());
  /// Forgets everything logged in the epoch (call at each epoch start).
  void reset();
  /// True when nothing was logged since the last reset.
  bool empty() const { return entries_.empty(); }

 private:
  struct Entry {
    LogOptions options;  // on_step and on_epoch resolved
    double last = 0.0;
    double aggregate = 0.0;
    double weight = 0.0;
    int64_t count = 0;
    Metric* metric = nullptr;  // log(name, metric): computed into `aggregate` by sync_epoch
  };
  void compute_metrics(Collectives& collectives);
  static bool wanted(const Entry& entry, MetricTarget target);

  bool training_;
  Collectives* step_sync_;
  int64_t batch_size_ = 1;
  std::string suffix_;
  std::map<std::string, Entry> entries_;
};

}  // namespace volt
