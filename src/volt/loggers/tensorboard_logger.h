// A logger that writes TensorBoard event files, as Lightning's TensorBoardLogger does.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "volt/loggers/logger.h"

namespace volt {

/// What TensorBoardLogger does beyond where it writes (that is LoggerOptions).
///
/// Example: `TensorBoardOptions tb; tb.flush_secs = 10; tb.default_hp_metric = false;`
struct TensorBoardOptions {
  /// Seconds between flushes of the event file while records arrive; save() and finalize()
  /// flush at once. 120 is the default of Lightning's (and TensorBoard's) SummaryWriter; 0
  /// flushes every record.
  double flush_secs = 120;
  /// Log the metric "hp_metric" = -1 at step 0 with the hyperparameters, as Lightning's
  /// `default_hp_metric=True` does, so TensorBoard's HPARAMS tab has a metric column.
  bool default_hp_metric = true;
  /// Appended to the event file's name, like SummaryWriter's `filename_suffix`.
  std::string filename_suffix;
};

/// Logs scalars and hyperparameters to a TensorBoard event file in log_dir().
///
/// The file is `events.out.tfevents.<unix time>.<hostname>.<pid>.<n>` (n counts the files this
/// process opened), created with log_dir() on the first record; its first record says
/// "brain.Event:2". log_metrics() writes one event per call: a `simple_value` (float32) per
/// metric, tagged with the metric's name, at the given step. log_hyperparams() writes the
/// hparams plugin's experiment and session start, as Lightning does (nested objects flattened to
/// "a/b" names), plus `hparams.yaml`; finalize() writes the session's end with its status, then
/// closes the file. A record logged after finalize() starts a new file, as Lightning's does.
///
/// To share one version folder with CSVLogger, resolve it once and give both the same options:
/// `options.version = resolve_version(options);`.
class TensorBoardLogger : public Logger {
 public:
  /// The first record of every event file, which readers use to recognise the format.
  static constexpr const char* kFileVersion = "brain.Event:2";
  /// The prefix of every event file's name; TensorBoard only reads files whose names contain it.
  static constexpr const char* kEventFilePrefix = "events.out.tfevents.";
  /// The metric logged with the hyperparameters when `default_hp_metric` is set.
  static constexpr const char* kHpMetric = "hp_metric";

  /// A logger writing under `resolve_log_dir(options)`, resolved once, here; creates nothing yet.
  explicit TensorBoardLogger(const LoggerOptions& options, const TensorBoardOptions& tensorboard_options = {});
  /// Flushes and closes the file; an error is a warning on `options.console`, since a destructor
  /// cannot throw.
  ~TensorBoardLogger() override;
  TensorBoardLogger(const TensorBoardLogger&) = delete;
  TensorBoardLogger& operator=(const TensorBoardLogger&) = delete;

  std::string name() const override;
  std::string log_dir() const override;
  /// The run's folder name inside `<save_dir>/<name>`, e.g. "version_3" or "12345_3".
  std::string version() const;
  /// The path of the event file being written, or "" before the first record.
  std::string event_file_path() const;

  /// Merges `params` (a JSON object) into the hyperparameters, writes them to the hparams plugin
  /// and `hparams.yaml`, and logs "hp_metric" = -1 at step 0 if `default_hp_metric` is set.
  void log_hyperparams(const nlohmann::json& params) override;
  /// Writes one event at `step` holding every metric as a float32 scalar.
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step) override;
  /// Flushes the event file to the operating system.
  void save() override;
  /// Writes the hparams session's end ("success", "failed"; anything else is recorded as
  /// unknown, e.g. "interrupted") if hyperparameters were logged, then flushes and closes.
  void finalize(const std::string& status) override;

 private:
  // Keeps protobuf's generated headers out of users' includes.
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace volt
