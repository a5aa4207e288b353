// The message global rank 0 broadcasts to commit sharded checkpoints: which checkpoints every
// process writes its shard of, under which save id.
#pragma once

#include <string>
#include <vector>

namespace volt {

/// Rank 0's plan for one sharded commit (FitCheckpoints): the save id and the checkpoints built
/// since the gather point. Every process writes its shard of each entry; rank 0 then writes the
/// entries' files with their shard index. Empty entries: nothing to write.
struct ShardedCommitPlan {
  /// One checkpoint to commit.
  struct Entry {
    /// The checkpoint's file (any bytes, a newline included).
    std::string path;
    /// True when its shards hold only the parameters' pieces (save_weights_checkpoint).
    bool weights_only = false;
    bool operator==(const Entry&) const = default;
  };
  /// Names the shard files of this commit (sharded_checkpoint.h's new_save_id).
  std::string save_id;
  /// The checkpoints, in the order they were saved.
  std::vector<Entry> entries;
  bool operator==(const ShardedCommitPlan&) const = default;
};

/// The bytes of `plan` for Collectives::broadcast_string: a version tag, then each field as its
/// length and its bytes, so a path may hold any byte.
std::string encode(const ShardedCommitPlan& plan);

/// The plan encode() wrote into `bytes`. Throws volt::Error naming what was given and what was
/// expected when `bytes` are not such a message (another version, cut short, trailing bytes).
ShardedCommitPlan decode_sharded_commit_plan(const std::string& bytes);

}  // namespace volt
