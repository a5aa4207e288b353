// The pure parts of MLFlowLogger: what MLflow's REST API accepts and how Volt's values are
// written for it. Separate from the logger so they are tested without a server.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace volt::mlflow {

/// MLflow's limits per `runs/log-batch` request (its REST API reference).
constexpr size_t kMaxMetricsPerBatch = 1000;
constexpr size_t kMaxParamsPerBatch = 100;  ///< see kMaxMetricsPerBatch
constexpr size_t kMaxTagsPerBatch = 100;    ///< see kMaxMetricsPerBatch
/// The longest metric, param or tag name MLflow stores.
constexpr size_t kMaxKeyLength = 250;
/// The longest param value MLflow stores (MLflow >= 2.0; longer ones are cut).
constexpr size_t kMaxParamValueLength = 6000;

/// One metric value as MLflow stores it.
struct MetricValue {
  std::string key;           ///< a valid name (metric_key)
  double value = 0;          ///< NaN and infinities are allowed
  int64_t timestamp_ms = 0;  ///< when it was logged, milliseconds since the Unix epoch
  int64_t step = 0;          ///< the global step
};

/// `name` as a valid MLflow name: characters other than letters, digits, '_', '-', '.', ' ',
/// ':' and '/' become '_', and it is cut to kMaxKeyLength.
std::string metric_key(const std::string& name);

/// `params` (a JSON object) flattened to MLflow params: nested objects joined with '/' ("optimizer/lr"),
/// strings as they are, other values as JSON text, values cut to kMaxParamValueLength. Sorted by key.
std::vector<std::pair<std::string, std::string>> flatten_params(const nlohmann::json& params);

/// A metric in log-batch's form; NaN and infinities as the strings "NaN", "Infinity" and
/// "-Infinity", which MLflow's protobuf JSON parser reads (JSON itself has no such numbers).
nlohmann::json metric_json(const MetricValue& metric);

/// The MLflow run status for how a Volt run ended: "success" → "FINISHED", "failed" →
/// "FAILED", anything else ("interrupted", "requeued") → "KILLED".
std::string run_status(const std::string& volt_status);

/// `uri` checked and without trailing slashes; throws volt::Error with a HINT unless it is
/// "http://" or "https://" with a host.
std::string normalize_tracking_uri(const std::string& uri);

/// The URL a file is PUT to so that it becomes `artifact_path` among a run's artifacts, for a run
/// whose artifact root is `artifact_uri`: only "mlflow-artifacts:" roots (a server started with
/// --serve-artifacts, MLflow's default) take uploads over HTTP; nullopt for any other root
/// (a path on the server's disk, s3://...), which Volt cannot write to.
///
/// Example: ("http://h:5000", "mlflow-artifacts:/1/abc/artifacts", "checkpoints/last.ckpt") →
/// "http://h:5000/api/2.0/mlflow-artifacts/artifacts/1/abc/artifacts/checkpoints/last.ckpt".
std::optional<std::string> artifact_upload_url(const std::string& tracking_uri, const std::string& artifact_uri,
                                               const std::string& artifact_path);

/// Seconds to wait before the next try after `failures` failed requests in a row: 0.5 s doubled
/// each time, at most `max_s`.
double retry_delay_s(int64_t failures, double max_s);

/// MLflow's error code in a response body (`{"error_code": "RESOURCE_DOES_NOT_EXIST", ...}`),
/// or "" when the body has none.
std::string error_code(const std::string& body);

}  // namespace volt::mlflow
