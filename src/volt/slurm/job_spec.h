// What an sbatch job asks SLURM for, and the batch script that asks for it.
//
// Everything here is pure: render_sbatch_script turns a JobSpec into script text and never
// calls sbatch, so the script a user submits can be pinned by a golden-string test.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace volt::slurm {

/// A job array: tasks 0..size-1, at most `parallelism` running at once (0: no limit).
///
/// One task per sweep trial: `ArraySpec{static_cast<int64_t>(trials.size()), 2}` renders as
/// `--array=0-<size-1>%2`, and each task finds its trial by SLURM_ARRAY_TASK_ID.
struct ArraySpec {
  /// The number of array tasks (>= 1).
  int64_t size = 1;
  /// The most tasks running at once; 0 leaves it to SLURM.
  int64_t parallelism = 0;
};

/// The `--array` value of an array: "0-3%2" for size 4 and parallelism 2, "0" for size 1.
std::string array_range(const ArraySpec& array);

/// The resources, files, signal and command of one sbatch job.
///
/// Empty strings and unset optionals leave the option to SLURM's (or the cluster's) default;
/// everything is checked by `validate`. A typical two-node GPU job:
///
///   JobSpec spec;
///   spec.job_name = "mnist";
///   spec.nodes = 2;
///   spec.ntasks_per_node = 4;    // one task per GPU: the Trainer's devices=4
///   spec.gpus_per_node = 4;
///   spec.time = "02:00:00";
///   spec.partition = "gpu";
///   spec.command = {"./train", "--devices", "4", "--num-nodes", "2"};
///   std::string script = render_sbatch_script(spec);
struct JobSpec {
  /// `--job-name`: letters, digits, '.', '_' and '-' only.
  std::string job_name = "volt";
  /// `--nodes` (>= 1).
  int64_t nodes = 1;
  /// `--ntasks-per-node` (>= 1): one task per Trainer device.
  int64_t ntasks_per_node = 1;
  /// GPUs per node, as `--gres=gpu:N` (0: none requested).
  int64_t gpus_per_node = 0;
  /// The GPU type in `--gres=gpu:<type>:N`, e.g. "a100"; empty for any type.
  std::string gpu_type;
  /// `--cpus-per-task` (>= 1) when set.
  std::optional<int64_t> cpus_per_task;
  /// `--mem` per node when set: digits and an optional K, M, G or T, e.g. "16G".
  std::optional<std::string> mem;
  /// `--time`: "MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM" or "D-HH:MM:SS"; required with
  /// `requeue`, because the signal lead time is measured against it.
  std::string time;
  /// `--partition`, e.g. "gpu" (a comma list is allowed).
  std::string partition;
  /// `--account` to charge.
  std::string account;
  /// `--qos`.
  std::string qos;
  /// `--output` path; `%j` (job id), `%A` (array job id), `%a` (array index), `%x` (job name),
  /// `%u`, `%N`, `%%` and zero-padded forms like `%3a` are expanded by SLURM.
  std::string output = "slurm-%j.out";
  /// `--error` path, with the same patterns as `output`; empty sends stderr to `output`.
  std::string error = "slurm-%j.out";
  /// `--open-mode=append`: a requeued job keeps appending to the same log instead of
  /// truncating what the earlier run wrote.
  bool open_mode_append = true;
  /// The signal SLURM sends before the time limit, without "SIG": USR1, USR2, TERM, INT, HUP,
  /// QUIT, ALRM or CONT; empty sends none.
  std::string signal = "USR1";
  /// How many seconds before the time limit `signal` is sent (1..65535, below the time limit).
  int64_t signal_lead_seconds = 90;
  /// Sends `signal` only to the batch shell (`--signal=B:USR1@90`) instead of to every srun
  /// step. The Trainer runs as srun steps, so the default (false) is what auto-requeue needs.
  bool signal_to_batch_shell_only = false;
  /// `--requeue`: the job may be put back in the queue (by the Trainer, or after a node failure).
  bool requeue = true;
  /// Runs the srun step again after it fails (a task killed, a node lost, a hang the process
  /// group's timeout ended), up to this many times within the same allocation, each with
  /// VOLT_RESTART_COUNT set to the attempt: a Trainer with snapshots resumes from the newest.
  /// 0: run it once.
  int64_t max_restarts = 0;
  /// Environment modules to `module load`, in order, e.g. {"cuda/12.1", "gcc/12"}.
  std::vector<std::string> modules;
  /// Bash lines run before srun, as written (they may use `$SLURM_*` variables).
  std::vector<std::string> setup;
  /// Further sbatch options, one per line, written after the others, e.g. {"--exclusive"}.
  std::vector<std::string> extra_sbatch;
  /// Variables exported before srun, in name order, e.g. {{"NCCL_DEBUG", "INFO"}}; values are
  /// literal (quoted), so use `setup` for values computed by the shell.
  std::map<std::string, std::string> env;
  /// The training program and its arguments, run with srun; each argument is quoted for bash.
  std::vector<std::string> command;
  /// `--array` when set.
  std::optional<ArraySpec> array;
};

/// Every problem with `spec`, each a sentence naming the field, what was given, what is
/// expected and a `HINT:`; empty when the spec can be rendered.
std::vector<std::string> validate(const JobSpec& spec);

/// The bash batch script for `spec`: `#!/bin/bash`, one `#SBATCH` line per set option (in the
/// order of JobSpec's fields, then `extra_sbatch`), `set -eo pipefail`, module loads, exports,
/// setup lines and `srun <command>`. Throws volt::Error listing every problem `validate` finds.
std::string render_sbatch_script(const JobSpec& spec);

/// A SLURM time limit ("90", "10:00", "02:00:00", "1-12", "1-12:30", "1-12:30:00") in
/// seconds, or nullopt when `text` is none of these forms or is zero.
std::optional<int64_t> parse_time_limit(std::string_view text);

/// `word` quoted for bash so that it stays one argument: unchanged when it has only safe
/// characters (letters, digits and `@%+=:,./_-`), otherwise in single quotes with each `'`
/// written as `'\''`; an empty word becomes `''`.
std::string shell_quote(std::string_view word);

}  // namespace volt::slurm
