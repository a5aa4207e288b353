// A logger that writes Lightning's CSVLogger layout: `metrics.csv` and `hparams.yaml`.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "volt/loggers/logger.h"

namespace volt {

/// Logs metrics to `<log_dir>/metrics.csv` and hyperparameters to `<log_dir>/hparams.yaml`.
///
/// The CSV is the one Lightning's CSVLogger writes: a header of the sorted union of all metric
/// keys and `step`, a row per log_metrics() call, an empty cell where a row lacks a key, floats in
/// Python's round-trip form, "\r\n" line ends (Python's csv default). A key first seen after rows
/// were written rewrites the file under the wider header. Rows are buffered and written every
/// `flush_logs_every_n_steps` calls, on save() and finalize(); the log directory is created on
/// the first write, and a `metrics.csv` already there is replaced, as Lightning does.
class CSVLogger : public Logger {
 public:
  /// The metrics file's name inside log_dir().
  static constexpr const char* kMetricsFileName = "metrics.csv";
  /// The hyperparameters file's name inside log_dir().
  static constexpr const char* kHparamsFileName = "hparams.yaml";

  /// A logger writing under `resolve_log_dir(options)`, resolved once, here.
  explicit CSVLogger(const LoggerOptions& options, int flush_logs_every_n_steps = 100);
  /// Writes buffered rows; an error is a warning on `options.console`, since a destructor cannot throw.
  ~CSVLogger() override;
  CSVLogger(const CSVLogger&) = delete;
  CSVLogger& operator=(const CSVLogger&) = delete;

  std::string name() const override;
  std::string log_dir() const override;
  /// Merges `params` (a JSON object) into the hyperparameters and rewrites `hparams.yaml` now.
  void log_hyperparams(const nlohmann::json& params) override;
  /// Buffers a row; a metric named "step" is replaced by `step`, as in Lightning.
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step) override;
  void save() override;
  void finalize(const std::string& status) override;

 private:
  struct Row {
    int64_t step;
    std::map<std::string, double> values;
  };

  /// The header of an existing metrics.csv at `path` (empty when there is none), to append to it.
  static std::vector<std::string> read_existing_header(const std::string& path);
  std::string metrics_path() const;
  void create_log_dir() const;
  void rewrite_with_header(const std::vector<std::string>& header) const;
  std::string format_row(const Row& row) const;

  std::string name_;
  std::string log_dir_;
  bool append_ = false;
  int flush_logs_every_n_steps_;
  std::shared_ptr<Console> console_;
  nlohmann::json hparams_ = nlohmann::json::object();
  std::vector<Row> pending_;
  /// The header of the file on disk, sorted; empty until the first row is written.
  std::vector<std::string> header_;
};

}  // namespace volt
