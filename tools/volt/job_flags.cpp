#include "job_flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt::tool {
namespace {

using slurm::JobSpec;
using Values = std::vector<std::string>;

/// How a flag takes its values.
enum class FieldKind {
  kValue,   ///< one value; the last one given wins
  kList,    ///< repeatable, each occurrence one value
  kSwitch,  ///< no value
};

/// One job flag: its name, help text, kind, and how it sets its JobSpec field.
struct JobField {
  const char* name;
  const char* type;
  const char* help;
  FieldKind kind;
  void (*set)(JobSpec& spec, const std::string& value);
};

int64_t whole_number(const std::string& flag, const std::string& value, int64_t min, const char* example) {
  const auto parsed = parse_int(value);
  VOLT_CHECK(parsed && *parsed >= min,
             "--{}='{}' is not a whole number >= {}; expected e.g. --{} {}. HINT: give a plain number.", flag, value,
             min, flag, example);
  return *parsed;
}

void set_export(JobSpec& spec, const std::string& value) {
  const auto eq = value.find('=');
  VOLT_CHECK(eq != std::string::npos && eq > 0,
             "--export '{}' has no NAME=; expected NAME=VALUE, e.g. --export "
             "NCCL_DEBUG=INFO. HINT: write the variable's name, '=' and its value.",
             value);
  const std::string name = value.substr(0, eq);
  const bool valid_name = !std::isdigit(static_cast<unsigned char>(name[0])) &&
                          std::all_of(name.begin(), name.end(),
                                      [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
  VOLT_CHECK(valid_name,
             "--export '{}' names the variable '{}'; expected letters, digits and '_', not starting with a "
             "digit. HINT: use a shell variable name such as NCCL_DEBUG.",
             value, name);
  spec.env[name] = value.substr(eq + 1);
}

// The flags in the order of JobSpec's fields, which is also the order of the #SBATCH lines.
const JobField kFields[] = {
    {"job-name", "NAME", "--job-name: letters, digits, '._-' (default volt)", FieldKind::kValue,
     [](JobSpec& s, const std::string& v) { s.job_name = v; }},
    {"nodes", "N", "--nodes (default 1); the Trainer's --num-nodes", FieldKind::kValue,
     [](JobSpec& s, const std::string& v) { s.nodes = whole_number("nodes", v, 1, "2"); }},
    {"ntasks-per-node", "N", "--ntasks-per-node (default 1); the Trainer's --devices", FieldKind::kValue,
     [](JobSpec& s, const std::string& v) { s.ntasks_per_node = whole_number("ntasks-per-node", v, 1, "4"); }},
    {"gpus-per-node", "N", "GPUs per node, as --gres=gpu:N (default 0: none)", FieldKind::kValue,
     [](JobSpec& s, const std::string& v) { s.gpus_per_node = whole_number("gpus-per-node", v, 0, "4"); }},
    {"gpu-type", "TYPE", "GPU type in --gres=gpu:TYPE:N, e.g. a100", FieldKind::kValue,
     [](JobSpec& s, const std::string& v) { s.gpu_type = v; }},
    {"cpus-per-task", "N", "--cpus-per-task", FieldKind::kValue,
     [](JobSpec& s, const std::string& v) { s.cpus_per_task = whole_number("cpus-per-task", v, 1, "8"); }},
    {"mem", "SIZE", "--mem per node, e.g. 16G", FieldKind::kValue, [](JobSpec& s, const std::string& v) { s.mem = v; }},
    {"time", "TIME", "--time, e.g. 02:00:00 or 1-12 (needed by auto-requeue)", FieldKind::kValue,
     [](JobSpec& s, const std::string& v) { s.time = v; }},
    {"partition", "NAME", "--partition", FieldKind::kValue, [](JobSpec& s, const std::string& v) { s.partition = v; }},
    {"account", "NAME", "--account", FieldKind::kValue, [](JobSpec& s, const std::string& v) { s.account = v; }},
    {"qos", "NAME", "--qos", FieldKind::kValue, [](JobSpec& s, const std::string& v) { s.qos = v; }},
    {"output", "PATH", "--output log path (%j, %A, %a, %x expanded by SLURM; default slurm-%j.out)", FieldKind::kValue,
     [](JobSpec& s, const std::string& v) { s.output = v; }},
    {"error", "PATH", "--error log path (default: the output log)", FieldKind::kValue,
     [](JobSpec& s, const std::string& v) { s.error = v; }},
    {"signal", "SIG", "signal SLURM sends before the time limit: USR1 (default), USR2, TERM, ... or '' for none",
     FieldKind::kValue,
     [](JobSpec& s, const std::string& v) {
       std::string name = v;
       std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::toupper(c); });
       if (name.rfind("SIG", 0) == 0) name = name.substr(3);
       s.signal = name;
     }},
    {"signal-lead", "SECONDS", "seconds before the time limit the signal is sent (default 90)", FieldKind::kValue,
     [](JobSpec& s, const std::string& v) { s.signal_lead_seconds = whole_number("signal-lead", v, 0, "90"); }},
    {"signal-batch-only", "", "send the signal to the batch shell only (B:); auto-requeue needs it on the srun steps",
     FieldKind::kSwitch, [](JobSpec& s, const std::string&) { s.signal_to_batch_shell_only = true; }},
    {"no-requeue", "", "leave out --requeue (auto-requeue needs it)", FieldKind::kSwitch,
     [](JobSpec& s, const std::string&) { s.requeue = false; }},
    {"max-restarts", "N",
     "run the srun step again after it fails, up to N times (default 0); the Trainer resumes from its newest snapshot",
     FieldKind::kValue,
     [](JobSpec& s, const std::string& v) { s.max_restarts = whole_number("max-restarts", v, 0, "3"); }},
    {"module", "MODULE", "module to load, repeatable: --module cuda/12.1 --module gcc/12", FieldKind::kList,
     [](JobSpec& s, const std::string& v) { s.modules.push_back(v); }},
    {"setup", "LINE", "bash line run before srun, repeatable: --setup 'source venv/bin/activate'", FieldKind::kList,
     [](JobSpec& s, const std::string& v) { s.setup.push_back(v); }},
    {"sbatch", "OPTION", "extra #SBATCH option, repeatable: --sbatch=--exclusive", FieldKind::kList,
     [](JobSpec& s, const std::string& v) { s.extra_sbatch.push_back(v); }},
    {"export", "NAME=VALUE", "variable exported before srun, repeatable: --export NCCL_DEBUG=INFO", FieldKind::kList,
     set_export},
};

const JobField* find_field(const std::string& name) {
  for (const auto& field : kFields) {
    if (name == field.name) return &field;
  }
  return nullptr;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  VOLT_CHECK(in.good(), "--job-file '{}' cannot be read; expected a JSON object of job flags. HINT: check the path.",
             path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// The values a JSON value stands for: one for a scalar, each element of an array; booleans
/// are switches ("true" sets, "false" leaves the default).
Values json_values(const std::string& key, const nlohmann::json& value, FieldKind kind, const std::string& source) {
  const auto scalar = [&](const nlohmann::json& item) -> std::string {
    if (item.is_string()) return item.get<std::string>();
    if (item.is_number_integer() || item.is_number_unsigned()) return item.dump();
    throw Error(fmt::format("{}: \"{}\" is {}; expected a string or a whole number. HINT: write e.g. \"{}\": \"...\".",
                            source, key, item.dump(), key));
  };
  if (kind == FieldKind::kSwitch) {
    VOLT_CHECK(value.is_boolean(), "{}: \"{}\" is {}; expected true or false. HINT: write \"{}\": true.", source, key,
               value.dump(), key);
    return value.get<bool>() ? Values{"true"} : Values{};
  }
  if (key == "export" && value.is_object()) {
    Values out;
    for (const auto& [name, item] : value.items()) out.push_back(name + "=" + scalar(item));
    return out;
  }
  if (kind == FieldKind::kList) {
    if (!value.is_array()) return {scalar(value)};
    Values out;
    for (const auto& item : value) out.push_back(scalar(item));
    return out;
  }
  return {scalar(value)};
}

}  // namespace

std::vector<std::string> job_flag_names() {
  std::vector<std::string> names;
  for (const auto& field : kFields) names.emplace_back(field.name);
  return names;
}

void apply_job_json(JobSpec& spec, const std::string& json_text, const std::string& source) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(
        fmt::format("{} is not valid JSON ({}); expected an object of job flags, e.g. {{\"nodes\": 2, "
                    "\"time\": \"01:00:00\"}}. HINT: check the file with python3 -m json.tool.",
                    source, e.what()));
  }
  VOLT_CHECK(json.is_object(),
             "{} holds {}; expected a JSON object of job flags, e.g. {{\"nodes\": 2}}. HINT: wrap "
             "the keys in {{...}}.",
             source, json.type_name());
  for (const auto& [raw_key, value] : json.items()) {
    std::string key = raw_key;
    std::replace(key.begin(), key.end(), '_', '-');
    const JobField* field = find_field(key);
    VOLT_CHECK(field != nullptr,
               "{}: unknown key \"{}\"; expected one of: {}. HINT: the keys are the job flags "
               "without dashes.",
               source, raw_key, join(job_flag_names(), ", "));
    for (const auto& item : json_values(raw_key, value, field->kind, source)) field->set(spec, item);
  }
}

void JobFlags::add_to(CLI::App& app) {
  for (const auto& field : kFields) {
    const std::string flag = std::string("--") + field.name;
    if (field.kind == FieldKind::kSwitch) {
      options_[field.name] = app.add_flag(flag, switches_[field.name], field.help);
      continue;
    }
    // One value per occurrence and no extra arguments: CLI11 lets a vector option swallow the
    // words after it and then eat a `--`, which would turn the program's flags into ours.
    CLI::Option* option = app.add_option(flag, values_[field.name], field.help)
                              ->expected(1)
                              ->allow_extra_args(false)
                              ->type_name(field.type)
                              ->group("Job (sbatch) flags");
    option->multi_option_policy(field.kind == FieldKind::kValue ? CLI::MultiOptionPolicy::TakeLast
                                                                : CLI::MultiOptionPolicy::TakeAll);
    options_[field.name] = option;
  }
  options_["signal-batch-only"]->group("Job (sbatch) flags");
  options_["no-requeue"]->group("Job (sbatch) flags");
  app.add_option("--job-file", job_file_,
                 "JSON object with the same keys as these flags, e.g. {\"nodes\": 2, \"module\": [\"cuda\"]}; flags "
                 "given on the command line win")
      ->group("Job (sbatch) flags");
}

JobSpec JobFlags::resolve() const {
  JobSpec spec;
  if (!job_file_.empty()) apply_job_json(spec, read_file(job_file_), "--job-file '" + job_file_ + "'");
  for (const auto& field : kFields) {
    if (options_.at(field.name)->count() == 0) continue;
    if (field.kind == FieldKind::kSwitch) {
      field.set(spec, "true");
      continue;
    }
    for (const auto& value : values_.at(field.name)) field.set(spec, value);
  }
  return spec;
}

}  // namespace volt::tool
