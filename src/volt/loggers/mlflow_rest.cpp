#include "volt/loggers/mlflow_rest.h"

#include <algorithm>
#include <cmath>

#include "volt/core/error.h"
#include "volt/loggers/http_client.h"

namespace volt::mlflow {
namespace {

constexpr const char* kArtifactScheme = "mlflow-artifacts:";

bool valid_key_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
         c == '.' || c == ' ' || c == ':' || c == '/';
}

void flatten_into(const nlohmann::json& value, const std::string& prefix,
                  std::vector<std::pair<std::string, std::string>>& out) {
  if (value.is_object() && !value.empty()) {
    for (const auto& [key, child] : value.items()) {
      std::string name = prefix;
      if (!name.empty()) name += '/';
      name += key;
      flatten_into(child, name, out);
    }
    return;
  }
  std::string text = value.is_string() ? value.get<std::string>() : value.dump();
  if (text.size() > kMaxParamValueLength) text.resize(kMaxParamValueLength);
  out.emplace_back(metric_key(prefix), std::move(text));
}

}  // namespace

std::string metric_key(const std::string& name) {
  std::string key = name.substr(0, kMaxKeyLength);
  std::replace_if(
      key.begin(), key.end(), [](char c) { return !valid_key_char(c); }, '_');
  return key;
}

std::vector<std::pair<std::string, std::string>> flatten_params(const nlohmann::json& params) {
  std::vector<std::pair<std::string, std::string>> out;
  if (params.is_null()) return out;
  VOLT_CHECK(params.is_object(),
             "hyperparameters must be a JSON object to become MLflow params; got {}. HINT: pass name-value pairs, e.g. "
             "{{\"lr\": 0.01}}, to save_hyperparameters or log_hyperparams.",
             params.type_name());
  flatten_into(params, "", out);
  std::sort(out.begin(), out.end());
  return out;
}

nlohmann::json metric_json(const MetricValue& metric) {
  nlohmann::json value;
  if (std::isnan(metric.value)) {
    value = "NaN";
  } else if (std::isinf(metric.value)) {
    value = metric.value > 0 ? "Infinity" : "-Infinity";
  } else {
    value = metric.value;
  }
  return {{"key", metric.key}, {"value", value}, {"timestamp", metric.timestamp_ms}, {"step", metric.step}};
}

std::string run_status(const std::string& volt_status) {
  if (volt_status == "success") return "FINISHED";
  if (volt_status == "failed") return "FAILED";
  return "KILLED";
}

std::string normalize_tracking_uri(const std::string& uri) {
  std::string text = uri;
  while (!text.empty() && text.back() == '/') text.pop_back();
  const size_t scheme_end = text.find("://");
  const std::string scheme = scheme_end == std::string::npos ? "" : text.substr(0, scheme_end);
  const bool has_host = scheme_end != std::string::npos && text.size() > scheme_end + 3;
  VOLT_CHECK((scheme == "http" || scheme == "https") && has_host,
             "MLflow tracking URI '{}' is not an http(s) server address; expected e.g. http://127.0.0.1:5000. "
             "HINT: Volt speaks MLflow's REST API, so it needs a tracking server: start one with `mlflow server "
             "--host 127.0.0.1 --port 5000` (it keeps runs in ./mlruns or --backend-store-uri) and pass its "
             "address; a file: or databricks URI is not supported.",
             uri);
  return text;
}

std::optional<std::string> artifact_upload_url(const std::string& tracking_uri, const std::string& artifact_uri,
                                               const std::string& artifact_path) {
  if (artifact_uri.rfind(kArtifactScheme, 0) != 0) return std::nullopt;
  std::string rest = artifact_uri.substr(std::string(kArtifactScheme).size());
  std::string base = tracking_uri;
  if (rest.rfind("//", 0) == 0) {
    // "mlflow-artifacts://host:port/path": the server named in the URI, with the tracking URI's scheme.
    const size_t path_start = rest.find('/', 2);
    const std::string authority = rest.substr(2, path_start == std::string::npos ? std::string::npos : path_start - 2);
    const std::string scheme = tracking_uri.substr(0, tracking_uri.find("://"));
    base = scheme + "://" + authority;
    rest = path_start == std::string::npos ? "" : rest.substr(path_start);
  }
  while (!rest.empty() && rest.front() == '/') rest.erase(rest.begin());
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  std::string url = base + "/api/2.0/mlflow-artifacts/artifacts/" + percent_encode(rest, "/");
  if (!artifact_path.empty()) url += "/" + percent_encode(artifact_path, "/");
  return url;
}

double retry_delay_s(int64_t failures, double max_s) {
  if (failures <= 0) return 0;
  const double delay = 0.5 * std::pow(2.0, static_cast<double>(std::min<int64_t>(failures - 1, 30)));
  return std::min(delay, max_s);
}

std::string error_code(const std::string& body) {
  const nlohmann::json parsed = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) return "";
  const auto it = parsed.find("error_code");
  return it != parsed.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace volt::mlflow
