// The Checkpointer: builds, writes, reads and restores a run's checkpoints, owns the HPC files,
// and says which file "last" and "best" mean.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "volt/checkpoint/checkpoint_io.h"
#include "volt/checkpoint/checkpoint_state.h"

namespace volt {

class Collectives;
class Console;

/// Where ckpt_path="last" looks when the Trainer has not saved a checkpoint itself.
///
/// The search is a fixed list of folders, never a recursive scan of the working directory, so it
/// cannot pick up another run's or another program's file.
struct LastCheckpointSearch {
  /// A ModelCheckpoint's explicit dirpath: when set, the only folder searched.
  std::string checkpoint_dir;
  /// default_root_dir.
  std::string root_dir;
  /// The folder holding the runs' version folders (default `<root_dir>/lightning_logs`).
  std::string logs_dir;
  /// A version folder to search first (a SLURM job logs under its job id); empty: none.
  std::string version;
};

/// The checkpoint "last" means under `search`, or "" when there is none. In each folder below,
/// the first that holds a `.ckpt` file wins: `checkpoint_dir` alone when set; else
/// `<logs_dir>/<version>/checkpoints`, then `<logs_dir>/version_<N>/checkpoints` from the highest
/// N down, then `<root_dir>/checkpoints` (runs without a logger). In that folder: `last.ckpt`,
/// else the newest file whose name contains "last", else the newest `.ckpt` file.
std::string find_last_checkpoint(const LastCheckpointSearch& search);

/// A checkpoint read from a file, with where it came from.
struct LoadedCheckpoint {
  /// The file.
  std::string path;
  /// Its contents.
  c10::IValue value;
  /// Where it was read, when not from `path` on this process's file system: "node-local shared
  /// memory" (the snapshots' memory tier) or "received from rank R" (a peer's copy); "" otherwise.
  std::string source;
};

/// Assembles and restores checkpoints through a CheckpointIO (atomic files by default).
///
/// It decides nothing about who writes: the fit loop calls save() on global rank 0 only.
class Checkpointer {
 public:
  /// Reads and writes through `io`.
  explicit Checkpointer(std::shared_ptr<CheckpointIO> io = std::make_shared<TorchCheckpointIO>());

  /// Replaces how files are written and read; throws volt::Error on nullptr.
  void set_io(std::shared_ptr<CheckpointIO> io);
  /// How files are written and read.
  CheckpointIO& io() { return *io_; }

  /// Writes the checkpoint of `parts` at `progress` to `path`: all of it, or only the weights
  /// (ModelCheckpoint's save_weights_only).
  void save(const TrainingParts& parts, const FitProgress& progress, const std::string& path,
            CheckpointContents contents = CheckpointContents::kFull);
  /// Reads `path`; throws volt::CheckpointError when it is unreadable. A folder PyTorch's
  /// torch.distributed.checkpoint wrote (is_dcp_checkpoint) is read from the file system, whatever
  /// the CheckpointIO, as dcp_training_checkpoint converts it, so that fit resumes from it and
  /// validate/test load its weights through the same checks as Volt's own files.
  c10::IValue load(const std::string& path);
  /// Deletes `path` when it exists, and its shard files when it is a sharded checkpoint.
  void remove(const std::string& path);

  /// The files "best" and "last" mean from now on (after a fit).
  void remember(std::string best, std::string last);
  /// The file to use for `requested`: "" stays "", "best" is the remembered best (an error
  /// without one), "last" the remembered last or else find_last_checkpoint(search) (a warning
  /// and "" when there is none), and a path must exist: a checkpoint file, or a folder of
  /// torch.distributed.checkpoint (see load).
  std::string resolve(const std::string& requested, const LastCheckpointSearch& search, Console& console) const;

  /// Collective: what a run that starts again resumes from, the same on every process. Each
  /// process reads its newest readable HPC checkpoint or snapshot in `dir` (a file cut short, by
  /// a full disk or a copy, is skipped with a warning and the one before it tried), where the
  /// memory tier `memory_dir` ("" none; snapshot_memory.h) stands in for a snapshot file of the
  /// same number (same bytes, no file system) or one a crash cut short. The highest number any
  /// process found wins; a process without it receives it from the lowest rank that has it (one
  /// read from that rank's memory tier is named in this node's, the same folder name). A sharded
  /// one wins only when every process finds its own shard (beside it, in `dir` or in its node's
  /// memory tier) or receives it from another node's tier, which holds a peer copy
  /// (snapshot_peer_copy); else the one before it is tried, with a warning naming who lacks it.
  /// Files and copies numbered up to `set_aside` are passed over: a finished or earlier run's
  /// (resume_numbers_set_aside).
  std::optional<LoadedCheckpoint> newest_resume_checkpoint(const std::string& dir, const std::string& memory_dir,
                                                           Collectives& collectives, Console& console,
                                                           int64_t set_aside = 0) const;
  /// Saves the next hpc_ckpt_<N>.ckpt in `dir` and deletes all but the newest `keep`, only after
  /// the new file is complete (a kill in between leaves one more, never none). Returns its path.
  std::string save_hpc_checkpoint(const TrainingParts& parts, const FitProgress& progress, const std::string& dir,
                                  int64_t keep);
  /// Deletes all but the newest `keep` HPC checkpoints in `dir` (with their shard files), for a
  /// sharded HPC save committed outside save_hpc_checkpoint.
  void prune_hpc_checkpoints(const std::string& dir, int64_t keep);

 private:
  std::shared_ptr<CheckpointIO> io_;
  std::string best_;
  std::string last_;
};

}  // namespace volt
