// The jobs of a sweep: one array job (or one job per trial) whose tasks each run
// `volt sweep run-trial`, which finds its trial in the manifest and runs the program with it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "volt/core/env.h"
#include "volt/slurm/job_spec.h"
#include "volt/slurm/sweep.h"

namespace volt::tool {

/// Where a sweep keeps its files, all under one root directory:
///
///   ROOT/manifest.json          the trials (slurm::render_manifest)
///   ROOT/<job-name>.sbatch      the array script (or ROOT/<job-name>-trial_003.sbatch per trial)
///   ROOT/logs/                  the SLURM logs (slurm-%A_%a.out; trial_003-%j.out per trial)
///   ROOT/jobs.json              the submitted job ids (submit only)
///   ROOT/trial_003/             trial 3's --default-root-dir
struct SweepLayout {
  /// The sweep root, absolute so a job started in any directory finds it.
  std::string root;

  /// ROOT/manifest.json.
  std::string manifest() const { return root + "/manifest.json"; }
  /// ROOT/jobs.json.
  std::string jobs_file() const { return root + "/jobs.json"; }
  /// ROOT/logs.
  std::string logs_dir() const { return root + "/logs"; }
};

/// What the sweep's jobs run and how many run at once.
struct SweepJobOptions {
  /// The absolute path of the `volt` binary the jobs call (`/proc/self/exe` of this one).
  std::string volt_executable;
  /// The sweep's files.
  SweepLayout layout;
  /// The most array tasks running at once (the `%K` of `--array=0-N%K`); 0: no limit.
  int64_t max_parallel = 0;
  /// The training program and its arguments, without the trial's flags.
  std::vector<std::string> program;
};

/// `volt sweep run-trial --manifest M --out ROOT [--index I] -- <program...>`: what each job runs.
std::vector<std::string> run_trial_command(const SweepJobOptions& options, std::optional<int64_t> index);

/// The job array of a sweep with `trials` trials: `base` with `--array=0-<trials-1>%<max_parallel>`,
/// srun running run_trial_command (the task finds its trial by SLURM_ARRAY_TASK_ID), and the
/// logs in ROOT/logs/slurm-%A_%a.out unless `base` names its own.
slurm::JobSpec sweep_array_job(const slurm::JobSpec& base, const SweepJobOptions& options, int64_t trials);

/// The job of one trial (`--one-job-per-trial`): `base` named "<job-name>-trial_003", running
/// run_trial_command with `--index 3`, logging to ROOT/logs/trial_003-%j.out unless `base`
/// names its own log.
slurm::JobSpec trial_job(const slurm::JobSpec& base, const SweepJobOptions& options, const slurm::Trial& trial);

/// Problems with running `program` in a sweep over `parameters`: a flag the sweep sets per trial
/// (a parameter, or --default-root-dir) already in the program's arguments, where two values
/// would fight. Each names the flag and has a HINT.
std::vector<std::string> check_program_for_sweep(const std::vector<std::string>& program,
                                                 const std::vector<slurm::SweepParameter>& parameters);

/// The trial index run-trial runs: `index` when given, else SLURM_ARRAY_TASK_ID from `env`.
/// Throws volt::Error with a HINT when neither is there or the variable is not a number.
int64_t resolve_trial_index(std::optional<int64_t> index, const Env& env);

/// What run-trial executes: `program`, the trial's flags, and `--default-root-dir
/// <root>/trial_XXX`, e.g. {"./train", "--devices", "2", "--lr", "0.1", "--default-root-dir",
/// "/sweeps/a/trial_001"}.
std::vector<std::string> run_trial_argv(const std::vector<std::string>& program, const slurm::Trial& trial,
                                        const std::string& root);

/// A submitted job of a sweep: the trial it runs and its SLURM id ("123_4" for array task 4).
struct JobRecord {
  /// The trial's index.
  int64_t index = 0;
  /// The id squeue and scontrol know the trial's job by.
  std::string job_id;
};

/// ROOT/jobs.json's text: {"format": "volt-sweep-jobs", "version": 1, "jobs": [{"index": 0,
/// "job_id": "123_0"}, ...]}.
std::string render_jobs_file(const std::vector<JobRecord>& jobs);

/// The records of a jobs file render_jobs_file wrote; throws volt::Error when it is not one.
std::vector<JobRecord> parse_jobs_file(const std::string& text, const std::string& source);

/// The job id in `sbatch --parsable` output ("123" or "123;cluster"); throws volt::Error quoting
/// the output when it holds none.
std::string parse_sbatch_job_id(const std::string& output);

}  // namespace volt::tool
