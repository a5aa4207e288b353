// Where each trial of a submitted sweep stands, from squeue and scontrol output.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sweep_jobs.h"
#include "volt/slurm/sweep.h"

namespace volt::tool {

/// SLURM states by job id from `squeue -h -r -o '%i %T'` output ("123_4 RUNNING" per line).
/// A pending array range that squeue did not split, "123_[4-7%2] PENDING", counts for each task.
std::map<std::string, std::string> parse_squeue(const std::string& output);

/// The JobState in `scontrol show job -o <id>` output ("... JobState=COMPLETED Reason=..."), or
/// nullopt when there is none (SLURM has forgotten the job).
std::optional<std::string> parse_scontrol_state(const std::string& output);

/// The job's state in `sacct -j <id> -n -X -P -o State` output ("FAILED", "CANCELLED by 0": its
/// first word), or nullopt when there is none (no accounting, or it does not know the job).
std::optional<std::string> parse_sacct_state(const std::string& output);

/// The state shown for one trial: squeue's state if the job is queued or running, else
/// scontrol's, else accounting's (sacct), else "ended?" when the trial's directory has files (the
/// job ran, but whether it failed only its log says) and "unknown" when not.
std::string trial_state(const std::optional<std::string>& squeue_state,
                        const std::optional<std::string>& scontrol_state, bool trial_dir_has_files,
                        const std::optional<std::string>& sacct_state = std::nullopt);

/// One line of `volt sweep status`.
struct TrialStatus {
  /// The trial, from the manifest.
  slurm::Trial trial;
  /// Its job id, from jobs.json ("-" when it was not submitted).
  std::string job_id;
  /// What trial_state said.
  std::string state;
};

/// The statuses as an aligned table: trial, job id, state, values (name=value ...).
std::string render_status(const std::vector<TrialStatus>& statuses);

}  // namespace volt::tool
