// HPC checkpoints: the files a SLURM job saves before it is requeued or preempted, and resumes
// from when it starts again (Lightning's hpc_ckpt_<N>.ckpt).
//
// They live in one fixed directory (default_root_dir unless set), not in a versioned log
// directory, so a restarted job finds them without knowing anything about the earlier run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace volt {

/// The HPC checkpoints in `dir`: files named hpc_ckpt_<N>.ckpt, highest N (newest) first. A
/// missing directory has none.
std::vector<std::string> list_hpc_checkpoints(const std::string& dir);

/// The path the next HPC checkpoint is saved to: hpc_ckpt_<highest N + 1>.ckpt (N starts at 1).
std::string next_hpc_checkpoint_path(const std::string& dir);

/// The HPC checkpoints in `dir` beyond the newest `keep` (keep >= 1), oldest last.
std::vector<std::string> hpc_checkpoints_to_prune(const std::string& dir, int64_t keep);

}  // namespace volt
