// The interface every logger implements, and where loggers write.
//
// Loggers are torch-free: the trainer turns tensors into doubles before it calls them, so this
// area builds and tests without LibTorch.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "volt/core/console.h"

namespace volt {

/// Receives hyperparameters and scalar metrics from the trainer (rank 0 only).
class Logger {
 public:
  virtual ~Logger() = default;

  /// The experiment name, e.g. "lightning_logs".
  virtual std::string name() const = 0;
  /// The directory this run writes to, e.g. `<save_dir>/lightning_logs/version_3`.
  virtual std::string log_dir() const = 0;
  /// Records the run's hyperparameters; `params` is a JSON object, merged into earlier ones.
  virtual void log_hyperparams(const nlohmann::json& params) = 0;
  /// Records one set of scalar metrics taken at global step `step`.
  virtual void log_metrics(const std::map<std::string, double>& metrics, int64_t step) = 0;
  /// Called on global rank 0 after a checkpoint file is complete at `path` (Lightning's
  /// after_save_checkpoint): a logger that keeps models (MLFlowLogger's log_model) uploads it,
  /// with a sharded checkpoint's shards (checkpoint_files).
  virtual void after_save_checkpoint(const std::string& path) {}
  /// Called after the run's resolved configuration was written to `path` (`config.yaml`), for a
  /// logger that keeps files with the run.
  virtual void after_save_config(const std::string& path) {}
  /// Writes anything buffered to storage.
  virtual void save() {}
  /// Called once at the end of a run; `status` is "success", "failed" or "interrupted".
  virtual void finalize(const std::string& status) {}
};

/// Where a logger writes: Lightning's `<save_dir>/<name>/<version>` layout, and where it reports
/// what it cannot throw (a file it could not write, a server that does not answer).
///
/// Example: `LoggerOptions options; options.save_dir = "runs"; options.name = "mnist";` writes
/// to `runs/mnist/version_0`, then `runs/mnist/version_1` on the next run.
struct LoggerOptions {
  /// The root directory of all experiments.
  std::string save_dir = ".";
  /// The experiment name, a folder under `save_dir`; empty puts versions directly in `save_dir`.
  std::string name = "lightning_logs";
  /// The run's folder name, used verbatim (e.g. "version_7" or a SLURM job id); unset means
  /// `version_<N>` with N one more than the largest existing `version_<digits>` folder (0 if none).
  std::optional<std::string> version;
  /// Continue files an earlier run left in the version folder (CSVLogger's metrics.csv) instead of
  /// starting them over: a requeued SLURM job logs into its job-id folder again after a restart.
  bool append = false;
  /// Where the logger's warnings go: stdout and stderr by default; the Trainer gives the loggers
  /// it makes its own console (Trainer::set_console), so they print once per run and tests can
  /// read them. Called from MLFlowLogger's sender thread too. Must not be null.
  std::shared_ptr<Console> console = make_stdio_console();
};

/// The files that make up the checkpoint at `path`: `path`, then the shard files of a sharded
/// (fsdp) checkpoint beside it, `<path>.<save id: 16 hex digits>.shard<rank>`
/// (docs/checkpoint-format.md), in rank order. A logger that keeps a checkpoint keeps them all:
/// the index alone is no model. Reads the folder's listing; a missing folder lists `path` alone.
std::vector<std::string> checkpoint_files(const std::string& path);

/// The folder name of numbered version `number`, "version_<number>": what Lightning makes of an
/// integer `version`. Example: `options.version = version_name(3);` writes to `.../version_3`.
std::string version_name(long long number);

/// The run's folder name `options` give: `*options.version` if set, else the next free
/// `version_<N>` under `<save_dir>/<name>` as the file system is now.
///
/// Several loggers of one run share a folder by resolving once and passing the result on:
/// `options.version = resolve_version(options);` then the same `options` to CSVLogger and
/// TensorBoardLogger. Pure apart from reading the directory listing; creates nothing.
std::string resolve_version(const LoggerOptions& options);

/// The run directory `options` name, resolved against the file system as it is now:
/// `<save_dir>/<name>/<resolve_version(options)>`.
///
/// Pure apart from reading the directory listing of `<save_dir>/<name>`; creates nothing.
std::string resolve_log_dir(const LoggerOptions& options);

namespace internal {

/// `options.console`, for a logger's constructor; throws volt::Error with a HINT when it is null.
/// `logger` names the logger in the message, e.g. "CSVLogger".
std::shared_ptr<Console> logger_console(const LoggerOptions& options, const char* logger);

}  // namespace internal

}  // namespace volt
