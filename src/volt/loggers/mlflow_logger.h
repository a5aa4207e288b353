// A logger that sends metrics, parameters, tags and artifacts to an MLflow tracking server over
// MLflow's REST API, as Lightning's MLFlowLogger does through MLflow's Python client.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

#include "volt/loggers/logger.h"

namespace volt {

class Env;

/// Which checkpoints MLFlowLogger uploads as artifacts (Lightning's `log_model`).
enum class LogModel {
  kNone,  ///< "none": no checkpoint (Lightning's False)
  kEnd,   ///< "end": at the end of the run, the checkpoints ModelCheckpoint kept (Lightning's True)
  kAll,   ///< "all": every checkpoint as it is saved (Lightning's "all")
};
/// "none", "end" or "all".
const char* to_string(LogModel mode);
/// Parses "none", "end" or "all" (also Lightning's "false" and "true"); throws volt::Error with a HINT.
LogModel parse_log_model(const std::string& text);

/// What MLFlowLogger sends where. The local folder (for the run-id file and anything the server
/// never received) is LoggerOptions'. MLFlowLogger reads no environment itself:
/// mlflow_options_from_env fills what is unset from MLflow's variables (the Trainer does this for
/// TrainerOptions::mlflow).
///
/// Example: `MLFlowOptions mlflow{.tracking_uri = "http://127.0.0.1:5000", .experiment_name = "mnist"};`
struct MLFlowOptions {
  /// The tracking server, "http://host:port" or "https://..." (a path prefix is kept); required
  /// by MLFlowLogger (mlflow_options_from_env takes MLFLOW_TRACKING_URI for an unset one).
  std::optional<std::string> tracking_uri;
  /// The experiment the run goes into, created when missing. Unset: LoggerOptions::name
  /// ("lightning_logs", Lightning's default; mlflow_options_from_env takes MLFLOW_EXPERIMENT_NAME).
  std::optional<std::string> experiment_name;
  /// Log into this existing run instead of creating one (Lightning's `run_id`).
  std::optional<std::string> run_id;
  /// The run's name in MLflow's UI; unset: the local version folder's ("version_3", a SLURM job id).
  std::optional<std::string> run_name;
  /// Tags set on the run, beside Volt's own (`volt.log_dir`, `volt.host`).
  std::map<std::string, std::string> tags;
  /// Which checkpoints are uploaded, under the run's `checkpoints/` artifacts.
  LogModel log_model = LogModel::kNone;
  /// `Authorization: Bearer` token (MLFLOW_TRACKING_TOKEN).
  std::string token;
  /// HTTP basic authentication (MLFLOW_TRACKING_USERNAME, MLFLOW_TRACKING_PASSWORD).
  std::string username;
  std::string password;  ///< see username
  /// Accept any TLS certificate (MLFLOW_TRACKING_INSECURE_TLS=true).
  bool insecure_tls = false;
  /// The most seconds one request may take before it is given up and retried.
  double request_timeout_s = 10;
  /// Seconds between sends of the metrics buffered since the last one.
  double flush_interval_s = 1;
  /// After a failed request, the wait before the next try doubles from 0.5 s up to this.
  double max_retry_interval_s = 30;
  /// finalize() waits at most this long for the server to take what is buffered (5 s at most for
  /// a run stopped to be requeued or by a signal); what it did not take is written to
  /// `<log_dir>/mlflow-undelivered.jsonl` and reported.
  double finalize_timeout_s = 30;
  /// Metric values held in memory while the server is unreachable; older ones beyond this go to
  /// `<log_dir>/mlflow-undelivered.jsonl` at once.
  int64_t max_buffered_metrics = 100000;
};

/// `options` with what is unset taken from MLflow's environment variables: MLFLOW_TRACKING_URI,
/// MLFLOW_EXPERIMENT_NAME, MLFLOW_RUN_ID, MLFLOW_TRACKING_TOKEN, MLFLOW_TRACKING_USERNAME,
/// MLFLOW_TRACKING_PASSWORD, MLFLOW_TRACKING_INSECURE_TLS. Pure.
MLFlowOptions mlflow_options_from_env(MLFlowOptions options, const Env& env);

/// What MLFlowLogger has delivered so far (delivery()), and what it has not.
struct MLFlowDelivery {
  std::string experiment_id;     ///< "" until the server answered
  std::string run_id;            ///< "" until the run was created (or found)
  int64_t metrics_sent = 0;      ///< metric values the server took
  int64_t metrics_pending = 0;   ///< metric values buffered, not yet sent
  int64_t metrics_saved = 0;     ///< metric values written to the undelivered file instead
  int64_t params_sent = 0;       ///< parameters the server took
  int64_t params_rejected = 0;   ///< parameters the server refused (a value changed within a run)
  int64_t artifacts_sent = 0;    ///< files uploaded
  int64_t artifacts_failed = 0;  ///< files not uploaded (no upload endpoint, gone, refused)
  int64_t failed_requests = 0;   ///< requests that failed, retried or not
  bool status_sent = false;      ///< the run's end status reached the server
  std::string last_error;        ///< the newest failure, "" if none
};

/// Logs to an MLflow tracking server through its REST API (`/api/2.0/mlflow/...`), from a
/// sender thread: log_metrics() only buffers, so a slow or unreachable server never slows or
/// stops training. Metrics go in batches of up to 1000 values every `flush_interval_s`;
/// hyperparameters become params (nested objects flattened to "a/b"), the run gets tags and a
/// status (RUNNING, then FINISHED, FAILED or KILLED), the resolved config (`config.yaml`) and the
/// checkpoints `log_model` names become artifacts where the server accepts uploads (`mlflow
/// server`'s default `--serve-artifacts`). A failed request is retried with a growing wait;
/// finalize() waits up to `finalize_timeout_s`, then writes whatever the server did not take to
/// `<log_dir>/mlflow-undelivered.jsonl` and reports it, as it reports a server that stops
/// answering, in a warning on LoggerOptions::console (stderr by default).
///
/// The run's id is kept in `<log_dir>/mlflow-run.json`: with LoggerOptions::append (a requeued
/// SLURM job's folder) the same run continues instead of a new one starting, and what an earlier
/// process of it could not deliver (its undelivered file) is sent first.
class MLFlowLogger : public Logger {
 public:
  /// The file in log_dir() that keeps the run's id.
  static constexpr const char* kRunFileName = "mlflow-run.json";
  /// The file in log_dir() that receives what the server never took, one JSON object a line.
  static constexpr const char* kUndeliveredFileName = "mlflow-undelivered.jsonl";

  /// A logger for the run in `resolve_log_dir(options)`; throws volt::Error with a HINT when
  /// `mlflow.tracking_uri` is unset or not http(s). Contacts the server only from its thread.
  MLFlowLogger(const LoggerOptions& options, MLFlowOptions mlflow);
  /// finalize("failed") if the run was not finalized; a failure is a warning on the console, never
  /// thrown.
  ~MLFlowLogger() override;
  MLFlowLogger(const MLFlowLogger&) = delete;
  MLFlowLogger& operator=(const MLFlowLogger&) = delete;

  /// The experiment's name.
  std::string name() const override;
  /// The local folder: `<save_dir>/<name>/<version>`, shared with the other loggers.
  std::string log_dir() const override;
  /// The tracking server's URI, without a trailing slash.
  std::string tracking_uri() const;
  /// Flattens `params` to "a/b" names and queues them as the run's params.
  void log_hyperparams(const nlohmann::json& params) override;
  /// Queues the values, stamped with the time of this call; names MLflow refuses get '_' for
  /// their other characters.
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step) override;
  /// Queues a tag on the run.
  void set_tag(const std::string& key, const std::string& value);
  /// Queues an upload of the file at `local_path` to the run's artifacts as `artifact_path`.
  void log_artifact(const std::string& local_path, const std::string& artifact_path);
  /// Uploads `path` (a sharded checkpoint with its shards: checkpoint_files) under `checkpoints/`
  /// (log_model "all"), or remembers it for finalize ("end").
  void after_save_checkpoint(const std::string& path) override;
  /// Uploads the config file as an artifact.
  void after_save_config(const std::string& path) override;
  /// Sends what is buffered now instead of at the next flush interval.
  void save() override;
  /// Sends the end status ("success": FINISHED, "failed": FAILED, otherwise KILLED) after
  /// everything buffered, waiting up to `finalize_timeout_s`; reports what did not arrive.
  void finalize(const std::string& status) override;
  /// What has been delivered so far.
  MLFlowDelivery delivery() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace volt
