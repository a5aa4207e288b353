#include "volt/loggers/tensorboard_logger.h"

#include <google/protobuf/struct.pb.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "volt/core/error.h"
#include "volt/loggers/hparams_yaml.h"
#include "volt/loggers/tensorboard_event.pb.h"
#include "volt/loggers/tfrecord.h"

namespace volt {
namespace {

namespace fs = std::filesystem;
namespace pb = ::volt::tensorboard;

// The names TensorBoard's hparams plugin looks for (tensorboard/plugins/hparams/metadata.py).
constexpr const char* kHparamsPluginName = "hparams";
constexpr int kHparamsPluginDataVersion = 0;
constexpr const char* kExperimentTag = "_hparams_/experiment";
constexpr const char* kSessionStartInfoTag = "_hparams_/session_start_info";
constexpr const char* kSessionEndInfoTag = "_hparams_/session_end_info";
constexpr const char* kHparamsFileName = "hparams.yaml";

/// Counts the event files this process opened, the last part of their names, as TensorBoard's
/// writer does: two loggers opening files in the same second still get different names.
std::atomic<int> event_file_counter{0};

double unix_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buffer[256] = {};
  if (::gethostname(buffer, sizeof(buffer) - 1) != 0 || buffer[0] == '\0') return "localhost";
  return buffer;
}

/// `params` flattened as Lightning's `_flatten_dict(params, delimiter="/")`: a nested non-empty
/// object's leaves get "outer/inner" names.
void flatten(const nlohmann::json& value, const std::string& key, std::map<std::string, nlohmann::json>& out) {
  if (!value.is_object() || value.empty()) {
    out[key] = value;
    return;
  }
  for (const auto& item : value.items()) {
    flatten(item.value(), key.empty() ? item.key() : key + "/" + item.key(), out);
  }
}

/// A hyperparameter as the hparams plugin stores it. TensorBoard knows only numbers, strings
/// and booleans, so, like Lightning's `_sanitize_params`, anything else becomes text: null is
/// Python's "None", arrays and empty objects their JSON.
google::protobuf::Value to_proto_value(const nlohmann::json& value) {
  google::protobuf::Value out;
  if (value.is_boolean()) {
    out.set_bool_value(value.get<bool>());
  } else if (value.is_number()) {
    out.set_number_value(value.get<double>());
  } else if (value.is_string()) {
    out.set_string_value(value.get<std::string>());
  } else if (value.is_null()) {
    out.set_string_value("None");
  } else {
    out.set_string_value(value.dump());
  }
  return out;
}

/// The HParamInfo torch's `hparams()` (which Lightning calls) writes for one value: strings and
/// booleans with their discrete domain, numbers as float64.
pb::HParamInfo hparam_info(const std::string& name, const google::protobuf::Value& value) {
  pb::HParamInfo info;
  info.set_name(name);
  switch (value.kind_case()) {
    case google::protobuf::Value::kBoolValue:
      info.set_type(pb::DATA_TYPE_BOOL);
      info.mutable_domain_discrete()->add_values()->set_bool_value(true);
      info.mutable_domain_discrete()->add_values()->set_bool_value(false);
      return info;
    case google::protobuf::Value::kNumberValue:
      info.set_type(pb::DATA_TYPE_FLOAT64);
      return info;
    default:  // protobuf's enum: to_proto_value only makes the three kinds here
      info.set_type(pb::DATA_TYPE_STRING);
      *info.mutable_domain_discrete()->add_values() = value;
      return info;
  }
}

/// An event holding one hparams plugin summary, as `tensorboard.plugins.hparams` writes them:
/// no value, the data in the metadata's plugin content.
pb::Event hparams_event(const char* tag, pb::HParamsPluginData data) {
  data.set_version(kHparamsPluginDataVersion);
  pb::Event event;
  pb::Summary::Value* value = event.mutable_summary()->add_value();
  value->set_tag(tag);
  pb::SummaryMetadata::PluginData* plugin = value->mutable_metadata()->mutable_plugin_data();
  plugin->set_plugin_name(kHparamsPluginName);
  plugin->set_content(data.SerializeAsString());
  return event;
}

pb::Status session_status(const std::string& status) {
  if (status == "success") return pb::STATUS_SUCCESS;
  if (status == "failed") return pb::STATUS_FAILURE;
  return pb::STATUS_UNKNOWN;  // "interrupted": TensorBoard has no such status
}

}  // namespace

struct TensorBoardLogger::Impl {
  std::string name;
  std::string version;
  std::string log_dir;
  TensorBoardOptions options;
  std::shared_ptr<Console> console;
  nlohmann::json hparams = nlohmann::json::object();
  /// Whether a session start was written whose end finalize() still owes.
  bool session_open = false;
  std::string path;
  std::ofstream file;
  std::chrono::steady_clock::time_point last_flush;

  void create_log_dir() const {
    std::error_code ec;
    fs::create_directories(log_dir, ec);
    VOLT_CHECK(!ec,
               "cannot create TensorBoard log directory '{}': {}. HINT: check that save_dir "
               "is writable.",
               log_dir, ec.message());
  }

  void open() {
    create_log_dir();
    const long long seconds = static_cast<long long>(std::time(nullptr));
    const std::string file_name = fmt::format("{}{:010d}.{}.{}.{}{}", kEventFilePrefix, seconds, host_name(),
                                              ::getpid(), event_file_counter.fetch_add(1), options.filename_suffix);
    const std::string new_path = (fs::path(log_dir) / file_name).string();
    file.open(new_path, std::ios::binary | std::ios::trunc);
    VOLT_CHECK(file.is_open(),
               "cannot open TensorBoard event file '{}' for writing: {}. HINT: "
               "check that the log directory is writable.",
               new_path, std::strerror(errno));
    path = new_path;
    last_flush = std::chrono::steady_clock::now();
    pb::Event first;
    first.set_wall_time(unix_time_now());
    first.set_file_version(kFileVersion);
    write(first);
  }

  void write(pb::Event& event) {
    if (!file.is_open()) open();
    if (event.wall_time() == 0) event.set_wall_time(unix_time_now());
    file << internal::frame_tfrecord(event.SerializeAsString());
    check_written();
    const auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - last_flush).count() >= options.flush_secs) flush();
  }

  void flush() {
    if (!file.is_open()) return;
    file.flush();
    check_written();
    last_flush = std::chrono::steady_clock::now();
  }

  void close() {
    if (!file.is_open()) return;
    file.close();
    check_written();
  }

  void check_written() const {
    VOLT_CHECK(!file.fail(),
               "cannot write TensorBoard event file '{}': {}. HINT: check free "
               "disk space.",
               path, std::strerror(errno));
  }
};

TensorBoardLogger::TensorBoardLogger(const LoggerOptions& options, const TensorBoardOptions& tensorboard_options)
    : impl_(std::make_unique<Impl>()) {
  VOLT_CHECK(std::isfinite(tensorboard_options.flush_secs) && tensorboard_options.flush_secs >= 0,
             "TensorBoardOptions.flush_secs is {}; expected 0 or more seconds. HINT: use 0 to "
             "flush every record.",
             tensorboard_options.flush_secs);
  VOLT_CHECK(tensorboard_options.filename_suffix.find('/') == std::string::npos,
             "TensorBoardOptions.filename_suffix is '{}'; expected no '/'. HINT: choose the "
             "folder with LoggerOptions.save_dir and name.",
             tensorboard_options.filename_suffix);
  impl_->name = options.name;
  impl_->version = resolve_version(options);
  LoggerOptions resolved = options;
  resolved.version = impl_->version;
  impl_->log_dir = resolve_log_dir(resolved);
  impl_->options = tensorboard_options;
  impl_->console = internal::logger_console(options, "TensorBoardLogger");
}

TensorBoardLogger::~TensorBoardLogger() {
  try {
    impl_->close();
  } catch (const std::exception& e) {
    impl_->console->warn(std::string("TensorBoardLogger could not close its event file: ") + e.what());
  }
}

std::string TensorBoardLogger::name() const { return impl_->name; }

std::string TensorBoardLogger::log_dir() const { return impl_->log_dir; }

std::string TensorBoardLogger::version() const { return impl_->version; }

std::string TensorBoardLogger::event_file_path() const { return impl_->path; }

void TensorBoardLogger::log_hyperparams(const nlohmann::json& params) {
  VOLT_CHECK(params.is_object(),
             "log_hyperparams got a JSON {}; expected an object of name: value pairs. HINT: wrap "
             "it, e.g. {{\"value\": ...}}.",
             params.type_name());
  impl_->hparams.update(params);

  std::map<std::string, nlohmann::json> flat;
  flatten(impl_->hparams, "", flat);
  pb::HParamsPluginData experiment_data;
  pb::Experiment* experiment = experiment_data.mutable_experiment();
  pb::HParamsPluginData start_data;
  pb::SessionStartInfo* start = start_data.mutable_session_start_info();
  start->set_start_time_secs(unix_time_now());
  for (const auto& [key, json_value] : flat) {
    const google::protobuf::Value value = to_proto_value(json_value);
    *experiment->add_hparam_infos() = hparam_info(key, value);
    (*start->mutable_hparams())[key] = value;
  }
  if (impl_->options.default_hp_metric) {
    experiment->add_metric_infos()->mutable_name()->set_tag(kHpMetric);
  }

  pb::Event experiment_event = hparams_event(kExperimentTag, experiment_data);
  impl_->write(experiment_event);
  pb::Event start_event = hparams_event(kSessionStartInfoTag, start_data);
  impl_->write(start_event);
  impl_->session_open = true;
  if (impl_->options.default_hp_metric) log_metrics({{kHpMetric, -1.0}}, 0);
  save_hparams_to_yaml((fs::path(impl_->log_dir) / kHparamsFileName).string(), impl_->hparams);
}

void TensorBoardLogger::log_metrics(const std::map<std::string, double>& metrics, int64_t step) {
  if (metrics.empty()) return;
  pb::Event event;
  event.set_step(step);
  for (const auto& [tag, value] : metrics) {
    pb::Summary::Value* summary_value = event.mutable_summary()->add_value();
    summary_value->set_tag(tag);
    summary_value->set_simple_value(static_cast<float>(value));
  }
  impl_->write(event);
}

void TensorBoardLogger::save() { impl_->flush(); }

void TensorBoardLogger::finalize(const std::string& status) {
  if (impl_->session_open) {
    pb::HParamsPluginData end;
    end.mutable_session_end_info()->set_status(session_status(status));
    end.mutable_session_end_info()->set_end_time_secs(unix_time_now());
    pb::Event end_event = hparams_event(kSessionEndInfoTag, end);
    impl_->write(end_event);
    impl_->session_open = false;
  }
  impl_->close();
}

}  // namespace volt
