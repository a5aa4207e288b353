#include "sweep_jobs.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt::tool {
namespace {

constexpr const char* kJobsFormat = "volt-sweep-jobs";

/// True when `base` still logs where JobSpec's defaults put it, so the sweep may move the logs.
bool default_output(const slurm::JobSpec& base) {
  const slurm::JobSpec defaults;
  return base.output == defaults.output && base.error == defaults.error;
}

/// True when `arg` is `flag` or `flag=...`.
bool is_flag(const std::string& arg, const std::string& flag) { return arg == flag || arg.rfind(flag + "=", 0) == 0; }

bool all_digits(const std::string& text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); });
}

}  // namespace

std::vector<std::string> run_trial_command(const SweepJobOptions& options, std::optional<int64_t> index) {
  std::vector<std::string> command{options.volt_executable,   "sweep", "run-trial",        "--manifest",
                                   options.layout.manifest(), "--out", options.layout.root};
  if (index) {
    command.push_back("--index");
    command.push_back(std::to_string(*index));
  }
  command.push_back("--");
  command.insert(command.end(), options.program.begin(), options.program.end());
  return command;
}

slurm::JobSpec sweep_array_job(const slurm::JobSpec& base, const SweepJobOptions& options, int64_t trials) {
  slurm::JobSpec spec = base;
  spec.array = slurm::ArraySpec{trials, options.max_parallel};
  spec.command = run_trial_command(options, std::nullopt);
  if (default_output(base)) {
    spec.output = options.layout.logs_dir() + "/slurm-%A_%a.out";
    spec.error = spec.output;
  }
  return spec;
}

slurm::JobSpec trial_job(const slurm::JobSpec& base, const SweepJobOptions& options, const slurm::Trial& trial) {
  slurm::JobSpec spec = base;
  const std::string trial_name = trial.output_dir("");  // "trial_003"
  spec.job_name = base.job_name + "-" + trial_name;
  spec.array.reset();
  spec.command = run_trial_command(options, trial.index);
  if (default_output(base)) {
    spec.output = options.layout.logs_dir() + "/" + trial_name + "-%j.out";
    spec.error = spec.output;
  }
  return spec;
}

std::vector<std::string> check_program_for_sweep(const std::vector<std::string>& program,
                                                 const std::vector<slurm::SweepParameter>& parameters) {
  std::vector<std::string> problems;
  for (std::size_t i = 1; i < program.size(); ++i) {
    if (is_flag(program[i], "--default-root-dir")) {
      problems.push_back(fmt::format(
          "the program's arguments set {}, but each trial writes to its own directory under the sweep's --out. "
          "HINT: remove --default-root-dir from the program's arguments; run-trial passes "
          "--default-root-dir <out>/trial_XXX.",
          program[i]));
    }
    for (const auto& parameter : parameters) {
      if (!is_flag(program[i], "--" + parameter.name)) continue;
      problems.push_back(fmt::format(
          "the program's arguments set {}, which the sweep sets per trial (--param {}=...). HINT: remove --{} from "
          "the program's arguments.",
          program[i], parameter.name, parameter.name));
    }
  }
  return problems;
}

int64_t resolve_trial_index(std::optional<int64_t> index, const Env& env) {
  if (index) {
    VOLT_CHECK(*index >= 0,
               "--index {} is negative; expected a trial index 0, 1, ... HINT: see the manifest's "
               "\"index\" fields.",
               *index);
    return *index;
  }
  const auto task = env.get("SLURM_ARRAY_TASK_ID");
  VOLT_CHECK(task.has_value(),
             "no trial index: neither --index nor SLURM_ARRAY_TASK_ID is set; expected one. HINT: "
             "run-trial runs inside a sweep's job array, which sets SLURM_ARRAY_TASK_ID; outside one, pass --index 0.");
  const auto parsed = parse_int(*task);
  VOLT_CHECK(parsed && *parsed >= 0,
             "SLURM_ARRAY_TASK_ID='{}' is not a trial index; expected a whole number >= 0. "
             "HINT: pass --index to choose the trial.",
             *task);
  return *parsed;
}

std::vector<std::string> run_trial_argv(const std::vector<std::string>& program, const slurm::Trial& trial,
                                        const std::string& root) {
  std::vector<std::string> argv = program;
  const auto flags = trial.flags();
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back("--default-root-dir");
  argv.push_back(trial.output_dir(root));
  return argv;
}

std::string render_jobs_file(const std::vector<JobRecord>& jobs) {
  nlohmann::json records = nlohmann::json::array();
  for (const auto& job : jobs) records.push_back({{"index", job.index}, {"job_id", job.job_id}});
  const nlohmann::json file{{"format", kJobsFormat}, {"version", 1}, {"jobs", records}};
  return file.dump(2) + "\n";
}

std::vector<JobRecord> parse_jobs_file(const std::string& text, const std::string& source) {
  const std::string expected = "a jobs file 'volt sweep submit' wrote";
  std::vector<JobRecord> jobs;
  try {
    const auto file = nlohmann::json::parse(text);
    VOLT_CHECK(file.is_object() && file.value("format", "") == kJobsFormat,
               "{} is not {} (no \"format\": \"{}\"). HINT: pass the --out of a submitted sweep.", source, expected,
               kJobsFormat);
    for (const auto& record : file.at("jobs")) {
      jobs.push_back({record.at("index").get<int64_t>(), record.at("job_id").get<std::string>()});
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(
        fmt::format("{} is not {} ({}). HINT: pass the --out of a submitted sweep.", source, expected, e.what()));
  }
  return jobs;
}

std::string parse_sbatch_job_id(const std::string& output) {
  const std::string line = trim(split(trim(output), '\n').back());
  std::string id = trim(split(line, ';').front());
  VOLT_CHECK(all_digits(id),
             "sbatch --parsable printed '{}'; expected a job id such as 12345. HINT: check that "
             "'sbatch' is SLURM's sbatch (or pass --sbatch-command).",
             trim(output));
  return id;
}

}  // namespace volt::tool
