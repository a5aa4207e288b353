#include "volt/loggers/mlflow_logger.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "volt/core/env.h"
#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/loggers/http_client.h"
#include "volt/loggers/mlflow_rest.h"

namespace volt {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using mlflow::MetricValue;

/// The longest finalize() waits for a run that was stopped ("interrupted", "requeued").
constexpr double kStoppedWaitS = 5;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string host_name() {
  char name[256] = {};
  return gethostname(name, sizeof(name) - 1) == 0 ? std::string(name) : std::string();
}

/// A file queued for upload.
struct Artifact {
  std::string local_path;
  std::string artifact_path;
};

/// What a request's outcome means for what it carried.
enum class Outcome {
  kSent,      ///< the server took it
  kRetry,     ///< no answer or a server error: keep it and try again later
  kRejected,  ///< the server refused it; sending it again would fail again
};

/// A metric's value as metric_json wrote it: a number, or "NaN", "Infinity", "-Infinity".
std::optional<double> metric_value(const nlohmann::json& value) {
  if (value.is_number()) return value.get<double>();
  if (!value.is_string()) return std::nullopt;
  const std::string text = value.get<std::string>();
  if (text == "NaN") return std::numeric_limits<double>::quiet_NaN();
  if (text == "Infinity") return std::numeric_limits<double>::infinity();
  if (text == "-Infinity") return -std::numeric_limits<double>::infinity();
  return std::nullopt;
}

Outcome outcome_of(const HttpResponse& response) {
  if (response.ok()) return Outcome::kSent;
  return response.transient() ? Outcome::kRetry : Outcome::kRejected;
}

}  // namespace

const char* to_string(LogModel mode) {
  switch (mode) {
    case LogModel::kNone:
      return "none";
    case LogModel::kEnd:
      return "end";
    case LogModel::kAll:
      return "all";
  }
  return "?";
}

LogModel parse_log_model(const std::string& text) {
  const std::string word = to_lower(trim(text));
  if (word == "none" || word == "false") return LogModel::kNone;
  if (word == "end" || word == "true") return LogModel::kEnd;
  if (word == "all") return LogModel::kAll;
  throw Error(fmt::format(
      "log_model='{}' is not supported; supported: 'none', 'end', 'all' (Lightning's false, true, 'all'). HINT: "
      "'end' uploads the checkpoints ModelCheckpoint kept when the run ends, 'all' every checkpoint as it is saved.",
      text));
}

MLFlowOptions mlflow_options_from_env(MLFlowOptions options, const Env& env) {
  if (!options.tracking_uri) options.tracking_uri = env.get("MLFLOW_TRACKING_URI");
  if (!options.experiment_name) options.experiment_name = env.get("MLFLOW_EXPERIMENT_NAME");
  if (!options.run_id) options.run_id = env.get("MLFLOW_RUN_ID");
  if (options.token.empty()) options.token = env.get_or("MLFLOW_TRACKING_TOKEN", "");
  if (options.username.empty()) options.username = env.get_or("MLFLOW_TRACKING_USERNAME", "");
  if (options.password.empty()) options.password = env.get_or("MLFLOW_TRACKING_PASSWORD", "");
  const std::string insecure = to_lower(env.get_or("MLFLOW_TRACKING_INSECURE_TLS", ""));
  if (insecure == "true" || insecure == "1") options.insecure_tls = true;
  return options;
}

struct MLFlowLogger::Impl {
  // Fixed at construction.
  MLFlowOptions options;
  std::string log_dir;
  std::string version;
  std::string tracking_uri;
  std::string experiment_name;
  bool append = false;
  /// Where the reports go; called from the sender thread too (Console's calls are thread-safe).
  std::shared_ptr<Console> console;

  // Shared with the sender thread, under `mutex`.
  mutable std::mutex mutex;
  std::condition_variable wake;
  std::deque<MetricValue> metrics;
  std::deque<std::pair<std::string, std::string>> params;
  std::deque<std::pair<std::string, std::string>> tags;
  std::deque<Artifact> artifacts;
  /// Every param queued in this run, so that a repeat is not sent and a change is caught here.
  std::map<std::string, std::string> params_seen;
  /// log_model "end": the checkpoints saved, uploaded at finalize if they still exist.
  std::vector<std::string> saved_checkpoints;
  /// The MLflow status finalize() asked for; unset while the run goes on.
  std::optional<std::string> end_status;
  /// The run was finalized and records came after: it is set RUNNING again first.
  bool reopen = false;
  bool flush_now = false;
  /// finalize()'s limit: the sender gives up on what is left at this time.
  std::optional<Clock::time_point> deadline;
  /// The server refused to make or find the run: nothing more is sent.
  bool broken = false;
  MLFlowDelivery delivery;
  std::thread sender;
  bool sender_running = false;
  bool warned_param_change = false;
  /// delivery.metrics_saved when finalize() last reported, so a second fit reports only its own.
  int64_t metrics_saved_reported = 0;
  /// The `.resending` file holds records this logger queued: finalize() removes it.
  bool owns_resending = false;

  // The sender thread's own.
  std::string artifact_uri;
  int64_t failures = 0;
  bool reported_unreachable = false;
  bool reported_no_uploads = false;

  std::string api(const std::string& endpoint) const { return tracking_uri + "/api/2.0/mlflow/" + endpoint; }
  std::string undelivered_path() const { return (fs::path(log_dir) / kUndeliveredFileName).string(); }
  std::string run_file_path() const { return (fs::path(log_dir) / kRunFileName).string(); }

  /// After a new record: a finalized run is set RUNNING again and the sender started if it is
  /// not running. Called with `mutex` held.
  void record_added() {
    if (end_status) {
      end_status.reset();
      delivery.status_sent = false;
      reopen = true;
    }
    ensure_sender();
  }

  /// Starts the sender thread if it is not running (the first record, or one after finalize()).
  /// Called with `mutex` held.
  void ensure_sender() {
    if (sender_running || broken) return;  // broken: nothing will be sent (finalize writes the rest down)
    if (sender.joinable()) sender.join();
    sender_running = true;
    sender = std::thread([this] { run_sender(); });
  }

  /// Records a failed request; the first of a series is reported, so an unreachable server is
  /// seen in the log at once, not only at the end.
  void note_failure(const std::string& what, const HttpResponse& response) {
    const std::string error = what + ": " + response.describe();
    bool report = false;
    {
      const std::lock_guard<std::mutex> lock(mutex);
      ++delivery.failed_requests;
      delivery.last_error = error;
      report = response.transient() && !reported_unreachable;
      if (report) reported_unreachable = true;
    }
    if (report) {
      console->warn(fmt::format("MLFlowLogger: {}; keeping the metrics and trying again (every {} s at most).", error,
                                options.max_retry_interval_s));
    }
  }

  /// Finds or creates the run. False when it has to be tried again later (or never: `broken`).
  bool ensure_run(HttpClient& http) {
    std::string run_id;
    bool resumed = false;
    {
      const std::lock_guard<std::mutex> lock(mutex);
      if (!delivery.run_id.empty()) return true;
    }
    if (options.run_id) {
      run_id = *options.run_id;
      resumed = true;
    } else if (append && fs::exists(run_file_path())) {
      // A requeued job's folder: the same run goes on.
      const nlohmann::json saved = nlohmann::json::parse(std::ifstream(run_file_path()), nullptr, false);
      if (saved.is_object() && saved.value("tracking_uri", "") == tracking_uri) {
        run_id = saved.value("run_id", "");
        resumed = !run_id.empty();
      }
    }
    if (resumed) {
      const HttpResponse found = http.get(api("runs/get?run_id=" + percent_encode(run_id)));
      if (!found.ok()) {
        note_failure("looking up run " + run_id, found);
        if (found.transient()) return false;
        if (options.run_id) return give_up("run_id " + run_id + " was not found on " + tracking_uri);
        run_id.clear();  // a stale file: start a new run
      } else {
        const nlohmann::json info = nlohmann::json::parse(found.body)["run"]["info"];
        artifact_uri = info.value("artifact_uri", "");
        const HttpResponse running =
            http.post_json(api("runs/update"), nlohmann::json{{"run_id", run_id}, {"status", "RUNNING"}}.dump());
        if (!running.ok()) {
          note_failure("setting run " + run_id + " RUNNING", running);
          if (running.transient()) return false;
        }
        const std::lock_guard<std::mutex> lock(mutex);
        delivery.run_id = run_id;
        delivery.experiment_id = info.value("experiment_id", "");
        return true;
      }
    }
    const std::optional<std::string> experiment_id = ensure_experiment(http);
    if (!experiment_id) return false;
    nlohmann::json run_tags = nlohmann::json::array();
    std::map<std::string, std::string> all_tags = options.tags;
    all_tags.emplace("volt.log_dir", fs::absolute(log_dir).lexically_normal().string());
    all_tags.emplace("volt.version", version);
    if (const std::string host = host_name(); !host.empty()) all_tags.emplace("volt.host", host);
    for (const auto& [key, value] : all_tags) run_tags.push_back({{"key", mlflow::metric_key(key)}, {"value", value}});
    const nlohmann::json request = {{"experiment_id", *experiment_id},
                                    {"run_name", options.run_name.value_or(version)},
                                    {"start_time", now_ms()},
                                    {"tags", run_tags}};
    const HttpResponse created = http.post_json(api("runs/create"), request.dump());
    if (!created.ok()) {
      note_failure("creating a run in experiment " + *experiment_id, created);
      return created.transient() ? false : give_up("the server refused to create the run");
    }
    const nlohmann::json info = nlohmann::json::parse(created.body)["run"]["info"];
    artifact_uri = info.value("artifact_uri", "");
    run_id = info.value("run_id", "");
    write_run_file(*experiment_id, run_id);
    const std::lock_guard<std::mutex> lock(mutex);
    delivery.run_id = run_id;
    delivery.experiment_id = *experiment_id;
    return true;
  }

  /// The experiment's id, created when missing; nullopt to try again later.
  std::optional<std::string> ensure_experiment(HttpClient& http) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      const HttpResponse found =
          http.get(api("experiments/get-by-name?experiment_name=" + percent_encode(experiment_name)));
      if (found.ok()) return nlohmann::json::parse(found.body)["experiment"].value("experiment_id", "");
      if (mlflow::error_code(found.body) != "RESOURCE_DOES_NOT_EXIST") {
        note_failure("looking up experiment '" + experiment_name + "'", found);
        if (!found.transient()) give_up("the server refused to look up the experiment");
        return std::nullopt;
      }
      const HttpResponse created =
          http.post_json(api("experiments/create"), nlohmann::json{{"name", experiment_name}}.dump());
      if (created.ok()) return nlohmann::json::parse(created.body).value("experiment_id", "");
      // Another process made it in between: look it up again.
      if (mlflow::error_code(created.body) == "RESOURCE_ALREADY_EXISTS") continue;
      note_failure("creating experiment '" + experiment_name + "'", created);
      if (!created.transient()) give_up("the server refused to create the experiment");
      return std::nullopt;
    }
    return std::nullopt;
  }

  bool give_up(const std::string& why) {
    const std::string error = delivery_error();
    console->warn(fmt::format(
        "MLFlowLogger: {}{}; nothing more is sent, and what is logged goes to {}. HINT: check the tracking URI, the "
        "experiment's permissions and the credentials (MLFLOW_TRACKING_TOKEN, MLFLOW_TRACKING_USERNAME/PASSWORD).",
        why, error.empty() ? "" : " (" + error + ")", undelivered_path()));
    const std::lock_guard<std::mutex> lock(mutex);
    broken = true;
    return false;
  }

  std::string delivery_error() const {
    const std::lock_guard<std::mutex> lock(mutex);
    return delivery.last_error;
  }

  void write_run_file(const std::string& experiment_id, const std::string& run_id) const {
    std::error_code error;
    fs::create_directories(log_dir, error);
    const std::string path = run_file_path();
    const std::string temporary = path + ".tmp";
    std::ofstream(temporary)
        << nlohmann::json{{"tracking_uri", tracking_uri}, {"experiment_id", experiment_id}, {"run_id", run_id}}.dump(2)
        << "\n";
    fs::rename(temporary, path, error);
  }

  /// Sends a batch of params or tags (`kind` "params" or "tags"); a refused batch of several is
  /// sent again one at a time, so one bad value costs only itself.
  Outcome send_pairs(HttpClient& http, const std::string& run_id, const char* kind,
                     const std::vector<std::pair<std::string, std::string>>& pairs, int64_t& rejected) {
    nlohmann::json items = nlohmann::json::array();
    for (const auto& [key, value] : pairs) items.push_back({{"key", key}, {"value", value}});
    const HttpResponse response =
        http.post_json(api("runs/log-batch"), nlohmann::json{{"run_id", run_id}, {kind, items}}.dump());
    const Outcome outcome = outcome_of(response);
    if (outcome == Outcome::kSent) return outcome;
    note_failure(std::string("logging ") + kind, response);
    if (outcome == Outcome::kRetry) return outcome;
    if (pairs.size() == 1) {
      ++rejected;
      return Outcome::kRejected;
    }
    for (const auto& pair : pairs) {
      const Outcome single = send_pairs(http, run_id, kind, {pair}, rejected);
      if (single == Outcome::kRetry) return single;
    }
    return Outcome::kSent;
  }

  /// Sends the params, tags, metrics and artifacts queued, then the end status if asked for,
  /// one request at a time. False when a request has to be tried again later.
  bool send_pending(HttpClient& http) {
    if (!ensure_run(http)) return false;
    std::string run_id;
    bool reopening = false;
    {
      const std::lock_guard<std::mutex> lock(mutex);
      run_id = delivery.run_id;
      reopening = reopen;
    }
    if (reopening) {
      const HttpResponse running =
          http.post_json(api("runs/update"), nlohmann::json{{"run_id", run_id}, {"status", "RUNNING"}}.dump());
      if (outcome_of(running) == Outcome::kRetry) {
        note_failure("setting the run RUNNING", running);
        return false;
      }
      const std::lock_guard<std::mutex> lock(mutex);
      reopen = false;
    }
    for (const char* kind : {"params", "tags"}) {
      const bool is_params = std::string(kind) == "params";
      while (true) {
        std::vector<std::pair<std::string, std::string>> batch;
        {
          const std::lock_guard<std::mutex> lock(mutex);
          auto& queue = is_params ? params : tags;
          const size_t count =
              std::min(queue.size(), is_params ? mlflow::kMaxParamsPerBatch : mlflow::kMaxTagsPerBatch);
          batch.assign(queue.begin(), queue.begin() + static_cast<std::ptrdiff_t>(count));
        }
        if (batch.empty()) break;
        int64_t rejected = 0;
        if (send_pairs(http, run_id, kind, batch, rejected) == Outcome::kRetry) return false;
        const std::lock_guard<std::mutex> lock(mutex);
        auto& queue = is_params ? params : tags;
        queue.erase(queue.begin(), queue.begin() + static_cast<std::ptrdiff_t>(batch.size()));
        if (is_params) {
          delivery.params_sent += static_cast<int64_t>(batch.size()) - rejected;
          delivery.params_rejected += rejected;
        }
      }
    }
    while (true) {
      nlohmann::json batch = nlohmann::json::array();
      {
        const std::lock_guard<std::mutex> lock(mutex);
        const size_t count = std::min(metrics.size(), mlflow::kMaxMetricsPerBatch);
        for (size_t i = 0; i < count; ++i) batch.push_back(mlflow::metric_json(metrics[i]));
      }
      if (batch.empty()) break;
      const HttpResponse response =
          http.post_json(api("runs/log-batch"), nlohmann::json{{"run_id", run_id}, {"metrics", batch}}.dump());
      const Outcome outcome = outcome_of(response);
      if (outcome != Outcome::kSent)
        note_failure("logging " + std::to_string(batch.size()) + " metric values", response);
      if (outcome == Outcome::kRetry) return false;
      const std::lock_guard<std::mutex> lock(mutex);
      const auto end = metrics.begin() + static_cast<std::ptrdiff_t>(batch.size());
      if (outcome == Outcome::kRejected) {
        // Kept in the undelivered file: the values are the user's, even if this server refused them.
        save_undelivered_metrics(metrics.begin(), end);
      } else {
        delivery.metrics_sent += static_cast<int64_t>(batch.size());
      }
      metrics.erase(metrics.begin(), end);
    }
    while (true) {
      std::optional<Artifact> artifact;
      {
        const std::lock_guard<std::mutex> lock(mutex);
        if (!artifacts.empty()) artifact = artifacts.front();
      }
      if (!artifact) break;
      const Outcome outcome = upload(http, *artifact);
      if (outcome == Outcome::kRetry) return false;
      const std::lock_guard<std::mutex> lock(mutex);
      artifacts.pop_front();
      ++(outcome == Outcome::kSent ? delivery.artifacts_sent : delivery.artifacts_failed);
    }
    std::optional<std::string> status;
    {
      const std::lock_guard<std::mutex> lock(mutex);
      if (end_status && !delivery.status_sent) status = end_status;
    }
    if (status) {
      const HttpResponse response = http.post_json(
          api("runs/update"), nlohmann::json{{"run_id", run_id}, {"status", *status}, {"end_time", now_ms()}}.dump());
      if (!response.ok()) note_failure("setting the run " + *status, response);
      if (outcome_of(response) == Outcome::kRetry) return false;
      const std::lock_guard<std::mutex> lock(mutex);
      delivery.status_sent = response.ok();
      if (!response.ok()) broken = true;
    }
    return true;
  }

  Outcome upload(HttpClient& http, const Artifact& artifact) {
    const std::optional<std::string> url =
        mlflow::artifact_upload_url(tracking_uri, artifact_uri, artifact.artifact_path);
    if (!url) {
      if (!reported_no_uploads) {
        reported_no_uploads = true;
        console->warn(fmt::format(
            "MLFlowLogger: the run's artifacts live at {}, which takes no uploads over HTTP; {} and later files stay "
            "local. HINT: start the server with --serve-artifacts (MLflow's default since 2.0) and an "
            "--artifacts-destination.",
            artifact_uri, artifact.local_path));
      }
      const std::lock_guard<std::mutex> lock(mutex);
      delivery.last_error = "no artifact upload endpoint for " + artifact_uri;
      return Outcome::kRejected;
    }
    if (!fs::exists(artifact.local_path)) return Outcome::kRejected;  // removed since (an old top-k checkpoint)
    const HttpResponse response = http.put_file(*url, artifact.local_path);
    const Outcome outcome = outcome_of(response);
    if (outcome != Outcome::kSent) note_failure("uploading " + artifact.local_path, response);
    return outcome;
  }

  /// The undelivered file, opened to append; a new one starts with a line saying where its
  /// records belong (the server, experiment and run, if one was made), for whoever sends them
  /// later. Called with `mutex` held.
  std::ofstream open_undelivered() const {
    std::error_code error;
    fs::create_directories(log_dir, error);
    const bool fresh = !fs::exists(undelivered_path());
    std::ofstream out(undelivered_path(), std::ios::app);
    if (fresh) {
      out << nlohmann::json{{"type", "run"},
                            {"tracking_uri", tracking_uri},
                            {"experiment_name", experiment_name},
                            {"run_name", options.run_name.value_or(version)},
                            {"run_id", delivery.run_id}}
                 .dump()
          << "\n";
    }
    return out;
  }

  std::string resending_path() const { return undelivered_path() + ".resending"; }

  /// Queues the records of an earlier run's undelivered file (and of a `.resending` one a run that
  /// died left) for this server, and renames the file to `.resending` until finalize(). A file
  /// written for another server is left alone.
  void reload_undelivered() {
    const std::lock_guard<std::mutex> lock(mutex);
    std::error_code error;
    bool loaded_undelivered = false;
    for (const std::string& path : {resending_path(), undelivered_path()}) {
      std::vector<nlohmann::json> lines;
      std::ifstream in(path);
      for (std::string text; std::getline(in, text);) {
        nlohmann::json line = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (line.is_object()) lines.push_back(std::move(line));  // else a line cut short by a crash
      }
      if (lines.empty()) continue;
      // Another server's records (the tracking URI changed between requeues) are left alone; so is
      // this run's file then, which finalize() would otherwise merge with them.
      if (lines.front().value("tracking_uri", "") != tracking_uri) return;
      owns_resending = true;
      loaded_undelivered = loaded_undelivered || path == undelivered_path();
      for (const nlohmann::json& line : lines) {
        const std::string type = line.value("type", "");
        if (type == "metric") {
          const std::optional<double> value = metric_value(line["value"]);
          if (value) {
            metrics.push_back(MetricValue{line.value("key", ""), *value, line.value("timestamp", int64_t{0}),
                                          line.value("step", int64_t{0})});
          }
        } else if (type == "param" && params_seen.emplace(line.value("key", ""), line.value("value", "")).second) {
          params.emplace_back(line.value("key", ""), line.value("value", ""));
        } else if (type == "tag") {
          tags.emplace_back(line.value("key", ""), line.value("value", ""));
        } else if (type == "artifact") {
          artifacts.push_back(Artifact{line.value("path", ""), line.value("artifact_path", "")});
        }
      }
    }
    if (loaded_undelivered) {
      // Both files' records are queued now: one .resending holds them until finalize().
      std::ofstream merged(resending_path(), std::ios::app);
      merged << std::ifstream(undelivered_path()).rdbuf();
      merged.close();
      fs::remove(undelivered_path(), error);
    }
    if (!metrics.empty() || !params.empty() || !tags.empty() || !artifacts.empty()) ensure_sender();
  }

  /// Appends metric values to the undelivered file. Called with `mutex` held.
  template <typename It>
  void save_undelivered_metrics(It begin, It end) {
    std::ofstream out = open_undelivered();
    for (It it = begin; it != end; ++it) {
      nlohmann::json line = mlflow::metric_json(*it);
      line["type"] = "metric";
      out << line.dump() << "\n";
      ++delivery.metrics_saved;
    }
    if (!out) console->warn("MLFlowLogger: cannot write " + undelivered_path());
  }

  /// Moves the oldest metric values beyond `max_buffered_metrics` (all of them once the server
  /// refused the run: nothing will send them) to the undelivered file. Called with `mutex` held.
  void trim_buffer() {
    const auto limit = broken ? size_t{0} : static_cast<size_t>(std::max<int64_t>(options.max_buffered_metrics, 0));
    if (metrics.size() <= limit) return;
    const auto end = metrics.begin() + static_cast<std::ptrdiff_t>(metrics.size() - limit);
    save_undelivered_metrics(metrics.begin(), end);
    metrics.erase(metrics.begin(), end);
  }

  bool all_sent() const {
    return metrics.empty() && params.empty() && tags.empty() && artifacts.empty() && !reopen &&
           (!end_status || delivery.status_sent);
  }

  void run_sender() {
    HttpClient http(HttpClientOptions{.timeout_s = options.request_timeout_s,
                                      .connect_timeout_s = std::min(options.request_timeout_s, 5.0),
                                      .bearer_token = options.token,
                                      .username = options.username,
                                      .password = options.password,
                                      .insecure_tls = options.insecure_tls});
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      const double wait_s =
          failures > 0 ? mlflow::retry_delay_s(failures, options.max_retry_interval_s) : options.flush_interval_s;
      Clock::time_point until =
          Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait_s));
      if (deadline) until = std::min(until, *deadline);
      // finalize() wakes the sender at once, unless it is waiting to retry.
      wake.wait_until(lock, until, [&] { return flush_now || (end_status && failures == 0) || broken; });
      flush_now = false;
      trim_buffer();
      if (broken || (deadline && Clock::now() >= *deadline && failures > 0)) break;
      lock.unlock();
      bool sent = false;
      try {
        sent = send_pending(http);
      } catch (const std::exception& e) {
        // An answer that is not MLflow's JSON (a proxy's HTML page at the URI): nothing will work.
        give_up(std::string("the server's answer was not MLflow's (") + e.what() + "); is " + tracking_uri +
                " an MLflow tracking server?");
      }
      lock.lock();
      if (sent) {
        if (failures > 0 && reported_unreachable) {
          console->warn(fmt::format("MLFlowLogger: {} answers again after {} failed requests; sending what was kept.",
                                    tracking_uri, failures));
        }
        failures = 0;
        reported_unreachable = false;
      } else {
        ++failures;
      }
      if (broken || (end_status && all_sent())) break;
      if (deadline && Clock::now() >= *deadline) break;
    }
    sender_running = false;
  }
};

MLFlowLogger::MLFlowLogger(const LoggerOptions& options, MLFlowOptions mlflow) : impl_(std::make_unique<Impl>()) {
  Impl& impl = *impl_;
  VOLT_CHECK(mlflow.tracking_uri.has_value(),
             "MLFlowLogger has no tracking URI. HINT: set MLFlowOptions::tracking_uri (--mlflow-tracking-uri), e.g. "
             "http://127.0.0.1:5000 for `mlflow server --host 127.0.0.1 --port 5000`, or fill the options from "
             "MLFLOW_TRACKING_URI with volt::mlflow_options_from_env(options, volt::Env::from_process()).");
  VOLT_CHECK(
      mlflow.flush_interval_s > 0 && mlflow.request_timeout_s > 0 && mlflow.finalize_timeout_s >= 0 &&
          mlflow.max_retry_interval_s > 0,
      "MLFlowOptions: flush_interval_s={}, request_timeout_s={}, finalize_timeout_s={}, max_retry_interval_s={}; "
      "expected positive seconds (finalize_timeout_s may be 0). HINT: leave them at their defaults.",
      mlflow.flush_interval_s, mlflow.request_timeout_s, mlflow.finalize_timeout_s, mlflow.max_retry_interval_s);
  impl.tracking_uri = mlflow::normalize_tracking_uri(*mlflow.tracking_uri);
  impl.experiment_name = mlflow.experiment_name.value_or(options.name.empty() ? "Default" : options.name);
  impl.version = resolve_version(options);
  impl.log_dir = (fs::path(options.save_dir) / options.name / impl.version).string();
  impl.append = options.append;
  impl.console = internal::logger_console(options, "MLFlowLogger");
  impl.options = std::move(mlflow);
  // A requeued job's folder may hold what the server did not take before the requeue: it goes
  // out first, ahead of this run's records.
  if (impl.append) impl.reload_undelivered();
}

MLFlowLogger::~MLFlowLogger() {
  try {
    bool running = false;
    {
      const std::lock_guard<std::mutex> lock(impl_->mutex);
      running = impl_->sender_running && !impl_->end_status;
    }
    if (running) finalize("failed");
    if (impl_->sender.joinable()) impl_->sender.join();
  } catch (const std::exception& e) {
    impl_->console->warn(std::string("MLFlowLogger could not finish: ") + e.what());
  }
}

std::string MLFlowLogger::name() const { return impl_->experiment_name; }

std::string MLFlowLogger::log_dir() const { return impl_->log_dir; }

std::string MLFlowLogger::tracking_uri() const { return impl_->tracking_uri; }

void MLFlowLogger::log_hyperparams(const nlohmann::json& params) {
  const std::vector<std::pair<std::string, std::string>> flat = mlflow::flatten_params(params);
  std::vector<std::string> changed;
  {
    const std::lock_guard<std::mutex> lock(impl_->mutex);
    for (const auto& [key, value] : flat) {
      const auto [it, added] = impl_->params_seen.emplace(key, value);
      if (added) {
        impl_->params.emplace_back(key, value);
      } else if (it->second != value) {
        // MLflow refuses to change a param within a run: keep the first, say so once.
        ++impl_->delivery.params_rejected;
        changed.push_back(fmt::format("{} ({} -> {})", key, it->second, value));
      }
    }
    impl_->record_added();
  }
  if (!changed.empty() && !impl_->warned_param_change) {
    impl_->warned_param_change = true;
    impl_->console->warn("MLFlowLogger: MLflow keeps a run's first value of a param; not sent: " + join(changed, ", "));
  }
}

void MLFlowLogger::log_metrics(const std::map<std::string, double>& metrics, int64_t step) {
  const int64_t timestamp = now_ms();
  const std::lock_guard<std::mutex> lock(impl_->mutex);
  for (const auto& [name, value] : metrics) {
    impl_->metrics.push_back(MetricValue{mlflow::metric_key(name), value, timestamp, step});
  }
  impl_->record_added();
  // Once the server refused the run no sender drains the buffer: the values go to the file now.
  // (Otherwise only the sender trims, so that it never loses track of the batch it is sending.)
  if (impl_->broken) impl_->trim_buffer();
}

void MLFlowLogger::set_tag(const std::string& key, const std::string& value) {
  const std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->tags.emplace_back(mlflow::metric_key(key), value);
  impl_->record_added();
}

void MLFlowLogger::log_artifact(const std::string& local_path, const std::string& artifact_path) {
  const std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->artifacts.push_back(Artifact{local_path, artifact_path});
  impl_->record_added();
}

void MLFlowLogger::after_save_checkpoint(const std::string& path) {
  if (impl_->options.log_model == LogModel::kAll) {
    // A sharded checkpoint's shards with it: the files are complete now.
    for (const std::string& file : checkpoint_files(path))
      log_artifact(file, "checkpoints/" + fs::path(file).filename().string());
  } else if (impl_->options.log_model == LogModel::kEnd) {
    const std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->saved_checkpoints.push_back(path);
  }
}

void MLFlowLogger::after_save_config(const std::string& path) {
  log_artifact(path, fs::path(path).filename().string());
}

void MLFlowLogger::save() {
  const std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->flush_now = true;
  impl_->wake.notify_all();
}

void MLFlowLogger::finalize(const std::string& status) {
  Impl& impl = *impl_;
  {
    const std::lock_guard<std::mutex> lock(impl.mutex);
    if (!impl.sender_running && impl.metrics.empty() && impl.params.empty() && impl.tags.empty() &&
        impl.artifacts.empty() && impl.saved_checkpoints.empty() && impl.delivery.run_id.empty()) {
      return;  // nothing was ever logged: no run to end (Lightning's finalize does the same)
    }
    // log_model "end": the checkpoints that still exist are the ones ModelCheckpoint kept.
    std::set<std::string> queued;
    for (const std::string& path : impl.saved_checkpoints) {
      if (!queued.insert(path).second || !fs::exists(path)) continue;
      for (const std::string& file : checkpoint_files(path))
        impl.artifacts.push_back(Artifact{file, "checkpoints/" + fs::path(file).filename().string()});
    }
    impl.saved_checkpoints.clear();
    impl.end_status = mlflow::run_status(status);
    impl.delivery.status_sent = false;
    // A run stopped for a requeue or by SIGTERM has SLURM's KillWait (30 s by default) to exit:
    // it waits 5 s at most, and a requeued job sends the rest when it resumes in this folder.
    const double wait_s = impl.end_status == "KILLED" ? std::min(impl.options.finalize_timeout_s, kStoppedWaitS)
                                                      : impl.options.finalize_timeout_s;
    impl.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait_s));
    impl.ensure_sender();
    impl.flush_now = true;
    impl.wake.notify_all();
  }
  if (impl.sender.joinable()) impl.sender.join();
  const std::lock_guard<std::mutex> lock(impl.mutex);
  impl.deadline.reset();
  // What an earlier run left was sent by now, or is written again below with the rest.
  if (impl.owns_resending) {
    std::error_code error;
    fs::remove(impl.resending_path(), error);
    impl.owns_resending = false;
  }
  const bool complete = impl.all_sent();
  const size_t params_left = impl.params.size();
  const size_t tags_left = impl.tags.size();
  const size_t files_left = impl.artifacts.size();
  if (!complete) {
    // What the server did not take is written down, not dropped: the run's values are the user's.
    impl.save_undelivered_metrics(impl.metrics.begin(), impl.metrics.end());
    impl.metrics.clear();
    std::ofstream out = impl.open_undelivered();
    for (const auto& [key, value] : impl.params) {
      out << nlohmann::json{{"type", "param"}, {"key", key}, {"value", value}}.dump() << "\n";
    }
    for (const auto& [key, value] : impl.tags) {
      out << nlohmann::json{{"type", "tag"}, {"key", key}, {"value", value}}.dump() << "\n";
    }
    for (const Artifact& a : impl.artifacts) {
      out << nlohmann::json{{"type", "artifact"}, {"path", a.local_path}, {"artifact_path", a.artifact_path}}.dump()
          << "\n";
    }
    if (!impl.delivery.status_sent) {
      out << nlohmann::json{{"type", "status"}, {"status", *impl.end_status}, {"end_time", now_ms()}}.dump() << "\n";
    }
    impl.params.clear();
    impl.tags.clear();
    impl.artifacts.clear();
  }
  const int64_t metrics_saved = impl.delivery.metrics_saved - impl.metrics_saved_reported;
  impl.metrics_saved_reported = impl.delivery.metrics_saved;
  if (complete && metrics_saved == 0) return;
  impl.console->warn(
      fmt::format("MLFlowLogger: {} did not take {} metric values, {} params, {} tags, {} files{} (last "
                  "error: {}); they are in {}. HINT: check that the server is up (curl {}/health), then send the "
                  "file's lines with MLflow's client (docs/loggers.md shows how).",
                  impl.tracking_uri, metrics_saved, params_left, tags_left, files_left,
                  impl.delivery.status_sent ? "" : " and the run's status " + *impl.end_status,
                  impl.delivery.last_error.empty() ? "none" : impl.delivery.last_error, impl.undelivered_path(),
                  impl.tracking_uri));
}

MLFlowDelivery MLFlowLogger::delivery() const {
  const std::lock_guard<std::mutex> lock(impl_->mutex);
  MLFlowDelivery out = impl_->delivery;
  out.metrics_pending = static_cast<int64_t>(impl_->metrics.size());
  return out;
}

}  // namespace volt
