#include "volt/slurm/job_spec.h"

#include <algorithm>
#include <cctype>

#include "volt/core/error.h"
#include "volt/core/problems.h"
#include "volt/core/strings.h"

namespace volt::slurm {

namespace {

/// Signals a program can catch and act on before the time limit (KILL and STOP cannot be caught).
constexpr const char* kSignals[] = {"USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "ALRM", "CONT"};
/// sbatch stores the lead time in 16 bits.
constexpr int64_t kMaxSignalLeadSeconds = 65535;

bool is_alnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }

bool only_chars(std::string_view text, std::string_view extra) {
  return std::all_of(text.begin(), text.end(),
                     [&](char c) { return is_alnum(c) || extra.find(c) != std::string_view::npos; });
}

bool has_space_or_quote(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](char c) {
    return std::isspace(static_cast<unsigned char>(c)) != 0 || c == '"' || c == '\'' || c == '\\';
  });
}

bool is_shell_name(std::string_view name) {
  return !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) && only_chars(name, "_");
}

std::optional<int64_t> parse_field(std::string_view text) {
  if (text.empty() || text.size() > 9) return std::nullopt;
  for (char c : text)
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  return std::stoll(std::string(text));
}

/// The first `%` pattern in an output path that SLURM does not expand, or "" when all are known.
std::string unknown_file_pattern(std::string_view path) {
  for (std::size_t i = 0; i < path.size(); ++i) {
    if (path[i] != '%') continue;
    std::size_t j = i + 1;
    if (j < path.size() && path[j] == '%') {
      i = j;
      continue;
    }
    if (j < path.size() && std::isdigit(static_cast<unsigned char>(path[j]))) ++j;  // zero padding: %3a
    if (j >= path.size() || std::string_view("jAaxuN").find(path[j]) == std::string_view::npos) {
      return std::string(path.substr(i, j + 1 - i));
    }
    i = j;
  }
  return "";
}

void check_token(std::vector<std::string>& problems, const char* field, const std::string& value, const char* example) {
  if (value.empty() || only_chars(value, "._,:+-")) return;
  problems.push_back(
      fmt::format("{}='{}' has characters an #SBATCH line cannot hold; expected letters, digits and '._,:+-'. "
                  "HINT: use the name SLURM shows (e.g. '{}').",
                  field, value, example));
}

void check_file_path(std::vector<std::string>& problems, const char* field, const std::string& path) {
  if (path.empty()) return;
  if (has_space_or_quote(path)) {
    problems.push_back(
        fmt::format("{}='{}' has spaces, quotes or backslashes; expected a path an #SBATCH line can hold. "
                    "HINT: use a path without them, e.g. 'logs/%x-%j.out'.",
                    field, path));
    return;
  }
  const std::string pattern = unknown_file_pattern(path);
  if (pattern.empty()) return;
  problems.push_back(
      fmt::format("{}='{}' has the pattern '{}', which SLURM does not expand; expected %j, %A, %a, %x, %u, %N or %% "
                  "(optionally zero-padded, e.g. %3a). HINT: write a literal '%' as '%%'.",
                  field, path, pattern));
}

void check_signal(std::vector<std::string>& problems, const JobSpec& spec) {
  if (spec.signal.empty()) return;
  const bool known =
      std::any_of(std::begin(kSignals), std::end(kSignals), [&](const char* name) { return spec.signal == name; });
  if (!known) {
    std::vector<std::string> names(std::begin(kSignals), std::end(kSignals));
    const bool prefixed = spec.signal.rfind("SIG", 0) == 0;
    problems.push_back(
        fmt::format("signal='{}' is not a signal SLURM can send ahead of the time limit; expected one of {}. HINT: {}.",
                    spec.signal, join(names, ", "),
                    prefixed ? fmt::format("write '{}' without 'SIG'", spec.signal.substr(3))
                             : std::string("use USR1, which the Trainer's auto-requeue listens for")));
  }
  if (spec.max_restarts < 0) {
    problems.push_back(fmt::format(
        "max_restarts={} is negative; expected how many times a failed srun step starts again. HINT: use 0 to run "
        "it once, or e.g. 3.",
        spec.max_restarts));
  }
  if (spec.signal_lead_seconds < 1 || spec.signal_lead_seconds > kMaxSignalLeadSeconds) {
    problems.push_back(
        fmt::format("signal_lead_seconds={} is out of range; expected 1 to {} seconds. HINT: 90 leaves time to save "
                    "a checkpoint and requeue.",
                    spec.signal_lead_seconds, kMaxSignalLeadSeconds));
    return;
  }
  const std::optional<int64_t> limit = parse_time_limit(spec.time);
  if (limit && spec.signal_lead_seconds >= *limit) {
    problems.push_back(
        fmt::format("signal_lead_seconds={} is not below time='{}' ({} s); expected the signal to come before the time "
                    "limit. HINT: lower signal_lead_seconds or raise time (volt slurm: --signal-lead, --time).",
                    spec.signal_lead_seconds, spec.time, *limit));
  }
}

void check_time(std::vector<std::string>& problems, const JobSpec& spec) {
  if (spec.time.empty()) {
    if (!spec.requeue) return;
    problems.push_back(
        "requeue=true but time is empty; expected a time limit, since the requeue signal is sent relative to "
        "it. HINT: set time, e.g. '02:00:00', or requeue=false.");
    return;
  }
  if (parse_time_limit(spec.time)) return;
  problems.push_back(
      fmt::format("time='{}' is not a SLURM time limit; expected 'MM', 'MM:SS', 'HH:MM:SS', 'D-HH', 'D-HH:MM' or "
                  "'D-HH:MM:SS' above zero, with minutes and seconds below 60. HINT: write two hours as '02:00:00' and "
                  "a day and a half as '1-12:00:00'.",
                  spec.time));
}

void check_counts(std::vector<std::string>& problems, const JobSpec& spec) {
  if (spec.nodes < 1) {
    problems.push_back(fmt::format(
        "nodes={} is not allowed; expected 1 or more. HINT: set nodes to the Trainer's num_nodes.", spec.nodes));
  }
  if (spec.ntasks_per_node < 1) {
    problems.push_back(
        fmt::format("ntasks_per_node={} is not allowed; expected 1 or more. HINT: set it to the Trainer's devices "
                    "(one task per device).",
                    spec.ntasks_per_node));
  }
  if (spec.gpus_per_node < 0) {
    problems.push_back(fmt::format("gpus_per_node={} is not allowed; expected 0 or more. HINT: use 0 for a CPU job.",
                                   spec.gpus_per_node));
  }
  if (!spec.gpu_type.empty() && spec.gpus_per_node <= 0) {
    problems.push_back(
        fmt::format("gpu_type='{}' is set but gpus_per_node={}; expected a GPU count with a GPU type. HINT: set "
                    "gpus_per_node, or clear gpu_type.",
                    spec.gpu_type, spec.gpus_per_node));
  }
  if (!spec.gpu_type.empty() && !only_chars(spec.gpu_type, "._-")) {
    problems.push_back(fmt::format(
        "gpu_type='{}' has characters a GRES name cannot hold; expected letters, digits and '._-'. HINT: use "
        "the type `sinfo -o %G` shows, e.g. 'a100'.",
        spec.gpu_type));
  }
  if (spec.cpus_per_task && *spec.cpus_per_task < 1) {
    problems.push_back(
        fmt::format("cpus_per_task={} is not allowed; expected 1 or more. HINT: leave it unset for SLURM's default.",
                    *spec.cpus_per_task));
  }
  if (spec.array && (spec.array->size < 1 || spec.array->parallelism < 0)) {
    problems.push_back(fmt::format(
        "array has size={} and parallelism={}; expected size 1 or more and parallelism 0 (no limit) or more. "
        "HINT: use one task per sweep trial, e.g. size=trials.size().",
        spec.array->size, spec.array->parallelism));
  }
}

void check_mem(std::vector<std::string>& problems, const JobSpec& spec) {
  if (!spec.mem) return;
  const std::string& mem = *spec.mem;
  std::string_view digits = mem;
  if (!digits.empty() && std::string_view("KMGT").find(digits.back()) != std::string_view::npos) {
    digits.remove_suffix(1);
  }
  if (parse_field(digits)) return;
  problems.push_back(fmt::format(
      "mem='{}' is not a memory size; expected digits with an optional unit K, M, G or T (e.g. '16G'). HINT: "
      "write 16 GiB as '16G', or leave mem unset for SLURM's default.",
      mem));
}

void check_script_parts(std::vector<std::string>& problems, const JobSpec& spec) {
  for (std::size_t i = 0; i < spec.modules.size(); ++i) {
    const std::string& module = spec.modules[i];
    if (!module.empty() && !has_space_or_quote(module)) continue;
    problems.push_back(fmt::format(
        "modules[{}]='{}' is not one module name; expected a name like 'cuda/12.1'. HINT: give each module its "
        "own entry.",
        i, module));
  }
  for (std::size_t i = 0; i < spec.extra_sbatch.size(); ++i) {
    const std::string& line = spec.extra_sbatch[i];
    if (!line.empty() && line[0] == '-' && line.find('\n') == std::string::npos) continue;
    problems.push_back(
        fmt::format("extra_sbatch[{}]='{}' is not one sbatch option; expected an option on one line starting with '-'. "
                    "HINT: write the option only, e.g. '--exclusive' (the '#SBATCH ' is added).",
                    i, line));
  }
  for (const auto& [name, value] : spec.env) {
    if (is_shell_name(name)) continue;
    problems.push_back(
        fmt::format("env has the name '{}', which is not a shell variable name; expected letters, digits and '_', not "
                    "starting with a digit. HINT: write it like 'NCCL_DEBUG'.",
                    name));
  }
  for (std::size_t i = 0; i < spec.setup.size(); ++i) {
    if (spec.setup[i].find('\n') == std::string::npos) continue;
    problems.push_back(fmt::format(
        "setup[{}] spans several lines; expected one bash line per entry. HINT: split it at its line breaks.", i));
  }
  if (spec.command.empty() || spec.command[0].empty()) {
    problems.push_back(
        "command is empty; expected the training program and its arguments. HINT: set command, e.g. "
        "{\"./train\", \"--devices\", \"4\"}; srun runs it on every task.");
  }
}

std::string suggested_job_name(const std::string& name) {
  std::string out;
  for (char c : name) out += is_alnum(c) || c == '.' || c == '-' ? c : '_';
  return out.empty() ? "volt" : out;
}

}  // namespace

std::string array_range(const ArraySpec& array) {
  std::string range = array.size == 1 ? "0" : fmt::format("0-{}", array.size - 1);
  if (array.parallelism > 0) range += fmt::format("%{}", array.parallelism);
  return range;
}

std::optional<int64_t> parse_time_limit(std::string_view text) {
  int64_t days = 0;
  const std::size_t dash = text.find('-');
  if (dash != std::string_view::npos) {
    const std::optional<int64_t> d = parse_field(text.substr(0, dash));
    if (!d) return std::nullopt;
    days = *d;
  }
  const std::vector<std::string> parts = split(dash == std::string_view::npos ? text : text.substr(dash + 1), ':');
  if (parts.size() > 3) return std::nullopt;
  std::vector<int64_t> values;
  for (const auto& part : parts) {
    const std::optional<int64_t> v = parse_field(part);
    if (!v) return std::nullopt;
    values.push_back(*v);
  }
  // Without days the fields are M, M:S or H:M:S; with days they are H, H:M or H:M:S.
  int64_t hours = 0, minutes = 0, seconds = 0;
  if (dash == std::string_view::npos) {
    // Align right: the last field is seconds unless it stands alone (minutes).
    if (values.size() == 1) {
      minutes = values[0];
    } else {
      seconds = values.back();
      minutes = values[values.size() - 2];
      if (values.size() == 3) hours = values[0];
    }
    if (values.size() == 3 && minutes >= 60) return std::nullopt;
  } else {
    hours = values[0];
    if (values.size() >= 2) minutes = values[1];
    if (values.size() == 3) seconds = values[2];
    if (hours >= 24 || minutes >= 60) return std::nullopt;
  }
  if (values.size() >= 2 && seconds >= 60) return std::nullopt;
  const int64_t total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds;
  if (total <= 0) return std::nullopt;
  return total;
}

std::string shell_quote(std::string_view word) {
  if (!word.empty() && only_chars(word, "@%+=:,./_-")) return std::string(word);
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::vector<std::string> validate(const JobSpec& spec) {
  std::vector<std::string> problems;
  if (spec.job_name.empty() || !only_chars(spec.job_name, "._-")) {
    problems.push_back(fmt::format(
        "job_name='{}' is not allowed; expected one or more letters, digits, '.', '_' or '-'. HINT: use a name "
        "like '{}'.",
        spec.job_name, suggested_job_name(spec.job_name)));
  }
  check_counts(problems, spec);
  check_mem(problems, spec);
  check_time(problems, spec);
  check_token(problems, "partition", spec.partition, "gpu");
  check_token(problems, "account", spec.account, "my_project");
  check_token(problems, "qos", spec.qos, "normal");
  check_file_path(problems, "output", spec.output);
  check_file_path(problems, "error", spec.error);
  check_signal(problems, spec);
  check_script_parts(problems, spec);
  return problems;
}

std::string render_sbatch_script(const JobSpec& spec) {
  throw_if_problems(fmt::format("the sbatch job '{}'", spec.job_name), validate(spec));
  std::string out = "#!/bin/bash\n";
  const auto option = [&out](std::string_view text) { out += fmt::format("#SBATCH {}\n", text); };
  option("--job-name=" + spec.job_name);
  option(fmt::format("--nodes={}", spec.nodes));
  option(fmt::format("--ntasks-per-node={}", spec.ntasks_per_node));
  if (spec.gpus_per_node > 0) {
    option(spec.gpu_type.empty() ? fmt::format("--gres=gpu:{}", spec.gpus_per_node)
                                 : fmt::format("--gres=gpu:{}:{}", spec.gpu_type, spec.gpus_per_node));
  }
  if (spec.cpus_per_task) option(fmt::format("--cpus-per-task={}", *spec.cpus_per_task));
  if (spec.mem) option("--mem=" + *spec.mem);
  if (!spec.time.empty()) option("--time=" + spec.time);
  if (!spec.partition.empty()) option("--partition=" + spec.partition);
  if (!spec.account.empty()) option("--account=" + spec.account);
  if (!spec.qos.empty()) option("--qos=" + spec.qos);
  if (!spec.output.empty()) option("--output=" + spec.output);
  if (!spec.error.empty()) option("--error=" + spec.error);
  if (spec.open_mode_append) option("--open-mode=append");
  if (!spec.signal.empty()) {
    option(fmt::format("--signal={}{}@{}", spec.signal_to_batch_shell_only ? "B:" : "", spec.signal,
                       spec.signal_lead_seconds));
  }
  if (spec.requeue) option("--requeue");
  if (spec.array) option("--array=" + array_range(*spec.array));
  for (const auto& line : spec.extra_sbatch) option(line);

  // No -u: module and environment activation scripts read unset variables. -e stops a job
  // whose setup failed before it holds the nodes for nothing.
  out += "\nset -eo pipefail\n\n";
  for (const auto& module : spec.modules) out += "module load " + shell_quote(module) + "\n";
  for (const auto& [name, value] : spec.env) out += fmt::format("export {}={}\n", name, shell_quote(value));
  for (const auto& line : spec.setup) out += line + "\n";
  if (!spec.modules.empty() || !spec.env.empty() || !spec.setup.empty()) out += "\n";

  std::vector<std::string> words{"srun"};
  for (const auto& arg : spec.command) words.push_back(shell_quote(arg));
  const std::string srun = join(words, " ");
  if (spec.max_restarts == 0) return out + srun + "\n";
  // A failed step starts again in the same allocation; each attempt knows its number, so that a
  // restarted Trainer says where it resumed from (and an injected fault strikes only once). A
  // requeue ends the step with 0 and so the loop; SIGTERM at the time limit ends the shell too.
  return out + fmt::format(
                   "# Runs the step again after a failure, up to {0} times; the Trainer resumes from its newest\n"
                   "# snapshot (--snapshot-every-n-steps).\n"
                   "attempt=0\n"
                   "while true; do\n"
                   "  export VOLT_RESTART_COUNT=$attempt\n"
                   "  status=0\n"
                   "  {1} || status=$?\n"
                   "  if [ \"$status\" -eq 0 ]; then exit 0; fi\n"
                   "  if [ \"$attempt\" -ge {0} ]; then\n"
                   "    echo \"volt: the srun step failed with exit code $status after {0} restarts; giving up.\" >&2\n"
                   "    exit \"$status\"\n"
                   "  fi\n"
                   "  attempt=$((attempt + 1))\n"
                   "  echo \"volt: the srun step failed with exit code $status; starting it again (restart $attempt of "
                   "{0}).\" >&2\n"
                   "done\n",
                   spec.max_restarts, srun);
}

}  // namespace volt::slurm
