// HPC checkpoints and snapshots: the files a run resumes from by itself when it starts again.
//
// HPC checkpoints (Lightning's hpc_ckpt_<N>.ckpt) are saved when SLURM asks a job to stop before
// it is requeued or preempted; snapshots (snapshot_<N>.ckpt) every n steps while a run goes on,
// so a run that crashes loses at most those steps. Both live in one fixed directory
// (default_root_dir unless set), not in a versioned log directory, so a restarted job finds them
// without knowing anything about the earlier run, and both are numbered in one sequence, so the
// highest N of either kind is the newest.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace volt {

/// The HPC checkpoints in `dir`: files named hpc_ckpt_<N>.ckpt, highest N (newest) first. A
/// missing directory has none.
std::vector<std::string> list_hpc_checkpoints(const std::string& dir);

/// The snapshots in `dir`: files named snapshot_<N>.ckpt, highest N (newest) first.
std::vector<std::string> list_snapshots(const std::string& dir);

/// The HPC checkpoints and snapshots in `dir` together, highest N (newest) first: what a run
/// that starts again resumes from, newest readable one first.
std::vector<std::string> list_resume_checkpoints(const std::string& dir);

/// Whether `path` names a snapshot (snapshot_<N>.ckpt) rather than an HPC checkpoint.
bool is_snapshot_path(const std::string& path);

/// N when `path` names an HPC checkpoint or a snapshot (hpc_ckpt_<N>.ckpt, snapshot_<N>.ckpt).
std::optional<int64_t> resume_checkpoint_number(const std::string& path);

/// The next number of the sequence HPC checkpoints and snapshots share in `dir`: the highest N
/// of either kind + 1 (N starts at 1), and above the numbers the progress marker says belong to
/// earlier runs (read_run_boundary), whose files may be gone.
int64_t next_resume_checkpoint_number(const std::string& dir);

/// The path the next HPC checkpoint is saved to: hpc_ckpt_<next_resume_checkpoint_number>.ckpt.
std::string next_hpc_checkpoint_path(const std::string& dir);

/// The path of snapshot number `n` in `dir`: snapshot_<n>.ckpt.
std::string snapshot_path(const std::string& dir, int64_t n);

/// The HPC checkpoints in `dir` beyond the newest `keep` (keep >= 1), oldest last.
std::vector<std::string> hpc_checkpoints_to_prune(const std::string& dir, int64_t keep);

/// The snapshots in `dir` beyond the newest `keep` (keep >= 1), oldest last.
std::vector<std::string> snapshots_to_prune(const std::string& dir, int64_t keep);

/// Removes the temporary files that writes of HPC checkpoints and snapshots (and of their shards)
/// left in `dir` when their process was killed half-way: `<file>.tmp.<pid>`, write_file_atomically's
/// names, each up to a checkpoint's size and removed by nothing else. Call it only where no write
/// into `dir` is in flight: at the start of a fit, on global rank 0, before any process can save.
/// Other files (another tool's temporary ones among them) are left alone. Returns what it
/// removed and their bytes in all.
std::pair<std::vector<std::string>, int64_t> remove_interrupted_writes(const std::string& dir);

/// Where a run with snapshots records the step it has reached: `<dir>/volt-progress`.
std::string progress_marker_path(const std::string& dir);

/// The step a run has reached, rewritten in place at every step while snapshots are on (global
/// rank 0), so that a restarted run can say how many steps the failure cost. Written without
/// fsync: it survives a killed process (the page cache keeps it), not a lost node. Its second
/// line is the run's token, 16 random hex digits written once when the file is created: what
/// ties the snapshots' memory tier (snapshot_memory.h) to this run and not to an earlier one
/// that used the same folder.
class ProgressMarker {
 public:
  /// Opens (or creates, with a new token) the file `path` and its folder; throws
  /// volt::CheckpointError if it can't.
  explicit ProgressMarker(const std::string& path);
  ~ProgressMarker();
  ProgressMarker(const ProgressMarker&) = delete;
  ProgressMarker& operator=(const ProgressMarker&) = delete;

  /// Records `step` (one pwrite of a fixed-width line).
  void record(int64_t step);

 private:
  int fd_ = -1;
};

/// What the progress marker says of the resume files (HPC checkpoints and snapshots) numbered up
/// to `number` in its folder: that they are a finished run's, or an earlier run's.
struct RunBoundary {
  /// The highest number of the files it speaks of.
  int64_t number = 0;
  /// True: the run that wrote them finished its fit (mark_run_finished); a fresh launch in the
  /// folder does not resume from them, a restart of that run (restart_attempt > 0) still does.
  /// False: a later run set them aside (set_aside_finished_run); no attempt resumes from them.
  bool finished = false;
};

/// The marker's boundary in `dir`; unset without a marker or when it records none.
std::optional<RunBoundary> read_run_boundary(const std::string& dir);

/// The numbers a fit started as attempt `restart_attempt` must not resume from, given its folder's
/// `boundary` (read_run_boundary): up to the boundary, unless the boundary is a finished run's and
/// this is a restart of it (its program failed after the fit, e.g. in test()). 0: none.
int64_t resume_numbers_set_aside(const std::optional<RunBoundary>& boundary, int64_t restart_attempt);

/// Records in `dir`'s progress marker (created if need be) that the run whose resume files are
/// there finished its fit, when there are any. Called by global rank 0 once every file is
/// complete: a fresh launch in the folder then starts anew (see RunBoundary). Returns the
/// boundary's number (0: no files, nothing recorded).
int64_t mark_run_finished(const std::string& dir);

/// Sets a finished run's resume files aside for the run starting in `dir`: rewrites the progress
/// marker as this run's (a new token, so no memory tier of the finished run's is taken for
/// this one's) with the boundary kept as an earlier run's, so that no attempt of this run resumes
/// from them. The files stay (a ckpt_path may name one); this run's snapshots are numbered above
/// them, so snapshots_to_keep prunes them first. Global rank 0, before any process saves.
void set_aside_finished_run(const std::string& dir, int64_t number);

/// The step the marker at `path` holds; unset when there is no marker or it does not parse.
std::optional<int64_t> read_progress_marker(const std::string& path);

/// The run token of the marker at `path`; unset when there is no marker or it holds none.
std::optional<std::string> read_progress_marker_token(const std::string& path);

}  // namespace volt
