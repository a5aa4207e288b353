// The sbatch job flags of `volt slurm render|submit` and `volt sweep render|submit`.
//
// One table maps each flag to one JobSpec field, so a flag on the command line and the same key
// in a `--job-file` JSON object are parsed by the same code and fail with the same message.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <string>
#include <vector>

#include "volt/slurm/job_spec.h"

namespace volt::tool {

/// The job flags of one subcommand, bound to a CLI::App and resolved into a JobSpec.
///
///   CLI::App app;
///   JobFlags flags;
///   flags.add_to(app);
///   app.parse(argc, argv);                    // --nodes 2 --time 01:00:00 --module cuda/12
///   slurm::JobSpec spec = flags.resolve();    // JobSpec defaults < --job-file keys < flags
class JobFlags {
 public:
  /// Adds every job flag (and `--job-file`) to `app`; this object must outlive parsing.
  void add_to(CLI::App& app);

  /// The JobSpec the parsed flags describe: JobSpec's defaults, then the keys of `--job-file`,
  /// then the flags given on the command line (repeatable flags append to the file's lists).
  /// Throws volt::Error naming the flag or key, the value given and what was expected.
  slurm::JobSpec resolve() const;

 private:
  /// The raw values of each value flag, by flag name without dashes.
  std::map<std::string, std::vector<std::string>> values_;
  /// The bound state of each flag without a value, by flag name.
  std::map<std::string, bool> switches_;
  /// The options CLI11 made, by flag name, to ask which were given.
  std::map<std::string, CLI::Option*> options_;
  /// `--job-file`: a JSON object whose keys are flag names.
  std::string job_file_;
};

/// Applies the JSON object `json_text` (keys: the job flag names without dashes, '_' or '-';
/// values: strings, numbers, booleans for flags without a value, arrays for repeatable flags and
/// an object or array for "export") to `spec`. `source` names the file in errors.
void apply_job_json(slurm::JobSpec& spec, const std::string& json_text, const std::string& source);

/// The names of the job flags, without dashes, in the order `--help` lists them.
std::vector<std::string> job_flag_names();

}  // namespace volt::tool
