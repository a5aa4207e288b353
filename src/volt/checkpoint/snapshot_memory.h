// The memory tier of snapshots: the newest snapshot's bytes also kept in node-local shared memory
// (/dev/shm, a tmpfs). They outlive the process that wrote them (not the node), so a run that
// starts again on the same node restores without reading the file system, and a snapshot whose
// file write a crash cut short is still whole there: a rank 0 killed mid-write loses at most one
// snapshot interval too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace volt {

/// The folder in `root` (e.g. /dev/shm) that holds the memory tier of the run whose snapshots go
/// to `hpc_dir`: `volt-snapshots-<uid>-<hash of hpc_dir>-<the token of its progress marker>`. The
/// token (ProgressMarker) ties it to this run: a folder emptied and reused by a new run gets a
/// new marker and token, so an earlier run's memory snapshot is never taken for the new run's.
/// "" when there is no marker yet (a run that has not started training has nothing to keep).
std::string memory_snapshot_dir(const std::string& root, const std::string& hpc_dir);

/// Writes snapshot number `n` (the bytes of a torch.save archive) into `dir` as snapshot_<n>.ckpt
/// (through a temporary file renamed over it: a reader never sees half of one), then removes the
/// older ones: the tier keeps the newest only. Throws volt::CheckpointError naming the file (a
/// full /dev/shm) with a HINT.
void write_memory_snapshot(const std::string& dir, int64_t n, const std::vector<char>& bytes);

/// Writes `bytes` as the file `name` (a shard of a sharded snapshot, or its index before the
/// commit) into the memory tier `dir`, atomically as write_memory_snapshot does, removing nothing.
/// Throws volt::CheckpointError naming the file (a full /dev/shm) with a HINT.
void write_memory_file(const std::string& dir, const std::string& name, const std::vector<char>& bytes);

/// The name under which a sharded snapshot's index waits in a memory tier until every process's
/// shard is there: `snapshot_<n>.ckpt.pending`, which no listing of snapshots takes for one.
std::string pending_memory_index_name(int64_t n);

/// After sharded snapshot `n` (save `save_id`) was committed in memory: removes from `dir` the
/// shards of `ranks` (this process's own, and the one it keeps a copy of for a process on the
/// previous node) of every other save and, with `owns_index` (global rank 0, or the process that
/// keeps rank 0's copies), the snapshots numbered below `n` and every pending index. Other
/// processes' files on the same node are theirs to remove.
void prune_memory_shards(const std::string& dir, const std::vector<int64_t>& ranks, int64_t n,
                         const std::string& save_id, bool owns_index);

/// The bytes of the file `name` in the memory tier `dir` (a shard sent to the process that lacks
/// it). Throws volt::CheckpointError naming the file when it cannot be read.
std::vector<char> read_memory_file(const std::string& dir, const std::string& name);

/// The newest snapshot number in `dir` (a memory tier), 0 when there is none.
int64_t newest_memory_snapshot_number(const std::string& dir);

/// Removes the memory tiers in `root` of earlier runs that used `hpc_dir` (every folder of its
/// hash but `keep`): what a crashed run with no restarts left in shared memory.
void remove_stale_memory_snapshots(const std::string& root, const std::string& hpc_dir, const std::string& keep);

/// Removes the memory tier `dir` ("" does nothing): the run it belongs to ended, and its shared
/// memory goes back to the node.
void remove_memory_snapshots(const std::string& dir);

}  // namespace volt
